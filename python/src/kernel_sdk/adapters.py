"""Between the tool-call shapes of the common model APIs and the kernel's turns.

Each API has three parts here: the tools to offer (`tools=`), the calls a model response asks
for (to submit as a turn), and the results to send back to the model. They take the APIs'
payloads as dicts (an SDK's response object works too: anything with `model_dump()`), so no model
SDK is needed.

- OpenAI Chat Completions: `openai_chat_tools`, `calls_from_openai_chat`, `openai_chat_results`.
- OpenAI Responses: `openai_responses_tools`, `calls_from_openai_responses`,
  `openai_responses_results`.
- Anthropic Messages: `anthropic_tools`, `calls_from_anthropic`, `anthropic_results`.

The model's call id becomes the step's `call_id`, so resubmitting the same response after a crash
replays the recorded results, and each result goes back under the id the model gave it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .records import CallResult, RegisteredTool, ToolCall
from .tools import Tool, ToolDefinition

Offered = Tool | ToolDefinition | RegisteredTool


def _describe(tool: Offered) -> tuple[str, str, dict[str, Any]]:
    if isinstance(tool, Tool):
        tool = tool.definition
    return tool.name, tool.description, tool.input_schema


def _plain(payload: Any) -> Any:
    """An SDK's response object as the dict its API sent."""
    dump = getattr(payload, "model_dump", None)
    return dump(exclude_none=True) if callable(dump) else payload


def _by_position(
    calls: Sequence[ToolCall], results: Iterable[CallResult]
) -> list[tuple[str, CallResult]]:
    paired = []
    for result in results:
        call = calls[result.position]
        if call.call_id is None:
            raise ValueError(f"call {result.position} ({call.tool}) has no call id to answer under")
        paired.append((call.call_id, result))
    return paired


def openai_chat_tools(tools: Iterable[Offered]) -> list[dict[str, Any]]:
    """The `tools=` of a Chat Completions request."""
    return [
        {"type": "function", "function": {"name": n, "description": d, "parameters": s}}
        for n, d, s in map(_describe, tools)
    ]


def calls_from_openai_chat(message: Any) -> list[ToolCall]:
    """The calls of an assistant message (`choices[0].message`), in order; `arguments` stays the
    model's JSON text, which the kernel checks."""
    message = _plain(message)
    return [
        ToolCall(call["function"]["name"], call["function"].get("arguments") or "{}", call["id"])
        for call in message.get("tool_calls") or []
        if call.get("type", "function") == "function"
    ]


def openai_chat_results(
    calls: Sequence[ToolCall], results: Iterable[CallResult]
) -> list[dict[str, Any]]:
    """One `tool` message per result, to append to the conversation."""
    return [
        {"role": "tool", "tool_call_id": call_id, "content": result.content}
        for call_id, result in _by_position(calls, results)
    ]


def openai_responses_tools(tools: Iterable[Offered]) -> list[dict[str, Any]]:
    """The `tools=` of a Responses request."""
    return [
        {"type": "function", "name": n, "description": d, "parameters": s}
        for n, d, s in map(_describe, tools)
    ]


def calls_from_openai_responses(output: Any) -> list[ToolCall]:
    """The `function_call` items of a response's `output` (the response itself, or its list)."""
    output = _plain(output)
    items = output.get("output", []) if isinstance(output, Mapping) else output
    return [
        ToolCall(item["name"], item.get("arguments") or "{}", item["call_id"])
        for item in map(_plain, items)
        if item.get("type") == "function_call"
    ]


def openai_responses_results(
    calls: Sequence[ToolCall], results: Iterable[CallResult]
) -> list[dict[str, Any]]:
    """One `function_call_output` input item per result."""
    return [
        {"type": "function_call_output", "call_id": call_id, "output": result.content}
        for call_id, result in _by_position(calls, results)
    ]


def anthropic_tools(tools: Iterable[Offered]) -> list[dict[str, Any]]:
    """The `tools=` of a Messages request."""
    return [{"name": n, "description": d, "input_schema": s} for n, d, s in map(_describe, tools)]


def calls_from_anthropic(message: Any) -> list[ToolCall]:
    """The `tool_use` blocks of a message (the message itself, or its `content` list)."""
    message = _plain(message)
    blocks = message.get("content", []) if isinstance(message, Mapping) else message
    return [
        ToolCall(block["name"], dict(block.get("input") or {}), block["id"])
        for block in map(_plain, blocks)
        if block.get("type") == "tool_use"
    ]


def anthropic_results(calls: Sequence[ToolCall], results: Iterable[CallResult]) -> dict[str, Any]:
    """The `user` message carrying one `tool_result` block per result; a failed call is marked
    `is_error`, so the model reads it as a failure it may work around."""
    return {
        "role": "user",
        "content": [
            {
                "type": "tool_result",
                "tool_use_id": call_id,
                "content": result.content,
                **({} if result.ok else {"is_error": True}),
            }
            for call_id, result in _by_position(calls, results)
        ],
    }
