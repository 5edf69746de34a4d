"""An MCP client for the end-to-end tests, on the official `mcp` package: connects to the kernel's
MCP server over stdio or Streamable HTTP, lists its tools, calls the ones asked for in order, and
prints one JSON line per thing it sees (tools, progress, result) so the test can follow along.

    python3 client.py stdio '["kernelctl", "--addr", "http://...", "mcp", "serve"]' '[{"tool": "add", "arguments": {"a": 1, "b": 2}}]'
    python3 client.py http http://127.0.0.1:8080/mcp '[...]' '{"Authorization": "Bearer ..."}'

With MCP_CLIENT_KEEP_SESSION=1 in its environment an HTTP client leaves without deleting its
session, as a client that crashed or lost its network would.
"""

import asyncio
import json
import os
import sys
from typing import Any

from mcp import ClientSession, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


async def session(read: Any, write: Any, calls: list[dict[str, Any]]) -> None:
    client_info = Implementation(name="e2e-client", version="1.0")
    async with ClientSession(read, write, client_info=client_info) as mcp:
        await mcp.initialize()
        listed = await mcp.list_tools()
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
        for call in calls:

            async def progress(
                value: float, total: float | None, message: str | None
            ) -> None:
                emit({"progress": value, "total": total, "message": message})

            try:
                result = await mcp.call_tool(
                    call["tool"],
                    call.get("arguments", {}),
                    read_timeout_seconds=call.get("timeout"),
                    progress_callback=progress,
                )
            except Exception as error:  # noqa: BLE001 - the test reads what happened
                emit({"error": {"tool": call["tool"], "message": str(error)}})
                continue
            emit(
                {
                    "result": {
                        "tool": call["tool"],
                        "is_error": bool(getattr(result, "is_error", False)),
                        "text": [
                            block.text
                            for block in getattr(result, "content", [])
                            if block.type == "text"
                        ],
                        "structured": getattr(result, "structured_content", None),
                    }
                }
            )


async def main() -> None:
    mode, target, calls = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
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


if __name__ == "__main__":
    asyncio.run(main())
