"""A Python worker against the real kernel: calls end to end, sync tools in threads and their
timeout, streaming progress, cancellation, the store-backed cache, approvals, a tool's exception
with its traceback, and results that are not JSON."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Any

import grpc
import pytest
from conftest import serving
from harness import Kernel, binary, eventually, within

from kernel_sdk import (
    AgentClient,
    CallOutcome,
    CallResult,
    ConcurrentCallIdError,
    Interruption,
    KernelError,
    ToolCall,
    ToolContext,
    ToolError,
    TurnProgress,
    tool,
)


@tool(read_only=True)
async def add(ctx: ToolContext, a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


@tool(timeout=0.5)
def sleepy(ctx: ToolContext, seconds: float) -> str:
    """Sleeps in its thread, stopping early when cancelled."""
    SLEEPY_THREADS.append(threading.current_thread().name)
    if ctx.cancelled.wait_sync(seconds):
        SLEEPY_CANCELLED.set()
        return "stopped"
    return "slept"


SLEEPY_THREADS: list[str] = []
SLEEPY_CANCELLED = threading.Event()


async def test_an_async_tool_runs_end_to_end_and_the_step_records_it(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add):
        run = await client.create_run("py-agent", input={"q": "sum"}, labels={"team": "py"})
        turn = await client.call_turn(run.id, 0, [ToolCall("add", {"a": 2, "b": 3})])
        [result] = turn.results
        assert result.outcome == CallOutcome.OK and result.output == 5 and result.content == "5"
        assert not result.replayed and result.attempts == 1

        # The same turn again is served from the log.
        again = await client.call_turn(run.id, 0, [ToolCall("add", {"a": 2, "b": 3})])
        assert again.results[0].replayed and again.results[0].output == 5

        done = await client.complete_run(run.id, {"answer": 5})
        assert done.status == "completed" and done.output == {"answer": 5}
        detail = await client.get_run(run.id)
        [step] = detail.steps
        assert step.tool == "add" and step.arguments == {"a": 2, "b": 3} and step.output == 5
        assert step.tool_fingerprint == add.fingerprint and step.worker
        assert detail.run.labels == {"team": "py"}


@tool(read_only=True)
async def traced(ctx: ToolContext) -> dict[str, str]:
    """Returns the trace context the kernel handed the call."""
    return ctx.trace_context()


AGENT_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


async def test_a_tool_is_handed_the_agents_trace_context(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, traced):
        run = await client.create_run("py-agent", traceparent=AGENT_TRACEPARENT)
        assert run.trace_id == "0af7651916cd43dd8448eb211c80319c"
        turn = await client.call_turn(run.id, 0, [ToolCall("traced", {})])
        # Without --otlp-endpoint the kernel exports no span of its own to put between them.
        assert turn.results[0].output == {"traceparent": AGENT_TRACEPARENT}

        untraced = await client.create_run("py-agent")
        assert len(untraced.trace_id) == 32 and untraced.trace_id != run.trace_id
        turn = await client.call_turn(untraced.id, 0, [ToolCall("traced", {})])
        assert turn.results[0].output == {}
    assert ToolContext.for_test().trace_context() == {}


async def test_a_call_id_held_in_flight_by_another_call_raises_concurrent_call_id_error(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, sleepy):
        run = await client.create_run("py-agent")
        first = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("sleepy", {"seconds": 0.4}, "nap")])
        )

        async def in_flight() -> bool:
            return bool((await client.get_run(run.id)).steps)

        await eventually("the first call to be recorded", in_flight)
        with pytest.raises(ConcurrentCallIdError) as refused:
            await client.call_turn(run.id, 1, [ToolCall("sleepy", {"seconds": 0.1}, "nap")])
        assert refused.value.code == "ALREADY_EXISTS"
        assert "call_id 'nap'" in refused.value.message
        assert isinstance(refused.value, KernelError)
        [result] = (await first).results
        assert result.output == "slept"


@tool(read_only=True)
async def whereami(ctx: ToolContext) -> dict[str, object]:
    """Says where its call stands in the run."""
    return {
        "turn": ctx.turn,
        "turn_id": ctx.turn_id,
        "position": ctx.position,
        "step_key": ctx.step_key,
        "idempotency_key": ctx.idempotency_key,
    }


async def test_a_tool_knows_its_turn_position_and_idempotency_key(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, whereami):
        run = await client.create_run("py-agent")
        turn = await client.call_turn(run.id, 3, [ToolCall("whereami", {})] * 2)
        [first, second] = [result.output for result in turn.results]
        assert first["turn"] == first["turn_id"] == 3 and second["position"] == 1
        assert second["step_key"] == "t3/p1"
        steps = {s.step_key: s for s in (await client.get_run(run.id)).steps}
        assert second["idempotency_key"] == steps["t3/p1"].idempotency_key


async def test_bad_arguments_are_refused_by_the_kernel_before_the_tool(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add):
        run = await client.create_run("py-agent")
        turn = await client.call_turn(run.id, 0, [ToolCall("add", {"a": "two", "b": 3})])
        [result] = turn.results
        assert result.outcome == CallOutcome.INVALID_ARGUMENTS
        assert "a" in result.content


async def test_a_sync_tool_runs_in_a_thread_and_its_timeout_cancels_it(
    kernel: Kernel, client: AgentClient
) -> None:
    SLEEPY_THREADS.clear()
    SLEEPY_CANCELLED.clear()
    async with serving(kernel, sleepy, name="threads"):
        run = await client.create_run("py-agent")
        quick = await client.call_turn(run.id, 0, [ToolCall("sleepy", {"seconds": 0.01})])
        assert quick.results[0].output == "slept"
        assert SLEEPY_THREADS == ["tool-threads_0"], "a plain def runs in the worker's threads"

        started = time.monotonic()
        slow = await client.call_turn(run.id, 1, [ToolCall("sleepy", {"seconds": 30})])
        [result] = slow.results
        assert result.outcome == CallOutcome.TIMED_OUT, result
        assert time.monotonic() - started < 20, "the timeout, not the sleep, ended the call"
        # The kernel's cancel reached the thread through ctx.cancelled.
        assert await asyncio.to_thread(SLEEPY_CANCELLED.wait, 10)


@tool(read_only=True)
async def countdown(ctx: ToolContext, start: int):  # type: ignore[no-untyped-def]
    """Counts down, streaming each number, then lifts off."""
    for n in range(start, 0, -1):
        yield str(n)
        await asyncio.sleep(0.05)
    yield {"status": "liftoff"}


async def test_an_async_generator_streams_every_item_but_the_last_as_progress(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, countdown):
        run = await client.create_run("py-agent")
        events = [
            event
            async for event in client.submit_turn(run.id, 0, [ToolCall("countdown", {"start": 3})])
        ]
        progress = [e.message for e in events if isinstance(e, TurnProgress)]
        results = [e for e in events if isinstance(e, CallResult)]
        assert progress == ["3", "2", "1"]
        assert isinstance(events[-1], CallResult), "the progress came live, before the result"
        assert results[0].output == {"status": "liftoff"}
        [step] = (await client.get_run(run.id)).steps
        assert step.progress_count == 3


HELD = asyncio.Event()


@tool(timeout=60)
async def hold(ctx: ToolContext) -> str:
    """Waits until the call is cancelled."""
    HELD.set()
    await ctx.cancelled.wait()
    return f"cancelled: {ctx.cancelled.reason}"


async def test_cancelling_the_run_reaches_the_running_tool(
    kernel: Kernel, client: AgentClient
) -> None:
    HELD.clear()
    async with serving(kernel, hold):
        run = await client.create_run("py-agent")
        turn = asyncio.ensure_future(client.call_turn(run.id, 0, [ToolCall("hold")]))
        await within("the held call to start", HELD.wait(), 30)
        cancelled = await client.cancel_run(run.id, "the user left")
        assert cancelled.status == "cancelled"
        [result] = (await within("the turn's results", turn, 30)).results
        assert result.outcome == CallOutcome.CANCELLED, result


# An event of its own: an asyncio.Event is bound to the loop of the first test that waits on it.
HELD_ALONE = asyncio.Event()


@tool(timeout=60)
async def hold_alone(ctx: ToolContext) -> str:
    """Waits until the call is cancelled."""
    HELD_ALONE.set()
    await ctx.cancelled.wait()
    return f"cancelled: {ctx.cancelled.reason}"


async def test_cancelling_one_call_reaches_its_tool_and_the_run_goes_on(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, hold_alone, add):
        run = await client.create_run("py-agent")
        turn = asyncio.ensure_future(client.call_turn(run.id, 0, [ToolCall("hold_alone")]))
        await within("the held call to start", HELD_ALONE.wait(), 30)
        step = await client.cancel_call(run.id, "t0/p0", "not needed")
        assert (step.step_key, step.status) == ("t0/p0", "cancelled"), step
        [result] = (await within("the turn's results", turn, 30)).results
        assert result.outcome == CallOutcome.CANCELLED, result
        assert result.content == "cancelled: not needed"
        [summed] = (await client.call_turn(run.id, 1, [ToolCall("add", {"a": 1, "b": 2})])).results
        assert summed.output == 3
        assert (await client.get_run(run.id)).run.status == "running"


@tool(read_only=True)
async def remember(ctx: ToolContext, key: str, value: int | None = None) -> object:
    """Writes a value to the tool's cache, or reads it back."""
    if value is not None:
        await ctx.cache.set(key, {"v": value}, ttl=60)
        return "stored"
    return await ctx.cache.get(key, "missing")


