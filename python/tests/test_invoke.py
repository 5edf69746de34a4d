"""Tools run as the worker runs them, without a kernel: argument validation, threads, streams,
the test context, and the options as the kernel registers them."""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass

import pytest
from pydantic import BaseModel

from kernel_sdk import (
    Cancellation,
    RetryPolicy,
    ToolContext,
    ToolDefinitionError,
    ToolError,
    tool,
    wrap_tool,
)
from kernel_sdk._proto import common_pb2
from kernel_sdk._wire import tool_spec


class Address(BaseModel):
    city: str
    zip: str


@dataclass
class Window:
    start: int
    end: int


@tool
async def ship(ctx: ToolContext, to: Address, window: Window) -> dict[str, object]:
    """Ships a parcel."""
    assert isinstance(to, Address) and isinstance(window, Window)
    return {"city": to.city, "days": window.end - window.start, "by": ctx.idempotency_key}


async def test_arguments_are_validated_into_the_parameter_types() -> None:
    ctx = ToolContext.for_test(idempotency_key="ik_1")
    result = await ship.invoke(
        ctx, {"to": {"city": "Lyon", "zip": "69001"}, "window": {"start": 1, "end": 4}}
    )
    assert result == {"city": "Lyon", "days": 3, "by": "ik_1"}
    with pytest.raises(ToolError) as refused:
        await ship.invoke(ctx, {"to": {"city": "Lyon"}, "window": {"start": 1, "end": 4}})
    assert refused.value.kind == "fatal" and "to.zip" in refused.value.message


@tool
def blocking_sum(ctx: ToolContext, a: int, b: int) -> dict[str, object]:
    """Adds in a thread."""
    ctx.progress("adding", current=1, total=1)
    return {"sum": a + b, "thread": threading.current_thread() is not threading.main_thread()}


async def test_a_plain_def_runs_in_a_thread_and_reports_progress_from_it() -> None:
    ctx = ToolContext.for_test()
    assert await blocking_sum.invoke(ctx, {"a": 1, "b": 2}) == {"sum": 3, "thread": True}
    assert [(p.message, p.current, p.total) for p in ctx.progress_log] == [("adding", 1, 1)]
    assert blocking_sum.blocking and not ship.blocking
    assert tool_spec(blocking_sum).options.blocking


@tool
async def steps(ctx: ToolContext, n: int):  # type: ignore[no-untyped-def]
    """Streams n steps, then a summary."""
    for i in range(n):
        yield {"step": i}
    yield "done"


async def test_an_async_generator_reports_all_but_its_last_item() -> None:
    ctx = ToolContext.for_test()
    assert await steps.invoke(ctx, {"n": 2}) == "done"
    assert [(p.message, p.data) for p in ctx.progress_log] == [
        ('{"step":0}', {"step": 0}),
        ('{"step":1}', {"step": 1}),
    ]

    @tool
    async def silent(ctx: ToolContext):  # type: ignore[no-untyped-def]
        """Streams nothing at all."""
        nothing: tuple[str, ...] = ()
        for item in nothing:
            yield item

    with pytest.raises(ToolError, match="streamed nothing") as empty:
        await silent.invoke(ToolContext.for_test(), {})
    assert empty.value.kind == "fatal"


def test_a_plain_generator_is_refused_with_what_to_write_instead() -> None:
    def gen(n: int):  # type: ignore[no-untyped-def]
        """Yields."""
        yield n

    with pytest.raises(ToolDefinitionError, match="make it an async generator"):
        tool(gen)


async def test_the_test_context_keeps_a_cache_in_memory_with_expiry() -> None:
    ctx = ToolContext.for_test()
    await ctx.cache.set("k", [1, 2])
    assert await ctx.cache.get("k") == [1, 2]
    await ctx.cache.set("short", 1, ttl=0.01)
    await asyncio.sleep(0.05)
    assert await ctx.cache.get("short", "gone") == "gone"
    with pytest.raises(ToolError, match="1 to 256 bytes"):
        await ctx.cache.get("")


async def test_a_cancellation_is_a_flag_for_threads_and_an_event_for_coroutines() -> None:
    cancellation = Cancellation()
    assert not cancellation
    waiter = asyncio.ensure_future(cancellation.wait())
    threading.Thread(target=cancellation.set, args=("timeout",)).start()
    await asyncio.wait_for(waiter, 5)
    assert cancellation and cancellation.is_set() and cancellation.reason == "timeout"
    assert cancellation.wait_sync(0)


