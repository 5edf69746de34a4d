//! The docs' shell blocks, run. Every command line of a block not marked `<!-- not run: REASON -->`
//! runs here, in page order, against one kernel with the demo worker, as a reader would type it:
//! `kernelctl` lines wait for their answer and must succeed; a `demo-agent` runs in the background
//! (a run waiting for a person's approval waits until a later line answers it) and must end as the
//! page says; `<RUN_ID>` is the run the last agent printed, `<ID>` the next pending approval, and
//! `name=$(...)` keeps what the command printed for a later `"$name"`. The kernel and the demo
//! worker the docs start are this test's own. A line this test cannot run fails it, naming the
//! page and line: such a block says why it is not run.

use std::collections::HashMap;
use std::process::Stdio;
use std::time::Duration;

use e2e::Kernel;
use tokio::process::{Child, Command};

use crate::docs::docs_commands;

/// Exit codes the docs promise other than 0, by page and line.
const EXITS: &[(&str, usize, i32)] = &[
    // The branch refuses the refund after its fork point, and the agent says so and exits 1.
    ("docs/guides/branches.md", 41, 1),
];

/// How long one command may take: `runs start --follow` lasts its whole run.
const COMMAND_TIME: Duration = Duration::from_secs(120);

/// A program a docs line runs, and how.
enum Line {
    /// A client: run it and wait for its answer.
    Kernelctl(Vec<String>),
    /// An agent: run it in the background; it prints its run id when it ends.
    Agent(Vec<String>),
    /// The kernel or the demo worker, as this test already serves them.
    Served,
}

/// A demo agent running in the background.
struct Agent {
    at: String,
    child: Child,
}

struct Runner<'k> {
    kernel: &'k Kernel,
    /// `$name` values, from `name=$(...)` lines.
    vars: HashMap<String, String>,
    /// The run id the last agent printed.
    last_run: Option<String>,
    agents: Vec<Agent>,
    /// Approvals a line answered already: each `<ID>` is the next one still pending.
    answered: Vec<String>,
    ran: usize,
}

impl Runner<'_> {
    async fn line(&mut self, page: &str, number: usize, text: &str) {
        let at = format!("{page}:{number}");
        let fills = self.fills(text).await;
        let mut fill = |name: &str| {
            fills
                .get(name)
                .cloned()
                .unwrap_or_else(|| panic!("{at}: nothing to fill {name} with"))
        };
        let mut capture: Option<String> = None;
        for words in docs_commands::commands_filled(text, &mut fill) {
            if let [assignment] = words.as_slice()
                && let Some(name) = assignment.strip_suffix('=')
            {
                capture = Some(name.to_owned());
                continue;
            }
            eprintln!("{at}: {}", words.join(" "));
            match classify(&words).unwrap_or_else(|| panic!("{at}: {words:?} cannot run in this test: {HOW}")) {
                Line::Served => {}
                Line::Kernelctl(args) => {
                    let printed = self.kernelctl(&at, page, number, &args).await;
                    if let Some(name) = capture.take() {
                        self.vars.insert(format!("${name}"), printed.trim().to_owned());
                    }
                }
                Line::Agent(args) => self.agents.push(Agent {
                    child: self.command("demo-agent", &args).spawn().expect("demo-agent starts"),
                    at: at.clone(),
                }),
            }
            self.ran += 1;
        }
    }

    /// What the line's placeholders stand for, waited for where they are not there yet.
    async fn fills(&mut self, text: &str) -> HashMap<String, String> {
        let mut fills = self.vars.clone();
        if text.contains("<RUN_ID>") || text.contains("<RUN ID>") {
            self.finish_agents(false).await;
            let run = self
                .last_run
                .clone()
                .expect("an agent printed a run id before <RUN_ID>");
            fills.insert("RUN_ID".into(), run.clone());
            fills.insert("RUN ID".into(), run);
        }
        if text.contains("<ID>") {
            let id = self.next_approval().await;
            self.answered.push(id.clone());
            fills.insert("ID".into(), id);
        }
        fills
    }

    /// The oldest pending approval no line answered yet.
    async fn next_approval(&self) -> String {
        e2e::eventually("a pending approval for <ID>", || async {
            let pending = self.kernel.pending_approvals().await;
            pending
                .iter()
                .map(|approval| approval.id.clone())
                .find(|id| !self.answered.contains(id))
                .ok_or(pending)
        })
        .await
    }

    async fn kernelctl(&self, at: &str, page: &str, number: usize, args: &[String]) -> String {
        let run = self.command("kernelctl", args).output();
        let output = tokio::time::timeout(COMMAND_TIME, run)
            .await
            .unwrap_or_else(|_| panic!("{at}: kernelctl {args:?} still running after {COMMAND_TIME:?}"))
            .expect("kernelctl runs");
        let expected = expected_exit(page, number);
        assert_eq!(
            output.status.code(),
            Some(expected),
            "{at}: kernelctl {args:?}\nstdout: {}\nstderr: {}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        String::from_utf8_lossy(&output.stdout).into_owned()
    }

    /// Waits for the agents running in the background, each to end as its page says; the last
    /// one's printed run id is `<RUN_ID>` from now on. With `all` false, waits only for the last.
    async fn finish_agents(&mut self, all: bool) {
        let from = if all { 0 } else { self.agents.len().saturating_sub(1) };
        let finishing: Vec<Agent> = self.agents.drain(from..).collect();
        for agent in finishing {
            let at = agent.at.clone();
            let output = tokio::time::timeout(COMMAND_TIME, agent.child.wait_with_output())
                .await
                .unwrap_or_else(|_| panic!("{at}: demo-agent still running after {COMMAND_TIME:?}"))
                .expect("demo-agent ends");
            let (page, number) = at.rsplit_once(':').expect("page:line");
            let expected = expected_exit(page, number.parse().expect("a line number"));
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert_eq!(
                output.status.code(),
                Some(expected),
                "{at}: demo-agent\nstdout: {stdout}\nstderr: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            if let Some(run) = stdout.lines().rev().find(|line| is_run_id(line.trim())) {
                self.last_run = Some(run.trim().to_owned());
            }
        }
    }

    fn command(&self, program: &str, args: &[String]) -> Command {
        let mut command = Command::new(e2e::binary(program));
        command
            .args(args)
            .env("KERNEL_ADDR", self.kernel.url())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        command
    }
}

