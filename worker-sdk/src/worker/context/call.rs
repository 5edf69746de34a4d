//! A tool calling another tool through the kernel ([`ToolContext::call`]): the callee is a call
//! of the run nested under the caller, with its own policy, approval, validation, limits, budget,
//! replay and branch rule.

use super::ToolContext;
use crate::agent::{AgentError, Call, CallOutcome};
use crate::error::ToolError;

/// The occurrence counter a body's calls keep (agent names never start with `?`).
const CALLS: &str = "?call";

impl ToolContext {
    /// Calls `call.tool` through the kernel from this call's body, and returns how it ended, as
    /// an agent's call would: the callee is a step of the run nested under this one
    /// (`call:<this step's key>#<n>` for the body's n-th call, shown under it by `kernelctl runs
    /// show`), checked against its own declaration: argument validation, the policy, a person's
    /// approval (the body waits for the answer), tool limits, the run's budget, and in a branch
    /// the branch rule (a call the branch may not make ends the branch with
    /// `write_tool_blocked`). Its idempotency key derives from this call's and `n`.
    ///
    /// The outcome is recorded: the same body run again (a retry, a redispatch) gets it back at
    /// once, and the callee runs once. Calls are told apart by their order in the body, so a
    /// body makes the same calls in the same order each time; another tool or other arguments
    /// in the place of a recorded call end as
    /// [`Outcome::ReplayInputChanged`](crate::Outcome::ReplayInputChanged), and nothing runs.
    /// A denial, a rejection or the callee's failure is an outcome to match on
    /// ([`CallOutcome::rejection`]), not an `Err`;
    /// `Err` is a fatal error when the kernel cannot be reached, or the context has none (a test
    /// context). A call still open when this one settles for good is cancelled.
    ///
    /// While the body waits on the callee alone, a `safe_to_retry` call gives back its worker
    /// slot after 100 ms and runs again from the start once the callee has settled, as with
    /// [`ToolContext::subagent`]; an `at_most_once` call keeps its slot (then a worker with one
    /// slot cannot run a callee it offers itself). `call.id` must be unset: the callee's
    /// identity is its place in the body. The worker's key needs `tools:call`.
    pub async fn call(&self, call: Call) -> Result<CallOutcome, ToolError> {
        let tool = call.tool.clone();
        let failed = |error: AgentError| ToolError::fatal(format!("ctx.call '{tool}': {error}"));
        let Some(kernel) = &self.kernel else {
            return Err(ToolError::fatal(format!(
                "ctx.call '{tool}': this context has no kernel (a test context); a dispatched call has one"
            )));
        };
        let occurrence = self.next_occurrence(CALLS);
        let response = kernel
            .call_tool(occurrence, crate::agent::wire::tool_call(call))
            .await
            .map_err(failed)?;
        let result = match (response.result, response.step) {
            (Some(result), _) => result,
            (None, Some(step)) => {
                let _waiting = self.waiting(step.step_key.clone());
                kernel.await_call(&step.step_key).await.map_err(failed)?
            }
            (None, None) => return Err(failed(AgentError::Protocol("the kernel returned no step".into()))),
        };
        crate::agent::wire::call_outcome(result).map_err(failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_call_from_a_test_context_is_a_fatal_error() {
        let error = ToolContext::for_test()
            .call(Call::new("lookup", serde_json::json!({"q": "tides"})))
            .await
            .expect_err("a test context has no kernel");
        assert_eq!(error.kind(), crate::ErrorKind::Fatal);
        assert!(error.message().contains("ctx.call 'lookup'"), "{error}");
        assert!(error.message().contains("this context has no kernel"), "{error}");
    }
}
