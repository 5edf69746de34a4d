"""Fixtures: a real kernel per test, and helpers that serve tools from this process and wait for
an approval or a run's end; the per-test time limit, and the end of every process a test
started."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from collections.abc import AsyncIterator, Generator, Iterator
from pathlib import Path

import pytest
from harness import Kernel, Process, eventually

from kernel_sdk import AgentClient, Event, Run, Tool, Worker

LIMIT_VAR = "E2E_TEST_TIMEOUT_S"
"""The per-test limit in seconds, shared with the Rust end-to-end tests (tests/src/watchdog.rs)."""


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """pytest-timeout fails a test over its limit (600 s, pyproject.toml); `E2E_TEST_TIMEOUT_S`
    sets the limit as it does for the Rust suite, and `--timeout` still wins over it. Runs before
    pytest-timeout reads its settings."""
    limit = os.environ.get(LIMIT_VAR)
    if limit and config.getoption("timeout", None) is None:
        try:
            config.option.timeout = float(limit)
        except ValueError:
            raise pytest.UsageError(f"{LIMIT_VAR}={limit!r} is not a number of seconds") from None


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    """A test over the limit says so under its name, with what sets the limit."""
    report = yield
    if call.excinfo is not None and "from pytest-timeout" in str(call.excinfo.value):
        said = (
            f"{item.nodeid}: {call.excinfo.value} {LIMIT_VAR} (or --timeout) sets the limit, "
            "600 s by default; the processes the test started are killed"
        )
        report.sections.append(("per-test time limit", said))
    return report


@pytest.fixture(autouse=True)
def _processes_end_with_their_test() -> Iterator[None]:
    """Every process the harness started ends with its test: one a test left running (it failed,
    or went over the time limit, before stopping it) is killed here, after the test's own
    fixtures and finally blocks have run."""
    yield
    killed = Process.stop_all()
    if killed:
        # Shown with the test's report when it failed.
        print(f"killed what the test left running: {', '.join(killed)}", file=sys.stderr)


@pytest.fixture
def kernel(tmp_path: Path) -> Iterator[Kernel]:
    """The kernel binary on port 0; a test whose kernel cannot start fails, never skips."""
    started = Kernel(tmp_path)
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
async def client(kernel: Kernel) -> AsyncIterator[AgentClient]:
    async with AgentClient(kernel.addr) as connected:
        yield connected


@contextlib.asynccontextmanager
async def serving(kernel: Kernel, *tools: Tool, **options: object) -> AsyncIterator[Worker]:
    """A worker in this process serving `tools`, open before the body runs, drained after."""
    settings: dict[str, object] = {"ephemeral_tools": True, **options}
    worker = Worker(kernel.addr, tools, **settings)  # type: ignore[arg-type]
    task = asyncio.create_task(worker.run(handle_signals=False))
    ready = asyncio.ensure_future(worker.wait_ready())
    done, _ = await asyncio.wait({task, ready}, timeout=30, return_when=asyncio.FIRST_COMPLETED)
    if ready not in done:
        ready.cancel()
        if task in done:
            task.result()
        raise AssertionError("the worker never opened a session")
    try:
        yield worker
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


async def pending_approval(client: AgentClient, run_id: str, what: str) -> str:
    """The id of the run's first pending approval, once there is one (`what` names the wait)."""

    async def asked() -> str:
        pending = await client.list_approvals(run_id=run_id)
        return pending[0].id if pending else ""

    return await eventually(what, asked)


async def ended_events(client: AgentClient, run_id: str) -> list[Event]:
    """The run's events, once its terminal event is recorded."""
    events: list[Event] = []
    async for event in client.watch_events(run_id):
        assert isinstance(event, Event)
        events.append(event)
    return events


async def ended_run(client: AgentClient, run_id: str) -> Run:
    """The run as it ended, once its terminal event is recorded."""
    async for _ in client.watch_events(run_id):
        pass
    return (await client.get_run(run_id)).run