async def test_the_cache_is_kept_by_the_kernel_across_calls_and_workers(
    kernel: Kernel, client: AgentClient
) -> None:
    run = await client.create_run("py-agent")
    # Kept registered when the first worker leaves: an ephemeral tool's cache goes with it.
    async with serving(kernel, remember, name="first", ephemeral_tools=False):
        stored = await client.call_turn(run.id, 0, [ToolCall("remember", {"key": "k", "value": 7})])
        assert stored.results[0].output == "stored"
    async with serving(kernel, remember, name="second"):
        read = await client.call_turn(run.id, 1, [ToolCall("remember", {"key": "k"})])
        assert read.results[0].output == {"v": 7}
        other = await client.call_turn(run.id, 2, [ToolCall("remember", {"key": "nope"})])
        assert other.results[0].output == "missing"


@tool(writes=True, requires_approval=True)
async def refund(ctx: ToolContext, cents: int) -> str:
    """Refunds an amount in cents."""
    return f"refunded {cents}"


async def test_an_approval_round_trip_from_python(kernel: Kernel, client: AgentClient) -> None:
    async with serving(kernel, refund):
        run = await client.create_run("py-agent")
        events = client.submit_turn(run.id, 0, [ToolCall("refund", {"cents": 500})])
        first = await anext(events)
        assert isinstance(first, Interruption) and first.tool == "refund"
        assert first.arguments == {"cents": 500}
        [waiting] = await client.list_approvals(run_id=run.id)
        assert waiting.id == first.approval_id and waiting.status == "pending"
        approved = await client.approve(waiting.id, decider="ana", reason="looks right")
        assert approved.status in ("approved", "consumed")
        result = await anext(events)
        assert isinstance(result, CallResult) and result.output == "refunded 500"
        assert result.approval is not None and result.approval.decider == "ana"

        # A rejection reaches the model as a readable refusal.
        events = client.submit_turn(run.id, 1, [ToolCall("refund", {"cents": 9})])
        asked = await anext(events)
        assert isinstance(asked, Interruption)
        await client.reject(asked.approval_id, decider="ana", reason="too small")
        rejected = await anext(events)
        assert isinstance(rejected, CallResult) and rejected.outcome == CallOutcome.REJECTED
        assert "too small" in rejected.content


