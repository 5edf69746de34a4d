"""Kernel tools for the OpenAI Agents SDK: `openai_agents_tools([...])` gives `FunctionTool`s for
an `Agent(tools=...)`. Every call the `Runner` makes goes through the kernel when it runs in a
hosted handler (see `kernel_sdk.integrations`), approvals included: a call a rule gates waits,
durably, for a person's answer in the kernel, and the handler gives its worker back meanwhile.

```python
@agent
async def support(ctx: AgentContext, question: str) -> str:
    bot = Agent(name="support", tools=openai_agents_tools([lookup_order, refund]))
    result = await Runner.run(bot, question, run_config=RunConfig(model_provider=RecordedModelProvider()))
    return str(result.final_output)
```

The model reads the kernel's text for every call: the result as JSON, or why there is none.
Needs the `openai-agents` extra: `pip install "kernel-sdk[openai-agents]"`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from typing import Any

from agents import FunctionTool, ModelProvider, ModelResponse, RunContextWrapper
from agents import Tool as AgentTool
from agents.items import TResponseStreamEvent
from agents.models.interface import Model
from agents.models.multi_provider import MultiProvider
from pydantic import TypeAdapter

from . import KernelTool, RoutedTool, recorded, routed


def openai_agents_tools(tools: Iterable[KernelTool]) -> list[AgentTool]:
    """The kernel tools as function tools, in the same order, each with the kernel's schema (not
    made strict: the kernel validates the arguments and the model reads what it refuses)."""
    return [_function_tool(tool) for tool in routed(tools)]


def _function_tool(tool: RoutedTool) -> FunctionTool:
    async def invoke(context: RunContextWrapper[Any], arguments: str) -> str:
        # The model's JSON text as it wrote it: the kernel parses it, and records what it refuses.
        answer = await tool.call(arguments or "{}")
        return answer.text

    return FunctionTool(
        name=tool.name,
        description=tool.description,
        params_json_schema=tool.input_schema,
        on_invoke_tool=invoke,
        strict_json_schema=False,
    )


_RESPONSE = TypeAdapter(ModelResponse)


class RecordedModel(Model):
    """A model whose answers in a hosted run are steps of the run (`step:<step_id>#N`), replayed
    from the record when the handler runs again. `Runner.run` asks `get_response`, which is
    recorded; a streamed run (`Runner.run_streamed`) is not, and asks the model each time."""

    def __init__(self, model: Model, *, step_id: str = "model") -> None:
        self.model = model
        self.step_id = step_id

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        async def ask() -> ModelResponse:
            return await self.model.get_response(*args, **kwargs)

        return await recorded(self.step_id, ask, _dump, _RESPONSE.validate_python)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        return self.model.stream_response(*args, **kwargs)


def _dump(response: ModelResponse) -> Any:
    return _RESPONSE.dump_python(response, mode="json", by_alias=True)


class RecordedModelProvider(ModelProvider):
    """Gives each agent's model, named or default, as a `RecordedModel`: pass it as
    `RunConfig(model_provider=RecordedModelProvider())` to record every model a run asks.
    `provider` finds the models (the SDK's own `MultiProvider` by default)."""

    def __init__(self, provider: ModelProvider | None = None, *, step_id: str = "model") -> None:
        self.provider = provider or MultiProvider()
        self.step_id = step_id

    def get_model(self, model_name: str | None) -> Model:
        return RecordedModel(self.provider.get_model(model_name), step_id=self.step_id)


def recorded_model(model: Model, *, step_id: str = "model") -> Model:
    """`model` as a `RecordedModel`, for an `Agent(model=...)` given a model object."""
    return RecordedModel(model, step_id=step_id)
