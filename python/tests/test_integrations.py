"""The framework integrations without a kernel: what each framework sees of a kernel tool (name,
description, schema), and that outside any run a `@tool` just runs while a tool only a worker
serves is refused. The calls through a kernel are in test_frameworks.py."""

from __future__ import annotations

import json
from typing import Any

import pytest
from agents import FunctionTool, RunContextWrapper
from langchain_core.messages import AIMessage, ToolMessage
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import messages as pydantic_messages
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kernel_sdk import ToolContext, ToolDefinition, tool, wrap_tool
from kernel_sdk.integrations import langchain as kernel_langchain
from kernel_sdk.integrations import openai_agents as kernel_openai_agents
from kernel_sdk.integrations import pydantic_ai as kernel_pydantic_ai
from kernel_sdk.integrations import routed


@tool
async def add(ctx: ToolContext, a: int, b: int = 1) -> int:
    """Adds two numbers."""
    return a + b


@tool
def shout(text: str) -> str:
    """Shouts."""
    return text.upper()


REMOTE = ToolDefinition(
    "remote_search",
    "Searches, on some other worker.",
    {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
)


def test_each_framework_sees_the_kernels_name_description_and_schema() -> None:
    [lc] = kernel_langchain.langchain_tools([add])
    assert (lc.name, lc.description) == ("add", "Adds two numbers.")
    assert lc.args == add.definition.input_schema["properties"]

    [oa] = kernel_openai_agents.openai_agents_tools([add])
    assert isinstance(oa, FunctionTool)
    assert (oa.name, oa.description) == ("add", "Adds two numbers.")
    assert oa.params_json_schema == add.definition.input_schema
    assert not oa.strict_json_schema

    toolset = kernel_pydantic_ai.pydantic_ai_toolset([add, REMOTE])
    assert [t.name for t in toolset.tools.values()] == ["add", "remote_search"]
    assert toolset.tools["remote_search"].function_schema.json_schema == REMOTE.input_schema


def test_a_name_given_twice_or_something_not_a_tool_is_refused() -> None:
    with pytest.raises(ValueError, match="tool 'add' is given twice"):
        routed([add, add])
    with pytest.raises(TypeError, match="got function"):
        routed([lambda: None])  # type: ignore[list-item]


async def test_outside_any_run_a_tool_just_runs_in_every_framework() -> None:
    [lc_add, lc_shout] = kernel_langchain.langchain_tools([add, shout])
    assert await lc_add.ainvoke({"a": 2, "b": 3}) == "5"
    assert await lc_shout.ainvoke({"text": "hi"}) == "HI"

    [oa_add] = kernel_openai_agents.openai_agents_tools([add])
    assert isinstance(oa_add, FunctionTool)
    context: RunContextWrapper[Any] = RunContextWrapper(context=None)
    assert await oa_add.on_invoke_tool(context, '{"a": 40, "b": 2}') == "42"  # type: ignore[arg-type]

    def model(messages: list[pydantic_messages.ModelMessage], info: AgentInfo) -> Any:
        returned = [
            part.content
            for message in messages
            if isinstance(message, pydantic_messages.ModelRequest)
            for part in message.parts
            if isinstance(part, pydantic_messages.ToolReturnPart)
        ]
        if returned:
            return pydantic_messages.ModelResponse(
                parts=[pydantic_messages.TextPart(json.dumps(returned))]
            )
        call = pydantic_messages.ToolCallPart("add", {"a": 1}, tool_call_id="c1")
        return pydantic_messages.ModelResponse(parts=[call])

    bot = PydanticAgent(
        FunctionModel(model), toolsets=[kernel_pydantic_ai.pydantic_ai_toolset([add])]
    )
    assert json.loads((await bot.run("add one")).output) == [2]


def _tool_graph(tools: list[Any]) -> Any:
    """A graph of one `ToolNode`, which runs the calls of the message it is given."""
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode(tools))
    graph.add_edge(START, "tools")
    return graph.compile()


async def test_a_tool_node_runs_the_models_calls_and_refuses_a_worker_only_tool_outside_a_run() -> (
    None
):
    calls = [
        {"name": "add", "args": {"a": 1, "b": 2}, "id": "c1", "type": "tool_call"},
        {"name": "remote_search", "args": {"q": "x"}, "id": "c2", "type": "tool_call"},
    ]
    graph = _tool_graph(kernel_langchain.langchain_tools([add, REMOTE]))
    with pytest.raises(RuntimeError, match="tool 'remote_search' is served by a worker"):
        await graph.ainvoke({"messages": [AIMessage(content="", tool_calls=calls)]})
    graph = _tool_graph(kernel_langchain.langchain_tools([add]))
    state = await graph.ainvoke({"messages": [AIMessage(content="", tool_calls=calls[:1])]})
    answer = state["messages"][-1]
    assert isinstance(answer, ToolMessage) and answer.content == "3", answer


async def test_a_wrapped_tool_goes_to_the_frameworks_as_any_tool_does() -> None:
    lookup = wrap_tool(
        "lookup",
        lambda args: {"found": args["key"]},
        description="Looks a key up.",
        args_schema={"properties": {"key": {"type": "string"}}, "required": ["key"]},
    )
    [lc] = kernel_langchain.langchain_tools([lookup])
    assert json.loads(await lc.ainvoke({"key": "k"})) == {"found": "k"}


async def test_a_recorded_model_outside_a_run_just_asks_the_model() -> None:
    def model(messages: list[pydantic_messages.ModelMessage], info: AgentInfo) -> Any:
        return pydantic_messages.ModelResponse(parts=[pydantic_messages.TextPart("plain")])

    bot = PydanticAgent(kernel_pydantic_ai.recorded_model(FunctionModel(model)))
    assert (await bot.run("hi")).output == "plain"
