"""The parts of rows of docs/reference/seed-parity.md the other Python tests leave out, checked
from the Python SDK against the real kernel: how results reach the model, retries and the errors
never retried, a call's timeout and its late result, name / description / schema overrides, an
approval's interruption, expiry and approver, status lines as progress, a tool's version, a
policy deciding by risk and permissions, denial events, resource locks, and a failed subagent."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import hosted_agents
import pytest
from conftest import ended_events, serving
from harness import Kernel, eventually, within

from kernel_sdk import (
    AgentClient,
    AgentContext,
    CallOutcome,
    CallResult,
    Event,
    Interruption,
    RetryPolicy,
    SubagentFailed,
    ToolCall,
    ToolContext,
    ToolDefinitionError,
    ToolError,
    TurnProgress,
    agent,
    tool,
)


@contextlib.asynccontextmanager
async def _governed(tmp_path: Path, policy: str) -> AsyncIterator[tuple[Kernel, AgentClient]]:
    """A kernel of its own reading `policy` as its policy file, and a client of it."""
    file = tmp_path / "policy.yaml"
    file.write_text(policy)
    kernel = Kernel(tmp_path, "--policy", str(file))
    try:
        async with AgentClient(kernel.addr) as client:
            yield kernel, client
    finally:
        kernel.stop()


def _of_step(events: list[Event], step_key: str) -> list[Event]:
    return [e for e in events if e.payload.get("step_key") == step_key]


# Row 3: a string result reaches the model as is; any other as compact JSON with sorted keys.


@tool(read_only=True)
async def sr_quote(ctx: ToolContext) -> str:
    """Says something with quotes in it."""
    return 'she said "hi"\nand left'


@tool(read_only=True)
async def sr_nested(ctx: ToolContext) -> dict[str, object]:
    """Returns a dict whose keys are out of order, at every level."""
    return {"b": 1, "a": [2, {"d": 3, "c": 4}]}


async def test_a_string_reaches_the_model_as_is_and_other_results_as_sorted_compact_json(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, sr_quote, sr_nested):
        run = await client.create_run("sr-results")
        text, data = (
            await client.call_turn(run.id, 0, [ToolCall("sr_quote"), ToolCall("sr_nested")])
        ).results
    assert text.content == 'she said "hi"\nand left', "not quoted, not escaped"
    assert text.output == 'she said "hi"\nand left'
    assert data.content == '{"a":[2,{"c":4,"d":3}],"b":1}'
    assert data.output == {"b": 1, "a": [2, {"d": 3, "c": 4}]}


# Row 7: retries as a count or a RetryPolicy; fatal and poison errors are never retried.

ATTEMPTS: dict[str, int] = {}
QUICK_RETRIES = RetryPolicy(max_attempts=3, initial_interval=0.01, max_interval=0.01)


def _attempted(name: str) -> None:
    ATTEMPTS[name] = ATTEMPTS.get(name, 0) + 1


@tool(retries=QUICK_RETRIES)
async def sr_fatal(ctx: ToolContext) -> str:
    """Fails in a way every attempt would."""
    _attempted("sr_fatal")
    raise ToolError.fatal("the account is closed")


@tool(retry=QUICK_RETRIES)
async def sr_poison(ctx: ToolContext) -> str:
    """Says its input is harmful."""
    _attempted("sr_poison")
    raise ToolError.poison("this input crashes the parser")


@tool(retries=QUICK_RETRIES)
async def sr_flaky(ctx: ToolContext) -> str:
    """Fails with a plain exception, which is retryable."""
    _attempted("sr_flaky")
    raise RuntimeError("the upstream hiccuped")


@tool(retries=2)
async def sr_flaky_count(ctx: ToolContext) -> str:
    """Fails with a plain exception; two retries, as a count."""
    _attempted("sr_flaky_count")
    raise RuntimeError("the upstream hiccuped again")


@tool(retry=1)
async def sr_recovers(ctx: ToolContext) -> str:
    """Fails its first attempt only; one retry, as a count spelled `retry`."""
    _attempted("sr_recovers")
    if ATTEMPTS["sr_recovers"] == 1:
        raise RuntimeError("not yet")
    return "recovered"


async def test_retries_count_or_policy_and_fatal_and_poison_errors_are_never_retried(
    kernel: Kernel, client: AgentClient
) -> None:
    ATTEMPTS.clear()
    tools = (sr_fatal, sr_poison, sr_flaky, sr_flaky_count, sr_recovers)
    async with serving(kernel, *tools):
        run = await client.create_run("sr-retries")
        results = (await client.call_turn(run.id, 0, [ToolCall(t.name) for t in tools])).results
        fatal, poison, flaky, counted, recovered = results
        steps = {s.tool: s for s in (await client.get_run(run.id)).steps}

    assert (fatal.attempts, fatal.error_kind, fatal.outcome) == (1, "fatal", CallOutcome.TOOL_ERROR)
    assert "the account is closed" in fatal.content
    # The outcome of a tool's own poison error is not asserted: the kernel records it as
    # tool_error, where docs/reference/outcomes.md reads as if it were poison.
    assert (poison.attempts, poison.error_kind, poison.status) == (1, "poison", "error"), poison
    assert "this input crashes the parser" in poison.content
    # Retryable: the first attempt and every retry the policy or the count allows.
    assert (flaky.attempts, flaky.error_kind) == (3, "retryable"), flaky
    assert flaky.outcome == CallOutcome.TOOL_ERROR and "the upstream hiccuped" in flaky.content
    assert (counted.attempts, counted.outcome) == (3, CallOutcome.TOOL_ERROR), counted
    assert (recovered.attempts, recovered.output) == (2, "recovered"), recovered

    assert ATTEMPTS == {
        "sr_fatal": 1,
        "sr_poison": 1,
        "sr_flaky": 3,
        "sr_flaky_count": 3,
        "sr_recovers": 2,
    }, "each attempt the kernel counts ran once, and no other"
    expected = {
        "sr_fatal": (1, "failed"),
        "sr_poison": (1, "failed"),
        "sr_flaky": (3, "failed"),
        "sr_flaky_count": (3, "failed"),
        "sr_recovers": (2, "succeeded"),
    }
    assert {name: (s.attempts, s.status) for name, s in steps.items()} == expected


# Row 9: a timeout per call; a timed-out call is cancelled and its late result discarded.

ASYNC_CANCELLED: list[str] = []


@tool(timeout=60)
async def sr_slow(ctx: ToolContext) -> str:
    """Waits until cancelled, then answers anyway (late)."""
    await ctx.cancelled.wait()
    ASYNC_CANCELLED.append(ctx.cancelled.reason)
    return "late answer"


async def test_an_async_call_past_its_own_timeout_is_cancelled_and_its_late_result_discarded(
    kernel: Kernel, client: AgentClient
) -> None:
    ASYNC_CANCELLED.clear()
    async with serving(kernel, sr_slow):
        run = await client.create_run("sr-timeouts")
        # The tool allows a minute; this call, 400 ms.
        [result] = (await client.call_turn(run.id, 0, [ToolCall("sr_slow", timeout=0.4)])).results
        assert result.outcome == CallOutcome.TIMED_OUT, result
        assert result.content == "tool 'sr_slow' timed out after 400ms (attempt 1)", result
        assert result.attempts == 1, "no retry policy: one attempt"

        # The worker's cancel reached the tool, which answered late; the kernel refused it.
        await kernel.process.said("stale result refused")
        assert ASYNC_CANCELLED == ["timeout"], "the tool saw its cancel, and why"
        [step] = (await client.get_run(run.id)).steps
        assert (step.status, step.outcome) == ("failed", "timed_out"), step
        assert step.output is None and step.error.startswith("tool 'sr_slow' timed out after 400ms")
        events = await client.list_events(run.id)
        assert [e.type for e in events].count("tool:result") == 1
        [scheduled] = [e for e in events if e.type == "tool:scheduled"]
        assert scheduled.payload["timeout_ms"] == 400, scheduled.payload


SYNC_RELEASE = threading.Event()
SYNC_RETURNED = threading.Event()


@tool(timeout=0.3)
def sr_stubborn(ctx: ToolContext) -> str:
    """Blocks its thread, deaf to the cancel, until the test lets it return."""
    SYNC_RELEASE.wait(30)
    SYNC_RETURNED.set()
    return "too late"


async def test_a_sync_call_past_its_timeout_has_its_late_result_discarded(
    kernel: Kernel, client: AgentClient
) -> None:
    SYNC_RELEASE.clear()
    SYNC_RETURNED.clear()
    async with serving(kernel, sr_stubborn):
        run = await client.create_run("sr-timeouts")
        [result] = (await client.call_turn(run.id, 0, [ToolCall("sr_stubborn")])).results
        assert result.outcome == CallOutcome.TIMED_OUT, result
        assert result.content.startswith("tool 'sr_stubborn' timed out after 300ms (attempt 1)")
        assert "a blocking tool's thread cannot be stopped" in result.content, result.content
        assert not SYNC_RETURNED.is_set(), "the timeout, not the tool, ended the call"

        # Now the thread returns: what it gives back is refused, never recorded.
        SYNC_RELEASE.set()
        assert await asyncio.to_thread(SYNC_RETURNED.wait, 30), "the thread returned"
        await kernel.process.said("stale result refused")
        [step] = (await client.get_run(run.id)).steps
        assert (step.status, step.outcome, step.attempts) == ("failed", "timed_out", 1), step
        assert step.output is None and "timed out after 300ms" in step.error, step
        events = await client.list_events(run.id)
        assert [e.type for e in events].count("tool:result") == 1
        [again] = (await client.call_turn(run.id, 0, [ToolCall("sr_stubborn")])).results
        assert again.replayed and again.outcome == CallOutcome.TIMED_OUT, again


# Row 13: name, description and schema overrides of what the model sees; the name is checked.

RENAMED_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"q": {"type": "integer", "minimum": 1, "description": "A positive count."}},
    "required": ["q"],
}


@tool(
    name="sr_renamed",
    description="What the model reads instead of the docstring.",
    args_schema=RENAMED_SCHEMA,
    read_only=True,
)
async def sr_original_name(ctx: ToolContext, q: int) -> int:
    """The docstring, which the override replaces."""
    return q * 2


async def test_the_name_description_and_schema_given_are_what_the_kernel_registers(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, sr_original_name):
        registered = {t.name: t for t in await client.list_tools()}
        assert "sr_original_name" not in registered
        renamed = registered["sr_renamed"]
        assert renamed.description == "What the model reads instead of the docstring."
        assert renamed.input_schema == RENAMED_SCHEMA
        assert renamed.fingerprint == sr_original_name.fingerprint

        run = await client.create_run("sr-overrides")
        ran, refused = (
            await client.call_turn(
                run.id, 0, [ToolCall("sr_renamed", {"q": 4}), ToolCall("sr_renamed", {"q": 0})]
            )
        ).results
        assert ran.output == 8
        # The schema given, not the signature's, is what the kernel checks the arguments against.
        assert refused.outcome == CallOutcome.INVALID_ARGUMENTS, refused
        assert "q" in refused.content, refused.content


def test_a_name_with_other_characters_is_refused_at_decoration() -> None:
    async def lookup(q: int) -> int:
        """Looks up."""
        return q

    for bad in ("bad name!", "", "x" * 65, "dots.are.out"):
        with pytest.raises(ToolDefinitionError) as refused:
            tool(name=bad)(lookup)
        assert "name takes 1 to 64 characters from [a-zA-Z0-9_-]" in str(refused.value)
    with pytest.raises(ToolDefinitionError, match=r"name takes 1 to 64 characters"):
        tool("bad name!")(lookup)
    assert tool(name="ok-Name_9")(lookup).name == "ok-Name_9"


# Rows 14 and 34: a gated call parks the run before it starts; the approver is recorded.

GATED_RAN: list[int] = []


@tool(writes=True, requires_approval=True)
async def sr_gated(ctx: ToolContext, cents: int) -> str:
    """Pays out, once a person approves."""
    GATED_RAN.append(cents)
    return f"paid {cents}"


async def test_a_gated_call_interrupts_the_run_before_it_starts_and_runs_once_approved(
    kernel: Kernel, client: AgentClient
) -> None:
    GATED_RAN.clear()
    async with serving(kernel, sr_gated):
        run = await client.create_run("sr-gate")
        events = client.submit_turn(run.id, 0, [ToolCall("sr_gated", {"cents": 500})])
        asked = await within("the interruption", anext(events))
        assert isinstance(asked, Interruption), asked

        before = await client.list_events(run.id)
        [interrupted] = [e for e in before if e.type == "run:interrupted"]
        payload = interrupted.payload
        assert payload["reason"] == "tool_approval" and asked.reason == "tool_approval"
        assert payload["approval_id"] == asked.approval_id
        assert payload["tool_name"] == "sr_gated" and payload["tool_input"] == {"cents": 500}
        assert payload["step_key"] == asked.step_key == "t0/p0"
        assert payload["decided_by"] == "tool:requires_approval"
        assert "tool:start" not in [e.type for e in _of_step(before, "t0/p0")]
        assert (await client.get_run(run.id)).run.status == "blocked"
        assert GATED_RAN == [], "nothing ran before the answer"

        await client.approve(asked.approval_id, decider="alice", reason="fine")
        result = await within("the approved call's result", anext(events))
        assert isinstance(result, CallResult) and result.output == "paid 500", result
        assert GATED_RAN == [500]
        after = await client.list_events(run.id)
        kinds = [e.type for e in after]
        assert kinds.index("run:interrupted") < kinds.index("run:resumed")
        assert kinds.index("run:resumed") < kinds.index("tool:start"), kinds
        assert (await client.get_run(run.id)).run.status == "running"


async def test_the_decision_and_the_approver_are_recorded_with_each_call(
    tmp_path: Path,
) -> None:
    GATED_RAN.clear()
    policy = "rules:\n  - id: sr-lookups\n    match: { tools: [sr_quote] }\n    decision: allow\n"
    async with (
        _governed(tmp_path, policy) as (kernel, client),
        serving(kernel, sr_quote, sr_nested, sr_gated),
    ):
        run = await client.create_run("sr-decisions")
        by_rule, by_default = (
            await client.call_turn(run.id, 0, [ToolCall("sr_quote"), ToolCall("sr_nested")])
        ).results
        assert by_rule.decided_by == "rule:sr-lookups", by_rule
        assert by_default.decided_by == "default:allow", by_default

        events = client.submit_turn(run.id, 1, [ToolCall("sr_gated", {"cents": 7})])
        asked = await within("the interruption", anext(events))
        assert isinstance(asked, Interruption)
        await client.approve(asked.approval_id, decider="alice", reason="checked the ticket")
        approved = await within("the approved call's result", anext(events))
        assert isinstance(approved, CallResult) and approved.output == "paid 7", approved
        assert approved.decided_by == "tool:requires_approval"
        assert approved.approval is not None
        assert (approved.approval.answer, approved.approval.decider) == ("approved", "alice")
        assert approved.approval.reason == "checked the ticket"

        steps = {s.step_key: s for s in (await client.get_run(run.id)).steps}
        assert steps["t0/p0"].decided_by == "rule:sr-lookups"
        assert steps["t0/p1"].decided_by == "default:allow"
        assert steps["t1/p0"].decided_by == "tool:requires_approval"
        [answered] = [e for e in await client.list_events(run.id) if e.type == "approval:answered"]
        assert answered.payload["answer"] == "approved" and answered.payload["decider"] == "alice"
        assert answered.payload["step_key"] == "t1/p0"


# Row 16: an approval that expires records an error result with the answer; the tool never runs.

HASTY_RAN: list[int] = []


@tool(writes=True, requires_approval=True, approval_timeout=0.5)
async def sr_hasty(ctx: ToolContext, cents: int) -> str:
    """Pays out, if a person approves within half a second."""
    HASTY_RAN.append(cents)
    return f"paid {cents}"


async def test_an_approval_that_expires_records_an_error_and_the_model_is_told(
    kernel: Kernel, client: AgentClient
) -> None:
    HASTY_RAN.clear()
    async with serving(kernel, sr_hasty):
        run = await client.create_run("sr-expiry")
        events = client.submit_turn(run.id, 0, [ToolCall("sr_hasty", {"cents": 900})])
        asked = await within("the interruption", anext(events))
        assert isinstance(asked, Interruption)
        result = await within("the expired call's result", anext(events))
        assert isinstance(result, CallResult), result
        assert result.outcome == CallOutcome.EXPIRED and result.status == "error", result
        assert result.approval is not None and result.approval.answer == "expired", result
        assert result.content == (
            "'sr_hasty' was not approved: the approval expired unanswered (approval timeout)"
        ), result.content
        assert result.approval.decider == "kernel", "the clock answered, not a person"
        assert HASTY_RAN == [], "the tool never ran"

        [step] = (await client.get_run(run.id)).steps
        assert (step.status, step.outcome, step.attempts) == ("failed", "expired", 0), step
        assert step.error == result.content
        events_seen = await client.list_events(run.id)
        kinds = [e.type for e in events_seen]
        assert "tool:start" not in kinds, kinds
        [answered] = [e for e in events_seen if e.type == "approval:answered"]
        assert answered.payload["answer"] == "expired"
        [settled] = [e for e in events_seen if e.type == "tool:result"]
        assert settled.payload["approval"] == "expired"
        [waiting] = await client.list_approvals(run_id=run.id, status="expired")
        assert waiting.id == asked.approval_id


# Row 28: emit_status reaches the agent as progress, and the step counts it.


@tool(read_only=True)
async def sr_chatty(ctx: ToolContext) -> str:
    """Says what it is doing as it goes."""
    await ctx.emit_status("looking up the order")
    await ctx.emit_status("checking the stock")
    return "in stock"


async def test_emit_status_reaches_the_agent_as_progress_and_the_step_counts_it(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, sr_chatty):
        run = await client.create_run("sr-status")
        seen = [e async for e in client.submit_turn(run.id, 0, [ToolCall("sr_chatty")])]
        progress = [e for e in seen if isinstance(e, TurnProgress)]
        assert [p.message for p in progress] == ["looking up the order", "checking the stock"]
        assert all(p.tool == "sr_chatty" and p.step_key == "t0/p0" for p in progress), progress
        assert isinstance(seen[-1], CallResult) and seen[-1].output == "in stock"
        [step] = (await client.get_run(run.id)).steps
        assert step.progress_count == 2


# Row 32: a tool's version is recorded with its calls.


@tool(version="3", read_only=True)
async def sr_versioned(ctx: ToolContext) -> str:
    """A tool at its third version."""
    return "v3"


async def test_a_tools_version_is_recorded_with_its_step(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, sr_versioned):
        [registered] = [t for t in await client.list_tools() if t.name == "sr_versioned"]
        assert registered.version == "3"
        run = await client.create_run("sr-version")
        await client.call_turn(run.id, 0, [ToolCall("sr_versioned")])
        [step] = (await client.get_run(run.id)).steps
        assert step.tool_version == "3" and step.tool_fingerprint == sr_versioned.fingerprint
        [scheduled] = [e for e in await client.list_events(run.id) if e.type == "tool:scheduled"]
        assert scheduled.payload["version"] == "3"


# Row 33: a policy file decides by risk level and permissions.

POLICED_RAN: list[str] = []


@tool(risk="high")
async def sr_risky(ctx: ToolContext) -> str:
    """A high-risk operation (above the policy's ceiling)."""
    POLICED_RAN.append("sr_risky")
    return "done"


@tool(risk="medium")
async def sr_moderate(ctx: ToolContext) -> str:
    """A medium-risk operation (asked about)."""
    POLICED_RAN.append("sr_moderate")
    return "done"


@tool(risk="low")
async def sr_harmless(ctx: ToolContext) -> str:
    """A low-risk operation."""
    POLICED_RAN.append("sr_harmless")
    return "done"


@tool(permissions=["billing:write"])
async def sr_billing(ctx: ToolContext) -> str:
    """Needs the billing:write permission."""
    POLICED_RAN.append("sr_billing")
    return "billed"


RISK_POLICY = """\
default: allow
max_risk: { ceiling: medium, approve_above: low }
require_permissions: true
"""


async def test_a_policy_file_denies_asks_or_allows_by_risk_and_permissions(
    tmp_path: Path,
) -> None:
    POLICED_RAN.clear()
    async with (
        _governed(tmp_path, RISK_POLICY) as (kernel, client),
        serving(kernel, sr_risky, sr_moderate, sr_harmless, sr_billing),
    ):
        plain = await client.create_run("sr-policy")
        risky, harmless, billing = (
            await client.call_turn(
                plain.id, 0, [ToolCall("sr_risky"), ToolCall("sr_harmless"), ToolCall("sr_billing")]
            )
        ).results
        assert risky.outcome == CallOutcome.DENIED and risky.decided_by == "preset:max_risk"
        assert risky.content == (
            "sr_risky not allowed. reason: risk high is above the policy's ceiling (medium)"
        ), risky.content
        assert harmless.outcome == CallOutcome.OK and harmless.decided_by == "default:allow"
        assert billing.outcome == CallOutcome.DENIED, billing
        assert billing.decided_by == "preset:require_permissions"
        assert billing.content == (
            "sr_billing not allowed. reason: the run lacks required permission(s): billing:write"
        ), billing.content
        assert POLICED_RAN == ["sr_harmless"], "denied calls never run"

        # The permission granted, the same tool runs.
        granted = await client.create_run("sr-policy", permissions=["billing:write"])
        [billed] = (await client.call_turn(granted.id, 0, [ToolCall("sr_billing")])).results
        assert billed.output == "billed" and billed.decided_by == "default:allow", billed

        # Above approve_above, under the ceiling: a person is asked first.
        events = client.submit_turn(plain.id, 1, [ToolCall("sr_moderate")])
        asked = await within("the interruption", anext(events))
        assert isinstance(asked, Interruption) and asked.tool == "sr_moderate", asked
        assert "sr_moderate" not in POLICED_RAN
        await client.approve(asked.approval_id, decider="ops")
        moderate = await within("the approved call", anext(events))
        assert isinstance(moderate, CallResult) and moderate.output == "done", moderate
        assert moderate.decided_by == "preset:max_risk"

        steps = {s.step_key: s for s in (await client.get_run(plain.id)).steps}
        decisions = {s.tool: (s.outcome, s.decided_by) for s in steps.values()}
        assert decisions == {
            "sr_risky": ("denied", "preset:max_risk"),
            "sr_harmless": ("ok", "default:allow"),
            "sr_billing": ("denied", "preset:require_permissions"),
            "sr_moderate": ("ok", "preset:max_risk"),
        }
        assert POLICED_RAN == ["sr_harmless", "sr_billing", "sr_moderate"]


# Row 39: a denied call emits tool:denied and the model reads an error result.

FORBIDDEN_RAN: list[str] = []


@tool(writes=True)
async def sr_forbidden(ctx: ToolContext, path: str) -> str:
    """Deletes a path (the policy denies it)."""
    FORBIDDEN_RAN.append(path)
    return "deleted"


async def test_a_denied_call_emits_tool_denied_and_the_model_reads_the_refusal(
    tmp_path: Path,
) -> None:
    FORBIDDEN_RAN.clear()
    async with (
        _governed(tmp_path, 'deny_list: ["sr_forbid*"]\n') as (kernel, client),
        serving(kernel, sr_forbidden, sr_harmless),
    ):
        run = await client.create_run("sr-denial")
        denied, allowed = (
            await client.call_turn(
                run.id,
                0,
                [ToolCall("sr_forbidden", {"path": "/"}), ToolCall("sr_harmless")],
            )
        ).results
        assert denied.outcome == CallOutcome.DENIED and denied.status == "error", denied
        assert denied.content.startswith("sr_forbidden not allowed. reason:"), denied.content
        assert denied.decided_by == "preset:deny_list" and denied.attempts == 0
        assert allowed.output == "done", "the turn goes on"
        assert FORBIDDEN_RAN == []

        events = await client.list_events(run.id)
        about = _of_step(events, denied.step_key)
        assert [e.type for e in about] == ["tool:denied"], [e.type for e in about]
        payload = about[0].payload
        assert payload["tool"] == "sr_forbidden" and payload["arguments"] == {"path": "/"}
        assert payload["outcome"] == "denied" and payload["status"] == "error"
        assert payload["decided_by"] == "preset:deny_list" and payload["reason"] == "denied"
        assert payload["error"] == denied.content
        [step] = [s for s in (await client.get_run(run.id)).steps if s.tool == "sr_forbidden"]
        assert (step.outcome, step.attempts) == ("denied", 0)


# Row 46: calls on one resource instance never run at once; other instances do.

PUSHES: list[str] = []
PUSH_RELEASE: dict[str, asyncio.Event] = {}


@tool(writes=True, resources=["repo:{repo}", "workspace"])
async def sr_push(ctx: ToolContext, repo: str, hold: bool = False) -> str:
    """Pushes to a repository; holds it until the test lets go when told to."""
    PUSHES.append(f"lock:{repo}")
    if hold:
        await PUSH_RELEASE["event"].wait()
    PUSHES.append(f"unlock:{repo}")
    return f"pushed to {repo}"


async def test_calls_on_one_resource_instance_never_run_at_once_while_other_instances_do(
    kernel: Kernel, client: AgentClient
) -> None:
    PUSHES.clear()
    PUSH_RELEASE["event"] = asyncio.Event()
    async with serving(kernel, sr_push, max_concurrency=8):
        first, second, other = [await client.create_run("sr-pusher") for _ in range(3)]
        holding = asyncio.ensure_future(
            client.call_turn(first.id, 0, [ToolCall("sr_push", {"repo": "acme", "hold": True})])
        )

        async def first_push() -> bool:
            return PUSHES == ["lock:acme"]

        await eventually("the first push to hold acme", first_push)
        waiting = asyncio.ensure_future(
            client.call_turn(second.id, 0, [ToolCall("sr_push", {"repo": "acme"})])
        )

        async def recorded() -> bool:
            steps = (await client.get_run(second.id)).steps
            return any(s.status == "pending" for s in steps)

        await eventually("the second push to acme to be recorded and wait", recorded)
        [scheduled] = [e for e in await client.list_events(second.id) if e.type == "tool:scheduled"]
        assert scheduled.payload["resources"] == ["repo:acme", "workspace"], scheduled.payload

        # Another instance is not held back: it runs and ends while acme is still held.
        [elsewhere] = (
            await client.call_turn(other.id, 0, [ToolCall("sr_push", {"repo": "other"})])
        ).results
        assert elsewhere.output == "pushed to other"
        assert PUSHES == ["lock:acme", "lock:other", "unlock:other"], PUSHES
        assert [s.status for s in (await client.get_run(second.id)).steps] == ["pending"]

        PUSH_RELEASE["event"].set()
        [held] = (await within("the first push", holding)).results
        [queued] = (await within("the second push", waiting)).results
        assert held.output == queued.output == "pushed to acme"
    acme = [line for line in PUSHES if line.endswith(":acme")]
    assert acme == ["lock:acme", "unlock:acme", "lock:acme", "unlock:acme"], PUSHES


# Row 49: a failed subagent started from a hosted handler raises SubagentFailed there.


@agent
async def sr_careful_parent(ctx: AgentContext, input: None) -> dict[str, object]:
    """Starts a counter subagent that fails, and says what it caught."""
    try:
        counted = await ctx.subagent("py_counter", -1)
    except SubagentFailed as failed:
        return {
            "caught": type(failed).__name__,
            "agent": failed.agent,
            "run_id": failed.run_id,
            "message": failed.message,
            "said": str(failed),
        }
    return {"caught": None, "counted": counted}


async def test_a_failed_subagent_raises_subagent_failed_in_the_handler(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(
        kernel, *hosted_agents.TOOLS, agents=[*hosted_agents.AGENTS, sr_careful_parent]
    ):
        run = await client.create_run("sr_careful_parent", hosted=True)
        events = await within("the run to end", ended_events(client, run.id), 60)
        assert events[-1].type == "run:completed", [e.type for e in events]
        output = (await client.get_run(run.id)).run.output
        assert output["caught"] == "SubagentFailed" and output["agent"] == "py_counter", output
        assert "ValueError: cannot count backwards" in output["message"], output
        assert output["said"].startswith(f"subagent 'py_counter' (run {output['run_id']}) failed")
        child = await client.get_run(output["run_id"])
        assert child.run.status == "failed" and child.run.parent_run_id == run.id, child.run
        [step] = [s for s in (await client.get_run(run.id)).steps if s.child_run_id]
        assert step.child_run_id == output["run_id"] and step.status == "failed", step
