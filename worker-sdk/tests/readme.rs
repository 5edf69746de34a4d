//! The README's "Writing tools" section: its program is `examples/readme_tool.rs` word for word,
//! so it compiles with every build, and its `[dependencies]` name the versions this workspace uses.

const README: &str = include_str!("../../README.md");

/// The section's first fenced block of `language`, without its fences.
fn block(language: &str) -> &'static str {
    let section = README
        .split("\n## Writing tools\n")
        .nth(1)
        .expect("the README has a \"Writing tools\" section");
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
fn the_readme_program_is_the_example() {
    assert_eq!(
        block("rust").trim_end(),
        include_str!("../examples/readme_tool.rs").trim_end(),
        "the README's tool program and worker-sdk/examples/readme_tool.rs differ; change both"
    );
}

#[test]
fn the_readme_dependencies_match_the_workspace() {
    let workspace = include_str!("../../Cargo.toml");
    let readme = block("toml");
    assert!(readme.contains("worker-sdk = "), "{readme}");
    for name in ["tokio", "serde", "schemars", "serde_json"] {
        let wanted = version(workspace, name).unwrap_or_else(|| panic!("the workspace has no {name}"));
        assert_eq!(
            version(readme, name).as_deref(),
            Some(wanted.as_str()),
            "the README's {name} version; the workspace uses {wanted}"
        );
    }
}
