"""The kernel's rules for calls, driven from the Python SDK against the real kernel: the rows of
docs/reference/seed-parity.md the Rust suite checks end to end, checked from Python too. An
unknown tool, a call outside its turn's offer, the run's call limit, what capture withholds, a
tool changed under a recorded call, a blocking tool past its timeout, the result
cache, a recorded approval's replay, a run no person may answer, a turn's concurrency bound, the
cost of a run, and an `at_most_once` call recorded but not yet started."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import pytest
from conftest import pending_approval, serving
from harness import Kernel, eventually, within

from kernel_sdk import (
    AgentClient,
    CallOutcome,
    KernelError,
    Tool,
    ToolCall,
    ToolContext,
    TurnEvent,
    tool,
    wrap_tool,
)


@tool(read_only=True)
async def add(ctx: ToolContext, a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


async def test_an_unknown_tool_runs_nothing_and_the_model_reads_what_exists(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add):
        run = await client.create_run("lost")
        turn = await client.call_turn(
            run.id, 0, [ToolCall("weather", {"city": "Oslo"}), ToolCall("add", {"a": 1, "b": 2})]
        )
        unknown, added = turn.results
        assert unknown.outcome == CallOutcome.UNKNOWN_TOOL
        assert unknown.content.startswith("unknown tool 'weather'; available: "), unknown.content
        assert "add" in unknown.content
        assert added.output == 3, "the turn goes on"
        events = await client.list_events(run.id)
        about = [e.type for e in events if e.payload.get("tool") == "weather"]
        assert "tool:start" not in about and "tool:result" in about, about
        assert (await client.get_run(run.id)).run.tool_calls == 2, "it counts as a call"


@tool(read_only=True)
async def echo(ctx: ToolContext, text: str) -> str:
    """Says its text back."""
    return text


async def test_a_call_outside_the_turns_offer_is_unknown_and_a_recorded_one_no_longer_offered_diverges(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add, echo):
        run = await client.create_run("offered")
        calls = [ToolCall("add", {"a": 1, "b": 2}), ToolCall("echo", {"text": "hi"})]
        first = (await client.call_turn(run.id, 0, calls, offered_tools=["add", "lookup"])).results
        assert first[0].output == 3
        assert first[1].outcome == CallOutcome.UNKNOWN_TOOL
        # The model is told what it was offered, though a worker offers echo.
        assert first[1].content == "unknown tool 'echo'; available: add, lookup", first[1].content

        # The same turn again, add no longer offered: its recorded call is not served.
        again = (await client.call_turn(run.id, 0, calls, offered_tools=["lookup"])).results
        assert again[0].outcome == CallOutcome.REPLAY_INPUT_CHANGED, again[0]
        assert "which this turn does not offer" in again[0].content, again[0].content
        assert again[1].replayed, "the unknown call replays its recorded outcome"

        events = len(await client.list_events(run.id))
        with pytest.raises(KernelError) as refused:
            await client.call_turn(run.id, 1, calls, offered_tools=["bad name"])
        assert refused.value.code == "INVALID_ARGUMENT"
        assert refused.value.message.startswith("offered_tools[0]:"), refused.value.message
        assert len(await client.list_events(run.id)) == events, "a refused turn writes nothing"


async def test_capture_decides_what_inspection_shows_while_replay_keeps_everything(
    kernel: Kernel, client: AgentClient
) -> None:
    # The planted value holds letters no hex id can, so a random id never looks like a leak.
    async with serving(kernel, echo):
        for capture in ("none", "metadata"):
            run = await client.create_run(
                "secretive", input={"card": "card-QZ-4111"}, capture=capture
            )
            calls = [ToolCall("echo", {"text": "card-QZ-4111"})]
            [result] = (await client.call_turn(run.id, 0, calls)).results
            assert result.content == "card-QZ-4111", (
                "the agent gets its result whatever the capture"
            )
            [replayed] = (await client.call_turn(run.id, 0, calls)).results
            assert replayed.replayed and replayed.content == "card-QZ-4111", "replay has it all"
            shown = await client.get_run(run.id)
            text = repr(shown)
            assert "card-QZ" not in text, f"capture={capture} leaks through GetRun: {text}"
            assert f"capture={capture}" in text, text
            events = await client.list_events(run.id)
            assert "card-QZ" not in repr(events), f"capture={capture} leaks through the event log"


async def test_a_runs_calls_count_toward_its_max_tool_calls_and_a_call_past_it_never_runs(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add):
        run = await client.create_run("bounded", max_tool_calls=2)
        calls = [ToolCall("add", {"a": n, "b": 1}) for n in range(3)] + [ToolCall("nope", {})]
        results = (await client.call_turn(run.id, 0, calls)).results
        assert [r.output for r in results[:2]] == [1, 2]
        for over in results[2:]:
            assert over.outcome == CallOutcome.LIMIT_EXCEEDED, over
            assert over.content.startswith(
                f"max_tool_calls reached: run {run.id} may make at most 2 tool calls"
            ), over.content
        events = await client.list_events(run.id)
        starts = [e for e in events if e.type == "tool:start"]
        assert len(starts) == 2, "a call past the limit never starts"
        assert (await client.get_run(run.id)).run.tool_calls == 2, "nor counts"


def _lookup(description: str) -> Tool:
    return wrap_tool(
        "lookup",
        lambda args: "found",
        description=description,
        args_schema={"properties": {"q": {"type": "integer"}}},
    )


async def test_a_recorded_call_whose_tool_changed_replays_as_a_divergence(
    kernel: Kernel, client: AgentClient
) -> None:
    before, after = _lookup("version one"), _lookup("version two")
    calls = [ToolCall("lookup", {"q": 1})]
    async with serving(kernel, before):
        run = await client.create_run("replayer")
        assert (await client.call_turn(run.id, 0, calls)).results[0].output == "found"
    async with serving(kernel, after):
        [replayed] = (await client.call_turn(run.id, 0, calls)).results
    assert replayed.outcome == CallOutcome.REPLAY_INPUT_CHANGED
    assert replayed.content.startswith(
        "replay_input_changed: tool 'lookup' changed since step t0/p0 was recorded"
    ), replayed.content
    assert before.fingerprint in replayed.content and after.fingerprint in replayed.content
    [step] = (await client.get_run(run.id)).steps
    assert step.attempts == 1, "nothing ran again"


BLOCKING_STARTS: list[float] = []


@tool(timeout=0.3, retries=3)
def blocking(ctx: ToolContext, seconds: float) -> str:
    """Sleeps in its thread, whatever the kernel says."""
    BLOCKING_STARTS.append(time.monotonic())
    time.sleep(seconds)
    return "woke"


async def test_a_blocking_tool_past_its_timeout_is_not_retried(
    kernel: Kernel, client: AgentClient
) -> None:
    BLOCKING_STARTS.clear()
    async with serving(kernel, blocking):
        run = await client.create_run("sleeper")
        [result] = (
            await client.call_turn(run.id, 0, [ToolCall("blocking", {"seconds": 0.6})])
        ).results
        assert result.outcome == CallOutcome.TIMED_OUT, result
        assert result.attempts == 1, "its thread cannot be stopped: another attempt would overlap"
        assert len(BLOCKING_STARTS) == 1


CHECKSUMS: list[str] = []


@tool(read_only=True, cache_ttl=60)
async def checksum(ctx: ToolContext, text: str) -> int:
    """A checksum of a text, cached by the kernel for a minute."""
    CHECKSUMS.append(text)
    return sum(text.encode())


async def test_a_read_only_tool_with_a_cache_ttl_is_served_from_the_store(
    kernel: Kernel, client: AgentClient
) -> None:
    CHECKSUMS.clear()
    async with serving(kernel, checksum):
        first = await client.create_run("hasher")
        [fresh] = (
            await client.call_turn(first.id, 0, [ToolCall("checksum", {"text": "abc"})])
        ).results
        second = await client.create_run("hasher")
        hit, miss = (
            await client.call_turn(
                second.id,
                0,
                [ToolCall("checksum", {"text": "abc"}), ToolCall("checksum", {"text": "abd"})],
            )
        ).results
        assert hit.content == fresh.content and hit.attempts == 0, "served from the store"
        assert miss.attempts == 1, "other arguments are a miss"
        assert CHECKSUMS == ["abc", "abd"]
        events = await client.list_events(second.id)
        [hit_event] = [
            e for e in events if e.type == "tool:result" and e.payload.get("position") == 0
        ]
        assert hit_event.payload["cache"] == "hit"


REFUNDS: list[int] = []


@tool(writes=True, requires_approval=True)
async def wire(ctx: ToolContext, cents: int) -> str:
    """Wires money, once a person approves."""
    REFUNDS.append(cents)
    return f"wired {cents}"


@tool(writes=True, requires_approval="args.cents > 10000")
async def refund(ctx: ToolContext, cents: int) -> str:
    """Refunds; more than 10000 cents waits for a person."""
    return f"refunded {cents}"


async def test_an_answered_approval_replays_and_other_arguments_at_its_place_diverge(
    kernel: Kernel, client: AgentClient
) -> None:
    REFUNDS.clear()
    async with serving(kernel, wire):
        run = await client.create_run("payer")
        turn = asyncio.ensure_future(client.call_turn(run.id, 0, [ToolCall("wire", {"cents": 5})]))

        approval = await pending_approval(client, run.id, "the wire to wait for a person")
        await client.approve(approval, decider="ops")
        [ran] = (await within("the approved wire", turn)).results
        assert ran.output == "wired 5"

        [again] = (await client.call_turn(run.id, 0, [ToolCall("wire", {"cents": 5})])).results
        assert again.replayed and again.output == "wired 5", "the answer is not asked again"
        [other] = (await client.call_turn(run.id, 0, [ToolCall("wire", {"cents": 6})])).results
        assert other.outcome == CallOutcome.REPLAY_INPUT_CHANGED, other
        assert REFUNDS == [5]


async def test_a_non_interactive_run_cannot_wait_for_a_person(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, add, wire, refund):
        run = await client.create_run("stream-consumer", non_interactive=True)
        with pytest.raises(KernelError) as refused:
            await client.call_turn(
                run.id, 0, [ToolCall("add", {"a": 1, "b": 1}), ToolCall("wire", {"cents": 1})]
            )
        assert refused.value.code == "FAILED_PRECONDITION"
        assert "calls[1]" in refused.value.message and "non-interactive" in refused.value.message
        assert not (await client.get_run(run.id)).steps, "the refused turn wrote nothing"
        # A call only a predicate gates is denied rather than parked.
        [denied] = (
            await client.call_turn(run.id, 0, [ToolCall("refund", {"cents": 20_000})])
        ).results
        assert denied.outcome == CallOutcome.DENIED
        assert denied.content.startswith("refund not allowed. reason: it needs a person's approval")


RUNNING = {"now": 0, "most": 0}


@tool(read_only=True)
async def overlap(ctx: ToolContext, n: int) -> int:
    """Holds a while, counting how many of its calls run at once."""
    RUNNING["now"] += 1
    RUNNING["most"] = max(RUNNING["most"], RUNNING["now"])
    await asyncio.sleep(0.1)
    RUNNING["now"] -= 1
    return n


async def test_a_turns_calls_run_at_once_up_to_its_max_concurrency(
    kernel: Kernel, client: AgentClient
) -> None:
    RUNNING.update(now=0, most=0)
    async with serving(kernel, overlap, max_concurrency=8):
        run = await client.create_run("fan-out")
        calls = [ToolCall("overlap", {"n": n}) for n in range(6)]
        turn = await client.call_turn(run.id, 0, calls, max_concurrency=2)
        assert [r.output for r in turn.results] == list(range(6)), "results in position order"
        assert RUNNING["most"] == 2, RUNNING


@tool(read_only=True, cost_per_call=0.25)
async def bureau_score(ctx: ToolContext, account: str) -> int:
    """A credit bureau's score (a paid call)."""
    return 700


