//! The Rust getting-started guide's "Writing tools" section (`docs/getting-started/rust.md`; it was
//! the README's, hence this file's name and the example's, `readme-tool`): its program is
//! `examples/readme_tool.rs` word for word, so it compiles with every build, and its `[dependencies]`
//! name the versions this workspace uses.

const GUIDE: &str = include_str!("../../docs/getting-started/rust.md");

/// The section's first fenced block of `language`, without its fences.
fn block(language: &str) -> &'static str {
    let section = GUIDE
        .split("\n## Writing tools\n")
        .nth(1)
        .expect("docs/getting-started/rust.md has a \"Writing tools\" section");
    let section = section.split("\n## ").next().unwrap_or(section);
    section
        .split(&format!("```{language}\n"))
        .nth(1)
        .and_then(|rest| rest.split("\n```").next())
        .unwrap_or_else(|| panic!("\"Writing tools\" has no ```{language} block"))
}

/// The version a manifest line `name = "1"` or `name = { version = "1", ... }` asks for.
fn version(manifest: &str, name: &str) -> Option<String> {
    let line = manifest.lines().find(|line| line.starts_with(&format!("{name} = ")))?;
    let rest = line.split_once(" = ")?.1;
    let rest = rest.split_once("version = ").map_or(rest, |(_, after)| after);
    Some(rest.split('"').nth(1)?.to_owned())
}

#[test]
fn the_guide_program_is_the_example() {
    assert_eq!(
        block("rust,no_run").trim_end(),
        include_str!("../examples/readme_tool.rs").trim_end(),
        "the tool program of docs/getting-started/rust.md and worker-sdk/examples/readme_tool.rs differ; change both"
    );
}

#[test]
fn the_guide_dependencies_match_the_workspace() {
    let workspace = include_str!("../../Cargo.toml");
    let guide = block("toml");
    assert!(guide.contains("worker-sdk = "), "{guide}");
    for name in ["tokio", "serde", "schemars", "serde_json"] {
        let wanted = version(workspace, name).unwrap_or_else(|| panic!("the workspace has no {name}"));
        assert_eq!(
            version(guide, name).as_deref(),
            Some(wanted.as_str()),
            "the {name} version in docs/getting-started/rust.md; the workspace uses {wanted}"
        );
    }
}
