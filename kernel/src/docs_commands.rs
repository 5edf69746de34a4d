//! The command lines in the code blocks of the user documentation (README.md, CONTRIBUTING.md,
//! ARCHITECTURE.md and the book under `docs/`), for the tests that parse them with the real clap
//! grammar: a flag renamed in the code cannot live on in the docs.
//!
//! The crates share no test utility crate, so the tests of kernelctl, kernel-mcp, the demo worker
//! and agent, and the e2e docs test include this file by its path; it needs only `std` and `clap`,
//! which each of them has.

// Each includer uses a part: the crates' tests the invocations, the e2e docs test the blocks.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// One invocation of a program in a docs code block: its page, line and arguments.
#[derive(Debug)]
pub struct Invocation {
    pub page: String,
    pub line: usize,
    pub args: Vec<String>,
}

impl Invocation {
    /// `page:line: program args`, for a failure message.
    pub fn describe(&self, program: &str, error: &dyn std::fmt::Display) -> String {
        let error = error.to_string();
        let error = error.lines().next().unwrap_or_default();
        format!(
            "{}:{}: {program} {}: {error}",
            self.page,
            self.line,
            self.args.join(" ")
        )
    }
}

/// Every invocation of `program` (`kernelctl`, `demo-agent`...): as `program`, as a path ending in
/// it (`target/release/kernelctl`), or through `cargo run [-q] -p program -- ...` (`--example
/// program` for an example). Placeholders such as `<RUN_ID>` are given a run id's shape. Lines of
/// blocks marked not run are read too: a block is marked for its other lines.
pub fn invocations(program: &str) -> Vec<Invocation> {
    let mut found = Vec::new();
    for (page, text) in pages() {
        for block in code_blocks(&text) {
            for (line, command) in &block.lines {
                for words in commands(command) {
                    if let Some(args) = arguments(program, &words) {
                        found.push(Invocation {
                            page: page.clone(),
                            line: *line,
                            args,
                        });
                    }
                }
            }
        }
    }
    found
}

/// The user documentation's pages, relative to the workspace root, with their text.
pub fn pages() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the workspace root");
    let mut paths: Vec<PathBuf> = ["README.md", "CONTRIBUTING.md", "ARCHITECTURE.md"]
        .iter()
        .map(|page| root.join(page))
        .collect();
    paths.extend(markdown_under(&root.join("docs")));
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let page = path.strip_prefix(root).expect("under the root").display().to_string();
            (page, text)
        })
        .collect()
}

/// Every `.md` file under `dir`, recursively, sorted.
pub fn markdown_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("a directory entry").path();
            if path.is_dir() {
                pending.push(path);
            } else if path.extension().is_some_and(|ext| ext == "md") {
                found.push(path);
            }
        }
    }
    found.sort();
    found
}

/// Fails, naming each page and line, unless every command line of `program` in the docs (at least
/// `at_least` of them) is accepted by its clap grammar `C` (a request for help or the version is
/// no refusal).
pub fn assert_every_command_line_parses<C: clap::Parser>(program: &str, at_least: usize) {
    use clap::error::ErrorKind;
    let parse = |words: Vec<&str>| match C::try_parse_from(words) {
        Err(error) if !matches!(error.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) => {
            Err(error.to_string())
        }
        _ => Ok(()),
    };
    let found = invocations(program);
    assert!(
        found.len() >= at_least.max(1),
        "too few {program} command lines found in the docs: {found:?}"
    );
    let refused: Vec<String> = found
        .iter()
        .filter_map(|invocation| {
            let words = std::iter::once(program).chain(invocation.args.iter().map(String::as_str));
            let error = parse(words.collect()).err()?;
            Some(invocation.describe(program, &error))
        })
        .collect();
    assert!(
        refused.is_empty(),
        "docs command lines {program} refuses:\n{}",
        refused.join("\n")
    );
}

/// A code block of a page, fenced or indented by four spaces.
#[derive(Debug)]
pub struct CodeBlock {
    /// The line of its opening fence, or of its first line when indented.
    pub line: usize,
    /// The fence's info string (`rust,no_run`, `sh`); empty for a bare fence or an indented block.
    pub info: String,
    /// The reason given by a `<!-- not run: REASON -->` comment on the line above it.
    pub not_run: Option<String>,
    /// Its lines with their line numbers, a line ending in `\` joined to the next.
    pub lines: Vec<(usize, String)>,
}

