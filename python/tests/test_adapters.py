"""The model-API adapters, over recorded response shapes, through the real kernel and back."""

from __future__ import annotations

import json

import pytest
from conftest import serving
from harness import Kernel

from kernel_sdk import AgentClient, CallOutcome, KernelError, ToolContext, tool
from kernel_sdk.adapters import (
    anthropic_results,
    anthropic_tools,
    calls_from_anthropic,
    calls_from_openai_chat,
    calls_from_openai_responses,
    openai_chat_results,
    openai_chat_tools,
    openai_responses_results,
    openai_responses_tools,
)


@tool(read_only=True)
async def add(ctx: ToolContext, a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool(read_only=True)
async def shout(ctx: ToolContext, text: str) -> dict[str, str]:
    """Upper-cases a text."""
    return {"text": text.upper()}


# What each API sends back when the model asks for tools (their documented shapes).
OPENAI_CHAT = {
    "id": "chatcmpl-9x",
    "object": "chat.completion",
    "model": "gpt-4o-2024-08-06",
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [
                    {
                        "id": "call_a1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a":2,"b":3}'},
                    },
                    {
                        "id": "call_b2",
                        "type": "function",
                        "function": {"name": "shout", "arguments": '{"text":"hi"}'},
                    },
                    {
                        "id": "call_c3",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": "two", "b": 1}'},
                    },
                ],
            },
        }
    ],
}
OPENAI_RESPONSES = {
    "id": "resp_1",
    "object": "response",
    "output": [
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {
            "type": "function_call",
            "id": "fc_1",
            "call_id": "call_r1",
            "name": "add",
            "arguments": '{"a":40,"b":2}',
            "status": "completed",
        },
    ],
}
ANTHROPIC = {
    "id": "msg_01",
    "type": "message",
    "role": "assistant",
    "model": "claude-sonnet-4-5",
    "stop_reason": "tool_use",
    "content": [
        {"type": "text", "text": "Adding, then shouting."},
        {"type": "tool_use", "id": "toolu_01", "name": "add", "input": {"a": 1, "b": 1}},
        {"type": "tool_use", "id": "toolu_02", "name": "shout", "input": {"text": 7}},
    ],
}


def test_registered_tools_become_each_apis_tools_parameter() -> None:
    schema = add.definition.input_schema
    assert openai_chat_tools([add]) == [
        {
            "type": "function",
            "function": {"name": "add", "description": "Adds two integers.", "parameters": schema},
        }
    ]
    assert openai_responses_tools([add]) == [
        {
            "type": "function",
            "name": "add",
            "description": "Adds two integers.",
            "parameters": schema,
        }
    ]
    assert anthropic_tools([add]) == [
        {"name": "add", "description": "Adds two integers.", "input_schema": schema}
    ]


async def test_openai_chat_tool_calls_round_trip_through_a_turn(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add, shout):
        run = await client.create_run("openai-agent")
        calls = calls_from_openai_chat(OPENAI_CHAT["choices"][0]["message"])  # type: ignore[index]
        assert [(c.tool, c.call_id) for c in calls] == [
            ("add", "call_a1"),
            ("shout", "call_b2"),
            ("add", "call_c3"),
        ]
        turn = await client.call_turn(run.id, 0, calls)
        messages = openai_chat_results(calls, turn.results)
        assert messages[:2] == [
            {"role": "tool", "tool_call_id": "call_a1", "content": "5"},
            {"role": "tool", "tool_call_id": "call_b2", "content": '{"text":"HI"}'},
        ]
        # Arguments off the schema come back to the model as a readable refusal.
        assert turn.results[2].outcome == CallOutcome.INVALID_ARGUMENTS
        assert messages[2]["tool_call_id"] == "call_c3" and "a" in messages[2]["content"]

        # The same response resubmitted after a crash replays, keyed by the model's call ids.
        again = await client.call_turn(run.id, 0, calls)
        assert [r.replayed for r in again.results[:2]] == [True, True]
        steps = (await client.get_run(run.id)).steps
        assert {s.call_id for s in steps} == {"call_a1", "call_b2", "call_c3"}


async def test_a_model_call_whose_arguments_are_not_json_is_refused_naming_it(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add):
        run = await client.create_run("openai-agent")
        broken = {
            "role": "assistant",
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "add", "arguments": "{}"}},
                {"id": "c2", "type": "function", "function": {"name": "add", "arguments": '{"a'}},
            ],
        }
        with pytest.raises(KernelError) as refused:
            await client.call_turn(run.id, 0, calls_from_openai_chat(broken))
        assert refused.value.code == "INVALID_ARGUMENT"
        assert "calls[1].arguments_json" in refused.value.message
        assert (await client.get_run(run.id)).steps == [], "a refused turn records nothing"


async def test_openai_responses_function_calls_round_trip(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add):
        run = await client.create_run("responses-agent")
        calls = calls_from_openai_responses(OPENAI_RESPONSES)
        assert [(c.tool, c.call_id) for c in calls] == [("add", "call_r1")]
        turn = await client.call_turn(run.id, 0, calls)
        assert openai_responses_results(calls, turn.results) == [
            {"type": "function_call_output", "call_id": "call_r1", "output": "42"}
        ]


async def test_anthropic_tool_use_blocks_round_trip_with_errors_marked(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add, shout):
        run = await client.create_run("anthropic-agent")
        calls = calls_from_anthropic(ANTHROPIC)
        assert [(c.tool, c.arguments, c.call_id) for c in calls] == [
            ("add", {"a": 1, "b": 1}, "toolu_01"),
            ("shout", {"text": 7}, "toolu_02"),
        ]
        turn = await client.call_turn(run.id, 0, calls)
        reply = anthropic_results(calls, turn.results)
        assert reply["role"] == "user"
        ok, bad = reply["content"]
        assert ok == {"type": "tool_result", "tool_use_id": "toolu_01", "content": "2"}
        assert bad["tool_use_id"] == "toolu_02" and bad["is_error"] is True
        assert "text" in bad["content"], "the schema error names the field"
        json.dumps(reply)  # what goes back to the API is plain JSON