async def test_each_calls_cost_is_recorded_and_summed_for_the_run(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, bureau_score, add):
        run = await client.create_run("scorer")
        await client.call_turn(
            run.id,
            0,
            [
                ToolCall("bureau_score", {"account": "a"}),
                ToolCall("bureau_score", {"account": "b"}),
                ToolCall("add", {"a": 1, "b": 1}),
            ],
        )
        detail = await client.get_run(run.id)
        assert detail.total_cost == pytest.approx(0.5)
        assert detail.cost_by_tool == {"bureau_score": pytest.approx(0.5)}
        assert [s.cost for s in detail.steps] == [0.25, 0.25, 0.0]


GATE = threading.Event()
CHARGES: list[int] = []


@tool(writes=True, idempotency="at_most_once", timeout=30)
async def charge(ctx: ToolContext, cents: int) -> str:
    """Charges once; holds its slot until the test lets it go."""
    CHARGES.append(cents)
    while not GATE.is_set():
        await asyncio.sleep(0.01)
    return f"charged {cents}"


async def test_an_at_most_once_call_recorded_but_never_started_still_runs(
    kernel: Kernel, client: AgentClient
) -> None:
    GATE.clear()
    CHARGES.clear()
    # One slot: the second charge is recorded, and waits for it.
    async with serving(kernel, charge, max_concurrency=1):
        run = await client.create_run("biller")
        first = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("charge", {"cents": 1})])
        )

        async def started() -> bool:
            return CHARGES == [1]

        await eventually("the first charge to start", started)

        # The agent submits the second and goes away before it starts.
        second = client.submit_turn(run.id, 1, [ToolCall("charge", {"cents": 2})])

        async def recorded() -> bool:
            steps = (await client.get_run(run.id)).steps
            return any(s.step_key == "t1/p0" and s.status == "pending" for s in steps)

        reader = asyncio.ensure_future(_drain(second))
        await eventually("the second charge to be recorded, not started", recorded)
        reader.cancel()
        assert CHARGES == [1]

        GATE.set()
        await within("the first charge", first)
        # The agent comes back: the recorded charge ran once, as it had not started.
        [result] = (await client.call_turn(run.id, 1, [ToolCall("charge", {"cents": 2})])).results
        assert result.outcome == CallOutcome.OK and result.attempts == 1, result
        assert CHARGES == [1, 2]


async def _drain(events: AsyncIterator[TurnEvent]) -> None:
    async for _ in events:
        pass
