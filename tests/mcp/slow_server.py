"""An MCP server on the official `mcp` package, for the cancellation test: its tool `wait` reports
progress once, then waits; when the client cancels the request (`notifications/cancelled`), the
handler is interrupted and appends `cancelled` to the file named by the first argument.

    python3 slow_server.py MARKER_FILE
"""

import sys
from pathlib import Path

import anyio
from mcp.server.mcpserver import Context, MCPServer

MARKER = Path(sys.argv[1])
server = MCPServer("slow")


def mark(what: str) -> None:
    with MARKER.open("a") as marker:
        marker.write(what + "\n")


@server.tool()
async def wait(ctx: Context, seconds: float = 3600) -> str:
    """Waits `seconds`, unless the request is cancelled first."""
    mark("started")
    await ctx.report_progress(0, 1, "waiting")
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        mark("cancelled")
        raise
    return "waited"


if __name__ == "__main__":
    server.run()
