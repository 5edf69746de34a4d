"""Kernel tools for Pydantic AI: `pydantic_ai_toolset([...])` gives a toolset for an
`Agent(toolsets=[...])`. Every call the agent makes goes through the kernel when it runs in a
hosted handler (see `kernel_sdk.integrations`).

```python
@agent
async def support(ctx: AgentContext, question: str) -> str:
    bot = Agent(model, toolsets=[pydantic_ai_toolset([lookup_order, refund])])
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
from pydantic_ai.toolsets import FunctionToolset

from . import KernelTool, RoutedTool, routed


def pydantic_ai_toolset(tools: Iterable[KernelTool]) -> FunctionToolset[Any]:
    """The kernel tools as one toolset, each with the kernel's name, description and schema."""
    return FunctionToolset([_tool(tool) for tool in routed(tools)])


def _tool(tool: RoutedTool) -> Tool[Any]:
    async def call(**arguments: Any) -> Any:
        answer = await tool.call(arguments)
        return answer.output if answer.ok else answer.text

    return Tool.from_schema(call, tool.name, tool.description, tool.input_schema)
