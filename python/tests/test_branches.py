"""Branches and case runs from Python, against the real kernel: a fork replays the recorded
write, runs a read live, and ends at a new write; a case run runs the write its token allows."""

from __future__ import annotations

from conftest import serving
from harness import Kernel

from kernel_sdk import AgentClient, CallOutcome, ToolCall, ToolContext, tool

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
