//! The documentation holds together: every relative Markdown link of the README, CHANGELOG.md,
//! ARCHITECTURE.md, CONTRIBUTING.md and the book under `docs/` names a file that exists and, with
//! a `#anchor`, a heading of that file (GitHub's slugs); every page of the book is linked from its
//! contents page, `docs/README.md`; the README stays a short front page; and every code block of
//! the user documentation is checked by some test or says why not.
//!
//! Only `std`, so this test compiles and links in moments.

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::io::Write as _;
use std::path::{Component, Path, PathBuf};

// The docs' code blocks and command lines, as the tests of the programs they run read them.
#[path = "../../kernel/src/docs_commands.rs"]
pub(crate) mod docs_commands;

/// The README must stay a front page: what, why, the two commands, the quickstart, links.
const README_MAX_LINES: usize = 200;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root")
        .to_path_buf()
}

/// The pages whose links are checked, relative to the root.
fn pages() -> Vec<PathBuf> {
    let root = root();
    let mut pages: Vec<PathBuf> = ["README.md", "CHANGELOG.md", "ARCHITECTURE.md", "CONTRIBUTING.md"]
        .iter()
        .map(PathBuf::from)
        .collect();
    for path in docs_commands::markdown_under(&root.join("docs")) {
        pages.push(path.strip_prefix(&root).expect("under the root").to_path_buf());
    }
    pages
}

/// The lines of `text` outside fenced code blocks, numbered from 1.
fn prose_lines(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|marker| trimmed.starts_with(marker));
        match (fence, marker) {
            (None, Some(marker)) => fence = Some(marker),
            (Some(open), Some(marker)) if open == marker => fence = None,
            (None, None) => lines.push((index + 1, line)),
            _ => {}
        }
    }
    lines
}

/// `line` without its inline code spans, so a `[x](y)` inside backticks is not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::new();
    for (index, part) in line.split('`').enumerate() {
        if index % 2 == 0 {
            out.push_str(part);
        }
    }
    out
}

/// The targets of the inline links `[text](target)` and images `![alt](target)` of one line.
fn link_targets(line: &str) -> Vec<String> {
    let line = without_code_spans(line);
    let mut targets = Vec::new();
    let mut rest = line.as_str();
    while let Some(at) = rest.find("](") {
        let after = &rest[at + 2..];
        match after.find(')') {
            Some(end) => {
                let target = after[..end].split_whitespace().next().unwrap_or("");
                targets.push(target.trim_matches(|c| c == '<' || c == '>').to_owned());
                rest = &after[end + 1..];
            }
            None => break,
        }
    }
    targets
}

/// GitHub's anchor for a heading: lowercase, spaces to `-`, punctuation other than `-` and `_` dropped.
fn slug(heading: &str) -> String {
    let text = heading.trim().trim_end_matches('#').trim();
    let mut slug = String::new();
    for c in text.to_lowercase().chars() {
        if c == ' ' {
            slug.push('-');
        } else if c.is_alphanumeric() || c == '-' || c == '_' {
            slug.push(c);
        }
    }
    slug
}

/// The anchors of a page's headings, a repeated one with `-1`, `-2`, ... as GitHub numbers them.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut anchors = BTreeSet::new();
    for (_, line) in prose_lines(text) {
        let hashes = line.chars().take_while(|&c| c == '#').count();
        if !(1..=6).contains(&hashes) || !line[hashes..].starts_with(' ') {
            continue;
        }
        let base = slug(&line[hashes..]);
        let count = seen.entry(base.clone()).or_insert(0);
        anchors.insert(if *count == 0 {
            base.clone()
        } else {
            format!("{base}-{count}")
        });
        *count += 1;
    }
    anchors
}

/// `path` with its `.` and `..` folded away (the files need not exist).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                if !out.pop() {
                    out.push("..");
                }
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn is_external(target: &str) -> bool {
    ["http://", "https://", "mailto:"]
        .iter()
        .any(|scheme| target.starts_with(scheme))
}

