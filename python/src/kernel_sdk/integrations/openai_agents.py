"""Kernel tools for the OpenAI Agents SDK: `openai_agents_tools([...])` gives `FunctionTool`s for
an `Agent(tools=...)`. Every call the `Runner` makes goes through the kernel when it runs in a
hosted handler (see `kernel_sdk.integrations`), approvals included: a call a rule gates waits,
durably, for a person's answer in the kernel, and the handler gives its worker back meanwhile.

```python
@agent
async def support(ctx: AgentContext, question: str) -> str:
    bot = Agent(name="support", model=model, tools=openai_agents_tools([lookup_order, refund]))
    result = await Runner.run(bot, question)
    return str(result.final_output)
```

The model reads the kernel's text for every call: the result as JSON, or why there is none.
Needs the `openai-agents` extra: `pip install "kernel-sdk[openai-agents]"`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from agents import FunctionTool, RunContextWrapper
from agents import Tool as AgentTool

from . import KernelTool, RoutedTool, routed


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
