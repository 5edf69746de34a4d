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
(`approve`, `reject`, `decline` or `cancel`, or an object: the form's content, for a tool's own
question); each form asked is printed with its schema. A `meta` value
`$last_run` stands for the run the previous result named (its `_meta` `kernel/run`). With
MCP_CLIENT_NO_FORMS=1 the client declares no elicitation, so it cannot be asked anything. With
MCP_CLIENT_TASKS=1 it declares the tasks extension (`io.modelcontextprotocol/tasks`, with
`kernel_sdk.mcp_tasks`, since the package ships no client for it): a call the server returns as a
task is polled until it ends, each status and failed poll printed; its forms are answered with
`tasks/update`, and a call's `cancel_after` (seconds) gives up on it that long after it began,
which cancels its task.
"""

import asyncio
import json
import math
import os
import sys
from typing import Any

import anyio
import mcp_types
from kernel_sdk.mcp_tasks import CreateTaskResult, Task, TasksExtension
from mcp import Client, ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def tasks_extension() -> TasksExtension:
    """The SDK's tasks client, each status and failed poll printed."""

    def status(task: Task | CreateTaskResult) -> None:
        emit(
            {
                "task": {
                    "id": task.task_id,
                    "status": task.status,
                    "message": task.status_message,
                }
            }
        )

    def unreachable(error: Exception) -> None:
        emit({"poll_error": str(error)})

    return TasksExtension(on_status=status, on_unreachable=unreachable)


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
    answers: list[Any] = []

    async def form(_context: Any, params: Any) -> Any:
        schema = getattr(params, "requested_schema", None)
        emit({"asked": {"message": params.message, "schema": schema}})
        answer = answers[0] if answers else "cancel"
        if isinstance(answer, dict):
            return mcp_types.ElicitResult(action="accept", content=answer)
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
        extensions=[tasks_extension()] if tasks else None,
    ) as mcp:
        emit({"protocol_version": mcp.protocol_version})
        emit_tools(await mcp.list_tools())
        last_run = None
        for call in calls:
            answers[:] = [call["answer"]] if "answer" in call else []
            meta = {
                key: last_run if value == "$last_run" else value
                for key, value in (call.get("meta") or {}).items()
            }

            try:
                with anyio.move_on_after(
                    call.get("cancel_after", math.inf)
                ) as deadline:
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
            if deadline.cancelled_caught:
                message = f"given up after {call['cancel_after']}s"
                emit({"error": {"tool": call["tool"], "message": message}})
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
