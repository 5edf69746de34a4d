"""An MCP client for the end-to-end tests, on the official `mcp` package: connects to the kernel's
MCP server over stdio or Streamable HTTP, lists its tools, calls the ones asked for in order, and
prints one JSON line per thing it sees (tools, progress, result) so the test can follow along.

    python3 client.py stdio '["kernelctl", "--addr", "http://...", "mcp", "serve"]' '[{"tool": "add", "arguments": {"a": 1, "b": 2}}]'
    python3 client.py http http://127.0.0.1:8080/mcp '[...]' '{"Authorization": "Bearer ..."}'

With MCP_CLIENT_KEEP_SESSION=1 in its environment an HTTP client leaves without deleting its
session, as a client that crashed or lost its network would.

With MCP_CLIENT_REVISION=2026-07-28 it speaks that revision (no session: `server/discover`, then
each request on its own, with `_meta`), through the package's `Client`. A call may then carry
`meta` (its `_meta`) and `answer`: what the client's user answers a form the server asks
(`approve`, `reject`, `decline` or `cancel`); each form asked is printed. A `meta` value
`$last_run` stands for the run the previous result named (its `_meta` `kernel/run`). With
MCP_CLIENT_NO_FORMS=1 the client declares no elicitation, so it cannot be asked anything. With
MCP_CLIENT_TASKS=1 it declares the tasks extension (`io.modelcontextprotocol/tasks`, which the
package does not ship: `TasksExtension` below is it, on the package's extension hooks): a call the
server returns as a task is polled with `tasks/get` until it ends, each status printed, through
the server going away for a while; its `input_required` forms are answered with `tasks/update`,
and a call's `cancel_after` (seconds) sends `tasks/cancel` that long after the task began.
"""

import asyncio
import json
import os
import sys
import time
from typing import Any, Literal

import mcp_types
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientRequestContext
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


class _TaskFields(mcp_types.Result):
    task_id: str
    status: Literal["working", "input_required", "completed", "failed", "cancelled"]
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class CreateTaskResult(_TaskFields):
    """A `tools/call` answered with a task (`resultType: "task"`)."""

    result_type: Literal["task"]


class GetTaskResult(_TaskFields):
    result_type: str = "complete"
    input_requests: dict[str, Any] | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


class TaskIdParams(mcp_types.RequestParams):
    task_id: str


class UpdateTaskParams(TaskIdParams):
    input_responses: dict[str, Any]


