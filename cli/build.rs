//! With the `python` feature, `riverbank` finds the libpython that PyO3 linked against without
//! LD_LIBRARY_PATH (pyenv's lib dir is not on the loader's path): an rpath to it.
fn main() {
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    #[cfg(feature = "python")]
    if let Some(dir) = &pyo3_build_config::get().lib_dir {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
