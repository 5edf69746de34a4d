"""`kernel_sdk.mcp_tasks` with the official `mcp` client against the kernel's MCP bridge
(`kernelctl mcp serve --listen`) at 2026-07-28: a slow call is a task polled to its result, a
call that waits for a person is a task whose form the client's callback answers, and cancelling
the awaiting code cancels the task's call in the kernel."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import mcp_types
import pytest
from conftest import serving
from harness import Kernel, Process, binary, eventually, within
from mcp import Client
from mcp.client.session import ClientRequestContext

from kernel_sdk import AgentClient, ToolContext, tool
from kernel_sdk.mcp_tasks import CreateTaskResult, Task, TasksExtension


@tool()
async def nap(ctx: ToolContext, seconds: float) -> str:
    """Sleeps, then says so."""
    await asyncio.sleep(seconds)
    return f"slept {seconds}s"


@tool(writes=True, requires_approval=True)
async def refund(customer: str, cents: int) -> str:
    """Refunds a customer, once a person approves."""
    return f"refunded {cents} cents to {customer}"


@pytest.fixture
async def bridge(kernel: Kernel) -> AsyncIterator[str]:
    """`kernelctl mcp serve --listen` on a free port, with a worker serving the tools."""
    process = Process(
        [
            str(binary("kernelctl")),
            "--addr",
            kernel.addr,
            "mcp",
            "serve",
            "--listen",
            "127.0.0.1:0",
        ],
        "kernelctl-mcp",
    )
    line = process.wait_for("mcp server listening on")
    async with serving(kernel, nap, refund):
        try:
            yield line.split("listening on ")[1].strip()
        finally:
            process.stop()


async def test_a_slow_call_is_a_task_polled_to_its_result(bridge: str) -> None:
    seen: list[str] = []

    def status(task: Task | CreateTaskResult) -> None:
        seen.append(task.status)

    async with Client(
        bridge, mode="2026-07-28", extensions=[TasksExtension(on_status=status)]
    ) as mcp:
        result = await within("the task's result", mcp.call_tool("nap", {"seconds": 2.5}))
        quick = await mcp.call_tool("nap", {"seconds": 0})
    assert isinstance(result, mcp_types.CallToolResult)
    assert [block.text for block in result.content if block.type == "text"] == ["slept 2.5s"]
    assert seen == ["working", "completed"]
    assert [block.text for block in quick.content if block.type == "text"] == ["slept 0.0s"]
    assert seen == ["working", "completed"], "a quick call is no task"


async def test_a_task_waiting_for_a_person_is_answered_by_the_clients_callback(
    bridge: str, client: AgentClient
) -> None:
    asked: list[str] = []

    async def approve(
        context: ClientRequestContext, params: mcp_types.ElicitRequestParams
    ) -> mcp_types.ElicitResult | mcp_types.ErrorData:
        asked.append(params.message)
        return mcp_types.ElicitResult(
            action="accept", content={"decision": "approve", "reason": "ok"}
        )

    async with Client(
        bridge, mode="2026-07-28", extensions=[TasksExtension()], elicitation_callback=approve
    ) as mcp:
        result = await within(
            "the approved call", mcp.call_tool("refund", {"customer": "c1", "cents": 500})
        )
    assert [block.text for block in result.content if block.type == "text"] == [
        "refunded 500 cents to c1"
    ]
    assert len(asked) == 1 and asked[0].startswith("Approve the call of 'refund'"), asked
    run_id = (result.meta or {})["kernel/run"]
    consumed = await client.list_approvals(run_id=run_id, status="consumed")
    assert [approval.decider for approval in consumed] == ["mcp client mcp"]


async def test_cancelling_the_awaiting_code_cancels_the_tasks_call(
    bridge: str, client: AgentClient
) -> None:
    seen: list[Task | CreateTaskResult] = []
    async with Client(
        bridge, mode="2026-07-28", extensions=[TasksExtension(on_status=seen.append)]
    ) as mcp:
        with anyio.move_on_after(2.0) as scope:
            await mcp.call_tool("nap", {"seconds": 60})
    assert scope.cancelled_caught
    assert [task.status for task in seen] == ["working"]
    run_id = seen[0].task_id.split(":")[0]

    async def cancelled() -> bool:
        steps = (await client.get_run(run_id)).steps
        return steps[0].status == "cancelled"

    assert await eventually("the task's call to be cancelled", cancelled)
    step = (await client.get_run(run_id)).steps[0]
    assert "tasks/cancel" in (step.error or ""), step