@tool(
    writes=True,
    requires_approval="args.cents > 10000",
    approval_timeout=timedelta(hours=1),
)
async def large_refund(ctx: ToolContext, cents: int) -> str:
    """Refunds an amount in cents; more than 10,000 waits for a person, for an hour at most."""
    return f"refunded {cents}"


async def test_a_predicate_with_a_timedelta_timeout_parks_only_the_large_refund(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, large_refund):
        run = await client.create_run("py-agent")
        small = await client.call_turn(run.id, 0, [ToolCall("large_refund", {"cents": 500})])
        [ran] = small.results
        assert ran.output == "refunded 500" and ran.approval is None, "no one was asked"

        events = client.submit_turn(run.id, 1, [ToolCall("large_refund", {"cents": 25_000})])
        asked = await anext(events)
        assert isinstance(asked, Interruption) and asked.arguments == {"cents": 25_000}
        [waiting] = await client.list_approvals(run_id=run.id)
        assert waiting.status == "pending" and waiting.expires_at is not None
        # The SDK's times are naive, in UTC.
        left = waiting.expires_at - datetime.now(UTC).replace(tzinfo=None)
        assert timedelta(minutes=55) < left <= timedelta(hours=1), left
        await client.reject(waiting.id, decider="ana", reason="too much")
        rejected = await anext(events)
        assert isinstance(rejected, CallResult) and rejected.outcome == CallOutcome.REJECTED


@tool(retries=0)
async def picky(ctx: ToolContext, mode: str) -> str:
    """Fails the way it is told to."""
    if mode == "fatal":
        raise ToolError.fatal("never going to work")
    raise RuntimeError("exploded")


async def test_tool_errors_reach_the_model_with_their_kind(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, picky):
        run = await client.create_run("py-agent")
        turn = await client.call_turn(
            run.id, 0, [ToolCall("picky", {"mode": "fatal"}), ToolCall("picky", {"mode": "other"})]
        )
        fatal, other = turn.results
        assert fatal.outcome == CallOutcome.TOOL_ERROR and fatal.error_kind == "fatal"
        assert "never going to work" in fatal.content
        assert other.error_kind == "retryable" and "RuntimeError: exploded" in other.content


