"""Budgets against the real kernel from Python: a runaway agent loop stopped at its budget with
the model reading why, the spend read back on the run, a subagent-free branch with a budget of its
own, a budget that limits nothing refused naming its field, a policy budget that asks a person,
raised by an answer, and a budget on tool run time that holds each call's timeout while it runs."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from conftest import serving
from harness import Kernel, kernel_with_policy

from kernel_sdk import (
    AgentClient,
    BudgetLimit,
    CallOutcome,
    CallResult,
    Interruption,
    KernelError,
    ToolCall,
    tool,
)

RAN: list[str] = []


@tool(cost_per_call=0.25)
async def py_search(query: str) -> str:
    """Searches for `query` (a paid API)."""
    RAN.append(query)
    return f"results for {query}"


async def test_a_runaway_loop_stops_at_its_budget_and_the_model_reads_why(
    kernel: Kernel, client: AgentClient
) -> None:
    RAN.clear()
    async with serving(kernel, py_search):
        run = await client.create_run(
            "researcher",
            budget=[BudgetLimit(max_cost=1.0), BudgetLimit(max_calls=10, tools="py_*")],
        )
        stopped = None
        for turn in range(20):
            done = await client.call_turn(
                run.id, turn, [ToolCall("py_search", {"query": f"q{turn}"})]
            )
            [result] = done.results
            if not result.ok:
                stopped = (turn, result)
                break
        assert stopped is not None, "the budget never stopped the loop"
        turn, refused = stopped
        assert turn == 4 and len(RAN) == 4, (turn, RAN)
        assert refused.outcome == CallOutcome.BUDGET_EXCEEDED
        assert refused.content == (
            f"budget exceeded: cost 1.25 of 1.00 for run {run.id}; 'py_search' did not run"
        )

        detail = await client.get_run(run.id)
        spent = [(limit.set_by, limit.spent_calls, limit.spent_cost) for limit in detail.run.budget]
        assert spent == [("request", 4, 1.0), ("request", 4, 1.0)], detail.run.budget
        assert detail.run.budget[1].tools == "py_*" and detail.run.budget[1].max_calls == 10

        # A branch of the run spends a budget of its own: its parent's limits, nothing spent.
        branch = await client.fork_run(run.id, at="t1/p0")
        copied = [(b.max_calls, b.max_cost, b.set_by, b.spent_cost) for b in branch.budget]
        assert copied == [(None, 1.0, "parent", 0.0), (10, None, "parent", 0.0)], copied


async def test_a_budget_that_limits_nothing_is_refused_naming_its_field(
    client: AgentClient,
) -> None:
    with pytest.raises(KernelError) as refused:
        await client.create_run("researcher", budget=[BudgetLimit(tools="py_*")])
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "budget[0]: sets none of max_calls, max_cost and max_time" in str(refused.value)


ASKING = """
default: allow
budgets:
  - max_cost: 0.5
    approval: { approvers: [finance] }
"""


async def test_a_budget_that_asks_is_raised_by_a_person_and_the_call_runs(tmp_path: Path) -> None:
    RAN.clear()
    with kernel_with_policy(tmp_path, ASKING) as kernel:
        async with AgentClient(kernel.addr) as client, serving(kernel, py_search):
            run = await client.create_run("researcher")
            done = await client.call_turn(
                run.id, 0, [ToolCall("py_search", {"query": q}) for q in ("a", "b")]
            )
            assert [r.ok for r in done.results] == [True, True], done.results
            # The third call would cost 0.75 of 0.50: it waits for a person, who raises the limit.
            asked = None
            async for item in client.submit_turn(
                run.id, 1, [ToolCall("py_search", {"query": "c"})]
            ):
                if isinstance(item, Interruption):
                    asked = item
                    assert item.reason == "budget_exceeded", item
                    assert item.message.startswith("budget exceeded: cost 0.75 of 0.50"), item
                    with pytest.raises(KernelError, match="answer_json"):
                        await client.approve(item.approval_id, decider="finance")
                    await client.answer(item.approval_id, {"max_cost": 1.0}, decider="finance")
                elif isinstance(item, CallResult):
                    assert item.ok, item
            assert asked is not None, "the call never waited for a person"
            assert RAN == ["a", "b", "c"]
            detail = await client.get_run(run.id)
            [limit] = detail.run.budget
            assert (limit.max_cost, limit.spent_cost) == (1.0, 0.75)
            assert limit.set_by == "policy:budgets[0], raised by finance"


@tool
async def py_nap(ms: int) -> str:
    """Sleeps `ms` milliseconds."""
    await asyncio.sleep(ms / 1000)
    return f"napped {ms}"


async def test_a_time_budget_holds_each_call_s_timeout_and_stops_the_loop_past_it(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, py_nap):
        run = await client.create_run("napper", budget=[BudgetLimit(max_time=2.5)])
        nap = ToolCall("py_nap", {"ms": 300}, timeout=1.0)
        # Four calls of a turn hold 1 s each of the 2.5 s: two run at once, and all four run.
        done = await client.call_turn(run.id, 0, [nap] * 4)
        assert all(r.ok for r in done.results), done.results
        steps = (await client.get_run(run.id)).steps
        spans = []
        for step in steps:
            assert step.started_at is not None and step.finished_at is not None, step
            spans.append((step.started_at, step.finished_at))
        for start, _ in spans:
            running = sum(1 for s, f in spans if s <= start < f)
            assert running <= 2, spans

        refused = None
        for turn in range(1, 20):
            [result] = (await client.call_turn(run.id, turn, [nap])).results
            if not result.ok:
                refused = result
                break
        assert refused is not None, "the time budget never stopped the loop"
        assert refused.outcome == CallOutcome.BUDGET_EXCEEDED
        assert "with 1.00 s more for this call's timeout, of 2.50 s" in refused.content, refused
        [limit] = (await client.get_run(run.id)).run.budget
        assert limit.max_time == 2.5 and limit.reserved_time == 0.0, limit
        assert 1.5 < limit.spent_time <= 2.5, limit

    with pytest.raises(ValueError, match=r"budget\[0\]\.max_time"):
        await client.create_run("napper", budget=[BudgetLimit(max_time=-1)])
