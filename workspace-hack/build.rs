//! Empty: it exists so that `[build-dependencies]` in Cargo.toml unify host crates' features.

fn main() {}