#[test]
fn every_relative_link_names_a_file_and_a_heading_that_exist() {
    let root = root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in pages() {
        let text = fs::read_to_string(root.join(&page)).unwrap_or_else(|e| panic!("{}: {e}", page.display()));
        for (number, line) in prose_lines(&text) {
            for target in link_targets(line) {
                if target.is_empty() || is_external(&target) {
                    continue;
                }
                checked += 1;
                let (file, anchor) = match target.split_once('#') {
                    Some((file, anchor)) => (file, Some(anchor)),
                    None => (target.as_str(), None),
                };
                let linked = if file.is_empty() {
                    page.clone()
                } else {
                    normalize(&page.parent().unwrap_or(Path::new("")).join(file))
                };
                let path = root.join(&linked);
                if linked.starts_with("..") || !path.exists() {
                    broken.push(format!(
                        "{}:{number}: ({target}): {} does not exist",
                        page.display(),
                        linked.display()
                    ));
                    continue;
                }
                let Some(anchor) = anchor else { continue };
                if path.is_dir() || path.extension().is_none_or(|ext| ext != "md") {
                    broken.push(format!(
                        "{}:{number}: ({target}): an anchor into a file that is not Markdown",
                        page.display()
                    ));
                    continue;
                }
                let headings = anchors(&fs::read_to_string(&path).expect("a linked page"));
                if !headings.contains(anchor) {
                    broken.push(format!(
                        "{}:{number}: ({target}): {} has no heading #{anchor} (its anchors: {})",
                        page.display(),
                        linked.display(),
                        headings.into_iter().collect::<Vec<_>>().join(", ")
                    ));
                }
            }
        }
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
    assert!(
        checked > 50,
        "only {checked} relative links found: is the link parser broken?"
    );
}

#[test]
fn every_page_of_the_book_is_in_its_contents() {
    let root = root();
    let contents_path = Path::new("docs/README.md");
    let contents = fs::read_to_string(root.join(contents_path)).expect("docs/README.md, the contents page");
    let mut listed = BTreeSet::new();
    for (_, line) in prose_lines(&contents) {
        for target in link_targets(line) {
            let file = target.split('#').next().unwrap_or("");
            if !file.is_empty() && !is_external(file) {
                listed.insert(normalize(&Path::new("docs").join(file)));
            }
        }
    }
    let orphans: Vec<String> = docs_commands::markdown_under(&root.join("docs"))
        .into_iter()
        .map(|path| path.strip_prefix(&root).expect("under the root").to_path_buf())
        .filter(|page| page != contents_path && !listed.contains(page))
        .map(|page| format!("{} is not linked from docs/README.md", page.display()))
        .collect();
    assert!(
        orphans.is_empty(),
        "pages missing from the contents:\n{}",
        orphans.join("\n")
    );
}

#[test]
fn the_readme_is_a_short_front_page() {
    let readme = fs::read_to_string(root().join("README.md")).expect("README.md");
    let lines = readme.lines().count();
    assert!(
        lines < README_MAX_LINES,
        "README.md: {lines} lines; keep it under {README_MAX_LINES} and move the rest into docs/"
    );
}

#[test]
fn slugs_follow_github() {
    assert_eq!(
        slug("The kernel's tools for MCP clients"),
        "the-kernels-tools-for-mcp-clients"
    );
    assert_eq!(
        slug("Writing tools: every `#[tool]` option"),
        "writing-tools-every-tool-option"
    );
    assert_eq!(
        slug("Outgrowing one machine: PostgreSQL and replicas"),
        "outgrowing-one-machine-postgresql-and-replicas"
    );
    assert_eq!(slug("snake_case and-dash"), "snake_case-and-dash");
    let repeated = anchors("# A\n## Notes\n```\n# not a heading\n```\n## Notes\n## Notes\n");
    assert_eq!(
        repeated,
        ["a", "notes", "notes-1", "notes-2"]
            .into_iter()
            .map(String::from)
            .collect()
    );
}

#[test]
fn links_are_found_outside_code_only() {
    let text = "see [a](a.md) and ![i](i.png)\n`[b](b.md)` [c](c.md#x \"title\")\n```\n[d](d.md)\n```\n";
    let found: Vec<String> = prose_lines(text)
        .into_iter()
        .flat_map(|(_, line)| link_targets(line))
        .collect();
    assert_eq!(found, ["a.md", "i.png", "c.md#x"]);
}

/// The ```yaml and ```toml blocks other tests load, by page and info string, with the source file
/// of the test that reads them (which must name the page).
const BLOCKS_CHECKED_ELSEWHERE: &[(&str, &str, &str)] = &[
    ("docs/guides/governance.md", "yaml", "kernel/src/governance.rs"),
    ("docs/guides/budgets.md", "yaml", "kernel/src/governance.rs"),
    ("docs/guides/limits.md", "yaml", "kernel/src/governance.rs"),
    ("docs/reference/policy-file.md", "yaml", "kernel/src/reference.rs"),
    ("docs/guides/mcp.md", "yaml", "kernel-mcp/src/config.rs"),
    ("docs/getting-started/rust.md", "toml", "worker-sdk/tests/readme.rs"),
];

/// Why `block` of `page` counts as checked, or `None`.
fn checked_by(page: &str, block: &docs_commands::CodeBlock) -> Option<String> {
    let read = |path: &str| fs::read_to_string(root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"));
    let language = block.info.split(',').next().unwrap_or_default();
    match language {
        // `rust,ignore` compiles nothing, so it must say why.
        "rust" if !block.info.contains("ignore") => read("worker-sdk/src/lib.rs")
            .contains(&format!("include_str!(\"../../{page}\")"))
            .then(|| "compiled by cargo test -p worker-sdk --doc".to_owned()),
        // A block marked not run is only compiled there.
        "python" if block.not_run.is_none() => Some("run by python/tests/test_docs_blocks.py".to_owned()),
        "yaml" | "toml" => BLOCKS_CHECKED_ELSEWHERE
            .iter()
            .find(|(listed, info, _)| *listed == page && *info == block.info)
            .filter(|(_, _, test)| read(test).contains(page))
            .map(|(_, _, test)| format!("loaded by a test in {test}")),
        // A shell block may run only commands the runner knows and still need what it lacks (another
        // worker, a second approval): its mark says what, and the runner leaves it.
        "" | "sh" if block.not_run.is_some() => None,
        "" | "sh" => {
            let commands: Vec<Vec<String>> = block
                .lines
                .iter()
                .flat_map(|(_, line)| docs_commands::commands(line))
                .collect();
            (!commands.is_empty() && commands.iter().all(|words| crate::docs_run::runs(words)))
                .then(|| "run by tests/tests/docs_run.rs, and parsed by the tests of the programs it runs".to_owned())
        }
        _ => None,
    }
}

#[test]
fn every_code_block_is_checked_or_says_why_not() {
    let mut unchecked = Vec::new();
    let (mut blocks, mut checked, mut not_run) = (0, 0, 0);
    for (page, text) in docs_commands::pages() {
        for block in docs_commands::code_blocks(&text) {
            blocks += 1;
            match (checked_by(&page, &block), &block.not_run) {
                (Some(_), None) => checked += 1,
                (None, Some(_)) => not_run += 1,
                (Some(how), Some(_)) => unchecked.push(format!(
                    "{page}:{}: marked not run, but it is {how}: drop the comment",
                    block.line
                )),
                (None, None) => unchecked.push(format!(
                    "{page}:{}: a ```{} block no test checks: make it one a test checks (see this test), \
                     or put <!-- not run: REASON --> on the line above it",
                    block.line, block.info
                )),
            }
        }
    }
    assert!(unchecked.is_empty(), "{}", unchecked.join("\n"));
    assert!(
        checked >= 20,
        "only {checked} of {blocks} code blocks checked: is the block parser broken?"
    );
    let _ = writeln!(
        std::io::stderr(),
        "{blocks} code blocks: {checked} checked, {not_run} not run"
    );
}