def _amount(text: str) -> int:
    return int(text)


@tool(retries=0)
async def parse_amount(ctx: ToolContext, text: str) -> int:
    """Parses an amount of cents."""
    return _amount(text)


# Where the traceback's last frame is: the line of _amount that raises.
LAST_FRAME = f'File "{__file__}", line {_amount.__code__.co_firstlineno + 1}, in _amount'


async def test_a_tools_exception_keeps_its_traceback_in_the_run_and_the_workers_log(
    kernel: Kernel, client: AgentClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kernel_sdk")
    async with serving(kernel, parse_amount):
        run = await client.create_run("py-agent")
        turn = await client.call_turn(run.id, 0, [ToolCall("parse_amount", {"text": "ten"})])
    [result] = turn.results
    assert result.content.startswith("ValueError: invalid literal for int() with base 10: 'ten'")
    assert "Traceback (most recent call last):" in result.content and LAST_FRAME in result.content
    assert "kernel_sdk" not in result.content, "the SDK's own frames are left out"

    [failed] = [r for r in caplog.records if r.getMessage().startswith("dispatch failed")]
    assert failed.levelno == logging.WARNING and failed.exc_info is not None
    assert "error=ValueError: invalid literal" in failed.getMessage()
    assert LAST_FRAME in caplog.text

    kernelctl = [str(binary("kernelctl")), "--addr", f"http://{kernel.addr}"]
    shown = await _run(*kernelctl, "runs", "show", run.id)
    assert "retryable: ValueError: invalid literal for int() with base 10: 'ten'" in shown, shown
    # The traceback's last lines follow under `trace:`; --json has it whole.
    assert "  trace:\n" in shown and LAST_FRAME in shown, shown
    [step] = json.loads(await _run(*kernelctl, "--json", "runs", "show", run.id))["steps"]
    assert LAST_FRAME in step["error"]["message"], step


async def _run(*command: str) -> str:
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=30, check=True
    )
    return done.stdout


@tool(read_only=True)
async def ratio(ctx: ToolContext, kind: str) -> dict[str, float]:
    """Returns a ratio that is not a number, or is infinite."""
    return {"ratio": float("nan") if kind == "nan" else float("-inf")}


async def test_a_result_that_is_not_a_number_is_an_error_naming_the_tool(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, ratio):
        run = await client.create_run("py-agent")
        turn = await client.call_turn(
            run.id, 0, [ToolCall("ratio", {"kind": "nan"}), ToolCall("ratio", {"kind": "inf"})]
        )
    for result in turn.results:
        assert result.outcome == CallOutcome.TOOL_ERROR and result.error_kind == "fatal", result
        assert result.content.startswith("tool 'ratio' returned a value that is not JSON"), result


class Ledger:
    """An app object the worker hands its tools."""

    def __init__(self) -> None:
        self.entries: list[str] = []


@tool
async def record(ctx: ToolContext, entry: str) -> int:
    """Appends an entry to the app's ledger."""
    ledger: Ledger = ctx.deps
    ledger.entries.append(f"{entry}@{ctx.step_key}")
    return len(ledger.entries)


async def test_tools_reach_the_apps_objects_through_deps(
    kernel: Kernel, client: AgentClient
) -> None:
    ledger = Ledger()
    async with serving(kernel, record, deps=ledger):
        run = await client.create_run("py-agent")
        turn = await client.call_turn(
            run.id, 0, [ToolCall("record", {"entry": "a"}, call_id="first")]
        )
        assert turn.results[0].output == 1
    assert ledger.entries == ["a@id:first"]


_asked: list[int] = []


def _over_10_000(args: dict[str, Any]) -> bool:
    _asked.append(args["cents"])
    if args["cents"] < 0:
        raise ValueError("a negative amount")
    return bool(args["cents"] > 10_000)


@tool(idempotency="at_most_once", writes=True, requires_approval=_over_10_000)
async def py_refund(ctx: ToolContext, cents: int) -> str:
    """Refunds an amount in cents; the worker's predicate decides who is asked."""
    return f"refunded {cents}"