class GetTask(mcp_types.Request[TaskIdParams, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: TaskIdParams
    name_param = "taskId"


class UpdateTask(mcp_types.Request[UpdateTaskParams, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: UpdateTaskParams
    name_param = "taskId"


class CancelTask(mcp_types.Request[TaskIdParams, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams
    name_param = "taskId"


# The call being made, for the task resolver: its `cancel_after`.
CURRENT_CALL: dict[str, Any] = {}


async def resolve_task(
    handle: CreateTaskResult, ctx: ClaimContext
) -> mcp_types.CallToolResult:
    """Polls a task until it ends; answers its forms; rides out the server's absence."""
    session = ctx.session
    emit({"task": {"id": handle.task_id, "status": handle.status}})
    began = time.monotonic()
    cancel_after = CURRENT_CALL.get("cancel_after")
    answered: set[str] = set()
    last = handle.status
    failing_since: float | None = None
    while True:
        await asyncio.sleep((handle.poll_interval_ms or 1000) / 1000)
        if cancel_after is not None and time.monotonic() - began >= cancel_after:
            cancel_after = None
            await session.send_request(
                CancelTask(params=TaskIdParams(task_id=handle.task_id)),
                mcp_types.EmptyResult,
            )
            emit({"task_cancel_sent": handle.task_id})
        try:
            task = await session.send_request(
                GetTask(params=TaskIdParams(task_id=handle.task_id)), GetTaskResult
            )
        except Exception as error:
            failing_since = failing_since or time.monotonic()
            if time.monotonic() - failing_since > 60:
                raise
            emit({"poll_error": str(error)})
            continue
        failing_since = None
        if task.status != last:
            emit(
                {
                    "task": {
                        "id": task.task_id,
                        "status": task.status,
                        "message": task.status_message,
                    }
                }
            )
            last = task.status
        if task.status == "completed":
            return mcp_types.CallToolResult.model_validate(task.result, by_name=False)
        if task.status in ("failed", "cancelled"):
            return mcp_types.CallToolResult(
                content=[
                    mcp_types.TextContent(type="text", text=f"task {task.status}")
                ],
                is_error=True,
            )
        if task.status == "input_required":
            todo = {
                k: r
                for k, r in (task.input_requests or {}).items()
                if k not in answered
            }
            responses = {}
            for key, request in todo.items():
                parsed = mcp_types.ElicitRequest.model_validate(request)
                result = await session.dispatch_input_request(
                    ClientRequestContext(session=session, request_id=key), parsed
                )
                responses[key] = result.model_dump(by_alias=True, exclude_none=True)
            if responses:
                await session.send_request(
                    UpdateTask(
                        params=UpdateTaskParams(
                            task_id=handle.task_id, input_responses=responses
                        )
                    ),
                    mcp_types.EmptyResult,
                )
                answered |= responses.keys()


class TasksExtension(ClientExtension):
    """The client side of `io.modelcontextprotocol/tasks`."""

    identifier = "io.modelcontextprotocol/tasks"

    def claims(self) -> list[ResultClaim[Any]]:
        return [
            ResultClaim(
                result_type="task", model=CreateTaskResult, resolve=resolve_task
            )
        ]


async def emit_progress(value: float, total: float | None, message: str | None) -> None:
    emit({"progress": value, "total": total, "message": message})


def emit_tools(listed: Any) -> None:
    emit(
        {
            "tools": [
                {
                    "name": tool.name,
                    "annotations": tool.annotations.model_dump(exclude_none=True)
                    if tool.annotations
                    else {},
                    "schema": tool.input_schema,
                }
                for tool in listed.tools
            ]
        }
    )


def emit_result(tool: str, result: Any) -> None:
    emit(
        {
            "result": {
                "tool": tool,
                "is_error": bool(getattr(result, "is_error", False)),
                "text": [
                    block.text
                    for block in getattr(result, "content", [])
                    if block.type == "text"
                ],
                "structured": getattr(result, "structured_content", None),
                "meta": getattr(result, "meta", None),
            }
        }
    )


async def modern(server: Any, calls: list[dict[str, Any]]) -> None:
    """The calls at 2026-07-28: no session, each request with its own `_meta`."""
    answers: list[str] = []

    async def form(_context: Any, params: Any) -> Any:
        emit({"asked": {"message": params.message}})
        answer = answers[0] if answers else "cancel"
        if answer in ("decline", "cancel"):
            return mcp_types.ElicitResult(action=answer)
        return mcp_types.ElicitResult(
            action="accept",
            content={"decision": answer, "reason": "from the e2e client"},
        )

    no_forms = os.environ.get("MCP_CLIENT_NO_FORMS") == "1"
    tasks = os.environ.get("MCP_CLIENT_TASKS") == "1"
    async with Client(
        server,
        mode="2026-07-28",
        client_info=Implementation(name="e2e-client", version="1.0"),
        elicitation_callback=None if no_forms else form,
        extensions=[TasksExtension()] if tasks else None,
    ) as mcp:
        emit({"protocol_version": mcp.protocol_version})
        emit_tools(await mcp.list_tools())
        last_run = None
        for call in calls:
            answers[:] = [call["answer"]] if "answer" in call else []
            CURRENT_CALL.clear()
            CURRENT_CALL.update(call)
            meta = {
                key: last_run if value == "$last_run" else value
                for key, value in (call.get("meta") or {}).items()
            }

            try:
                result = await mcp.call_tool(
                    call["tool"],
                    call.get("arguments", {}),
                    read_timeout_seconds=call.get("timeout"),
                    progress_callback=emit_progress,
                    meta=meta or None,
                )
            except Exception as error:  # noqa: BLE001 - the test reads what happened
                emit({"error": {"tool": call["tool"], "message": str(error)}})
                continue
            last_run = (result.meta or {}).get("kernel/run", last_run)
            emit_result(call["tool"], result)


async def session(read: Any, write: Any, calls: list[dict[str, Any]]) -> None:
    client_info = Implementation(name="e2e-client", version="1.0")
    async with ClientSession(read, write, client_info=client_info) as mcp:
        await mcp.initialize()
        emit_tools(await mcp.list_tools())
        for call in calls:
            try:
                result = await mcp.call_tool(
                    call["tool"],
                    call.get("arguments", {}),
                    read_timeout_seconds=call.get("timeout"),
                    progress_callback=emit_progress,
                )
            except Exception as error:  # noqa: BLE001 - the test reads what happened
                emit({"error": {"tool": call["tool"], "message": str(error)}})
                continue
            emit_result(call["tool"], result)


async def main() -> None:
    mode, target, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    if os.environ.get("MCP_CLIENT_REVISION") == "2026-07-28":
        await modern_at(mode, target, calls)
        return
    if mode == "stdio":
        argv = json.loads(target)
        async with stdio_client(
            StdioServerParameters(command=argv[0], args=argv[1:])
        ) as (read, write):
            await session(read, write, calls)
    else:
        import httpx2 as httpx

        headers = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
        async with (
            httpx.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(
                target,
                http_client=http,
                terminate_on_close=os.environ.get("MCP_CLIENT_KEEP_SESSION") != "1",
            ) as streams,
        ):
            await session(streams[0], streams[1], calls)


async def modern_at(mode: str, target: str, calls: list[dict[str, Any]]) -> None:
    if mode == "stdio":
        argv = json.loads(target)
        await modern(StdioServerParameters(command=argv[0], args=argv[1:]), calls)
        return
    import httpx2 as httpx

    headers = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        await modern(streamable_http_client(target, http_client=http), calls)


if __name__ == "__main__":
    asyncio.run(main())
