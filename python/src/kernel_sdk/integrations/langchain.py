"""Kernel tools for LangChain and LangGraph: `langchain_tools([...])` gives `StructuredTool`s to
hand to `create_agent` or a `ToolNode`. Every call the graph makes goes through the kernel when
the graph runs in a hosted handler (see `kernel_sdk.integrations`).

```python
@agent
async def support(ctx: AgentContext, question: str) -> str:
    model = recorded_model(init_chat_model("anthropic:claude-sonnet-4-5"))
    graph = create_agent(model, langchain_tools([lookup_order, refund]))
    state = await graph.ainvoke({"messages": [("user", question)]})
    return state["messages"][-1].text
```

A call that did not give a result (denied, rejected, failed) reaches the model as a
`ToolMessage` with `status="error"` and the kernel's text, so the graph goes on and the model can
take another path. Needs the `langchain` extra: `pip install "kernel-sdk[langchain]"`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, message_to_dict, messages_from_dict
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable, RunnableBinding
from langchain_core.tools import BaseTool, StructuredTool, ToolException

from . import KernelTool, RoutedTool, recorded, routed


def langchain_tools(tools: Iterable[KernelTool]) -> list[BaseTool]:
    """The kernel tools as LangChain tools, in the same order: each named, described and with
    the argument schema the kernel has for it; async only, as a hosted handler's graph runs."""
    return [_structured(tool) for tool in routed(tools)]


def _structured(tool: RoutedTool) -> StructuredTool:
    async def call(**arguments: Any) -> str:
        answer = await tool.call(arguments)
        if not answer.ok:
            raise ToolException(answer.text)
        return answer.text

    return StructuredTool(
        name=tool.name,
        description=tool.description,
        args_schema=tool.input_schema,
        coroutine=call,
        handle_tool_error=True,
    )


class _RecordedChatModel(BaseChatModel):
    """A chat model whose answers are steps of the run (see `recorded_model`)."""

    inner: BaseChatModel
    step_id: str = "model"

    @property
    def _llm_type(self) -> str:
        return f"recorded-{self.inner._llm_type}"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable[Any, AIMessage]:
        # The inner model formats the tools as its API wants them; its arguments come back to
        # `_agenerate` here, which hands them on.
        bound = self.inner.bind_tools(tools, **kwargs)
        if isinstance(bound, BaseChatModel):
            # A model that takes the tools another way (or not at all) binds nothing.
            return self
        if not isinstance(bound, RunnableBinding):
            raise TypeError(
                f"{type(self.inner).__name__}.bind_tools gave a {type(bound).__name__}, not "
                "a binding of its arguments; record the model's answers with ctx.step instead"
            )
        return self.bind(**bound.kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        # A sync call cannot wait on the run's record: it asks the model, unrecorded.
        message = self.inner.invoke(messages, stop=stop, **kwargs)
        return ChatResult(generations=[ChatGeneration(message=message)])

    async def _agenerate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        async def ask() -> BaseMessage:
            return await self.inner.ainvoke(messages, stop=stop, **kwargs)

        message = await recorded(self.step_id, ask, message_to_dict, _message_of)
        return ChatResult(generations=[ChatGeneration(message=message)])


def _message_of(recorded: Any) -> BaseMessage:
    [message] = messages_from_dict([recorded])
    return message


def recorded_model(model: BaseChatModel, *, step_id: str = "model") -> BaseChatModel:
    """`model`, with each answer it gives in a hosted run recorded as a step (`step:<step_id>#N`)
    and replayed from the record when the handler runs again; `bind_tools` and structured
    output work as on `model`. Only async calls (`ainvoke`, as `create_agent` makes them in a
    hosted handler) are recorded; outside a run it is `model`."""
    return _RecordedChatModel(inner=model, step_id=step_id)
