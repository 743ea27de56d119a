//! Compile schema/telemetry/v1/telemetry.proto with prost. protoc comes from
//! `protoc-bin-vendored`, so a build needs no system protobuf compiler.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    let proto = "../../schema/telemetry/v1/telemetry.proto";
    println!("cargo:rerun-if-changed={proto}");
    std::env::set_var("PROTOC", protoc_bin_vendored::protoc_bin_path()?);
    prost_build::compile_protos(&[proto], &["../../schema"])?;
    Ok(())
}
