//! The `kernel.v1` protocol, and the wire conventions both ends must agree on.
//!
//! Generated types live in [`v1`]; [`canonical`] holds the JSON canonicalisation and the hashes
//! (tool fingerprints, call hashes) that the kernel and the worker SDK both compute, so a worker's
//! announced fingerprint can be checked byte for byte; [`duration`] reads durations as people
//! write them, for the kernel's flags and policy files and for `kernelctl`.

pub mod alignment;
pub mod canonical;
pub mod duration;
pub mod nesting;
pub mod receipt;
pub mod traceparent;

/// Generated messages, clients and servers of package `kernel.v1`.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    tonic::include_proto!("kernel.v1");
}

/// Generated messages, client and server of package `kernel.replica.v1`: the link between
/// replicas, which clients never use.
#[allow(clippy::all, missing_docs)]
pub mod replica {
    tonic::include_proto!("kernel.replica.v1");
}

/// Encoded `FileDescriptorSet` of the protocol, with its comments (source info), for gRPC server
/// reflection and the generated page `docs/reference/grpc-api.md`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kernel_v1_descriptor.bin"));
