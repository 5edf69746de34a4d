"""A Python worker with a few tools and a hosted agent, the Python side of the Rust demo worker.

    python python/examples/worker.py --kernel 127.0.0.1:50051
    cargo run -p kernelctl -- runs start py_trip_planner --input '{"destination": "Lisbon"}' --follow

It serves until SIGTERM or Ctrl-C, then drains: calls in flight finish, no new ones come.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import time
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from kernel_sdk import AgentContext, StepInfo, ToolContext, ToolError, Worker, agent, tool

ORDERS = {
    "A-1001": {"customer": "cus_42", "total_cents": 4200, "status": "shipped"},
    "A-1002": {"customer": "cus_7", "total_cents": 125000, "status": "delivered"},
}


class Order(BaseModel):
    order_id: str
    customer: str
    total_cents: int
    status: Literal["pending", "shipped", "delivered"]


@tool(read_only=True, timeout=5)
async def lookup_order(
    ctx: ToolContext, order_id: Annotated[str, Field(description="Like A-1001")]
) -> Order:
    """Looks an order up by its id; answers are cached in the kernel for a minute."""
    cached = await ctx.cache.get(order_id)
    if cached is None:
        found = ORDERS.get(order_id)
        if found is None:
            raise ToolError.fatal(f"no order {order_id}; known: {', '.join(sorted(ORDERS))}")
        cached = {"order_id": order_id, **found}
        await ctx.cache.set(order_id, cached, ttl=60)
    return Order.model_validate(cached)


@tool(read_only=True)
def word_count(text: str) -> int:
    """Counts the words of a text (a plain def: it runs in the worker's threads)."""
    return len(text.split())


@tool(read_only=True, timeout=60)
async def summarize(ctx: ToolContext, order_id: str, steps: int = 3):  # type: ignore[no-untyped-def]
    """Writes an order's summary, streaming its progress (each yield but the last is progress)."""
    for step in range(1, steps + 1):
        if ctx.cancelled:
            raise ToolError.retryable("cancelled")
        yield {"step": step, "of": steps}
        await asyncio.sleep(0.2)
    yield f"order {order_id}: summarized in {steps} steps"


@tool(
    writes=True,
    idempotency="at_most_once",
    timeout=10,
    requires_approval="args.cents > 10000",
)
async def refund_order(
    ctx: ToolContext,
    order_id: str,
    cents: Annotated[int, Field(gt=0, description="The amount, in cents")],
) -> str:
    """Refunds part of an order (pretend); more than 10000 cents needs a person's approval."""
    # A real refund would send the idempotency key to the payment system as its dedup key.
    return f"refunded {cents} cents on {order_id} (idempotency key {ctx.idempotency_key})"


class Trip(BaseModel):
    destination: str
    days: int = 2


@agent
async def py_trip_planner(ctx: AgentContext, trip: Trip) -> dict[str, object]:
    """Plans a trip: asks a (scripted) model once, checks two orders in one turn, and keeps notes
    through a note-taker subagent on a session."""

    def ask_model(info: StepInfo) -> dict[str, object]:
        # A real model call goes here: recorded once, its answer replayed after a crash.
        return {"stops": [trip.destination, "the coast"], "asked_at": time.time()}

    plan = await ctx.once("model:plan", ask_model)
    orders = await ctx.call_turn(
        [("lookup_order", {"order_id": "A-1001"}), ("word_count", {"text": trip.destination})]
    )
    session = f"notes:{ctx.run_id}"
    notes = []
    for stop in plan["stops"]:
        notes.append(
            await ctx.subagent("py_note_taker", {"note": f"visit {stop}"}, session=session)
        )
    return {"plan": plan, "orders": [o.content for o in orders], "notes": notes[-1]}


@agent
async def py_note_taker(ctx: AgentContext, input: dict[str, str]) -> list[str]:
    """Keeps a list of notes: each run of a session adds one to what the last run kept."""
    session = ctx.session
    kept = list(session.previous_output or []) if session else []
    return [*kept, input["note"]]


async def main() -> None:
    parser = argparse.ArgumentParser(description="A Python worker for the kernel")
    parser.add_argument("--kernel", default=os.environ.get("KERNEL_ADDR", "127.0.0.1:50051"))
    parser.add_argument("--name", default="py-demo-worker")
    parser.add_argument("--api-key", default=os.environ.get("KERNEL_API_KEY"))
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    worker = Worker(
        args.kernel,
        [lookup_order, word_count, summarize, refund_order],
        agents=[py_trip_planner, py_note_taker],
        name=args.name,
        api_key=args.api_key,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
