"""Hosted agents built on the agent frameworks, each with a scripted model (no network, no key)
whose answers the run records, and the same three kernel tools: a lookup that runs, a wipe the policy denies, and a refund that
waits for a person. The model's first answer calls all three; its second reports, as JSON, what
each tool message said, so a test reads what the model read.

`worker_process.py --frameworks` serves them in a process of its own; each tool and each model call prints a
line (`started tool=...`, `model asked agent=...`) a test waits on or counts.
"""

from __future__ import annotations

import json
from typing import Any

import agents as openai_agents
from agents.models.interface import Model as OpenAIModel
from agents.usage import Usage
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool
from openai.types.responses import (
    ResponseFunctionToolCall,
    ResponseOutputMessage,
    ResponseOutputText,
)
from pydantic_ai import Agent as PydanticAgent
from pydantic_ai import messages as pydantic_messages
from pydantic_ai.models.function import AgentInfo, FunctionModel

from kernel_sdk import AgentContext, ToolContext, agent, tool
from kernel_sdk.integrations import langchain as kernel_langchain
from kernel_sdk.integrations import openai_agents as kernel_openai_agents
from kernel_sdk.integrations import pydantic_ai as kernel_pydantic_ai

FIRST_CALLS: list[tuple[str, dict[str, Any]]] = [
    ("fw_lookup", {"order": "A1"}),
    ("fw_wipe", {"table": "orders"}),
    ("fw_refund", {"order": "A1", "cents": 250}),
]
QUESTION = "refund order A1"


@tool
async def fw_lookup(ctx: ToolContext, order: str) -> dict[str, object]:
    """Looks an order up."""
    print(f"started tool=fw_lookup attempt={ctx.attempt}", flush=True)
    return {"order": order, "cents": 250}


@tool(writes=True)
async def fw_wipe(ctx: ToolContext, table: str) -> str:
    """Wipes a table (the policy denies it)."""
    raise AssertionError("a denied tool never runs")


@tool(writes=True, requires_approval=True)
async def fw_refund(ctx: ToolContext, order: str, cents: int) -> str:
    """Refunds an order, once a person approves."""
    print(f"started tool=fw_refund attempt={ctx.attempt}", flush=True)
    return f"refunded {cents} on {order}"


TOOLS = [fw_lookup, fw_wipe, fw_refund]


def _asked(agent_name: str) -> None:
    print(f"model asked agent={agent_name}", flush=True)


# LangChain / LangGraph


def _langchain_agent() -> Any:
    class ScriptedChat(BaseChatModel):
        """Calls the three tools, then reports what their messages said."""

        @property
        def _llm_type(self) -> str:
            return "scripted"

        def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
            # As the providers' models do: the tools in the API's format, bound as arguments.
            return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

        def _generate(
            self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None, **_: Any
        ) -> ChatResult:
            _asked("lc_support")
            said = {m.name: [m.status, m.content] for m in messages if isinstance(m, ToolMessage)}
            if said:
                message = AIMessage(content=json.dumps(said, sort_keys=True))
            else:
                message = AIMessage(
                    content="",
                    tool_calls=[
                        {"name": name, "args": args, "id": f"call_{i}", "type": "tool_call"}
                        for i, (name, args) in enumerate(FIRST_CALLS)
                    ],
                )
            return ChatResult(generations=[ChatGeneration(message=message)])

    model = kernel_langchain.recorded_model(ScriptedChat())
    return create_agent(model, kernel_langchain.langchain_tools(TOOLS))


@agent
async def lc_support(ctx: AgentContext, question: str) -> Any:
    """A LangGraph agent (`create_agent`) whose tool calls go through the kernel."""
    graph = _langchain_agent()
    state = await graph.ainvoke({"messages": [("user", question)]})
    return json.loads(state["messages"][-1].text)


# OpenAI Agents SDK


def _openai_agent() -> Any:
    class ScriptedModel(OpenAIModel):
        """Calls the three tools, then reports what their outputs said."""

        async def get_response(
            self, system_instructions: Any, input: Any, *a: Any, **k: Any
        ) -> Any:
            _asked("oa_support")
            items = [] if isinstance(input, str) else input
            names = {
                item["call_id"]: item["name"]
                for item in map(_plain, items)
                if item.get("type") == "function_call"
            }
            said = {
                names[item["call_id"]]: item["output"]
                for item in map(_plain, items)
                if item.get("type") == "function_call_output"
            }
            output: list[Any]
            if said:
                text = json.dumps(said, sort_keys=True)
                output = [
                    ResponseOutputMessage(
                        id="msg_1",
                        type="message",
                        role="assistant",
                        status="completed",
                        content=[ResponseOutputText(type="output_text", text=text, annotations=[])],
                    )
                ]
            else:
                output = [
                    ResponseFunctionToolCall(
                        id=f"fc_{i}",
                        call_id=f"call_{i}",
                        type="function_call",
                        name=name,
                        arguments=json.dumps(args),
                        status="completed",
                    )
                    for i, (name, args) in enumerate(FIRST_CALLS)
                ]
            return openai_agents.ModelResponse(output=output, usage=Usage(), response_id=None)

        def stream_response(self, *args: Any, **kwargs: Any) -> Any:
            raise NotImplementedError("the scripted model does not stream")

    return openai_agents.Agent(
        name="oa_support",
        model=kernel_openai_agents.recorded_model(ScriptedModel()),
        tools=kernel_openai_agents.openai_agents_tools(TOOLS),
    )


def _plain(item: Any) -> dict[str, Any]:
    dump = getattr(item, "model_dump", None)
    return dict(dump()) if callable(dump) else dict(item)


@agent
async def oa_support(ctx: AgentContext, question: str) -> Any:
    """An OpenAI Agents SDK agent whose `Runner`'s tool calls go through the kernel."""
    result = await openai_agents.Runner.run(_openai_agent(), question)
    return json.loads(str(result.final_output))


# Pydantic AI


def _pydantic_agent() -> Any:
    def scripted(
        messages: list[pydantic_messages.ModelMessage], info: AgentInfo
    ) -> pydantic_messages.ModelResponse:
        _asked("pa_support")
        said = {
            part.tool_name: part.content
            for message in messages
            if isinstance(message, pydantic_messages.ModelRequest)
            for part in message.parts
            if isinstance(part, pydantic_messages.ToolReturnPart)
        }
        if said:
            text = json.dumps(said, sort_keys=True)
            return pydantic_messages.ModelResponse(parts=[pydantic_messages.TextPart(text)])
        return pydantic_messages.ModelResponse(
            parts=[
                pydantic_messages.ToolCallPart(name, args, tool_call_id=f"call_{i}")
                for i, (name, args) in enumerate(FIRST_CALLS)
            ]
        )

    return PydanticAgent(
        kernel_pydantic_ai.recorded_model(FunctionModel(scripted)),
        toolsets=[kernel_pydantic_ai.pydantic_ai_toolset(TOOLS)],
    )


@agent
async def pa_support(ctx: AgentContext, question: str) -> Any:
    """A Pydantic AI agent whose tool calls go through the kernel."""
    result = await _pydantic_agent().run(question)
    return json.loads(result.output)


AGENTS = [lc_support, oa_support, pa_support]

# The frameworks are imported above, before the worker starts: a handler importing one on the
# worker's loop would hold up its heartbeats for as long as the import takes (over a second).
openai_agents.set_tracing_disabled(True)
