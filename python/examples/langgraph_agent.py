"""A LangGraph agent hosted by the kernel: every tool call the graph makes, and every answer its
model gives, is recorded in the run, checked by the policy, and replayed after a crash.

    pip install "./python[langchain]"
    python python/examples/langgraph_agent.py --kernel 127.0.0.1:50051
    cargo run -p kernelctl -- runs start support_graph --input '"refund order A-1001"' --follow
    cargo run -p kernelctl -- runs show <RUN_ID>

With no `--model` the model is scripted (no network, no key): it looks the order up and refunds
it. With `--model anthropic:claude-sonnet-4-5` (or any name LangChain's `init_chat_model` knows,
its provider's package installed and its key set) a real model decides.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
from typing import Any

from langchain.agents import create_agent
from langchain.chat_models import init_chat_model
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.utils.function_calling import convert_to_openai_tool

from kernel_sdk import AgentContext, ToolContext, Worker, agent, tool
from kernel_sdk.integrations.langchain import langchain_tools, recorded_model

ORDERS = {"A-1001": 4200, "A-1002": 125000}
MODEL: str | None = None
"""The model's name for `init_chat_model`; `None` scripts it."""


@tool(read_only=True)
async def lookup_order(order_id: str) -> dict[str, object]:
    """Looks an order up by its id (like A-1001): its total in cents."""
    if order_id not in ORDERS:
        return {"order_id": order_id, "found": False}
    return {"order_id": order_id, "found": True, "total_cents": ORDERS[order_id]}


@tool(writes=True, idempotency="at_most_once", requires_approval="args.cents > 10000")
async def refund_order(ctx: ToolContext, order_id: str, cents: int) -> str:
    """Refunds part of an order; more than 10000 cents waits for a person's approval."""
    return f"refunded {cents} cents on {order_id} (idempotency key {ctx.idempotency_key})"


class ScriptedChat(BaseChatModel):
    """A stand-in for a real model: looks up the order named in the question, refunds its
    total, then says what the tools said."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self.bind(tools=[convert_to_openai_tool(t) for t in tools], **kwargs)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        said = [m for m in messages if isinstance(m, ToolMessage)]
        order = next((w for w in messages[0].text.split() if w.startswith("A-")), "A-1001")
        found = json.loads(said[0].text) if len(said) == 1 else {}
        if not said:
            call = {"name": "lookup_order", "args": {"order_id": order}, "id": "c1"}
        elif found.get("found"):
            cents = found["total_cents"]
            call = {"name": "refund_order", "args": {"order_id": order, "cents": cents}, "id": "c2"}
        else:
            text = " / ".join(m.text for m in said)
            return ChatResult(generations=[ChatGeneration(message=AIMessage(content=text))])
        message = AIMessage(content="", tool_calls=[{**call, "type": "tool_call"}])
        return ChatResult(generations=[ChatGeneration(message=message)])


@agent
async def support_graph(ctx: AgentContext, question: str) -> str:
    """Answers a support question with a LangGraph agent whose calls go through the kernel."""
    model = init_chat_model(MODEL) if MODEL else ScriptedChat()
    graph = create_agent(recorded_model(model), langchain_tools([lookup_order, refund_order]))
    state = await graph.ainvoke({"messages": [HumanMessage(question)]})
    return str(state["messages"][-1].text)


async def main() -> None:
    global MODEL
    parser = argparse.ArgumentParser(description="A worker hosting a LangGraph agent")
    parser.add_argument("--kernel", default=os.environ.get("KERNEL_ADDR", "127.0.0.1:50051"))
    parser.add_argument("--model", help="a model for init_chat_model; scripted without one")
    parser.add_argument("--api-key", default=os.environ.get("KERNEL_API_KEY"))
    args = parser.parse_args()
    MODEL = args.model
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker = Worker(
        args.kernel,
        [lookup_order, refund_order],
        agents=[support_graph],
        name="py-langgraph-worker",
        api_key=args.api_key,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