/// What a line may hold, for the failure message of one that holds something else.
const HOW: &str = "this test runs kernelctl (but not `mcp serve` or `bench`) and demo-agent, and serves \
                   `kernel` without flags and `demo-worker --root .`; put <!-- not run: REASON --> above \
                   its block, naming the test that runs it";

/// Whether this test runs (or serves) a command of a docs block: a block of such commands only
/// counts as checked when nothing marks it not run.
pub(crate) fn runs(words: &[String]) -> bool {
    matches!(words, [assignment] if docs_commands::is_assignment(assignment)) || classify(words).is_some()
}

fn classify(words: &[String]) -> Option<Line> {
    if let Some(args) = docs_commands::arguments("kernelctl", words) {
        let first = args.first().map(String::as_str);
        return (!matches!(first, Some("mcp" | "bench"))).then_some(Line::Kernelctl(args));
    }
    if let Some(args) = docs_commands::arguments("demo-agent", words) {
        return Some(Line::Agent(args));
    }
    let served = docs_commands::arguments("kernel", words).is_some_and(|args| args.is_empty())
        || docs_commands::arguments("demo-worker", words).is_some_and(|args| args == ["--root", "."]);
    served.then_some(Line::Served)
}

/// A run id's shape: a hyphenated UUID.
fn is_run_id(text: &str) -> bool {
    text.len() == 36
        && text.char_indices().all(|(index, c)| match index {
            8 | 13 | 18 | 23 => c == '-',
            _ => c.is_ascii_hexdigit(),
        })
}

fn expected_exit(page: &str, number: usize) -> i32 {
    EXITS
        .iter()
        .find(|(listed, line, _)| *listed == page && *line == number)
        .map_or(0, |(_, _, code)| *code)
}

#[tokio::test]
async fn every_command_line_of_a_block_not_marked_not_run_runs() {
    let kernel = Kernel::start();
    let root = tempfile::tempdir().unwrap();
    let root_arg = root.path().display().to_string();
    let _worker = kernel.worker_with("demo", &["--root", &root_arg]);
    let mut runner = Runner {
        kernel: &kernel,
        vars: HashMap::new(),
        last_run: None,
        agents: Vec::new(),
        answered: Vec::new(),
        ran: 0,
    };
    for (page, text) in docs_commands::pages() {
        for block in docs_commands::code_blocks(&text) {
            if block.not_run.is_some() || !matches!(block.info.as_str(), "" | "sh") {
                continue;
            }
            for (number, line) in &block.lines {
                runner.line(&page, *number, line).await;
            }
        }
        runner.finish_agents(true).await;
    }
    assert!(
        runner.ran >= 15,
        "only {} command lines ran: is the block reader broken?",
        runner.ran
    );
}
