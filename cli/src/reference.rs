//! `docs/reference/kernelctl.md`, generated from the command-line grammar of [`crate::args`].
//!
//! A hand-written list of commands and flags falls behind the code. This page is rendered from
//! the clap command itself, and its test fails when the page on disk differs from what the code
//! renders now, so a new command or a changed flag cannot ship with a stale page. With
//! `KERNEL_UPDATE_DOCS=1` the test writes the page instead.

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::PathBuf;

use clap::CommandFactory;

use crate::args::Cli;

const PAGE: &str = "kernelctl.md";

/// `text` fit for one table cell: its lines joined, `|` escaped.
fn cell(text: &str) -> String {
    text.split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .replace('|', "\\|")
}

/// What `--help` prints of a command, or of an argument: the long help where given.
fn long_text(long: Option<&clap::builder::StyledStr>, short: Option<&clap::builder::StyledStr>) -> String {
    long.or(short).map(|text| text.to_string()).unwrap_or_default()
}

/// `text` as prose: [`cell`], with the final period clap's help leaves out.
fn prose(text: &str) -> String {
    let mut text = cell(text);
    if !text.is_empty() && !text.ends_with(['.', '!', '?']) {
        text.push('.');
    }
    text
}

/// `sentence` after `text`, which clap's help leaves without its final period.
fn append(text: &mut String, sentence: &str) {
    if !text.is_empty() {
        if !text.ends_with(['.', '!', '?']) {
            text.push('.');
        }
        text.push(' ');
    }
    text.push_str(sentence);
}

/// An argument as typed: `--limit <LIMIT>`, `-f, --follow`, `<ID>`, `[ID]`.
fn arg_name(arg: &clap::Arg) -> String {
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
fn arg_meaning(arg: &clap::Arg) -> String {
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
fn shown_args(command: &clap::Command) -> Vec<&clap::Arg> {
    command
        .get_arguments()
        .filter(|arg| !arg.is_hide_set())
        .filter(|arg| !matches!(arg.get_action(), clap::ArgAction::Help | clap::ArgAction::Version))
        .filter(|arg| !matches!(arg.get_id().as_str(), "help" | "version"))
        .collect()
}

/// A table of arguments: name, environment variable, default, meaning.
fn arg_table(out: &mut String, args: &[&clap::Arg]) {
    out.push_str("| argument | environment | default | meaning |\n|---|---|---|---|\n");
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

/// `command`, reached by `path`, and every subcommand under it, a heading level deeper.
fn command_section(out: &mut String, command: &clap::Command, path: &str, level: usize) {
    let _ = writeln!(out, "{} `{path}`\n", "#".repeat(level.min(6)));
    let about = long_text(command.get_long_about(), command.get_about());
    if !about.is_empty() {
        let _ = writeln!(out, "{}\n", prose(&about));
    }
    let args = shown_args(command);
    if !args.is_empty() {
        arg_table(out, &args);
        out.push('\n');
    }
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        command_section(out, sub, &format!("{path} {}", sub.get_name()), level + 1);
    }
}

/// Every command of `kernelctl`, global flags first.
fn page() -> String {
    let command = Cli::command();
    let mut out = String::from(
        "<!-- Generated from kernelctl's command line (cli/src/args.rs) by kernelctl's test \
         `reference::tests::kernelctl`; do not edit. Regenerate: KERNEL_UPDATE_DOCS=1 cargo test -p kernelctl \
         reference -->\n",
    );
    out.push_str("# kernelctl\n\n");
    let about = long_text(command.get_long_about(), command.get_about());
    let _ = writeln!(
        out,
        "{}\n\n`kernelctl [GLOBAL FLAGS] <COMMAND> [ARGUMENTS]`. `kernelctl <COMMAND> --help` prints the same; \
         `kernelctl --version` the version. Exit codes: 0 done, 1 failed, 2 a usage error.\n",
        prose(&about)
    );
    out.push_str("## Global flags\n\nAccepted by every command.\n\n");
    let globals: Vec<&clap::Arg> = shown_args(&command)
        .into_iter()
        .filter(|arg| arg.is_global_set())
        .collect();
    arg_table(&mut out, &globals);
    out.push('\n');
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        command_section(&mut out, sub, &format!("kernelctl {}", sub.get_name()), 2);
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernelctl() {
        let rendered = page();
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../docs/reference")
            .join(PAGE);
        if std::env::var_os("KERNEL_UPDATE_DOCS").is_some_and(|value| value == "1") {
            std::fs::write(&path, &rendered).unwrap_or_else(|error| panic!("writing docs/reference/{PAGE}: {error}"));
            // Straight to the process's stderr: the test harness swallows `eprintln!` of a passing test.
            let _ = writeln!(std::io::stderr(), "wrote docs/reference/{PAGE}");
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
            panic!(
                "docs/reference/{PAGE} differs from the code (first at line {line}); regenerate it with \
                 KERNEL_UPDATE_DOCS=1 cargo test -p kernelctl reference"
            );
        }
    }

    #[test]
    fn a_cell_keeps_a_table_whole() {
        assert_eq!(cell("a | b\n  c\n\nd"), "a \\| b c d");
    }
}