def test_options_reach_the_kernel_as_declared() -> None:
    @tool(
        retries=RetryPolicy.exponential(5, 0.5, 8),
        timeout=2.5,
        idempotency="at_most_once",
        writes=True,
        requires_approval="args.cents > 100",
        approval_timeout=3600,
        risk="high",
        owner="payments",
        permissions=["billing:write"],
        resources=["ledger"],
        cost_per_call=0.25,
        strip_nulls=True,
    )
    async def charge(cents: int) -> str:
        """Charges."""
        return "ok"

    options = tool_spec(charge).options
    assert options.retry.max_attempts == 5 and options.retry.initial_interval_ms == 500
    assert options.retry.backoff_coefficient == 2.0 and options.retry.max_interval_ms == 8000
    assert options.timeout_ms == 2500 and options.approval_timeout_ms == 3_600_000
    assert options.idempotency == common_pb2.IDEMPOTENCY_AT_MOST_ONCE and options.writes
    assert not options.requires_approval and options.requires_approval_expr == "args.cents > 100"
    assert options.risk == common_pb2.RISK_LEVEL_HIGH and options.owner == "payments"
    assert list(options.permissions) == ["billing:write"] and list(options.resources) == ["ledger"]
    assert options.cost_per_call == 0.25 and options.strip_nulls and not options.blocking

    @tool(retries=2, requires_approval=True)
    async def plain() -> str:
        """Plain."""
        return "ok"

    options = tool_spec(plain).options
    assert options.retry.max_attempts == 3 and options.requires_approval
    assert not tool_spec(ship).options.HasField("retry"), "no retries: the kernel's default"


async def test_a_wrapped_callable_runs_sync_in_a_thread_or_async_on_the_loop() -> None:
    def lookup(args: dict[str, object]) -> dict[str, object]:
        return {"thread": threading.current_thread() is not threading.main_thread(), **args}

    async def fetch(args: dict[str, object]) -> str:
        return f"fetched {args['url']}"

    sync_tool = wrap_tool("lookup", lookup, description="Looks up.", args_schema={"properties": {}})
    async_tool = wrap_tool(
        "fetch",
        fetch,
        description="Fetches.",
        args_schema={"properties": {"url": {"type": "string"}}},
        to_result=str.upper,
    )
    ctx = ToolContext.for_test()
    assert await sync_tool.invoke(ctx, {"q": 1}) == {"thread": True, "q": 1}
    assert await async_tool.invoke(ctx, {"url": "x"}) == "FETCHED X"
    assert sync_tool.blocking and not async_tool.blocking


def test_a_schema_given_replaces_the_derived_one_in_the_definition_and_fingerprint() -> None:
    schema = {"properties": {"q": {"type": "string", "minLength": 1}}, "required": ["q"]}

    @tool(args_schema=schema)
    async def search(q: str) -> str:
        """Searches."""
        return q

    @tool
    async def search_derived(q: str) -> str:
        """Searches."""
        return q

    assert search.definition.input_schema == {"type": "object", **schema}
    assert search.fingerprint != search_derived.fingerprint


async def test_ctx_http_is_one_shared_async_client() -> None:
    import httpx

    ctx = ToolContext.for_test(deps={"db": "fake"})
    assert isinstance(ctx.http, httpx.AsyncClient) and ctx.http is ctx.http
    assert ctx.deps == {"db": "fake"}
    await ctx.http.aclose()


async def test_a_cancelled_call_has_a_grace_to_end_then_is_dropped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from kernel_sdk import worker as worker_module

    monkeypatch.setattr(worker_module, "_CANCEL_GRACE", 0.05)

    async def ends_when_told(cancelled: Cancellation) -> str:
        await cancelled.wait()
        return "ended on its own"

    async def ignores_it() -> str:
        await asyncio.sleep(10)
        return "never"

    # A tool that ends within the grace gives its result.
    told = Cancellation()
    asyncio.get_running_loop().call_later(0.01, told.set, "cancel")
    assert await worker_module._within_grace(ends_when_told(told), told) == "ended on its own"

    # One that ignores the cancel is dropped once the grace is over.
    ignored = Cancellation()
    ignored.set("timed out")
    with pytest.raises(ToolError, match="call cancelled before it finished: timed out") as dropped:
        await worker_module._within_grace(ignores_it(), ignored)
    assert dropped.value.kind == "retryable"
    current = asyncio.current_task()
    assert current is not None and current.cancelling() == 0, "the drop is not the task's cancel"

    # The task's own cancel (its session ends) is not turned into a tool error.
    outer = asyncio.ensure_future(worker_module._within_grace(ignores_it(), Cancellation()))
    await asyncio.sleep(0.01)
    outer.cancel()
    with pytest.raises(asyncio.CancelledError):
        await outer
