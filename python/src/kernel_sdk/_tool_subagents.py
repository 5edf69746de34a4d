"""Subagents a tool body starts, questions it asks a person and tools it calls: how it reaches
the kernel, and what it waits on.

A call's body starts a child run through the worker's session (`KernelLink`), fenced by the
call's dispatch, so the same call run again (a retry, a redispatch) gets back the child it
started, never a second one. `SubagentWaits` keeps what the body waits on, so the worker can give
back the call's slot once the body has waited on subagents alone for a while.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from .records import CallResult

# How long a body must wait on the same subagents before its call may give back its slot (and a
# hosted handler on its children and answers): long enough that a child that ends at once is
# awaited in place, as the Rust SDK waits.
SUSPEND_AFTER = 0.1


@dataclass(frozen=True)
class ChildStep:
    """A subagent step of the calling run, as the kernel answered."""

    key: str
    child_run_id: str
    settled: bool
    succeeded: bool
    output_json: str
    error: str


@dataclass(frozen=True)
class NestedCall:
    """A call a tool body made through the kernel, as the kernel answered: its step key, and
    its result once it has settled."""

    key: str
    result: CallResult | None


class KernelLink(Protocol):
    """How a dispatched call's body reaches the kernel: the worker's session, under the call's
    dispatch. Failures come back as `ToolError`."""

    async def start(
        self, agent: str, input_json: str, session: str, occurrence: int
    ) -> ChildStep: ...

    async def await_step(self, key: str) -> ChildStep: ...

    async def ask(self, fields: dict[str, Any], occurrence: int) -> ChildStep:
        """Asks a person the question `fields` hold (`_question.question_fields`)."""
        ...

    async def call(
        self, tool: str, arguments_json: str, timeout_ms: int, occurrence: int
    ) -> NestedCall:
        """Calls `tool` through the kernel as the body's `occurrence`-th call."""
        ...

    async def await_call(self, key: str) -> CallResult:
        """The result of the body's call `key`, once it has settled."""
        ...


class SubagentWaits:
    """What one call's body has started and waits on: each agent's count of children (their
    identity within the call) and the subagent steps awaited now."""

    def __init__(self) -> None:
        self._occurrences: dict[str, int] = {}
        self._waiting: dict[str, int] = {}
        self._changed = asyncio.Event()
        self.on_wait: Callable[[], None] | None = None
        """Called when the body starts waiting on a subagent (the worker watches it then)."""

    def occurrence(self, agent: str) -> int:
        """How many children of `agent` the body started before this one."""
        count = self._occurrences.get(agent, 0)
        self._occurrences[agent] = count + 1
        return count

    @contextlib.contextmanager
    def waiting(self, key: str) -> Iterator[None]:
        """Marks `key` awaited while the block runs."""
        self._waiting[key] = self._waiting.get(key, 0) + 1
        self._changed.set()
        if self.on_wait is not None:
            self.on_wait()
        try:
            yield
        finally:
            left = self._waiting[key] - 1
            if left:
                self._waiting[key] = left
            else:
                del self._waiting[key]
            self._changed.set()

    async def suspendable(self, refused: Sequence[str] = ()) -> list[str]:
        """The subagent steps awaited, once the body has awaited them alone for `SUSPEND_AFTER`
        without a change: the call may then give back its slot. Never `refused`, the steps of a
        suspension the kernel refused: the body waits on, holding its slot, until what it awaits
        changes."""
        while True:
            self._changed.clear()
            waiting = sorted(self._waiting)
            if not waiting or waiting == list(refused):
                await self._changed.wait()
                continue
            try:
                await asyncio.wait_for(self._changed.wait(), SUSPEND_AFTER)
            except TimeoutError:
                return waiting
