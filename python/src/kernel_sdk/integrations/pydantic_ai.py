"""Kernel tools for Pydantic AI: `pydantic_ai_toolset([...])` gives a toolset for an
`Agent(toolsets=[...])`. Every call the agent makes goes through the kernel when it runs in a
hosted handler (see `kernel_sdk.integrations`).

```python
@agent
async def support(ctx: AgentContext, question: str) -> str:
    bot = Agent(recorded_model("anthropic:claude-sonnet-4-5"),
                toolsets=[pydantic_ai_toolset([lookup_order, refund])])
    result = await bot.run(question)
    return result.output
```

A result reaches the model as data; a call without one as the kernel's text. A call that waits
for a person waits in the kernel, durably, not as one of Pydantic AI's deferred tool calls: the
run parks, the handler gives its worker back, and the agent goes on from the recorded calls
once the person answers. Needs the `pydantic-ai` extra: `pip install "kernel-sdk[pydantic-ai]"`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from pydantic_ai import Tool
from pydantic_ai.messages import ModelMessage, ModelMessagesTypeAdapter, ModelResponse
from pydantic_ai.models import Model, ModelRequestParameters
from pydantic_ai.models.wrapper import WrapperModel
from pydantic_ai.settings import ModelSettings
from pydantic_ai.toolsets import FunctionToolset

from . import KernelTool, RoutedTool, recorded, routed


def pydantic_ai_toolset(tools: Iterable[KernelTool]) -> FunctionToolset[Any]:
    """The kernel tools as one toolset, each with the kernel's name, description and schema."""
    return FunctionToolset([_tool(tool) for tool in routed(tools)])


def _tool(tool: RoutedTool) -> Tool[Any]:
    async def call(**arguments: Any) -> Any:
        answer = await tool.call(arguments)
        return answer.output if answer.ok else answer.text

    return Tool.from_schema(call, tool.name, tool.description, tool.input_schema)


class RecordedModel(WrapperModel):
    """A model whose answers in a hosted run are steps of the run (`step:<step_id>#N`), replayed
    from the record when the handler runs again. `Agent.run` asks `request`, which is recorded;
    a streamed run (`run_stream`) is not, and asks the model each time."""

    def __init__(self, wrapped: Model | str, *, step_id: str = "model") -> None:
        super().__init__(wrapped)
        self.step_id = step_id

    async def request(
        self,
        messages: list[ModelMessage],
        model_settings: ModelSettings | None,
        model_request_parameters: ModelRequestParameters,
    ) -> ModelResponse:
        async def ask() -> ModelResponse:
            return await self.wrapped.request(messages, model_settings, model_request_parameters)

        return await recorded(self.step_id, ask, _dump, _load)


def _dump(response: ModelResponse) -> Any:
    return ModelMessagesTypeAdapter.dump_python([response], mode="json")[0]


def _load(recorded: Any) -> ModelResponse:
    [response] = ModelMessagesTypeAdapter.validate_python([recorded])
    assert isinstance(response, ModelResponse), "a recorded answer is a model response"
    return response


def recorded_model(model: Model | str, *, step_id: str = "model") -> Model:
    """`model` (a model, or a name such as `"openai:gpt-5"`) as a `RecordedModel`."""
    return RecordedModel(model, step_id=step_id)
