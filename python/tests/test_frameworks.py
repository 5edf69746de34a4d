"""The agent frameworks' own tool loops, with kernel tools, in hosted agents on a worker process
against the real kernel: LangGraph's `create_agent`, the OpenAI Agents SDK's `Runner` and a
Pydantic AI `Agent`, each with a scripted model whose answers the run records. Every call the
framework makes is a step of the run; a denied call reaches the model as text; a call waiting
for a person parks the run, which outlives a SIGKILL of the process hosting it and goes on where
another process picks it up, with the model's answers and the calls recorded before the kill
replayed rather than asked or run again.
"""

from __future__ import annotations

from pathlib import Path

import framework_agents
import pytest
from conftest import ended_events, pending_approval
from harness import Kernel, Process, eventually, python_worker, within

from kernel_sdk import AgentClient


@pytest.mark.parametrize("agent_name", ["lc_support", "oa_support", "pa_support"])
async def test_a_framework_agents_tool_calls_go_through_the_kernel_and_outlive_a_sigkill(
    tmp_path: Path, agent_name: str
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text('deny_list: ["fw_wipe"]\n')
    kernel = Kernel(tmp_path, "--policy", str(policy))
    first = python_worker(kernel, "--frameworks", "--name", "first")
    second: Process | None = None
    try:
        async with AgentClient(kernel.addr) as client:
            await first.said("worker session open")
            run = await client.create_run(agent_name, input=framework_agents.QUESTION, hosted=True)

            approval = await pending_approval(client, run.id, "the refund to wait for a person")
            await first.said("started tool=fw_lookup")

            async def looked_up() -> bool:
                steps = (await client.get_run(run.id)).steps
                return any(s.tool == "fw_lookup" and s.status == "succeeded" for s in steps)

            # Killed once the lookup's result is recorded: a call cut short runs again.
            await eventually("the lookup's result to be recorded", looked_up)
            assert not any("started tool=fw_refund" in line for line in first.lines)
            first.kill9()

            second = python_worker(kernel, "--frameworks", "--name", "second")
            await second.said("worker session open")
            await client.approve(approval, decider="ops", reason="refund ok")
            events = await within("the run to end", ended_events(client, run.id), 60)
            detail = await client.get_run(run.id)
            assert detail.run.status == "completed", (detail.run.reason, second.log())
            said = detail.run.output
            assert "A1" in str(said["fw_lookup"]), said
            assert "fw_wipe not allowed. reason:" in str(said["fw_wipe"]), said
            assert "refunded 250 on A1" in str(said["fw_refund"]), said

            # Each framework call is a step of the run, settled once.
            calls = {s.tool: s for s in detail.steps if s.tool.startswith("fw_")}
            assert {tool: s.outcome for tool, s in calls.items()} == {
                "fw_lookup": "ok",
                "fw_wipe": "denied",
                "fw_refund": "ok",
            }
            assert calls["fw_lookup"].attempts == 1
            assert calls["fw_refund"].decided_by == "tool:requires_approval"
            # The model's three calls were one turn, as one response's calls are.
            assert len({s.turn for s in calls.values()}) == 1, [s.step_key for s in calls.values()]
            # The model answered twice in all: its first answer, given before the kill, was
            # replayed from the record.
            assert sum("model asked" in line for line in first.lines) == 1
            assert sum("model asked" in line for line in second.lines) == 1, second.log()
            models = [s for s in detail.steps if s.step_key.startswith("step:model#")]
            assert [s.status for s in models] == ["succeeded", "succeeded"], models
            # The lookup ran once, before the kill; the second process replayed its record and
            # ran only the approved refund.
            assert not any("started tool=fw_lookup" in line for line in second.lines)
            assert sum("started tool=fw_refund" in line for line in second.lines) == 1, second.log()
            assert any(e.type == "run:interrupted" for e in events), [e.type for e in events]
    finally:
        first.stop()
        if second is not None:
            second.stop()
        kernel.stop()
