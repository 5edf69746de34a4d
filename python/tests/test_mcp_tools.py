"""`wrap_mcp_tools` over the official `mcp` package: a real MCP server (`MCPServer`) and its
`Client`, in memory, their `Tool` descriptors and `CallToolResult`s; plain dicts as the protocol
sends them; and the wrapped tools served by a worker, their calls recorded by the kernel."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from conftest import pending_approval, serving
from harness import Kernel, within
from mcp.client import Client
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError as McpToolError
from mcp.types import ToolAnnotations
from pydantic import BaseModel

from kernel_sdk import (
    AgentClient,
    CallOutcome,
    ToolCall,
    ToolContext,
    ToolDefinitionError,
    ToolError,
)
from kernel_sdk.mcp import wrap_mcp_tool, wrap_mcp_tools


class Hits(BaseModel):
    hits: list[str]


def docs_server() -> MCPServer:
    server = MCPServer("docs")

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def search(query: str, limit: int | None = None) -> Hits:
        """Searches the docs."""
        return Hits(hits=[f"{query}:{limit or 2}"])

    @server.tool(annotations=ToolAnnotations(destructive_hint=False))
    def note(text: str) -> str:
        """Adds a note."""
        return f"noted {text}"

    @server.tool()
    def wipe(table: str) -> str:
        """Wipes a table."""
        raise McpToolError(f"{table} is not yours")

    return server


async def test_an_mcp_servers_tools_wrap_with_their_schema_hints_and_results() -> None:
    async with Client(docs_server()) as docs:
        tools = wrap_mcp_tools(await docs.list_tools(), call=docs.call_tool, prefix="docs")
        by_name = {t.name: t for t in tools}
        assert sorted(by_name) == ["docs_note", "docs_search", "docs_wipe"]
        search = by_name["docs_search"]
        assert search.definition.description == "Searches the docs."
        assert "query" in search.definition.input_schema["properties"]
        effects = {
            n: (
                t.definition.options.read_only,
                t.definition.options.writes,
                t.definition.options.idempotency,
            )
            for n, t in by_name.items()
        }
        # The Rust SDK's rules: a hint says what it says, and a tool that does not say it is
        # idempotent may have run, so it is at_most_once.
        assert effects == {
            "docs_search": (True, False, "safe_to_retry"),
            "docs_note": (False, False, "at_most_once"),
            "docs_wipe": (False, False, "at_most_once"),
        }
        assert search.definition.version.startswith("mcp.") and len(search.definition.version) == 20

        ctx = ToolContext.for_test()
        # The server sees the bare name; nulls are gone; structured content comes first.
        assert await search.invoke(ctx, {"query": "lease", "limit": None}) == {"hits": ["lease:2"]}
        # A typed return is structured content too: the server wraps a string as {"result": ...}.
        assert await by_name["docs_note"].invoke(ctx, {"text": "hi"}) == {"result": "noted hi"}
        with pytest.raises(ToolError, match="orders is not yours") as failed:
            await by_name["docs_wipe"].invoke(ctx, {"table": "orders"})
        assert failed.value.kind == "fatal"


async def test_plain_dict_descriptors_and_results_wrap_too() -> None:
    calls: list[tuple[str, dict[str, Any]]] = []

    def call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
        calls.append((name, arguments))
        return {"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}

    descriptor = {
        "name": "fetch",
        "description": "Fetches a page.",
        "inputSchema": {"type": "object", "properties": {"url": {"type": "string"}}},
        "annotations": {"readOnlyHint": True},
    }
    fetch = wrap_mcp_tool(descriptor, call=call)
    assert fetch.name == "fetch" and fetch.definition.options.read_only
    assert await fetch(url="x", lang=None) == "a\nb"
    assert calls == [("fetch", {"url": "x"})]

    raw = wrap_mcp_tool(
        descriptor, call=call, to_result=lambda r: r, strip_nulls=False, writes=True
    )
    assert await raw(url="y", lang=None) == {
        "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]
    }
    assert calls[-1] == ("fetch", {"url": "y", "lang": None})
    assert raw.definition.options.writes and not raw.definition.options.read_only
    bare = wrap_mcp_tool({"name": "bare"}, call=call).definition
    assert bare.options.idempotency == "at_most_once" and bare.description == "bare (an MCP tool)"
    destructive = {"name": "drop", "annotations": {"destructiveHint": True}}
    assert wrap_mcp_tool(destructive, call=call).definition.options.writes
    # A changed definition is another version, so its recorded calls diverge on replay.
    other = wrap_mcp_tool({**descriptor, "description": "Other."}, call=call)
    assert fetch.definition.version != other.definition.version

    # Ids keep to the kernel's characters; one too long, or taken, is left out of a list.
    assert wrap_mcp_tool({"name": "get.page"}, call=call, prefix="web").name == "web_get_page"
    listed = wrap_mcp_tools([{"name": "a" * 70}, {"name": "x.y"}, {"name": "x_y"}], call=call)
    assert [t.name for t in listed] == ["x_y"]
    images = {"content": [{"type": "image", "data": "AA==", "mimeType": "image/png"}]}
    shown = wrap_mcp_tool(descriptor, call=lambda name, args: images)
    assert await shown(url="x") == images["content"]

    with pytest.raises(TypeError, match="list_tools"):
        wrap_mcp_tools({"name": "x"}, call=call)


async def test_wrapped_mcp_tools_served_by_a_worker_are_recorded_by_the_kernel(
    kernel: Kernel, client: AgentClient
) -> None:
    async with Client(docs_server()) as docs:
        tools = wrap_mcp_tools(await docs.list_tools(), call=docs.call_tool, prefix="docs")
        async with serving(kernel, *tools):
            run = await client.create_run("mcp-agent")
            turn = await client.call_turn(
                run.id,
                0,
                [
                    ToolCall("docs_search", {"query": "replay"}),
                    ToolCall("docs_wipe", {"table": "runs"}),
                ],
            )
            [found, wiped] = turn.results
            assert found.outcome == CallOutcome.OK and found.output == {"hits": ["replay:2"]}
            assert wiped.outcome == CallOutcome.TOOL_ERROR and "runs is not yours" in wiped.content
            steps = {s.tool: s for s in (await client.get_run(run.id)).steps}
            assert steps["docs_search"].arguments == {"query": "replay"}


async def test_requires_approval_may_name_the_server_tools_a_person_is_asked_about(
    kernel: Kernel, client: AgentClient
) -> None:
    async with Client(docs_server()) as docs:
        listed = await docs.list_tools()
        with pytest.raises(ToolDefinitionError, match="does not list: wipe_all"):
            wrap_mcp_tools(listed, call=docs.call_tool, requires_approval=("wipe_all",))
        tools = wrap_mcp_tools(
            listed, call=docs.call_tool, prefix="docs", requires_approval=("note",)
        )
        gates = {t.name: t.definition.options.requires_approval for t in tools}
        assert gates == {"docs_search": False, "docs_note": True, "docs_wipe": False}
        async with serving(kernel, *tools):
            run = await client.create_run("mcp-agent")
            calls = [
                ToolCall("docs_search", {"query": "gates"}),
                ToolCall("docs_note", {"text": "x"}),
            ]
            turn = asyncio.ensure_future(client.call_turn(run.id, 0, calls))
            approval = await pending_approval(client, run.id, "the note to be asked about")
            assert [a.tool for a in await client.list_approvals(run_id=run.id)] == ["docs_note"]
            await client.approve(approval, decider="alice")
            found, noted = (await within("the turn", turn, 30)).results
            assert found.output == {"hits": ["gates:2"]} and found.approval is None
            assert noted.output == {"result": "noted x"} and noted.approval is not None
            assert noted.approval.decider == "alice"
