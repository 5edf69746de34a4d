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

import hashlib
import inspect
import logging
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from .canonical import to_canonical
from .errors import ToolError
from .tools import Tool, ToolDefinitionError, wrap_tool

logger = logging.getLogger("kernel_sdk.mcp")

_MAX_ID = 64

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
    tool: see `wrap_mcp_tool`, whose options each one takes. `requires_approval` may also be a
    list of the server's (bare) tool names, as `MCPServer(requires_approval=("delete_issue",))`
    on the seed page: only those are asked about, and a name the server does not list is refused
    (a typo would leave a tool ungated)."""
    listed = _field(descriptors, "tools")
    items = listed if listed is not None else descriptors
    if isinstance(items, Mapping) or not isinstance(items, Iterable):
        raise TypeError(
            "wrap_mcp_tools takes a list_tools() result or a list of tool descriptors, "
            f"got {type(descriptors).__name__}"
        )
    items = list(items)
    gated = _gated_names(options.get("requires_approval"))
    if gated is not None:
        unknown = sorted(gated - {_field(descriptor, "name") for descriptor in items})
        if unknown:
            raise ToolDefinitionError(
                f"requires_approval names MCP tools the server does not list: {', '.join(unknown)}"
            )
    tools: list[Tool] = []
    for descriptor in items:
        name = _field(descriptor, "name")
        if _tool_id(prefix, name) is None:
            logger.warning(
                "mcp tool left out: its id would be longer than %d characters tool=%s prefix=%s",
                _MAX_ID,
                name,
                prefix,
            )
            continue
        tool = wrap_mcp_tool(
            descriptor,
            call=call,
            prefix=prefix,
            to_result=to_result,
            strip_nulls=strip_nulls,
            **options,
        )
        if any(other.name == tool.name for other in tools):
            logger.warning(
                "mcp tool left out: another tool has the same id tool=%s id=%s", name, tool.name
            )
            continue
        tools.append(tool)
    return tools


def wrap_mcp_tool(
    descriptor: Any,
    *,
    call: McpCall,
    prefix: str = "",
    to_result: Callable[[Any], Any] | None = None,
    strip_nulls: bool = True,
    **options: Any,
) -> Tool:
    """One MCP tool as a kernel tool, by the Rust SDK's rules (`worker_sdk::mcp::wrap_mcp_tool`).

    - Its id is `f"{prefix}_{name}"` (the bare name without a prefix), each character outside
      `[A-Za-z0-9_-]` made `_`; an id over 64 characters is refused (`wrap_mcp_tools` leaves
      such a tool out, and one whose id another took). `call` is given the bare name.
    - Its description and input schema are the descriptor's (the title without a description).
    - Its hints say what it does: `readOnlyHint` makes it `read_only`, `destructiveHint` makes it
      `writes`; it is `safe_to_retry` when read-only or `idempotentHint`, else `at_most_once`
      (MCP's default for a tool that does not say is "may be destructive, not idempotent").
      Options given here win.
    - Its version is `mcp.` and a hash of the whole descriptor, so a changed definition is a new
      fingerprint, and a replay of a call recorded under the old one a divergence.
    - Arguments that are `null` are left out before the call is recorded (models fill optional
      fields with null, which typed MCP parameters refuse); `strip_nulls=False` keeps them.
    - Its result is the `CallToolResult`'s structured content when it has some, else its text
      blocks joined by newlines, else (images, audio, resources) its content blocks as JSON;
      `to_result` maps the `CallToolResult` instead. A result marked `isError` fails the call
      with its text, which the model reads.
    - Any other keyword is a `@tool` option (`requires_approval`, `timeout`, ...);
      `requires_approval` may be a list of bare tool names, which gates this tool only when its
      name is among them.
    """
    name = _field(descriptor, "name")
    if not isinstance(name, str) or not name:
        raise ToolDefinitionError(f"an MCP tool descriptor has no name: {descriptor!r}")
    gated = _gated_names(options.get("requires_approval"))
    if gated is not None:
        options = {k: v for k, v in options.items() if k != "requires_approval"}
        if name in gated:
            options["requires_approval"] = True
    tool_id = _tool_id(prefix, name)
    if tool_id is None:
        raise ToolDefinitionError(
            f"MCP tool '{name}': its id with prefix '{prefix}' is longer than {_MAX_ID} characters"
        )
    schema = _field(descriptor, "inputSchema", "input_schema") or {"type": "object"}
    description = _field(descriptor, "description") or _field(descriptor, "title") or ""
    if not description.strip():
        description = f"{name} (an MCP tool)"
    hinted = _effects(_field(descriptor, "annotations"))
    if "read_only" in options or "writes" in options:
        # What the caller says of the tool's effect replaces what its hints say.
        hinted = {k: v for k, v in hinted.items() if k not in ("read_only", "writes")}
    effects = {"version": _version(descriptor), **hinted, **options}

    async def invoke(arguments: dict[str, Any]) -> Any:
        result = call(name, arguments)
        if inspect.isawaitable(result):
            result = await result
        return result

    def flatten(result: Any) -> Any:
        if _field(result, "isError", "is_error"):
            message = "\n".join(_texts(result) or []) or to_canonical(_blocks(result))
            raise ToolError.fatal(message)
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


def _gated_names(option: Any) -> set[str] | None:
    """`requires_approval` given as a list of tool names, as a set; `None` for any other value
    (`True`, a predicate), which every tool takes as it is."""
    if not isinstance(option, list | tuple | set | frozenset):
        return None
    if not all(isinstance(name, str) and name for name in option):
        raise ToolDefinitionError(
            f"requires_approval takes True, a predicate, or a list of tool names, not {option!r}"
        )
    return set(option)


def _field(value: Any, *names: str) -> Any:
    """A field of a dict or an attribute of an object, under the first of `names` it has."""
    for name in names:
        if isinstance(value, Mapping):
            if name in value:
                return value[name]
        elif hasattr(value, name):
            return getattr(value, name)
    return None


def _tool_id(prefix: str, name: Any) -> str | None:
    joined = f"{prefix}_{name}" if prefix else str(name)
    tool_id = re.sub(r"[^A-Za-z0-9_-]", "_", joined)
    return tool_id if len(tool_id) <= _MAX_ID else None


def _effects(annotations: Any) -> dict[str, Any]:
    read_only = _field(annotations, "readOnlyHint", "read_only_hint") is True
    idempotent = read_only or _field(annotations, "idempotentHint", "idempotent_hint") is True
    effects: dict[str, Any] = {"idempotency": "safe_to_retry" if idempotent else "at_most_once"}
    if read_only:
        effects["read_only"] = True
    elif _field(annotations, "destructiveHint", "destructive_hint") is True:
        effects["writes"] = True
    return effects


def _version(descriptor: Any) -> str:
    """`mcp.` and the first 16 hex digits of sha256 over the descriptor's canonical JSON."""
    return "mcp." + hashlib.sha256(to_canonical(_plain(descriptor)).encode()).hexdigest()[:16]


def _plain(value: Any) -> Any:
    """An `mcp` package model as the JSON the protocol sends (a dict stays as it is)."""
    dump = getattr(value, "model_dump", None)
    return dump(mode="json", by_alias=True, exclude_none=True) if callable(dump) else value


def _without_nulls(arguments: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in arguments.items() if value is not None}


def _texts(result: Any) -> list[str] | None:
    """The content's text blocks, when every block is text."""
    texts = []
    for block in _field(result, "content") or []:
        text = _field(block, "text")
        if _field(block, "type") != "text" or not isinstance(text, str):
            return None
        texts.append(text)
    return texts


def _blocks(result: Any) -> Any:
    return [_plain(block) for block in _field(result, "content") or []]


def _flattened(result: Any) -> Any:
    """A `CallToolResult` as a result: its structured content first, else its joined text, else
    its content blocks; a value that is not a `CallToolResult` stays as it is."""
    if _field(result, "content") is None:
        return result
    structured = _field(result, "structuredContent", "structured_content")
    if structured is not None:
        return structured
    texts = _texts(result)
    return "\n".join(texts) if texts is not None else _blocks(result)
