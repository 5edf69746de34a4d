"""Branches and case runs from Python, against the real kernel: a fork replays the recorded
write, runs a read live, and ends at a new write (its reason withheld at capture `none`); a case
run runs the write its token allows; a hosted branch runs read and pure steps live, refuses a
write step and a new `ctx.once`, replays a recorded subagent or runs it as a branch of the
recorded child, refuses one the parent never started (each refusal ends the run though the handler
catches it), and ends unresumable when its parent is deleted while it waits."""

from __future__ import annotations

import asyncio
import subprocess
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from conftest import ended_run, serving
from harness import Kernel, binary, eventually

from kernel_sdk import (
    AgentClient,
    AgentContext,
    CallOutcome,
    KernelError,
    RunStatus,
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


async def test_runs_are_listed_by_branch_tool_label_status_and_time_page_by_page(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, quote):
        started = datetime.now(UTC) - timedelta(seconds=1)
        shop = await client.create_run("shop", labels={"team": "billing"})
        await client.call_turn(shop.id, 0, [ToolCall("quote", {"sku": "ab"})])
        await client.complete_run(shop.id, None)
        idle = await client.create_run("idle")
        branch = await client.fork_run(shop.id)

        def ids(page: Any) -> list[str]:
            return [run.id for run in page.runs]

        assert ids(await client.list_runs(branch_of=shop.id)) == [branch.id]
        assert ids(await client.list_runs(tool="quote")) == [shop.id]
        assert ids(await client.list_runs(labels={"team": "billing"}, status="completed")) == [
            shop.id
        ]
        assert ids(await client.list_runs(agent="idle")) == [idle.id]
        assert ids(await client.list_runs(created_before=started)) == []
        everything = ids(await client.list_runs(created_after=started))
        assert everything == [branch.id, idle.id, shop.id], "newest first"
        first = await client.list_runs(page_size=2)
        assert ids(first) == everything[:2] and first.next_page_token
        rest = await client.list_runs(page_size=2, page_token=first.next_page_token)
        assert ids(rest) == everything[2:] and not rest.next_page_token
        with pytest.raises(ValueError, match="unknown run status 'done'"):
            await client.list_runs(status="done")
        with pytest.raises(ValueError, match="created_after: give a timezone-aware"):
            await client.list_runs(created_after=datetime.now())
        with pytest.raises(KernelError) as refused:
            await client.list_runs(branch_of="not-a-run")
        assert "forked_from_run_id" in str(refused.value)


async def test_at_capture_none_a_branchs_refusal_withholds_its_reason(
    kernel: Kernel, client: AgentClient
) -> None:
    charged.clear()
    async with serving(kernel, quote, pay):
        run = await client.create_run("shop", capture="none")
        await client.call_turn(run.id, 0, [ToolCall("pay", {"cents": 200})])
        await client.complete_run(run.id, {"done": True})
        branch = await client.fork_run(run.id, at="t0/p0")
        [refused] = (
            await client.call_turn(branch.id, 1, [ToolCall("pay", {"cents": 300})])
        ).results
        assert refused.outcome == CallOutcome.WRITE_TOOL_BLOCKED
        assert refused.content.startswith("write_tool_blocked: 'pay'"), refused.content
        assert refused.content.endswith("(reason withheld: capture=none)"), refused.content
        ended = (await client.get_run(branch.id)).run
        assert ended.reason == "write_tool_blocked: pay (reason withheld: capture=none)"
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
    """Runs the steps, calls and subagents its input lists, in order, catching each one's error:
    `{"once": id}`, `{"step": id, "effect": ...}`, `{"call": tool, "args": {...}}`, `{"child":
    agent, "input": ...}`."""
    out: list[object] = []
    for op in script["ops"]:

        def ran(info: StepInfo, name: str = op.get("once") or op.get("step", "")) -> str:
            STEPS_RAN.append(name)
            return name

        # Each error is caught and the script goes on: a branch's refusal ends the run all the
        # same.
        try:
            if "child" in op:
                out.append(await ctx.subagent(op["child"], op["input"]))
            elif "once" in op:
                out.append(await ctx.once(op["once"], ran))
            elif "step" in op:
                out.append(await ctx.step(op["step"], ran, effect=op["effect"]))
            else:
                out.append((await ctx.call(op["call"], op["args"])).content)
        except Exception as error:  # noqa: BLE001 (the script shows what a caught error changes)
            out.append(f"error: {error}")
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
        assert (await ended_run(client, parent.id)).status == "completed"
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
        ended = await ended_run(client, branch.id)
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
        ended = await ended_run(client, other.id)
        assert ended.reason == "write_tool_blocked: ctx.step:other (reason: step)"
        assert "other" not in STEPS_RAN


@agent
async def py_child(ctx: AgentContext, input: dict[str, Any]) -> dict[str, object]:
    """Does its write step once, and says its label and its run."""
    await ctx.step("work", lambda info: STEPS_RAN.append(f"work:{input['label']}"))
    return {"label": input["label"], "run_id": ctx.run_id}


async def test_a_hosted_branch_replays_a_recorded_subagent_or_branches_it_and_refuses_a_new_one(
    kernel: Kernel, client: AgentClient
) -> None:
    STEPS_RAN.clear()
    async with serving(kernel, agents=[py_script, py_child]):

        def child(label: str) -> dict[str, Any]:
            return {"ops": [{"child": "py_child", "input": {"label": label}}]}

        parent = await client.create_run("py_script", input=child("a"), hosted=True)
        recorded = await ended_run(client, parent.id)
        assert recorded.status == "completed", recorded
        assert STEPS_RAN == ["work:a"]

        # The same child again replays its output: no second child runs.
        same = await client.fork_run(parent.id)
        assert (await ended_run(client, same.id)).output == recorded.output
        assert STEPS_RAN == ["work:a"]

        # With another input the child runs as a branch of the recorded one: its recorded write
        # step replays, and its output says the new label.
        other = await client.fork_run(parent.id, input=child("b"))
        [output] = (await ended_run(client, other.id)).output
        assert output["label"] == "b", output
        grandchild = (await client.get_run(output["run_id"])).run
        assert grandchild.forked_from_run_id == recorded.output[0]["run_id"]
        assert grandchild.parent_run_id == other.id
        assert STEPS_RAN == ["work:a"], "the child's write step replayed"

        # A subagent the parent never started is refused as an effect.
        new_agent = {"ops": [{"child": "py_script", "input": {"ops": []}}]}
        refused = await client.fork_run(parent.id, input=new_agent)
        ended = await ended_run(client, refused.id)
        assert ended.reason == "write_tool_blocked: subagent:py_script (reason: effect)"


async def test_a_hosted_case_run_runs_the_step_its_token_allows_and_refuses_the_others(
    kernel: Kernel, client: AgentClient
) -> None:
    STEPS_RAN.clear()
    async with serving(kernel, agents=[py_script]):
        script = {
            "ops": [
                {"step": "save", "effect": "write"},
                {"step": "mail", "effect": "write"},
            ]
        }
        case = await client.create_run("py_script", input=script, hosted=True, allow=["step:save"])
        ended = await ended_run(client, case.id)
        assert ended.reason == "write_tool_blocked: ctx.step:mail (reason: step)", ended
        assert STEPS_RAN == ["save"], "the token's step ran, the other never"
        steps = {s.step_key: s for s in (await client.get_run(case.id)).steps}
        assert steps["step:save#0"].decided_by == "allow:step:save"


LOOKUP_HELD = asyncio.Event()


@tool(read_only=True)
async def held_lookup(ctx: ToolContext, q: str) -> str:
    """Looks `q` up, once the test lets it."""
    await LOOKUP_HELD.wait()
    return f"found {q}"


async def test_a_suspended_branch_whose_parent_was_deleted_ends_unresumable(
    kernel: Kernel, client: AgentClient
) -> None:
    LOOKUP_HELD.clear()
    async with serving(kernel, quote, held_lookup, agents=[py_script]):
        recorded = {"ops": [{"call": "quote", "args": {"sku": "ab"}}]}
        parent = await client.create_run("py_script", input=recorded, hosted=True)
        assert (await ended_run(client, parent.id)).status == "completed"
        waits = {"ops": [{"call": "held_lookup", "args": {"q": "x"}}]}
        branch = await client.fork_run(parent.id, input=waits)

        async def suspended() -> bool:
            return (await client.get_run(branch.id)).run.status == RunStatus.SUSPENDED

        # Waiting on the live read, the handler gives back its slot.
        await eventually("the branch to suspend", suspended)
        deleted = subprocess.run(
            [
                str(binary("kernelctl")),
                "--addr",
                f"http://{kernel.addr}",
                "runs",
                "delete",
                parent.id,
            ],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert deleted.returncode == 0, deleted.stderr
        LOOKUP_HELD.set()
        ended = await ended_run(client, branch.id)
        assert ended.status == "failed", ended
        assert ended.reason.startswith("branch_unresumable: parent_missing"), ended.reason
