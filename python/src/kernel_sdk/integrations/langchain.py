"""Kernel tools for LangChain and LangGraph: `langchain_tools([...])` gives `StructuredTool`s to
hand to `create_agent` or a `ToolNode`. Every call the graph makes goes through the kernel when
the graph runs in a hosted handler (see `kernel_sdk.integrations`).

```python
@agent
async def support(ctx: AgentContext, question: str) -> str:
    graph = create_agent(model, langchain_tools([lookup_order, refund]))
    state = await graph.ainvoke({"messages": [("user", question)]})
    return state["messages"][-1].text
```

A call that did not give a result (denied, rejected, failed) reaches the model as a
`ToolMessage` with `status="error"` and the kernel's text, so the graph goes on and the model can
take another path. Needs the `langchain` extra: `pip install "kernel-sdk[langchain]"`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langchain_core.tools import BaseTool, StructuredTool, ToolException

from . import KernelTool, RoutedTool, routed


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
