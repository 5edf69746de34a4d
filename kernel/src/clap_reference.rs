//! What the generated reference pages of the kernel's and kernelctl's command lines share: table
//! cells, a clap argument's name and meaning as `--help` gives them, the table of arguments, and
//! the check of a page against the code. kernelctl includes this file by its path (the crates
//! share no test utility crate); it is compiled for tests only.

use std::fmt::Write as _;
use std::io::Write as _;

/// Compares `rendered` with `docs/reference/<page>`, or writes it there with `KERNEL_UPDATE_DOCS=1`;
/// a mismatch names `regenerate`, the command that writes the page.
pub fn check(page: &str, rendered: &str, regenerate: &str) {
    let path = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/reference")
        .join(page);
    if std::env::var_os("KERNEL_UPDATE_DOCS").is_some_and(|value| value == "1") {
        std::fs::write(&path, rendered).unwrap_or_else(|error| panic!("writing docs/reference/{page}: {error}"));
        // Straight to the process's stderr: the test harness swallows `eprintln!` of a passing test.
        let _ = writeln!(std::io::stderr(), "wrote docs/reference/{page}");
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    if on_disk != rendered {
        let line = on_disk
            .lines()
            .zip(rendered.lines())
            .position(|(disk, code)| disk != code)
            .unwrap_or_else(|| on_disk.lines().count().min(rendered.lines().count()))
            + 1;
        panic!("docs/reference/{page} differs from the code (first at line {line}); regenerate it with {regenerate}");
    }
}

/// `text` fit for one table cell: its lines joined, `|` escaped.
pub fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// What `--help` prints of a command, or of an argument: the long help where given.
pub fn long_text(long: Option<&clap::builder::StyledStr>, short: Option<&clap::builder::StyledStr>) -> String {
    long.or(short).map(|text| text.to_string()).unwrap_or_default()
}

/// `text` as prose: [`cell`], with the final period clap's help leaves out.
pub fn prose(text: &str) -> String {
    let mut text = cell(text);
    if !text.is_empty() && !text.ends_with(['.', '!', '?']) {
        text.push('.');
    }
    text
}

/// `sentence` after `text`, which clap's help leaves without its final period.
pub fn append(text: &mut String, sentence: &str) {
    if !text.is_empty() {
        if !text.ends_with(['.', '!', '?']) {
            text.push('.');
        }
        text.push(' ');
    }
    text.push_str(sentence);
}

/// An argument as typed: `--limit <LIMIT>`, `-f, --follow`, `<ID>`, `[ID]`.
pub fn arg_name(arg: &clap::Arg) -> String {
    let value = arg
        .get_value_names()
        .and_then(|names| names.first())
        .map(|name| name.to_string())
        .unwrap_or_else(|| arg.get_id().as_str().to_uppercase());
    let short = arg.get_short().map(|short| format!("-{short}, ")).unwrap_or_default();
    match arg.get_long() {
        Some(long) if arg.get_action().takes_values() => format!("{short}--{long} <{value}>"),
        Some(long) => format!("{short}--{long}"),
        None if arg.is_required_set() => format!("<{value}>"),
        None => format!("[{value}]"),
    }
}

/// An argument's help, with its possible values, and whether it is required or repeats.
pub fn arg_meaning(arg: &clap::Arg) -> String {
    let mut text = long_text(arg.get_long_help(), arg.get_help());
    let values = arg.get_possible_values();
    if arg.get_action().takes_values() && !values.is_empty() && !arg.is_hide_possible_values_set() {
        let values: Vec<String> = values
            .iter()
            .filter(|value| !value.is_hide_set())
            .map(|value| match value.get_help() {
                Some(help) => format!("`{}` — {help}", value.get_name()),
                None => format!("`{}`", value.get_name()),
            })
            .collect();
        let separator = if values.iter().any(|value| value.contains(" — ")) {
            "; "
        } else {
            ", "
        };
        append(&mut text, &format!("Values: {}.", values.join(separator)));
    }
    let supplied = arg.get_env().is_some() || !arg.get_default_values().is_empty();
    if arg.get_long().is_some() && arg.is_required_set() && !supplied {
        append(&mut text, "Required.");
    }
    if matches!(arg.get_action(), clap::ArgAction::Append) && !text.to_lowercase().contains("repeat") {
        append(&mut text, "Repeatable.");
    }
    text
}

/// The arguments a command shows in `--help`, but for `--help` and `--version` themselves.
pub fn shown_args(command: &clap::Command) -> Vec<&clap::Arg> {
    command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter(|arg| !matches!(arg.get_action(), clap::ArgAction::Help | clap::ArgAction::Version))
        .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
        .collect()
}

/// A table of arguments, the first column headed `what` (`flag`, `argument`): name, environment
/// variable, default, meaning.
pub fn arg_table(out: &mut String, what: &str, args: &[&clap::Arg]) {
    let _ = writeln!(out, "| {what} | environment | default | meaning |\n|---|---|---|---|");
    for arg in args {
        let env = arg
            .get_env()
            .filter(|_| !arg.is_hide_env_set())
            .map(|env| format!("`{}`", env.to_string_lossy()))
            .unwrap_or_default();
        let defaults: Vec<String> = arg
            .get_default_values()
            .iter()
            .map(|value| value.to_string_lossy().into_owned())
            .collect();
        let default = if defaults.is_empty() || arg.is_hide_default_value_set() {
            String::new()
        } else {
            format!("`{}`", defaults.join(","))
        };
        let _ = writeln!(
            out,
            "| `{}` | {env} | {default} | {} |",
            arg_name(arg),
            prose(&arg_meaning(arg))
        );
    }
}
