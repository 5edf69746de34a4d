//! The reference pages generated from the code: the kernel's flags, its metrics, its event kinds
//! (and their payloads' JSON Schema), the policy file's keys and the gRPC API, under
//! `docs/reference/`, and the table of call outcomes in the hand-written `outcomes.md`, from the
//! proto.
//!
//! Hand-written lists of flags and metrics fall behind the code they describe. These pages are
//! rendered from the code itself (the clap command, a fresh metrics registry, the event payload
//! types, the policy parser's table of keys, the protos' descriptor set with its comments), and
//! each test here fails when its page on disk differs from what the code renders now, so a change
//! to a flag, a metric or an event kind cannot ship with a stale page. With `KERNEL_UPDATE_DOCS=1`
//! the tests write the pages instead.

mod events;
mod grpc_api;
mod policy_file;

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::CommandFactory;

use crate::clap_reference::{self, arg_name, arg_table, cell, prose, shown_args};
use crate::config::Config;
use crate::model::{EventType, Outcome};

/// The proto that declares `CallOutcome`, its comments the outcomes' meanings.
const COMMON_PROTO: &str = include_str!("../../proto/kernel/v1/common.proto");

/// The last line of the generated table in `outcomes.md`; the first is its [`generated_by`] line.
const END_OF_OUTCOMES: &str = "<!-- End of the generated table. -->\n";

/// How a page says it is generated, on its first line.
fn generated_by(test: &str, source: &str) -> String {
    format!(
        "<!-- Generated from {source} by the kernel's test `reference::tests::{test}`; do not edit. \
         Regenerate: KERNEL_UPDATE_DOCS=1 cargo test -p kernel --lib reference -->\n"
    )
}

/// Compares `rendered` with `docs/reference/<page>`, or writes it there with `KERNEL_UPDATE_DOCS=1`.
fn check(page: &str, rendered: &str) {
    clap_reference::check(
        page,
        rendered,
        "KERNEL_UPDATE_DOCS=1 cargo test -p kernel --lib reference",
    );
}

/// Every flag of `kernel`, by help heading, then each subcommand's.
fn kernel_flags_page() -> String {
    let command = Config::command();
    let mut out = generated_by("kernel_flags", "the kernel's flags (kernel/src/config.rs)");
    out.push_str("# The kernel's flags\n\n");
    let about = command
        .get_long_about()
        .or(command.get_about())
        .map(|about| about.to_string());
    let _ = writeln!(
        out,
        "{}\n\n`kernel [FLAGS]` serves; `kernel <COMMAND> [FLAGS]` does something else. Every flag can also be given \
         as its environment variable; a flag on the command line wins. `kernel --help` prints the same, \
         `kernel --version` the version. [Configuration](configuration.md) says more.\n",
        prose(&about.unwrap_or_default())
    );
    let flags = shown_args(&command);
    let mut headings: Vec<Option<&str>> = Vec::new();
    for arg in &flags {
        if !headings.contains(&arg.get_help_heading()) {
            headings.push(arg.get_help_heading());
        }
    }
    for heading in headings {
        let _ = writeln!(out, "## {}\n", heading.unwrap_or("Flags"));
        let group: Vec<&clap::Arg> = flags
            .iter()
            .copied()
            .filter(|arg| arg.get_help_heading() == heading)
            .collect();
        arg_table(&mut out, "flag", &group);
        out.push('\n');
    }
    let globals: Vec<String> = flags
        .iter()
        .filter(|arg| arg.is_global_set())
        .map(|arg| format!("`{}`", arg_name(arg)))
        .collect();
    for sub in command.get_subcommands().filter(|sub| !sub.is_hide_set()) {
        let _ = writeln!(out, "## `kernel {}`\n", sub.get_name());
        let about = sub.get_long_about().or(sub.get_about()).map(|about| about.to_string());
        let _ = writeln!(out, "{}\n", prose(&about.unwrap_or_default()));
        let own = shown_args(sub);
        if !globals.is_empty() {
            let _ = writeln!(out, "It takes the global {} above.\n", globals.join(", "));
        }
        if !own.is_empty() {
            arg_table(&mut out, "flag", &own);
            out.push('\n');
        }
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

/// One metric family of the text exposition: its `# TYPE`, `# UNIT` and `# HELP` lines and the
/// names (with label names) of its samples.
#[derive(Default)]
struct Family {
    name: String,
    kind: String,
    unit: String,
    help: String,
    samples: Vec<String>,
}

/// The families of an OpenMetrics text, in order.
fn families(text: &str) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# ") {
            let mut words = rest.splitn(3, ' ');
            let (Some(what), Some(name)) = (words.next(), words.next()) else {
                continue;
            };
            let value = words.next().unwrap_or("").to_owned();
            if families.last().is_none_or(|family| family.name != name) {
                families.push(Family {
                    name: name.to_owned(),
                    ..Family::default()
                });
            }
            let family = families.last_mut().expect("just pushed");
            match what {
                "TYPE" => family.kind = value,
                "UNIT" => family.unit = value,
                "HELP" => family.help = value,
                _ => {}
            }
        } else if let Some(family) = families.last_mut() {
            let sample = line.split([' ']).next().unwrap_or("");
            let (name, labels) = match sample.split_once('{') {
                Some((name, labels)) => {
                    let names: Vec<&str> = labels
                        .trim_end_matches('}')
                        .split(',')
                        .filter_map(|pair| pair.split_once('=').map(|(key, _)| key))
                        .collect();
                    (name, format!("{{{}}}", names.join(", ")))
                }
                None => (sample, String::new()),
            };
            let shown = format!("`{name}{labels}`");
            if !name.is_empty() && !family.samples.contains(&shown) {
                family.samples.push(shown);
            }
        }
    }
    families
}

