//! `docs/reference/kernelctl.md`, generated from the command-line grammar of [`crate::args`].
//!
//! A hand-written list of commands and flags falls behind the code. This page is rendered from
//! the clap command itself, and its test fails when the page on disk differs from what the code
//! renders now, so a new command or a changed flag cannot ship with a stale page. With
//! `KERNEL_UPDATE_DOCS=1` the test writes the page instead.

use std::fmt::Write as _;

use clap::CommandFactory;

use crate::args::Cli;
use crate::clap_reference::{arg_table, check, long_text, prose, shown_args};

const PAGE: &str = "kernelctl.md";

/// `command`, reached by `path`, and every subcommand under it, a heading level deeper.
fn command_section(out: &mut String, command: &clap::Command, path: &str, level: usize) {
    let _ = writeln!(out, "{} `{path}`\n", "#".repeat(level.min(6)));
    let about = long_text(command.get_long_about(), command.get_about());
    if !about.is_empty() {
        let _ = writeln!(out, "{}\n", prose(&about));
    }
    let args = shown_args(command);
    if !args.is_empty() {
        arg_table(out, "argument", &args);
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
    arg_table(&mut out, "argument", &globals);
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
        check(PAGE, &page(), "KERNEL_UPDATE_DOCS=1 cargo test -p kernelctl reference");
    }

    #[test]
    fn a_cell_keeps_a_table_whole() {
        assert_eq!(crate::clap_reference::cell("a | b\n  c\n\nd"), "a \\| b c d");
    }
}
