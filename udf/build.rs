//! With the `python` feature, the test binaries find the libpython that PyO3 linked against
//! without LD_LIBRARY_PATH (pyenv's lib dir is not on the loader's path): an rpath to it.
fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    #[cfg(feature = "python")]
    {
        let config = pyo3_build_config::get();
        let dir = config.lib_dir.as_deref().unwrap_or("/usr/lib");
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        // Where the interpreter's standard library is: checked before CPython starts (a
        // CPython without it aborts the process), see `udf::python::available`.
        let v = config.version;
        println!(
            "cargo:rustc-env=RIVERBANK_PYTHON_STDLIB={dir}/python{}.{}",
            v.major, v.minor
        );
    }
}
