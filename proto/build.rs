//! Generates the Rust code for `proto/` with a vendored `protoc`, so no system protoc is needed,
//! and writes the file descriptor set that the daemon serves through gRPC reflection.
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; prost-build reads PROTOC from the environment.
    unsafe { std::env::set_var("PROTOC", protoc) };
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out_dir.join("tunecache_descriptor.bin"))
        // Stats is printed as JSON and as a table by the CLI, field by field, in proto order.
        .type_attribute("tunecache.v1.StatsResponse", "#[derive(serde::Serialize)]")
        // The Python binding presents these answers as objects of their fields, by name.
        .type_attribute("tunecache.v1.Device", "#[derive(serde::Serialize)]")
        .type_attribute("tunecache.v1.UsageGroup", "#[derive(serde::Serialize)]")
        .type_attribute(
            "tunecache.v1.SnapshotResponse",
            "#[derive(serde::Serialize)]",
        )
        .type_attribute("tunecache.v1.ViewInfo", "#[derive(serde::Serialize)]")
        .type_attribute(
            "tunecache.v1.EndViewResponse",
            "#[derive(serde::Serialize)]",
        )
        // Artifact chunks are split off the received buffer and handed on without a copy.
        .bytes(".tunecache.v1.ArtifactChunk.data")
        .compile_protos(
            &[
                "tunecache/v1/tunecache.proto",
                "tunecache/tuner/v1/tuner.proto",
                "tunecache/journal/v1/journal.proto",
            ],
            &["."],
        )?;
    println!("cargo:rerun-if-changed=tunecache");
    Ok(())
}
