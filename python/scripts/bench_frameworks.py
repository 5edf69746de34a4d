"""What each framework integration adds per tool call, and prints the figures.

    python3 python/scripts/bench_frameworks.py --kernel 127.0.0.1:50051 [--calls 50] [--rounds 3]

A worker in this process serves `fw_echo` and hosts one agent per way of calling it: `plain` (a
handler calling the tool as a function, through the kernel), `langgraph` (`create_agent`),
`openai_agents_sdk` (`Runner`) and `pydantic_ai` (`Agent`). Each framework's scripted model asks
for one call per answer, `--calls` times, then answers; its answers are not recorded. Each
framework runs twice a round: with the kernel's tools (`langchain_tools`, ...) and with the same
function as the framework's own tool, which runs in the handler without the kernel. The figures
are the time per call (median and range over the rounds), and what the kernel's tools add to the
framework's own per call.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from typing import Any

import agents as openai_agents
from agents.models.interface import Model as OpenAIModel
from agents.usage import Usage
from langchain.agents import create_agent
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
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
from pydantic_ai.toolsets import FunctionToolset
from pydantic_ai.usage import UsageLimits

from kernel_sdk import AgentClient, AgentContext, Worker, agent, tool
from kernel_sdk.integrations.langchain import langchain_tools
from kernel_sdk.integrations.openai_agents import openai_agents_tools
from kernel_sdk.integrations.pydantic_ai import pydantic_ai_toolset

openai_agents.set_tracing_disabled(True)


@tool(read_only=True)
async def fw_echo(n: int) -> int:
    """Returns its argument."""
    return n


async def native_echo(n: int) -> int:
    """Returns its argument."""
    return n


native_echo.__name__ = "fw_echo"


@agent
async def plain(ctx: AgentContext, job: dict[str, Any]) -> int:
    """Calls the tool as a function, `calls` times."""
    for n in range(job["calls"]):
        await fw_echo(n=n)
    return int(job["calls"])


class _Chat(BaseChatModel):
    calls: int

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        done = sum(isinstance(m, ToolMessage) for m in messages)
        if done >= self.calls:
            message = AIMessage(content=str(done))
        else:
            call = {"name": "fw_echo", "args": {"n": done}, "id": f"c{done}", "type": "tool_call"}
            message = AIMessage(content="", tool_calls=[call])
        return ChatResult(generations=[ChatGeneration(message=message)])


@agent
async def langgraph(ctx: AgentContext, job: dict[str, Any]) -> str:
    """A LangGraph agent calling the tool `calls` times."""
    calls = job["calls"]
    tools: list[Any] = [native_echo] if job["native"] else langchain_tools([fw_echo])
    graph = create_agent(_Chat(calls=calls), tools)
    state = await graph.ainvoke(
        {"messages": [HumanMessage("go")]}, {"recursion_limit": 3 * calls + 10}
    )
    return str(state["messages"][-1].text)


class _Model(OpenAIModel):
    def __init__(self, calls: int) -> None:
        self.calls = calls

    async def get_response(
        self, system_instructions: Any, input: Any, *args: Any, **kwargs: Any
    ) -> Any:
        items = [] if isinstance(input, str) else input
        done = sum(
            1
            for item in items
            if (item.get("type") if isinstance(item, dict) else getattr(item, "type", None))
            == "function_call_output"
        )
        output: list[Any]
        if done >= self.calls:
            text = ResponseOutputText(type="output_text", text=str(done), annotations=[])
            output = [
                ResponseOutputMessage(
                    id="m", type="message", role="assistant", status="completed", content=[text]
                )
            ]
        else:
            output = [
                ResponseFunctionToolCall(
                    id=f"f{done}",
                    call_id=f"c{done}",
                    type="function_call",
                    name="fw_echo",
                    arguments=json.dumps({"n": done}),
                    status="completed",
                )
            ]
        return openai_agents.ModelResponse(output=output, usage=Usage(), response_id=None)

    def stream_response(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError


@agent
async def openai_agents_sdk(ctx: AgentContext, job: dict[str, Any]) -> str:
    """An OpenAI Agents SDK agent calling the tool `calls` times."""
    calls = job["calls"]
    tools = (
        [openai_agents.function_tool(native_echo)]
        if job["native"]
        else openai_agents_tools([fw_echo])
    )
    bot = openai_agents.Agent(name="bench", model=_Model(calls), tools=tools)
    result = await openai_agents.Runner.run(bot, "go", max_turns=calls + 5)
    return str(result.final_output)


@agent
async def pydantic_ai(ctx: AgentContext, job: dict[str, Any]) -> str:
    """A Pydantic AI agent calling the tool `calls` times."""
    calls = job["calls"]

    def model(
        messages: list[pydantic_messages.ModelMessage], info: AgentInfo
    ) -> pydantic_messages.ModelResponse:
        done = sum(
            isinstance(part, pydantic_messages.ToolReturnPart)
            for message in messages
            if isinstance(message, pydantic_messages.ModelRequest)
            for part in message.parts
        )
        if done >= calls:
            return pydantic_messages.ModelResponse(parts=[pydantic_messages.TextPart(str(done))])
        call = pydantic_messages.ToolCallPart("fw_echo", {"n": done}, tool_call_id=f"c{done}")
        return pydantic_messages.ModelResponse(parts=[call])

    toolset = FunctionToolset([native_echo]) if job["native"] else pydantic_ai_toolset([fw_echo])
    bot = PydanticAgent(FunctionModel(model), toolsets=[toolset])
    limits = UsageLimits(request_limit=calls + 5)
    return (await bot.run("go", usage_limits=limits)).output


AGENTS = [plain, langgraph, openai_agents_sdk, pydantic_ai]


async def _time_run(client: AgentClient, name: str, calls: int, native: bool) -> float:
    started = time.perf_counter()
    run = await client.create_run(name, input={"calls": calls, "native": native}, hosted=True)
    async for _ in client.watch_events(run.id):
        pass
    elapsed = time.perf_counter() - started
    detail = await client.get_run(run.id)
    if detail.run.status != "completed":
        raise RuntimeError(f"{name}: run {run.id} ended {detail.run.status}: {detail.run.reason}")
    made = sum(step.tool == "fw_echo" for step in detail.steps)
    if made != (0 if native else calls):
        raise RuntimeError(f"{name}: {made} calls recorded, not {calls}")
    return elapsed / calls


def _ms(seen: list[float]) -> str:
    return (
        f"{statistics.median(seen) * 1000:.2f} ms ({min(seen) * 1000:.2f}-{max(seen) * 1000:.2f})"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="127.0.0.1:50051")
    parser.add_argument("--calls", type=int, default=50, help="tool calls in each run")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    worker = Worker(args.kernel, [fw_echo], agents=AGENTS, name="fw-bench", ephemeral_tools=True)
    serving = asyncio.create_task(worker.run(handle_signals=False))
    await worker.wait_ready()
    ways = [("plain", False)] + [(a.name, native) for a in AGENTS[1:] for native in (True, False)]
    per_call: dict[tuple[str, bool], list[float]] = {way: [] for way in ways}
    async with AgentClient(args.kernel) as client:
        for name, native in ways:
            await _time_run(client, name, 5, native)  # warm-up: imports, connections
        for _ in range(args.rounds):
            for name, native in ways:
                per_call[(name, native)].append(await _time_run(client, name, args.calls, native))
    worker.stop()
    await serving
    print(f"{args.calls} calls per run, {args.rounds} rounds; time per call, median (range)")
    print(f"{'plain (a kernel call from a handler)':40} {_ms(per_call[('plain', False)])}")
    for agent_def in AGENTS[1:]:
        own, kernel = per_call[(agent_def.name, True)], per_call[(agent_def.name, False)]
        added = statistics.median(kernel) - statistics.median(own)
        print(
            f"{agent_def.name:18} own tools {_ms(own)}, kernel tools {_ms(kernel)}:"
            f" +{added * 1000:.2f} ms per call"
        )


if __name__ == "__main__":
    asyncio.run(main())
