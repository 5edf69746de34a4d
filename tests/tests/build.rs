//! The first build: after the workspace build (`cargo run -p kernel`'s, or the test command's),
//! the quickstart's other commands compile only their own crates. Cargo resolves features per
//! command, so a shared dependency asked for with other features by one package alone would be
//! built again, and every crate above it (tokio, hyper, tonic: 69 crates, once); the
//! `workspace-hack` crate asks for the union of features so that each resolves alike.

use std::process::Command;

/// Every registry crate `cargo build ARGS` builds (compiled or reused), as `name@version kind
/// [features]`.
fn registry_units(args: &[&str]) -> std::collections::BTreeSet<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut command = Command::new(cargo);
    // Cargo gives a test the variables it gives a build script (this package's name, version,
    // folder). Build scripts that declare them (ring's does) are rerun when they differ from those
    // of the build being checked, which had none: the child gets the environment of that build.
    for (name, _) in std::env::vars_os() {
        let name = name.to_string_lossy();
        if ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_BIN_", "CARGO_CRATE_"]
            .iter()
            .any(|prefix| name.starts_with(prefix))
            || ["CARGO_TARGET_TMPDIR", "CARGO_PRIMARY_PACKAGE", "OUT_DIR"].contains(&name.as_ref())
        {
            command.env_remove(name.as_ref());
        }
    }
    let output = command
        .arg("build")
        .args(args)
        .args(["--message-format", "json"])
        .current_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/.."))
        .output()
        .expect("cargo runs");
    assert!(
        output.status.success(),
        "cargo build {args:?} failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter(|message| message["reason"] == "compiler-artifact")
        .filter(|message| {
            message["package_id"]
                .as_str()
                .is_some_and(|id| id.starts_with("registry+"))
        })
        .map(|message| {
            let id = message["package_id"].as_str().unwrap_or_default();
            format!(
                "{} {} {}",
                id.rsplit('#').next().unwrap_or(id),
                message["target"]["kind"],
                message["features"]
            )
        })
        .collect()
}

/// Compares feature sets, not freshness: a target folder that once built a package alone keeps
/// those artifacts too, and would hide a difference a clean build shows.
#[test]
fn each_quickstart_command_alone_builds_its_dependencies_as_the_workspace_build_does() {
    // The test command builds the workspace's binaries and examples before any test runs; without
    // them there is no workspace build to compare with.
    e2e::binary("kernel");
    e2e::binary("demo-worker");
    let workspace = registry_units(&["--workspace", "--bins", "--examples"]);
    for args in [
        &["-p", "kernel"][..],
        &["-p", "kernelctl"],
        &["-p", "worker-sdk", "--example", "demo-worker"],
        &["-p", "worker-sdk", "--example", "demo-agent"],
        &["-p", "kernel-mcp"],
    ] {
        let other: Vec<String> = registry_units(args).difference(&workspace).cloned().collect();
        assert!(
            other.is_empty(),
            "`cargo build {}` builds these with other features than the workspace build, so compiles them \
             again (and every crate above them): {other:#?}\n(add their features to workspace-hack/Cargo.toml)",
            args.join(" ")
        );
    }
}
