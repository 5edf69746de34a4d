//! The README's outcomes snippet is the doc test of `worker_sdk::Outcome`'s module, which the
//! doc tests compile: the two must not drift apart.

fn readme_block(after_heading: &str) -> String {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md")).expect("README.md");
    let section = &readme[readme.find(after_heading).expect("the heading")..];
    let start = section.find("```rust\n").expect("a rust block") + "```rust\n".len();
    let end = start + section[start..].find("```").expect("the block ends");
    section[start..end].to_owned()
}

fn doc_block(source: &str) -> String {
    let mut block = String::new();
    let mut inside = false;
    for line in source.lines().filter_map(|l| l.strip_prefix("//!")) {
        let line = line.strip_prefix(' ').unwrap_or(line);
        if line.starts_with("```") {
            if inside {
                break;
            }
            inside = true;
            continue;
        }
        // Hidden lines (`# ...`) wrap the snippet in a function; the README shows the body.
        if inside && !line.starts_with("# ") && line != "#" {
            block.push_str(line);
            block.push('\n');
        }
    }
    block
}

#[test]
fn the_readme_outcomes_snippet_is_the_compiled_doc_test() {
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/agent/outcome.rs"))
        .expect("agent/outcome.rs");
    assert_eq!(readme_block("## Outcomes a program can read"), doc_block(&source));
}