/// Every metric of `/metrics`, as a scrape shows it.
fn metrics_page() -> String {
    let text = crate::metrics::Metrics::for_reference().encode();
    let mut out = generated_by("metrics", "a fresh registry of kernel/src/metrics.rs");
    out.push_str("# Metrics\n\n");
    out.push_str(
        "What the kernel exports on `/metrics` of `--http-listen`, in the OpenMetrics text format (see \
         [The console, metrics and traces](../guides/console.md)). A counter's samples end in `_total`; a \
         histogram's are `_bucket{le}`, `_sum` and `_count`. Gauges of the store and the scheduler are set when \
         `/metrics` is scraped.\n\n",
    );
    out.push_str("| metric | type | unit | samples | help |\n|---|---|---|---|---|\n");
    for family in families(&text) {
        let _ = writeln!(
            out,
            "| `{}` | {} | {} | {} | {} |",
            family.name,
            family.kind,
            family.unit,
            family.samples.join(", "),
            cell(&family.help)
        );
    }
    out
}

/// The gRPC statuses a request may be answered with, and a tool's error kinds.
fn errors_page() -> String {
    let mut out = generated_by(
        "errors",
        "KernelError in kernel/src/error.rs and ErrorKind in proto/kernel/v1/common.proto",
    );
    out.push_str(
        "# Errors

",
    );
    out.push_str(
        "Two things fail differently. A **request** the kernel refuses or cannot do is answered with a gRPC \
         status: its code is one of those below, and its message says what, naming the field where a field is \
         wrong (`calls[1].arguments_json: not valid JSON ...`). A **call** whose tool fails is not an error of \
         the request: it is recorded and settled, the model reads its text, and a program reads its \
         [outcome](outcomes.md); the tool's error kind decides whether it is retried. `kernelctl` prints a \
         status's message on stderr and exits with 1 (2 for a command line it cannot parse).\n\n",
    );
    out.push_str("## gRPC statuses\n\n| status | when | may the same request succeed later? |\n|---|---|---|\n");
    for error in crate::error::KernelError::examples() {
        let (when, again) = error.guidance();
        let code = tonic::Status::from(error).code();
        let _ = writeln!(out, "| `{}` | {} | {} |", status_name(code), cell(when), cell(again));
    }
    out.push_str(
        "\n## A tool's error kinds\n\nA worker answers a failed call with an error and its kind (`ErrorKind`, \
         which both SDKs' `ToolError` carries). A call whose tool fails with `fatal` or `poison`, or with \
         `retryable` on every attempt its retry policy allows, settles as `tool_error`.\n\n| kind | meaning |\n|---|---|\n",
    );
    for (value, comment) in proto_enum(COMMON_PROTO, "ErrorKind") {
        let Some(name) = value.strip_prefix("ERROR_KIND_") else {
            panic!("{value} is not named ERROR_KIND_*");
        };
        if name != "UNSPECIFIED" {
            let _ = writeln!(out, "| `{}` | {} |", name.to_lowercase(), prose(&comment));
        }
    }
    out
}

