//! Compiles `kernel/v1/*.proto` with protox, so no system `protoc` is needed.

use std::path::PathBuf;

use prost::Message;

const FILES: &[&str] = &[
    "kernel/v1/common.proto",
    "kernel/v1/runs.proto",
    "kernel/v1/tool_calls.proto",
    "kernel/v1/workers.proto",
    "kernel/v1/registry.proto",
    "kernel/v1/approvals.proto",
    "kernel/v1/admin.proto",
    "kernel/v1/hosted.proto",
];

const LINK: &str = "kernel/replica/v1/link.proto";

fn main() -> Result<(), Box<dyn std::error::Error>> {
    for file in FILES {
        println!("cargo:rerun-if-changed={file}");
    }
    // `protox::compile` keeps the source info, comments included: reflection clients show them,
    // and the kernel's test renders docs/reference/grpc-api.md from them.
    let descriptors = protox::compile(FILES, ["."])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    std::fs::write(out_dir.join("kernel_v1_descriptor.bin"), descriptors.encode_to_vec())?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(descriptors)?;
    // The replicas' own link is not part of the public protocol: no reflection, no reference page.
    println!("cargo:rerun-if-changed={LINK}");
    let link = protox::compile([LINK], ["."])?;
    tonic_prost_build::configure()
        .build_client(true)
        .build_server(true)
        .compile_fds(link)?;
    Ok(())
}