/// The code blocks of a page.
pub fn code_blocks(text: &str) -> Vec<CodeBlock> {
    let mut blocks: Vec<CodeBlock> = Vec::new();
    let mut fenced = false;
    let mut indented = false;
    let mut continued = false;
    let mut above = "";
    for (index, line) in text.lines().enumerate() {
        let not_run = || {
            above
                .strip_prefix("<!-- not run: ")?
                .strip_suffix(" -->")
                .map(str::to_owned)
        };
        let code = if let Some(info) = line.trim_start().strip_prefix("```") {
            if !fenced {
                blocks.push(CodeBlock {
                    line: index + 1,
                    info: info.trim().to_owned(),
                    not_run: not_run(),
                    lines: Vec::new(),
                });
            }
            fenced = !fenced;
            None
        } else if fenced {
            Some(line)
        } else if let Some(code) = line.strip_prefix("    ") {
            // An indented block follows a blank line or a comment on its own line, not a paragraph.
            let comment = above.starts_with("<!--") && above.ends_with("-->");
            if !indented && (above.is_empty() || comment) {
                blocks.push(CodeBlock {
                    line: index + 1,
                    info: String::new(),
                    not_run: not_run(),
                    lines: Vec::new(),
                });
                indented = true;
            }
            indented.then_some(code)
        } else {
            indented &= line.trim().is_empty();
            None
        };
        above = line.trim();
        match code {
            Some(code) if continued => blocks
                .last_mut()
                .and_then(|block| block.lines.last_mut())
                .expect("a line to continue")
                .1
                .push_str(code),
            Some(code) if !code.trim().is_empty() => blocks
                .last_mut()
                .expect("a block")
                .lines
                .push((index + 1, code.to_owned())),
            _ => {}
        }
        continued = code.is_some_and(|code| code.ends_with('\\'));
        if continued {
            blocks
                .last_mut()
                .and_then(|block| block.lines.last_mut())
                .expect("the line just pushed")
                .1
                .pop();
        }
    }
    blocks
}

/// A shell line's simple commands, as words: `<RUN_ID>`, `<ID>`, `<RUN ID>`... given an id of the
/// kernel's shape, and a shell variable (`$port`, `"$branch"`) 1, which fits where the docs use
/// one: a port or an id.
pub fn commands(line: &str) -> Vec<Vec<String>> {
    commands_filled(line, &mut |name| {
        if name.starts_with('$') {
            "1".to_owned()
        } else {
            "01a235ed-e22d-765f-95d7-ff186f0bb0e2".to_owned()
        }
    })
}

/// A shell line's simple commands, as words, each placeholder (`RUN_ID` for `<RUN_ID>`) and shell
/// variable (`$branch`) replaced by what `fill` gives for its name: a test that runs the line
/// gives real ids.
pub fn commands_filled(line: &str, fill: &mut dyn FnMut(&str) -> String) -> Vec<Vec<String>> {
    segments(&placeholders(line, fill))
}

