"""Kernel tools for the agent frameworks: each framework's tool loop calls them, and each call goes
through the kernel.

- `kernel_sdk.integrations.langchain`: LangChain and LangGraph (`create_agent`, `ToolNode`).
- `kernel_sdk.integrations.openai_agents`: the OpenAI Agents SDK (`Agent(tools=...)`).
- `kernel_sdk.integrations.pydantic_ai`: Pydantic AI (`Agent(toolsets=[...])`).

Each takes kernel tools (`@tool` functions, `wrap_tool` tools, or tools other workers serve, as
`AgentClient.list_tools()` lists them) and gives the framework's own tool objects. Inside a hosted
handler, a call the framework makes is a call of the run: recorded as a step, checked by the
policy, asked of a person when a rule or the tool says so, and replayed from the record when the
handler runs again after a crash or a suspension. What the model reads is what the kernel says:
the result, or for a denied, rejected or failed call the text the kernel gives it, so the model
can take another path. Outside any run a `@tool` just runs, as it does when called directly.

Each module also has `recorded_model(model)`: the framework's model, with each answer recorded
as a local step of the run (`step:model#N`, a `read`), so a handler that runs again gets the
answers the model gave the first time rather than asking again (and paying again, and perhaps
hearing something else, which would no longer match the calls recorded after it).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from ..canonical import to_canonical
from ..context import ToolContext, current_run
from ..errors import ToolError
from ..hosted import AgentContext
from ..records import CallOutcome, RegisteredTool
from ..tools import Tool, ToolDefinition

T = TypeVar("T")

KernelTool = Tool | ToolDefinition | RegisteredTool
"""What the integrations take: a `@tool` (or `wrap_tool`) tool, which also runs outside a run, or
only a definition, for a tool some other worker serves."""


@dataclass(frozen=True)
class Answer:
    """How one call through the kernel ended, as a framework hands it to its model."""

    ok: bool
    """The tool returned a result."""
    output: Any
    """The result as JSON data when `ok`, else `None`."""
    text: str
    """What the model reads: the result as JSON text (a string as itself), or the kernel's
    account of why there is none (`"<tool> not allowed. reason: ..."` for a denial)."""
    outcome: str
    """The call's `CallOutcome`."""


@dataclass(frozen=True)
class RoutedTool:
    """One kernel tool as the integrations see it: its name, description and argument schema,
    and `call`, which goes through the run around it."""

    name: str
    description: str
    input_schema: dict[str, Any]
    local: Tool | None
    """The function itself, which runs when there is no run around the call."""

    async def call(self, arguments: Mapping[str, Any] | str) -> Answer:
        """Calls the tool, with its arguments as data or as the model's JSON text, through the
        run around the caller (a hosted handler and the tasks it starts); with no run, runs a
        local tool on a test context, and refuses a tool only a worker serves."""
        if self.local is not None:
            arguments = self._prepared(arguments)
        run = current_run.get()
        if run is not None:
            wire = arguments if isinstance(arguments, str) else dict(arguments)
            if isinstance(run, AgentContext):
                # A framework runs one response's calls concurrently: they go in as one turn.
                result = await run.call(self.name, wire, together=True)
            else:
                result = await run.call(self.name, wire)
            return Answer(result.ok, result.output, result.content, result.outcome)
        if self.local is None:
            raise RuntimeError(
                f"tool '{self.name}' is served by a worker: call it inside a run (a hosted "
                "agent's handler), where the kernel dispatches it"
            )
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
            if not isinstance(arguments, dict):
                raise ToolError.fatal(f"tool '{self.name}': arguments must be a JSON object")
        output = await self.local.invoke(ToolContext.for_test(tool=self.name), dict(arguments))
        text = output if isinstance(output, str) else to_canonical(output)
        return Answer(True, output, text, CallOutcome.OK)

    def _prepared(self, arguments: Mapping[str, Any] | str) -> Mapping[str, Any] | str:
        """The model's arguments as the tool wants them recorded (`wrap_tool`'s
        `transform_args`); JSON text that is not an object stays as it is, for the kernel to
        refuse."""
        assert self.local is not None
        if isinstance(arguments, str):
            try:
                parsed = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                return arguments
            if not isinstance(parsed, dict):
                return arguments
            arguments = parsed
        return self.local._prepared(dict(arguments))


def routed(tools: Iterable[KernelTool]) -> list[RoutedTool]:
    """Each tool's name, description, schema and local function, refusing a name given twice
    (the model could not tell them apart)."""
    seen: set[str] = set()
    out: list[RoutedTool] = []
    for tool in tools:
        local = tool if isinstance(tool, Tool) else None
        if isinstance(tool, Tool):
            definition: ToolDefinition | RegisteredTool = tool.definition
        elif isinstance(tool, ToolDefinition | RegisteredTool):
            definition = tool
        else:
            raise TypeError(
                "a kernel tool is a @tool function, a wrap_tool tool, a ToolDefinition or a "
                f"RegisteredTool, got {type(tool).__name__}"
            )
        if definition.name in seen:
            raise ValueError(f"tool '{definition.name}' is given twice")
        seen.add(definition.name)
        out.append(
            RoutedTool(
                definition.name, definition.description, dict(definition.input_schema), local
            )
        )
    return out


async def recorded(
    step_id: str,
    ask: Callable[[], Awaitable[T]],
    dump: Callable[[T], Any],
    load: Callable[[Any], T],
) -> T:
    """`ask()`'s answer, recorded as a `read` step of the hosted run around the caller (as JSON,
    by `dump`) and given back by `load`, live and on replay alike; with no hosted run, just
    `ask()`."""
    run = current_run.get()
    if not isinstance(run, AgentContext):
        return await ask()

    async def step(info: Any) -> Any:
        return dump(await ask())

    return load(await run.step(step_id, step, effect="read"))
