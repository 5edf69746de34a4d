"""A Python tool body calling tools through the kernel against the real kernel: with `ctx.call`
and by calling a tool function directly (`await py_refund(ctx, cents=...)`). Each callee is a
step nested under its caller with its own declaration: a gated refund waits for a person and its
rejection raises `ToolCallRejected` in the body; a replay runs nothing again; a branch refuses a
nested write its parent never recorded; a test context has no kernel."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from conftest import pending_approval, serving
from harness import Kernel

from kernel_sdk import (
    AgentClient,
    CallOutcome,
    ToolCall,
    ToolCallRejected,
    ToolContext,
    ToolError,
    tool,
)

RAN: list[str] = []


@tool(read_only=True)
async def py_find_order(ctx: ToolContext, order: str) -> dict[str, str]:
    """Looks an order up."""
    RAN.append(f"find:{order}")
    return {"order": order, "status": "delivered"}


@tool(requires_approval="args.cents > 10000")
async def py_refund(ctx: ToolContext, cents: int) -> str:
    """Refunds `cents`; a big refund needs a person."""
    RAN.append(f"refund:{cents}")
    return f"refunded {cents}"


@tool(read_only=True)
async def py_support(ctx: ToolContext, order: str, cents: int) -> dict[str, Any]:
    """Finds the order, then refunds it: each a call through the kernel."""
    RAN.append(f"support:{order}")
    found = await ctx.call("py_find_order", {"order": order})
    try:
        refunded = await py_refund(ctx, cents=cents)
    except ToolCallRejected as rejected:
        return {"found": found.output, "refund": None, "rejected": rejected.reason}
    return {"found": found.output, "refund": refunded}


TOOLS = (py_find_order, py_refund, py_support)


async def test_a_tool_calls_tools_through_the_kernel_each_recorded_under_it_and_run_once(
    kernel: Kernel, client: AgentClient
) -> None:
    RAN.clear()
    async with serving(kernel, *TOOLS):
        run = await client.create_run("support")
        turn = [ToolCall("py_support", {"order": "o-9", "cents": 500})]
        [result] = (await client.call_turn(run.id, 0, turn)).results
        assert result.outcome == CallOutcome.OK, result
        assert result.output == {
            "found": {"order": "o-9", "status": "delivered"},
            "refund": "refunded 500",
        }
        detail = await client.get_run(run.id)
        nested = {s.step_key: s for s in detail.steps if s.caller_step_key}
        assert sorted(nested) == ["call:t0/p0#0", "call:t0/p0#1"], detail.steps
        assert nested["call:t0/p0#0"].tool == "py_find_order"
        assert nested["call:t0/p0#1"].tool == "py_refund"
        assert {s.caller_step_key for s in nested.values()} == {"t0/p0"}
        assert detail.run.tool_calls == 3

        # The agent's turn again: served from the log; no body runs again.
        ran = list(RAN)
        [again] = (await client.call_turn(run.id, 0, turn)).results
        assert again.replayed and again.output == result.output
        assert RAN == ran == ["support:o-9", "find:o-9", "refund:500"]


async def test_a_nested_gated_call_waits_for_a_person_and_a_rejection_raises_in_the_body(
    kernel: Kernel, client: AgentClient
) -> None:
    RAN.clear()
    async with serving(kernel, *TOOLS):
        run = await client.create_run("support")
        turn = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("py_support", {"order": "o-7", "cents": 50_000})])
        )
        approval_id = await pending_approval(client, run.id, "the refund's approval")
        [asked] = await client.list_approvals(run_id=run.id)
        assert (asked.tool, asked.step_key) == ("py_refund", "call:t0/p0#1"), asked
        await client.reject(approval_id, decider="bob", reason="over the limit")
        [result] = (await asyncio.wait_for(turn, 30)).results
        assert result.outcome == CallOutcome.OK, result
        assert result.output["refund"] is None
        assert "bob" in result.output["rejected"], result.output
        assert "refund:50000" not in RAN, "a rejected call never runs"
        detail = await client.get_run(run.id)
        [refund] = [s for s in detail.steps if s.step_key == "call:t0/p0#1"]
        assert refund.outcome == CallOutcome.REJECTED


async def test_a_branch_refuses_a_nested_write_its_parent_never_recorded(
    kernel: Kernel, client: AgentClient
) -> None:
    RAN.clear()
    async with serving(kernel, *TOOLS):
        run = await client.create_run("support")
        await client.call_turn(run.id, 0, [ToolCall("py_find_order", {"order": "o-1"})])
        support = [ToolCall("py_support", {"order": "o-1", "cents": 300})]
        await client.call_turn(run.id, 1, support)
        await client.complete_run(run.id, {"done": True})
        assert RAN.count("refund:300") == 1

        # Forked before the support call: it runs live (read-only), and so does the read it
        # makes, but the refund it calls is unmarked and its parent never made it there.
        branch = await client.fork_run(run.id, at="t0/p0")
        [refused] = (await client.call_turn(branch.id, 1, support)).results
        assert refused.outcome != CallOutcome.OK, refused
        detail = await client.get_run(branch.id)
        assert detail.run.status == "failed"
        assert detail.run.reason.startswith("write_tool_blocked: py_refund"), detail.run.reason
        [blocked] = [s for s in detail.steps if s.step_key == "call:t1/p0#1"]
        assert blocked.outcome == CallOutcome.WRITE_TOOL_BLOCKED
        assert RAN.count("refund:300") == 1, "the branch never refunded"


async def test_the_console_s_run_page_names_a_nested_call_s_caller(tmp_path: Path) -> None:
    kernel = Kernel(tmp_path, "--http-listen", "127.0.0.1:0")
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, *TOOLS):
            run = await client.create_run("support")
            turn = [ToolCall("py_support", {"order": "o-3", "cents": 100})]
            await client.call_turn(run.id, 0, turn)
            url = f"http://{kernel.http}/runs/{run.id}"
            page = await asyncio.to_thread(_read, url)
        # Each nested call right after its caller, in the body's order.
        places = [
            page.index(f'data-key="{key}"') for key in ("t0/p0", "call:t0/p0#0", "call:t0/p0#1")
        ]
        assert places == sorted(places), places
        for key in ("call:t0/p0#0", "call:t0/p0#1"):
            row = page[page.index(f'data-key="{key}"') :]
            row = row[: row.index("</details>")]
            assert 'title="called by t0/p0"' in row, row
            assert "Called by</dt><dd><code>t0/p0</code>" in row, row
    finally:
        kernel.stop()


def _read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


async def test_from_a_test_context_ctx_call_is_a_tool_error_and_a_direct_call_just_runs() -> None:
    ctx = ToolContext.for_test()
    with pytest.raises(ToolError) as raised:
        await ctx.call("py_find_order", {"order": "o-2"})
    assert raised.value.kind == "fatal"
    assert "this context has no kernel" in raised.value.message
    assert await py_refund(ctx, cents=20_000) == "refunded 20000"
