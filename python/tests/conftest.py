"""Fixtures: a real kernel per test, and a helper that serves tools from this process."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from harness import Kernel

from kernel_sdk import AgentClient, Tool, Worker


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
