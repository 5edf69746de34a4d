"""Branches and case runs from Python, against the real kernel: a fork replays the recorded
write, runs a read live, and ends at a new write; a case run runs the write its token allows; a
hosted branch runs read and pure steps live and refuses a write step and a new `ctx.once`."""

from __future__ import annotations

from typing import Any

from conftest import serving
from harness import Kernel

from kernel_sdk import (
    AgentClient,
    AgentContext,
    CallOutcome,
    Run,
    StepInfo,
    ToolCall,
    ToolContext,
    agent,
    tool,
)

charged: list[int] = []


@tool(read_only=True)
async def quote(ctx: ToolContext, sku: str) -> int:
    """The price of an item, in cents."""
    return len(sku) * 100


@tool(writes=True)
async def pay(ctx: ToolContext, cents: int) -> str:
    """Charge the card."""
    charged.append(cents)
    return f"paid {cents}"


async def test_a_fork_replays_the_recorded_write_runs_reads_and_ends_at_a_new_write(
    kernel: Kernel, client: AgentClient
) -> None:
    charged.clear()
    async with serving(kernel, quote, pay):
        run = await client.create_run("shop")
        await client.call_turn(
            run.id, 0, [ToolCall("quote", {"sku": "ab"}), ToolCall("pay", {"cents": 200})]
        )
        await client.complete_run(run.id, {"done": True})

        branch = await client.fork_run(run.id, set_results={"t0/p0": 300})
        assert branch.forked_from_run_id == run.id
        replayed = (
            await client.call_turn(
                branch.id, 0, [ToolCall("quote", {"sku": "ab"}), ToolCall("pay", {"cents": 200})]
            )
        ).results
        assert [r.output for r in replayed] == [300, "paid 200"]
        read = (await client.call_turn(branch.id, 1, [ToolCall("quote", {"sku": "abc"})])).results
        assert read[0].output == 300 and read[0].outcome == CallOutcome.OK
        [refused] = (
            await client.call_turn(branch.id, 2, [ToolCall("pay", {"cents": 300})])
        ).results
        assert refused.outcome == CallOutcome.WRITE_TOOL_BLOCKED
        assert "(reason: write)" in refused.content
        detail = await client.get_run(branch.id)
        assert detail.run.status == "failed"
        assert detail.run.reason == "write_tool_blocked: pay (reason: write)"
        assert [s.replayed_from_run_id for s in detail.steps[:2]] == [run.id, run.id]
        assert charged == [200], "only the parent paid"


async def test_a_case_run_runs_the_write_its_token_allows(
    kernel: Kernel, client: AgentClient
) -> None:
    charged.clear()
    async with serving(kernel, quote, pay):
        case = await client.create_run("shop", allow=["tool:pay"])
        assert case.allow == ("tool:pay",)
        [paid] = (await client.call_turn(case.id, 0, [ToolCall("pay", {"cents": 5})])).results
        assert paid.outcome == CallOutcome.OK
        assert charged == [5]


STEPS_RAN: list[str] = []


@agent
async def py_script(ctx: AgentContext, script: dict[str, Any]) -> list[object]:
    """Runs the steps and calls its input lists, in order: `{"once": id}`, `{"step": id,
    "effect": ...}`, `{"call": tool, "args": {...}}`."""
    out: list[object] = []
    for op in script["ops"]:

        def ran(info: StepInfo, name: str = op.get("once") or op.get("step", "")) -> str:
            STEPS_RAN.append(name)
            return name

        if "once" in op:
            out.append(await ctx.once(op["once"], ran))
        elif "step" in op:
            out.append(await ctx.step(op["step"], ran, effect=op["effect"]))
        else:
            out.append((await ctx.call(op["call"], op["args"])).content)
    return out


async def test_a_hosted_branch_runs_read_and_pure_steps_and_refuses_write_steps_and_once(
    kernel: Kernel, client: AgentClient
) -> None:
    STEPS_RAN.clear()
    async with serving(kernel, quote, agents=[py_script]):
        recorded = {
            "ops": [
                {"once": "plan"},
                {"step": "save", "effect": "write"},
                {"call": "quote", "args": {"sku": "ab"}},
            ]
        }
        parent = await client.create_run("py_script", input=recorded, hosted=True)
        assert (await _ended(client, parent.id)).status == "completed"
        assert STEPS_RAN == ["plan", "save"]

        changed = {
            "ops": [
                {"once": "plan"},
                {"step": "look", "effect": "read"},
                {"step": "sum", "effect": "pure"},
                {"step": "save", "effect": "write"},
                {"step": "mail", "effect": "write"},
                {"call": "quote", "args": {"sku": "ab"}},
            ]
        }
        branch = await client.fork_run(parent.id, input=changed)
        ended = await _ended(client, branch.id)
        assert ended.status == "failed", ended
        assert ended.reason == "write_tool_blocked: ctx.step:mail (reason: step)"
        assert STEPS_RAN == ["plan", "save", "look", "sum"], "reads run live, the write never"
        steps = {s.step_key: s for s in (await client.get_run(branch.id)).steps}
        assert steps["step:plan#0"].replayed_from_run_id == parent.id
        assert steps["step:save#0"].decided_by == "branch:parent"
        assert steps["step:look#0"].replayed_from_run_id == ""
        assert steps["step:mail#0"].outcome == CallOutcome.WRITE_TOOL_BLOCKED

        # A ctx.once the parent never recorded is refused whatever it does.
        other = await client.fork_run(parent.id, input={"ops": [{"once": "other"}]})
        ended = await _ended(client, other.id)
        assert ended.reason == "write_tool_blocked: ctx.step:other (reason: step)"
        assert "other" not in STEPS_RAN


async def _ended(client: AgentClient, run_id: str) -> Run:
    async for _ in client.watch_events(run_id):
        pass
    return (await client.get_run(run_id)).run