/// A gRPC code as the protocol spells it (`INVALID_ARGUMENT`).
fn status_name(code: tonic::Code) -> String {
    let mut name = String::new();
    for (index, c) in format!("{code:?}").chars().enumerate() {
        if c.is_ascii_uppercase() && index > 0 {
            name.push('_');
        }
        name.push(c.to_ascii_uppercase());
    }
    name
}

/// The values of the proto enum `name`, each with the comment above it, in order.
fn proto_enum(proto: &str, name: &str) -> Vec<(String, String)> {
    let start = proto
        .find(&format!("enum {name} {{"))
        .unwrap_or_else(|| panic!("enum {name} in the proto"));
    let mut values = Vec::new();
    let mut comment = Vec::new();
    for line in proto[start..].lines().skip(1).map(str::trim) {
        if line == "}" {
            break;
        }
        if let Some(text) = line.strip_prefix("//") {
            comment.push(text.trim());
        } else if let Some((value, _)) = line.split_once('=') {
            values.push((value.trim().to_owned(), comment.join(" ")));
            comment.clear();
        }
    }
    values
}

/// The table of `CallOutcome`, its lines between its first and last line in `outcomes.md`.
fn outcomes_table() -> String {
    let mut out = generated_by("outcomes", "CallOutcome in proto/kernel/v1/common.proto");
    out.push_str("| outcome | the call |\n|---|---|\n");
    for (value, comment) in proto_enum(COMMON_PROTO, "CallOutcome") {
        let Some(name) = value.strip_prefix("CALL_OUTCOME_") else {
            panic!("{value} is not named CALL_OUTCOME_*");
        };
        if name == "UNSPECIFIED" {
            continue;
        }
        let _ = writeln!(out, "| `{}` | {} |", name.to_lowercase(), prose(&comment));
    }
    out.push('\n');
    out.push_str(END_OF_OUTCOMES);
    out
}

