//! Generates Beam's portability types and gRPC services (tonic) from the FileDescriptorSet that
//! `proto/extract.py` took from the apache-beam 2.77.0 wheel: no protoc, no Python at build time.
use prost::Message;

fn main() -> std::io::Result<()> {
    let path = "proto/beam-2.77.0.binpb";
    println!("cargo:rerun-if-changed={path}");
    let bytes = std::fs::read(path)?;
    let fds = prost_types::FileDescriptorSet::decode(bytes.as_slice())
        .map_err(|e| std::io::Error::other(format!("{path}: {e}")))?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .bytes(".org.apache.beam.model.fn_execution.v1.Elements.Data.data")
        .include_file("beam.rs")
        .compile_fds(fds)
}
