//! The outcomes snippet of `docs/reference/outcomes.md` (once the README's, hence this file's name)
//! is the doc test of `worker_sdk::Outcome`'s module, which the doc tests compile: the two must not
//! drift apart.

fn docs_block(after_heading: &str) -> String {
    let page = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/reference/outcomes.md"))
        .expect("docs/reference/outcomes.md");
    let section = &page[page.find(after_heading).expect("the heading")..];
    let start = section.find("```rust,no_run\n").expect("a rust block") + "```rust,no_run\n".len();
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
        // Hidden lines (`# ...`) wrap the snippet in a function; the page shows the body.
        if inside && !line.starts_with("# ") && line != "#" {
            block.push_str(line);
            block.push('\n');
        }
    }
    block
}

#[test]
fn the_outcomes_snippet_in_the_docs_is_the_compiled_doc_test() {
    let source = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/src/agent/outcome.rs"))
        .expect("agent/outcome.rs");
    assert_eq!(docs_block("# Outcomes a program can read\n"), doc_block(&source));
}
