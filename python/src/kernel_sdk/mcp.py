"""MCP servers' tools as kernel tools (Rebuno's `rebuno.mcp`): each MCP tool becomes a `wrap_tool`
tool, so a worker serves it, the kernel records, checks and replays its calls, and the
frameworks (`kernel_sdk.integrations`) can hand it to a model like any other tool.

```python
async with Client("http://localhost:8000/mcp") as docs:
    tools = wrap_mcp_tools(await docs.list_tools(), call=docs.call_tool, prefix="docs")
    await Worker(kernel, tools).run()
```

A descriptor is the official `mcp` package's `Tool` (or anything with the same attributes, such
as a fastmcp tool) or a plain dict as the protocol sends it. The MCP package itself is not
needed here: the worker that serves the tools holds the session.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .errors import ToolError
from .tools import Tool, ToolDefinitionError, wrap_tool

McpCall = Callable[[str, dict[str, Any]], Any]
"""`call(name, arguments)`: calls the tool on its server, as `ClientSession.call_tool` does, and
gives (or returns an awaitable of) its `CallToolResult`."""


def wrap_mcp_tools(
    descriptors: Any,
    *,
    call: McpCall,
    prefix: str = "",
    to_result: Callable[[Any], Any] | None = None,
    strip_nulls: bool = True,
    **options: Any,
) -> list[Tool]:
    """Each tool of `descriptors` (a `list_tools()` result, or a list of descriptors) as a kernel
    tool: see `wrap_mcp_tool`, whose options each one takes."""
    listed = _field(descriptors, "tools")
    items = listed if listed is not None else descriptors
    if isinstance(items, Mapping) or not isinstance(items, Iterable):
        raise TypeError(
            "wrap_mcp_tools takes a list_tools() result or a list of tool descriptors, "
            f"got {type(descriptors).__name__}"
        )
    return [
        wrap_mcp_tool(
            descriptor,
            call=call,
            prefix=prefix,
            to_result=to_result,
            strip_nulls=strip_nulls,
            **options,
        )
        for descriptor in items
    ]


def wrap_mcp_tool(
    descriptor: Any,
    *,
    call: McpCall,
    prefix: str = "",
    to_result: Callable[[Any], Any] | None = None,
    strip_nulls: bool = True,
    **options: Any,
) -> Tool:
    """One MCP tool as a kernel tool.

    - Its id is `f"{prefix}_{name}"` (the bare name without a prefix); `call` is given the
      bare name, as the server knows it.
    - Its description and input schema are the descriptor's.
    - Its hints say what it does: `readOnlyHint` makes it `read_only`; any other tool `writes`
      unless its `destructiveHint` is false. `read_only=` or `writes=` given here win.
    - Arguments that are `null` are left out before the call is recorded (models fill optional
      fields with null, which typed MCP parameters refuse); `strip_nulls=False` keeps them.
    - Its result is the `CallToolResult`'s structured content when it has some, else its text
      blocks joined by newlines; `to_result` maps the `CallToolResult` instead. A result marked
      `isError` fails the call with its text, which the model reads.
    - Any other keyword is a `@tool` option (`idempotency`, `requires_approval`, `timeout`, ...).
    """
    name = _field(descriptor, "name")
    if not isinstance(name, str) or not name:
        raise ToolDefinitionError(f"an MCP tool descriptor has no name: {descriptor!r}")
    tool_id = f"{prefix}_{name}" if prefix else name
    schema = _field(descriptor, "inputSchema", "input_schema") or {"type": "object"}
    description = _field(descriptor, "description") or _field(descriptor, "title") or ""
    if not description.strip():
        description = f"The MCP tool {name}."
    # What the caller says of the tool's effect replaces what its hints say.
    said = "read_only" in options or "writes" in options
    effects = {**({} if said else _effects(_field(descriptor, "annotations"))), **options}

    async def invoke(arguments: dict[str, Any]) -> Any:
        result = call(name, arguments)
        if inspect.isawaitable(result):
            result = await result
        return result

    def flatten(result: Any) -> Any:
        if _field(result, "isError", "is_error"):
            raise ToolError.fatal(_text(result) or f"the MCP tool {name} failed")
        return to_result(result) if to_result is not None else _flattened(result)

    return wrap_tool(
        tool_id,
        invoke,
        description=description,
        args_schema=dict(schema),
        to_result=flatten,
        transform_args=_without_nulls if strip_nulls else None,
        **effects,
    )


def _field(value: Any, *names: str) -> Any:
    """A field of a dict or an attribute of an object, under the first of `names` it has."""
    for name in names:
        if isinstance(value, Mapping):
            if name in value:
                return value[name]
        elif hasattr(value, name):
            return getattr(value, name)
    return None


def _effects(annotations: Any) -> dict[str, bool]:
    if annotations is None:
        return {"writes": True}
    if _field(annotations, "readOnlyHint", "read_only_hint") is True:
        return {"read_only": True}
    # MCP's default: a tool that is not read-only may be destructive.
    return {"writes": _field(annotations, "destructiveHint", "destructive_hint") is not False}


def _without_nulls(arguments: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in arguments.items() if value is not None}


def _text(result: Any) -> str:
    blocks = _field(result, "content") or []
    return "\n".join(
        text
        for block in blocks
        if _field(block, "type") == "text" and isinstance(text := _field(block, "text"), str)
    )


def _flattened(result: Any) -> Any:
    """A `CallToolResult` as a result: its structured content first, else its joined text; a
    value that is not a `CallToolResult` stays as it is."""
    structured = _field(result, "structuredContent", "structured_content")
    if structured is not None:
        return structured
    if _field(result, "content") is None:
        return result
    return _text(result)