/// The line with its placeholders and shell variables filled.
fn placeholders(line: &str, fill: &mut dyn FnMut(&str) -> String) -> String {
    let mut out = String::new();
    let mut rest = line;
    while let Some(start) = rest.find(['<', '$']) {
        out.push_str(&rest[..start]);
        let after = &rest[start + 1..];
        if rest[start..].starts_with('$') {
            let name = after
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(after.len());
            if name == 0 {
                out.push('$');
            } else {
                out.push_str(&fill(&rest[start..start + 1 + name]));
            }
            rest = &after[name..];
            continue;
        }
        match after.find('>') {
            Some(end)
                if after[..end]
                    .chars()
                    .all(|c| c.is_ascii_uppercase() || c == '_' || c == ' ') =>
            {
                out.push_str(&fill(&after[..end]));
                rest = &after[end + 1..];
            }
            _ => {
                out.push('<');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

/// A shell line's simple commands as words: quotes removed, a `#` comment dropped, split at
/// `|`, `&&`, `||`, `;`, `&` and around `$(...)`.
fn segments(line: &str) -> Vec<Vec<String>> {
    let mut segments = vec![Vec::new()];
    let mut word: Option<String> = None;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' | '"' => {
                let word = word.get_or_insert_with(String::new);
                for inner in chars.by_ref() {
                    if inner == c {
                        break;
                    }
                    word.push(inner);
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            '#' if word.is_none() => break,
            '$' if chars.peek() == Some(&'(') => {
                chars.next();
                segments.last_mut().expect("a segment").extend(word.take());
                segments.push(Vec::new());
            }
            '|' | '&' | ';' | ')' => {
                segments.last_mut().expect("a segment").extend(word.take());
                segments.push(Vec::new());
            }
            c if c.is_whitespace() => segments.last_mut().expect("a segment").extend(word.take()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    segments.last_mut().expect("a segment").extend(word);
    segments.retain(|words| !words.is_empty());
    segments
}

/// The arguments `words` give `program`, if they invoke it (after any `NAME=value` assignments).
pub fn arguments(program: &str, words: &[String]) -> Option<Vec<String>> {
    let start = words.iter().position(|word| !is_assignment(word))?;
    let words = &words[start..];
    if words.first()? == "cargo" && words.get(1)? == "run" {
        let separator = words.iter().position(|word| word == "--").unwrap_or(words.len());
        let cargo = &words[..separator];
        // The program is the example or binary named, else the package's own.
        let named = |flags: &[&str]| {
            cargo
                .windows(2)
                .find(|pair| flags.contains(&pair[0].as_str()))
                .map(|pair| &pair[1])
        };
        let target = named(&["--example", "--bin"]).or_else(|| named(&["-p", "--package"]))?;
        (target == program).then(|| words.get(separator + 1..).unwrap_or_default().to_vec())
    } else {
        (words[0].rsplit('/').next() == Some(program)).then(|| words[1..].to_vec())
    }
}

/// `NAME=value`, a shell variable's assignment.
pub fn is_assignment(word: &str) -> bool {
    word.split_once('=')
        .is_some_and(|(name, _)| !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_lines_split_into_simple_commands() {
        let words = |line: &str| commands(line);
        assert_eq!(
            words(r#"branch=$(cargo run -q -p kernelctl -- runs fork <RUN_ID> --at t0/p0)  # a comment"#),
            [
                vec!["branch="],
                vec![
                    "cargo",
                    "run",
                    "-q",
                    "-p",
                    "kernelctl",
                    "--",
                    "runs",
                    "fork",
                    "01a235ed-e22d-765f-95d7-ff186f0bb0e2",
                    "--at",
                    "t0/p0"
                ]
            ]
        );
        assert_eq!(
            words(r#"target/release/kernel --listen 127.0.0.1:$port & kernelctl x --input '{"a": 1}' | jq ."#),
            [
                vec!["target/release/kernel", "--listen", "127.0.0.1:1"],
                vec!["kernelctl", "x", "--input", r#"{"a": 1}"#],
                vec!["jq", "."]
            ]
        );
        let cargo: Vec<String> = ["cargo", "run", "-p", "kernelctl", "--", "status"]
            .map(String::from)
            .to_vec();
        assert_eq!(arguments("kernelctl", &cargo), Some(vec!["status".to_owned()]));
        assert_eq!(arguments("kernel", &cargo), None);
        let example: Vec<String> = [
            "cargo",
            "run",
            "-p",
            "worker-sdk",
            "--example",
            "demo-agent",
            "--",
            "--scenario",
            "refund",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(arguments("worker-sdk", &example), None);
        assert_eq!(
            arguments("demo-agent", &example),
            Some(vec!["--scenario".to_owned(), "refund".to_owned()])
        );
    }

    #[test]
    fn code_blocks_are_fenced_or_indented_and_join_continuations() {
        let page = "Text\n    a paragraph's second line\n\n    kernel --a \\\n      --b\n\n<!-- not run: why -->\n```sh\nkernelctl x\n```\n";
        let blocks = code_blocks(page);
        assert_eq!(blocks.len(), 2, "{blocks:?}");
        assert_eq!(
            (blocks[0].line, blocks[0].info.as_str(), &blocks[0].not_run),
            (4, "", &None)
        );
        assert_eq!(blocks[0].lines, [(4, "kernel --a   --b".to_owned())]);
        assert_eq!((blocks[1].line, blocks[1].info.as_str()), (8, "sh"));
        assert_eq!(blocks[1].not_run.as_deref(), Some("why"));
        assert_eq!(blocks[1].lines, [(9, "kernelctl x".to_owned())]);
    }
}
