//! Which runs [`AgentClient::list_runs`](super::AgentClient::list_runs) returns, and one page of
//! them.

use std::time::SystemTime;

use kernel_proto::v1 as pb;

/// Filters of [`AgentClient::list_runs`](super::AgentClient::list_runs): a run is listed when it
/// meets every one set. Built as `RunQuery::new().agent("billing").label("team", "payments")`.
#[derive(Clone, Debug, Default)]
pub struct RunQuery {
    request: pb::ListRunsRequest,
}

impl RunQuery {
    /// Every run, newest first, 50 to a page.
    pub fn new() -> Self {
        Self::default()
    }

    /// Only runs in this status.
    pub fn status(mut self, status: pb::RunStatus) -> Self {
        self.request.status = status as i32;
        self
    }

    /// Only runs of this agent.
    pub fn agent(mut self, agent: impl Into<String>) -> Self {
        self.request.agent = agent.into();
        self
    }

    /// Only runs carrying this label (repeatable: every one must be carried).
    pub fn label(mut self, key: impl AsRef<str>, value: impl AsRef<str>) -> Self {
        (self.request.labels).push(format!("{}={}", key.as_ref(), value.as_ref()));
        self
    }

    /// Only the subagent runs this run started.
    pub fn parent(mut self, run_id: impl Into<String>) -> Self {
        self.request.parent_run_id = run_id.into();
        self
    }

    /// Only the branches forked from this run ([`AgentClient::fork_run`](super::AgentClient::fork_run)).
    pub fn branch_of(mut self, run_id: impl Into<String>) -> Self {
        self.request.forked_from_run_id = run_id.into();
        self
    }

    /// Only runs that made a call of this tool.
    pub fn tool(mut self, tool: impl Into<String>) -> Self {
        self.request.tool = tool.into();
        self
    }

    /// Only runs created at or after this moment.
    pub fn created_after(mut self, at: SystemTime) -> Self {
        self.request.created_after = Some(at.into());
        self
    }

    /// Only runs created before this moment.
    pub fn created_before(mut self, at: SystemTime) -> Self {
        self.request.created_before = Some(at.into());
        self
    }

    /// At most this many runs (the kernel caps it at 1000; 0 means its default, 50).
    pub fn page_size(mut self, runs: u32) -> Self {
        self.request.page_size = runs;
        self
    }

    /// The page after the one whose [`RunPage::next_page_token`] this is.
    pub fn page_token(mut self, token: impl Into<String>) -> Self {
        self.request.page_token = token.into();
        self
    }

    pub(super) fn into_request(self) -> pb::ListRunsRequest {
        self.request
    }
}

/// One page of runs, newest first.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RunPage {
    /// The page's runs.
    pub runs: Vec<pb::Run>,
    /// Give it to [`RunQuery::page_token`] for the next page; empty on the last.
    pub next_page_token: String,
}