async def test_a_python_predicate_decides_in_the_worker_and_its_answer_is_recorded(
    kernel: Kernel, client: AgentClient
) -> None:
    """The seed's spelling, a Python function of the arguments: the kernel asks the worker before
    it records each new call; a 500-cent refund runs unasked, a 25,000-cent one waits for a
    person, and a predicate that raises asks too. A resubmitted turn is served from the record."""
    _asked.clear()
    async with serving(kernel, py_refund):
        run = await client.create_run("py-agent")
        [small] = (
            await client.call_turn(run.id, 0, [ToolCall("py_refund", {"cents": 500})])
        ).results
        assert small.output == "refunded 500" and small.approval is None, small

        events = client.submit_turn(run.id, 1, [ToolCall("py_refund", {"cents": 25_000})])
        asked = await anext(events)
        assert isinstance(asked, Interruption) and asked.arguments == {"cents": 25_000}
        [waiting] = await client.list_approvals(run_id=run.id)
        await client.approve(waiting.id, decider="ana")
        approved = await anext(events)
        assert isinstance(approved, CallResult) and approved.output == "refunded 25000", approved

        events = client.submit_turn(run.id, 2, [ToolCall("py_refund", {"cents": -5})])
        raised = await anext(events)
        assert isinstance(raised, Interruption), "a predicate that raises asks a person"
        [waiting] = await client.list_approvals(run_id=run.id)
        await client.reject(waiting.id, decider="ana", reason="negative")
        rejected = await anext(events)
        assert isinstance(rejected, CallResult) and rejected.outcome == CallOutcome.REJECTED
        assert _asked == [500, 25_000, -5]

        again = await client.call_turn(run.id, 0, [ToolCall("py_refund", {"cents": 500})])
        assert again.results[0].replayed and again.results[0].output == "refunded 500"
        assert _asked == [500, 25_000, -5], "a replayed turn does not ask again"


class _Refusing:
    """A `CallTurn` stub that refuses with `code`, as an older or a strict kernel would."""

    def __init__(self, code: grpc.StatusCode) -> None:
        self.code = code
        self.asked = 0

    async def __call__(self, request: object, **kwargs: object) -> object:
        self.asked += 1
        raise grpc.aio.AioRpcError(self.code, grpc.aio.Metadata(), grpc.aio.Metadata(), "no")


async def test_call_turn_falls_back_to_the_stream_when_one_answer_cannot_do(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add):
        run = await client.create_run("py-agent")
        # One answer for the whole turn, by default.
        assert (await client.call_turn(run.id, 0, [ToolCall("add", {"a": 1, "b": 1})])).results[
            0
        ].output == 2

        # Too big for one answer: this turn goes by the stream, the next asks for one answer again.
        too_big = _Refusing(grpc.StatusCode.RESOURCE_EXHAUSTED)
        client._calls.CallTurn = too_big
        [result] = (await client.call_turn(run.id, 1, [ToolCall("add", {"a": 2, "b": 2})])).results
        assert result.output == 4 and too_big.asked == 1
        await client.call_turn(run.id, 2, [ToolCall("add", {"a": 3, "b": 3})])
        assert too_big.asked == 2

        # A kernel without CallTurn: the stream, from then on.
        older = _Refusing(grpc.StatusCode.UNIMPLEMENTED)
        client._calls.CallTurn = older
        for turn in (3, 4):
            [result] = (
                await client.call_turn(run.id, turn, [ToolCall("add", {"a": turn, "b": 0})])
            ).results
            assert result.output == turn
        assert older.asked == 1


_GATHERED = {"started": 0}
_RELEASE = asyncio.Event()


@tool(read_only=True)
async def gathered(ctx: ToolContext, n: int) -> int:
    """Waits for the test to release every call at once, then returns its number."""
    _GATHERED["started"] += 1
    await _RELEASE.wait()
    return n


async def test_results_ready_together_go_to_the_kernel_in_one_message_each_recorded(
    kernel: Kernel, client: AgentClient, caplog: pytest.LogCaptureFixture
) -> None:
    _GATHERED["started"] = 0
    _RELEASE.clear()
    caplog.set_level(logging.DEBUG, logger="kernel_sdk.worker")
    async with serving(kernel, gathered, max_concurrency=16):
        run = await client.create_run("gatherer")
        turn = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("gathered", {"n": n}) for n in range(12)])
        )

        async def all_started() -> bool:
            return _GATHERED["started"] == 12

        await eventually("the twelve calls to start", all_started)
        # Released at once, every call's result is queued before the session's sender runs.
        _RELEASE.set()
        results = (await within("the turn", turn, 30)).results
    assert [r.output for r in results] == list(range(12))
    sent = [r.getMessage() for r in caplog.records if "results sent together" in r.getMessage()]
    assert sent == ["results sent together count=12"], sent
    steps = (await client.get_run(run.id)).steps
    assert all(step.status == "succeeded" and step.attempts == 1 for step in steps), steps
