"""Tool limits against the real kernel from Python: a policy's bound on calls at once holds for a
Python worker's tool, the calls past it wait rather than fail, and each step reads back the limit
it passed and how long it waited."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import serving
from harness import Kernel, kernel_with_policy, scrape

from kernel_sdk import AgentClient, ToolCall, ToolDefinitionError, tool

POLICY = """
default: allow
limits:
  - tools: "py_charge*"
    at_once: 1
    per_second: 50
"""

RUNNING = [0]
MOST = [0]


async def _one_at_a_time(seconds: float) -> None:
    """Counts the calls running now while it holds `seconds`, keeping the most in `MOST`."""
    RUNNING[0] += 1
    MOST[0] = max(MOST[0], RUNNING[0])
    try:
        await asyncio.sleep(seconds)
    finally:
        RUNNING[0] -= 1


@tool
async def py_charge(cents: int) -> str:
    """Charges `cents` at a provider that allows one call at a time."""
    await _one_at_a_time(0.03)
    return f"charged {cents}"


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Kernel]:
    """A kernel whose policy limits `py_charge*` to one call at once."""
    with kernel_with_policy(tmp_path, POLICY) as started:
        yield started


async def test_a_bound_on_calls_at_once_holds_and_the_calls_past_it_wait(limited: Kernel) -> None:
    MOST[0] = 0
    async with AgentClient(limited.addr) as client, serving(limited, py_charge, max_concurrency=8):
        run = await client.create_run("payer")
        calls = [ToolCall("py_charge", {"cents": n}) for n in range(6)]
        done = await client.call_turn(run.id, 0, calls)
        assert [r.ok for r in done.results] == [True] * 6, done.results
        assert MOST[0] == 1, "the worker had eight slots; the limit let one call run at a time"
        detail = await client.get_run(run.id)
        assert all(step.limited_by == ("py_charge*",) for step in detail.steps), detail.steps
        assert sum(step.limit_wait_ms > 0 for step in detail.steps) >= 4, detail.steps
        # Every start passed the limit; its waits are on /metrics, by limit.
        samples = scrape(limited)
        assert samples['kernel_tool_limit_wait_seconds_count{limit="py_charge*"}'] == 6
        assert samples['kernel_tool_limit_wait_seconds_sum{limit="py_charge*"}'] > 0


@tool(at_once=1)
async def py_render(page: int) -> str:
    """Renders `page` on a licence that allows one render at a time, wherever it runs."""
    await _one_at_a_time(0.02)
    return f"rendered {page}"


async def test_a_tool_s_own_limit_holds_without_a_policy(kernel: Kernel) -> None:
    MOST[0] = 0
    async with AgentClient(kernel.addr) as client, serving(kernel, py_render, max_concurrency=8):
        run = await client.create_run("renderer")
        calls = [ToolCall("py_render", {"page": n}) for n in range(5)]
        done = await client.call_turn(run.id, 0, calls)
        assert [r.ok for r in done.results] == [True] * 5, done.results
        assert MOST[0] == 1, "the tool declared one call at a time; its worker had eight slots"
        detail = await client.get_run(run.id)
        assert all(step.limited_by == ("tool:py_render",) for step in detail.steps), detail.steps


def test_a_tool_s_own_limit_is_checked_when_it_is_declared() -> None:
    with pytest.raises(ToolDefinitionError, match="per_second"):
        tool(per_second=0)(py_render.function)
    with pytest.raises(ToolDefinitionError, match="at_once"):
        tool(at_once=0)(py_render.function)
    with pytest.raises(ToolDefinitionError, match="burst bounds a rate"):
        tool(burst=3, at_once=2)(py_render.function)
