"""Python workers that die, drain, and share a run with a Rust worker, against the real kernel."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

from conftest import serving
from harness import Kernel, Process, binary, python_worker, within

from kernel_sdk import AgentClient, CallOutcome, ToolCall, ToolContext, tool


def _started(line: str) -> dict[str, str]:
    """`started tool=py_fetch key=ik_... attempt=1` as its fields."""
    return dict(word.split("=", 1) for word in line.split() if "=" in word)


async def test_a_safe_call_whose_worker_is_killed_finishes_on_another_with_the_same_key(
    kernel: Kernel, client: AgentClient
) -> None:
    first = python_worker(kernel, "--hang", "--name", "first")
    second: Process | None = None
    try:
        await first.said("worker session open")
        run = await client.create_run("py-agent")
        turn = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("py_fetch", {"url": "https://example.com"})])
        )
        began = _started(await first.said("started tool=py_fetch"))
        assert began["attempt"] == "1"
        first.kill9()

        second = python_worker(kernel, "--name", "second")
        ran = _started(await second.said("started tool=py_fetch"))
        assert ran["key"] == began["key"], "a retry carries the call's idempotency key"
        assert int(ran["attempt"]) >= 2
        [result] = (await within("the turn's results", turn, 30)).results
        assert result.outcome == CallOutcome.OK, result
        assert result.output["key"] == began["key"]
        [step] = (await client.get_run(run.id)).steps
        assert step.worker == "second" and step.attempts >= 2
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_a_hung_worker_loses_its_lease_and_its_late_result_is_not_recorded(
    kernel: Kernel, client: AgentClient
) -> None:
    first = python_worker(kernel, "--slow", "2", "--name", "first")
    second: Process | None = None
    try:
        await first.said("worker session open")
        run = await client.create_run("py-agent")
        turn = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("py_fetch", {"url": "https://example.com"})])
        )
        await first.said("started tool=py_fetch")
        second = python_worker(kernel, "--name", "second")
        await second.said("worker session open")
        # Hung: no heartbeat, no result; its lease lapses and the call goes to the other worker.
        first.process.send_signal(signal.SIGSTOP)
        ran = _started(await second.said("started tool=py_fetch"))
        assert ran["attempt"] == "2"
        [result] = (await within("the turn's results", turn, 30)).results
        assert result.outcome == CallOutcome.OK and result.output["attempt"] == 2, result
        first.process.send_signal(signal.SIGCONT)
        # The resumed worker finds its session gone and opens another; its late result went
        # nowhere.
        await first.said("worker session open")
        events = await client.list_events(run.id)
        lost = [e.payload for e in events if e.type == "tool:lease_lost"]
        assert lost and "lease expired" in lost[0]["reason"], lost
        results = [e.payload for e in events if e.type == "tool:result"]
        assert [r["attempts"] for r in results] == [2], "only the live attempt's result"
        [step] = (await client.get_run(run.id)).steps
        assert step.worker == "second" and step.attempts == 2
    finally:
        first.process.send_signal(signal.SIGCONT)
        first.stop()
        if second is not None:
            second.stop()


async def test_an_at_most_once_call_whose_worker_is_killed_is_indeterminate_never_run_twice(
    kernel: Kernel, client: AgentClient
) -> None:
    first = python_worker(kernel, "--hang", "--name", "first")
    second: Process | None = None
    try:
        await first.said("worker session open")
        run = await client.create_run("py-agent")
        turn = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("py_charge", {"cents": 1200})])
        )
        await first.said("started tool=py_charge")
        # A worker that would finish the charge is there when the first one dies.
        second = python_worker(kernel, "--name", "second")
        await second.said("worker session open")
        first.kill9()
        [result] = (await within("the turn's results", turn, 30)).results
        assert result.outcome == CallOutcome.INDETERMINATE, result
        assert not any("started" in line for line in second.lines), "the charge ran twice"
        [step] = (await client.get_run(run.id)).steps
        assert step.attempts == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_sigterm_drains_a_worker_its_call_finishes_and_it_exits_cleanly(
    kernel: Kernel, client: AgentClient
) -> None:
    worker = python_worker(kernel, "--slow", "1", "--name", "draining")
    try:
        await worker.said("worker session open")
        run = await client.create_run("py-agent")
        turn = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("py_fetch", {"url": "u"})])
        )
        await worker.said("started tool=py_fetch")
        code = await asyncio.to_thread(worker.terminate)
        assert code == 0, worker.log()
        assert any("worker draining" in line and "in_flight=1" in line for line in worker.lines)
        [result] = (await within("the turn's results", turn, 30)).results
        assert result.outcome == CallOutcome.OK, result
    finally:
        worker.stop()


@tool(read_only=True)
async def shout(ctx: ToolContext, text: str) -> str:
    """Upper-cases a text."""
    return text.upper()


async def test_a_python_worker_and_a_rust_worker_serve_one_run(
    kernel: Kernel, client: AgentClient
) -> None:
    rust = Process(
        [str(binary("demo-worker")), "--kernel", f"http://{kernel.addr}", "--name", "rust-demo"],
        "rust demo worker",
    )
    try:
        await rust.said("worker session open")
        async with serving(kernel, shout, name="python-demo"):
            run = await client.create_run("mixed-agent")
            turn = await client.call_turn(
                run.id, 0, [ToolCall("add", {"a": 40, "b": 2}), ToolCall("shout", {"text": "hi"})]
            )
            assert [r.output for r in turn.results] == [42, "HI"]
            steps = (await client.get_run(run.id)).steps
            assert {s.tool: s.worker for s in steps} == {"add": "rust-demo", "shout": "python-demo"}
    finally:
        rust.stop()


async def test_a_worker_reconnects_after_the_kernel_is_killed_and_restarted(
    kernel: Kernel,
) -> None:
    async with serving(kernel, shout, name="reconnecting", ephemeral_tools=False) as worker:
        first = worker.session_id
        await asyncio.to_thread(kernel.restart)
        # The old session is gone; the worker opens a new one on the restarted kernel.
        second = await within("the worker's next session", worker.wait_ready(after=first), 30)
        assert second != first
        async with AgentClient(kernel.addr) as client:
            run = await client.create_run("py-agent")
            turn = await client.call_turn(run.id, 0, [ToolCall("shout", {"text": "back"})])
            assert turn.results[0].output == "BACK"


_charges: list[int] = []
_lingering = asyncio.Event()


@tool
async def linger(seconds: float) -> str:
    """Waits `seconds`, then says it is done."""
    _lingering.set()
    await asyncio.sleep(seconds)
    return "done"


@tool(idempotency="at_most_once")
async def charge_once(cents: int) -> str:
    """Charges `cents`, counting each charge."""
    _charges.append(cents)
    return f"charged {cents}"


async def test_an_agent_resubmits_a_turn_refused_while_the_kernel_drains(tmp_path: Path) -> None:
    kernel = Kernel(tmp_path, "--drain-timeout-ms", "20000")
    try:
        async with (
            serving(kernel, linger, charge_once, name="drained", ephemeral_tools=False),
            AgentClient(kernel.addr) as client,
        ):
            held = await client.create_run("py-held")
            holding = asyncio.ensure_future(
                client.call_turn(held.id, 0, [ToolCall("linger", {"seconds": 2})])
            )
            await within("the lingering call to start", _lingering.wait(), 30)
            run = await client.create_run("py-patient")
            kernel.process.process.send_signal(signal.SIGTERM)
            await kernel.process.said("draining: new turns and sessions refused")
            turn = asyncio.ensure_future(
                client.call_turn(run.id, 0, [ToolCall("charge_once", {"cents": 5})])
            )
            # The running call finishes and reaches its turn before the kernel exits.
            [lingered] = (await within("the holding turn's results", holding, 30)).results
            assert lingered.outcome == CallOutcome.OK, lingered
            assert await asyncio.to_thread(kernel.process.process.wait, 30) == 0
            assert not turn.done(), "the refused turn waits for the kernel to be back"
            await asyncio.to_thread(kernel.restart)
            [charged] = (await within("the turn's results", turn, 60)).results
            assert charged.outcome == CallOutcome.OK, charged
            assert _charges == [5], "the charge ran once"
    finally:
        kernel.stop()