/// Checks (or with `KERNEL_UPDATE_DOCS=1` writes) the generated part of a hand-written page:
/// from the line `section` starts with to the line it ends with.
fn check_section(page: &str, section: &str) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../docs/reference")
        .join(page);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|error| panic!("reading docs/reference/{page}: {error}"));
    let first = section.lines().next().expect("a first line");
    let last = section.lines().last().expect("a last line");
    let start = text.find(first.split(" by ").next().expect("a first line")).unwrap_or_else(|| {
        panic!("docs/reference/{page} has no generated section starting with '{first}'; put its first and last lines where it belongs")
    });
    let end = start
        + text[start..]
            .find(last)
            .unwrap_or_else(|| panic!("docs/reference/{page}: the generated section has no last line '{last}'"))
        + last.len()
        + 1;
    check(
        page,
        &format!("{}{section}{}", &text[..start], &text[end.min(text.len())..]),
    );
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;

    use super::*;

    #[test]
    fn kernel_flags() {
        check("kernel-flags.md", &kernel_flags_page());
    }

    #[test]
    fn metrics() {
        check("metrics.md", &metrics_page());
    }

    #[test]
    fn events() {
        for kind in EventType::ALL {
            assert!(
                !kind.doc().trim().is_empty(),
                "{kind} has no doc comment to say what it records"
            );
        }
        let generated_by = generated_by("events", "the payload types of kernel/src/machine/events.rs");
        check("events.md", &events::page(generated_by));
    }

    #[test]
    fn events_schema() {
        let comment = "Generated from the payload types of kernel/src/machine/events.rs by the kernel's test \
                       `reference::tests::events_schema`; do not edit. Regenerate: KERNEL_UPDATE_DOCS=1 cargo test -p \
                       kernel --lib reference";
        check(events::SCHEMA_FILE, &events::schema_document(comment));
    }

    #[test]
    fn outcomes() {
        let names: Vec<String> = proto_enum(COMMON_PROTO, "CallOutcome")
            .into_iter()
            .filter_map(|(value, _)| value.strip_prefix("CALL_OUTCOME_").map(str::to_lowercase))
            .filter(|name| name != "unspecified")
            .collect();
        let kernel: Vec<&str> = Outcome::ALL.iter().map(|outcome| outcome.as_str()).collect();
        assert_eq!(
            names, kernel,
            "CallOutcome and the kernel's Outcome name the same outcomes, in order"
        );
        check_section("outcomes.md", &outcomes_table());
    }

    #[test]
    fn errors() {
        assert_eq!(status_name(tonic::Code::FailedPrecondition), "FAILED_PRECONDITION");
        let kinds: Vec<String> = proto_enum(COMMON_PROTO, "ErrorKind")
            .into_iter()
            .filter_map(|(value, _)| value.strip_prefix("ERROR_KIND_").map(str::to_lowercase))
            .filter(|name| name != "unspecified")
            .collect();
        let kernel: Vec<&str> = crate::model::ErrorKind::ALL.iter().map(|kind| kind.as_str()).collect();
        assert_eq!(
            kinds, kernel,
            "ErrorKind in the proto and the kernel name the same kinds"
        );
        check("errors.md", &errors_page());
    }

    #[test]
    fn policy_file() {
        let generated_by = generated_by("policy_file", "the table of keys in kernel/src/policy/keys.rs");
        check("policy-file.md", &policy_file::page(generated_by));
    }

    /// The example of docs/reference/policy-file.md, as the page on disk shows it, loads.
    #[test]
    fn the_policy_file_example_loads() {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/reference/policy-file.md");
        let page = std::fs::read_to_string(&path).expect("docs/reference/policy-file.md");
        let example = policy_file::yaml_block(&page).expect("a ```yaml block in docs/reference/policy-file.md");
        crate::policy::Policy::from_yaml(example).unwrap_or_else(|error| panic!("{error}"));
    }

    #[test]
    fn grpc_api() {
        let generated_by = generated_by("grpc_api", "the comments of proto/kernel/v1/*.proto");
        let page = grpc_api::page(generated_by);
        let mut headings: Vec<&str> = page.lines().filter(|line| line.starts_with('#')).collect();
        let count = headings.len();
        headings.sort_unstable();
        headings.dedup();
        assert_eq!(
            headings.len(),
            count,
            "a heading repeats, so its anchor is not the one the links use"
        );
        check("grpc-api.md", &page);
    }

    /// Lists, on stderr, the RPCs, messages and enums whose proto has no comment for the page.
    #[test]
    fn grpc_api_uncommented() {
        let missing = grpc_api::uncommented();
        let _ = writeln!(std::io::stderr(), "without a comment: {}", missing.join("; "));
    }

    #[test]
    fn a_cell_keeps_a_table_whole() {
        assert_eq!(cell("a | b\n  c\n\nd"), "a \\| b c d");
    }

    #[test]
    fn families_name_their_samples_and_labels() {
        let text = "# HELP k_calls Calls.\n# TYPE k_calls counter\nk_calls_total{tool=\"x\",outcome=\"ok\"} 1\n\
                    # HELP k_wait Wait.\n# TYPE k_wait histogram\n# UNIT k_wait seconds\n\
                    k_wait_sum 0.0\nk_wait_count 0\nk_wait_bucket{le=\"1.0\"} 0\nk_wait_bucket{le=\"+Inf\"} 0\n# EOF\n";
        let found = families(text);
        assert_eq!(
            found.len(),
            2,
            "{:?}",
            found.iter().map(|family| &family.name).collect::<Vec<_>>()
        );
        assert_eq!(found[0].samples, ["`k_calls_total{tool, outcome}`"]);
        assert_eq!(
            (found[1].kind.as_str(), found[1].unit.as_str()),
            ("histogram", "seconds")
        );
        assert_eq!(
            found[1].samples,
            ["`k_wait_sum`", "`k_wait_count`", "`k_wait_bucket{le}`"]
        );
    }
}
