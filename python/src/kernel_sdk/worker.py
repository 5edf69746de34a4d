"""The worker: serves a set of tools to the kernel over one session at a time, reconnecting when
the connection breaks, draining when told to stop.

A session is one bidirectional stream: Hello and Welcome, then dispatches, cancels, heartbeats,
progress, results and cache requests, each fenced by its `(dispatch_id, attempt)` pair. Each
dispatch runs on its own task (a plain `def` tool in the worker's threads); a separate task sends
heartbeats so a busy tool never starves the lease. A refused registration ends `run` with
`WorkerRefused`; a lost connection is retried with exponential backoff and jitter (100 ms doubling
to 5 s); `stop()` (or SIGTERM / SIGINT) drains the open session: no more dispatches, the calls in
flight finish within the drain timeout, then the stream closes.

The worker says what it does on the `kernel_sdk.worker` logger: the session it opened (its name,
tools and kernel), each backoff while it cannot reach the kernel (with a hint), its drain and its
stop. With no logging configured those lines go to stderr (`_show_logs_by_default`). A tool that
raises fails its call as retryable with the exception's type, text and traceback, and the worker
logs it at WARNING with the traceback.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import inspect
import json
import logging
import os
import random
import signal
import sys
import threading
import time
import traceback
from collections.abc import AsyncIterator, Coroutine, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc

from . import _wire as wire
from ._agent_wire import SETTLED, call_result
from ._proto import (
    common_pb2,
    hosted_pb2,
    hosted_pb2_grpc,
    tool_calls_pb2,
    workers_pb2,
    workers_pb2_grpc,
)
from ._tool_subagents import ChildStep, NestedCall
from .context import Cancellation, Progress, ToolContext, _Shared, current_run
from .errors import ToolError, WorkerRefused
from .hosted import Agent, AgentContext, AgentError, agent_spec
from .records import CallResult
from .tools import Tool, ToolDefinitionError
from .transport import Tls, channel, metadata, target

logger = logging.getLogger("kernel_sdk.worker")

SDK_VERSION = "kernel-sdk-python/0.1.0"
DEFAULT_MAX_CONCURRENCY = 8
DEFAULT_DRAIN_TIMEOUT = 10.0
_HANDSHAKE_TIMEOUT = 10.0
_CANCEL_GRACE = 2.0
_CLOSE_TIMEOUT = 2.0
_DEFAULT_HEARTBEAT = 5.0
_CACHE_TIMEOUT = 30.0
_RECONNECT_INITIAL = 0.1
_RECONNECT_MAX = 5.0
# A verdict on the registration, not a fault of the connection: connecting again will not help.
_REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.UNAUTHENTICATED,
    grpc.StatusCode.UNIMPLEMENTED,
}


class Worker:
    """A process's connection to the kernel, serving its tools.

    ```python
    worker = Worker("127.0.0.1:50051", tools=[add], name="math")
    await worker.run()  # until SIGTERM, SIGINT or worker.stop()
    ```

    `agents` are hosted agents (`@agent`) whose runs the kernel dispatches here, each holding a
    slot while its handler runs. `max_concurrency` calls and handlers run at once (the kernel never
    sends more); `deps` is what tools reach
    as `ctx.deps`; `api_key` is sent as `authorization: Bearer ...` (the key needs
    `workers:connect`, and its tool globs must cover every tool offered); `tls` reaches a kernel
    serving TLS; `drain_timeout` is how long stopping waits for calls in flight; with
    `ephemeral_tools` the kernel forgets the tools once no session offers them (for tests).

    With no logging configured, `run` shows the worker's lines (connected, cannot reach the
    kernel, draining, stopped) on stderr at INFO; configure logging before `run` to send them
    elsewhere, or set the `kernel_sdk` logger's level to quiet them.
    """

    def __init__(
        self,
        kernel: str,
        tools: Iterable[Tool] = (),
        *,
        agents: Iterable[Agent] = (),
        name: str = "worker",
        max_concurrency: int = DEFAULT_MAX_CONCURRENCY,
        api_key: str | None = None,
        tls: Tls | None = None,
        deps: Any = None,
        drain_timeout: float = DEFAULT_DRAIN_TIMEOUT,
        ephemeral_tools: bool = False,
    ) -> None:
        target(kernel, tls)
        metadata(api_key)
        if not name.strip():
            raise ValueError("the worker name is empty")
        if max_concurrency < 1:
            raise ValueError("max_concurrency must be at least 1")
        self.tools: dict[str, Tool] = {}
        for item in tools:
            if not isinstance(item, Tool):
                raise ToolDefinitionError(
                    f"{item!r} is not a tool: decorate it with @tool or build it with wrap_tool"
                )
            if item.name in self.tools:
                raise ToolDefinitionError(f"tool '{item.name}' is offered twice")
            self.tools[item.name] = item
        self.agents: dict[str, Agent] = {}
        for hosted in agents:
            if not isinstance(hosted, Agent):
                raise ToolDefinitionError(f"{hosted!r} is not an agent: decorate it with @agent")
            if hosted.name in self.agents:
                raise ToolDefinitionError(f"agent '{hosted.name}' is hosted twice")
            self.agents[hosted.name] = hosted
        if not self.tools and not self.agents:
            raise ValueError("the worker offers no tools and hosts no agents")
        self.kernel = kernel
        self.name = name
        self.max_concurrency = max_concurrency
        self.drain_timeout = drain_timeout
        self.ephemeral_tools = ephemeral_tools
        self._tls = tls
        self._api_key = api_key
        self._shared = _Shared(deps=deps)
        self._stopping: asyncio.Event | None = None
        self._stop_requested = False
        self.session_id: str | None = None
        """The open session's id, `None` between sessions."""
        self._session_changed = asyncio.Condition()

    def stop(self) -> None:
        """Drains the open session and ends `run` (safe to call from a signal handler or before
        `run` starts)."""
        self._stop_requested = True
        if self._stopping is not None:
            self._stopping.set()

    async def wait_ready(self, *, after: str | None = None) -> str:
        """Returns the id of an open session (the kernel has registered the tools and may
        dispatch to them), waiting for `run` to open one; with `after`, one other than that
        session (a reconnection)."""
        async with self._session_changed:
            await self._session_changed.wait_for(
                lambda: self.session_id is not None and self.session_id != after
            )
            assert self.session_id is not None
            return self.session_id

    async def _set_session(self, session_id: str | None) -> None:
        async with self._session_changed:
            self.session_id = session_id
            self._session_changed.notify_all()

    async def run(self, *, handle_signals: bool = True) -> None:
        """Serves the tools until `stop()` (or SIGTERM / SIGINT, with `handle_signals` on the main
        thread), then drains and returns. Raises `WorkerRefused` if the kernel refuses the session.
        """
        _show_logs_by_default()
        loop = asyncio.get_running_loop()
        self._stopping = asyncio.Event()
        if self._stop_requested:
            self._stopping.set()
        handled: list[signal.Signals] = []
        if handle_signals and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, self.stop)
                handled.append(signum)
        # Shared by every session, so calls a lost session left running count against the limit.
        slots = asyncio.Semaphore(self.max_concurrency)
        threads = ThreadPoolExecutor(
            max_workers=self.max_concurrency * 2, thread_name_prefix=f"tool-{self.name}"
        )
        try:
            await self._sessions(slots, threads)
        finally:
            for signum in handled:
                loop.remove_signal_handler(signum)
            threads.shutdown(wait=False, cancel_futures=True)
            await self._shared.aclose()
            self.session_id = None

    async def _sessions(self, slots: asyncio.Semaphore, threads: ThreadPoolExecutor) -> None:
        assert self._stopping is not None
        delay = _RECONNECT_INITIAL
        attempt = 0
        while not self._stopping.is_set():
            session = _Session(self, slots, threads)
            try:
                await session.run(self._stopping)
                logger.info("worker stopped worker=%s", self.name)
                return
            except _Lost as lost:
                if lost.opened:
                    delay, attempt = _RECONNECT_INITIAL, 0
                attempt += 1
                wait = delay / 2 + random.uniform(0, delay / 2)
                delay = min(delay * 2, _RECONNECT_MAX)
                what = "kernel session lost" if lost.opened else "cannot reach the kernel"
                logger.warning(
                    "%s, reconnecting worker=%s kernel=%s attempt=%d retry_in_ms=%d error=%s",
                    what,
                    self.name,
                    self.kernel,
                    attempt,
                    wait * 1000,
                    lost.error,
                )
            finally:
                await self._set_session(None)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), wait)
        logger.info("worker stopped worker=%s", self.name)


@dataclass
class _Suspend:
    """A hosted handler's (or a tool body's) slot given back, waiting on these steps."""

    waiting_on: list[str]


class _Lost(Exception):
    """The connection or the stream broke; `opened` tells whether a Welcome came first."""

    def __init__(self, error: str, opened: bool) -> None:
        super().__init__(error)
        self.error = error
        self.opened = opened


@dataclass
class _Running:
    attempt: int
    cancellation: Cancellation
    task: asyncio.Task[None] | None = None


@dataclass
class _Session:
    worker: Worker
    slots: asyncio.Semaphore
    threads: ThreadPoolExecutor
    outbound: asyncio.Queue[workers_pb2.OpenSessionRequest | None] = field(
        default_factory=asyncio.Queue
    )
    running: dict[str, _Running] = field(default_factory=dict)
    cache_waiting: dict[int, asyncio.Future[workers_pb2.CacheResponse]] = field(
        default_factory=dict
    )
    questions: set[asyncio.Task[None]] = field(default_factory=set)
    """Approval predicates being evaluated, kept until they answer."""
    suspensions: dict[str, tuple[int, asyncio.Future[bool]]] = field(default_factory=dict)
    """Suspensions sent and not answered yet, by dispatch id: each future says whether the
    kernel refused it and left the dispatch ours."""
    next_request: int = 0
    closed: bool = False
    hosted: hosted_pb2_grpc.HostedServiceStub | None = None

    async def run(self, stopping: asyncio.Event) -> None:
        worker = self.worker
        tools = list(worker.tools.values())
        agents = [agent_spec(hosted) for hosted in worker.agents.values()]
        self.send(
            wire.hello(
                worker.name,
                tools,
                agents,
                worker.max_concurrency,
                worker.ephemeral_tools,
                SDK_VERSION,
            )
        )
        connection = channel(worker.kernel, worker._tls)
        # Hosted handlers call the kernel on the session's connection.
        self.hosted = hosted_pb2_grpc.HostedServiceStub(connection)
        try:
            stub = workers_pb2_grpc.WorkerServiceStub(connection)
            call = stub.OpenSession(self._requests(), metadata=metadata(worker._api_key))
            welcome = await self._welcome(call, stopping)
            if welcome is None:
                return
            await worker._set_session(welcome.session_id)
            logger.info(
                "worker session open worker=%s kernel=%s tools=%s agents=%s session_id=%s "
                "heartbeat_ms=%d lease_ttl_ms=%d",
                worker.name,
                worker.kernel,
                ",".join(worker.tools) or "-",
                ",".join(worker.agents) or "-",
                welcome.session_id,
                welcome.heartbeat_interval_ms,
                welcome.lease_ttl_ms,
            )
            every = welcome.heartbeat_interval_ms / 1000 or _DEFAULT_HEARTBEAT
            heartbeats = asyncio.create_task(self._heartbeats(every))
            try:
                await self._serve(call, stopping)
            finally:
                heartbeats.cancel()
        finally:
            self._end()
            await connection.close(grace=None)

    async def _requests(self) -> AsyncIterator[workers_pb2.OpenSessionRequest]:
        """The session's outbound stream. Results queued together go in one message: each
        message costs more than its contents, so a busy worker sends fewer."""
        outbound = self.outbound
        while True:
            message = await outbound.get()
            if message is None:
                return
            if message.WhichOneof("message") != "result" or outbound.empty():
                yield message
                continue
            results = [message.result]
            follow: workers_pb2.OpenSessionRequest | None = None
            ended = False
            while not outbound.empty():
                queued = outbound.get_nowait()
                if queued is None:
                    ended = True
                    break
                if queued.WhichOneof("message") != "result":
                    follow = queued
                    break
                results.append(queued.result)
            if len(results) > 1:
                logger.debug("results sent together count=%d", len(results))
                yield wire.results(results)
            else:
                yield message
            if follow is not None:
                yield follow
            if ended:
                return

    def send(self, message: workers_pb2.OpenSessionRequest | None) -> None:
        """Queues a message; after the session ended it goes nowhere."""
        if not self.closed:
            self.outbound.put_nowait(message)

    async def _welcome(self, call: Any, stopping: asyncio.Event) -> workers_pb2.Welcome | None:
        reading = asyncio.ensure_future(asyncio.wait_for(call.read(), _HANDSHAKE_TIMEOUT))
        stop = asyncio.ensure_future(stopping.wait())
        try:
            done, _ = await asyncio.wait({reading, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if reading not in done:
            reading.cancel()
            call.cancel()
            return None
        try:
            first = reading.result()
        except TimeoutError:
            call.cancel()
            raise _Lost(
                f"no welcome from the kernel in time (is a kernel listening on {self.worker.kernel}?)",
                opened=False,
            ) from None
        except grpc.aio.AioRpcError as error:
            if error.code() in _REFUSALS:
                raise WorkerRefused(error.code().name, error.details() or "") from None
            raise _Lost(_describe(self.worker.kernel, error), opened=False) from None
        if first is grpc.aio.EOF:
            raise _Lost("kernel closed the session before its welcome", opened=False)
        if first.WhichOneof("message") != "welcome":
            raise _Lost(f"expected welcome, got {first.WhichOneof('message')}", opened=False)
        welcome: workers_pb2.Welcome = first.welcome
        return welcome

    async def _heartbeats(self, every: float) -> None:
        while True:
            await asyncio.sleep(every)
            self.send(wire.heartbeat())

    async def _serve(self, call: Any, stopping: asyncio.Event) -> None:
        reader = asyncio.create_task(self._read(call))
        stop = asyncio.create_task(stopping.wait())
        try:
            done, _ = await asyncio.wait({reader, stop}, return_when=asyncio.FIRST_COMPLETED)
            if reader in done:
                error = reader.exception()
                if isinstance(error, grpc.aio.AioRpcError):
                    raise _Lost(_describe(self.worker.kernel, error), opened=True)
                if error is not None:
                    raise error
                raise _Lost("kernel closed the session", opened=True)
            await self._drain(reader)
        finally:
            stop.cancel()
            reader.cancel()

    async def _drain(self, reader: asyncio.Task[None]) -> None:
        """No more dispatches; the calls in flight finish (within the drain timeout), then our
        side of the stream ends and the kernel has a moment to end its."""
        in_flight = [r.task for r in self.running.values() if r.task is not None]
        logger.info(
            "worker draining worker=%s kernel=%s in_flight=%d timeout_s=%g",
            self.worker.name,
            self.worker.kernel,
            len(in_flight),
            self.worker.drain_timeout,
        )
        self.send(wire.drain())
        if in_flight:
            _, pending = await asyncio.wait(in_flight, timeout=self.worker.drain_timeout)
            if pending:
                logger.warning(
                    "drain timeout, abandoning calls in flight in_flight=%d", len(pending)
                )
        self.send(None)
        with contextlib.suppress(TimeoutError, grpc.aio.AioRpcError, asyncio.CancelledError):
            await asyncio.wait_for(asyncio.shield(reader), _CLOSE_TIMEOUT)
        logger.info("worker session closed worker=%s", self.worker.name)

    async def _read(self, call: Any) -> None:
        while True:
            message = await call.read()
            if message is grpc.aio.EOF:
                return
            self._handle(message)

    def _handle(self, message: workers_pb2.OpenSessionResponse) -> None:
        kind = message.WhichOneof("message")
        if kind == "dispatch":
            self._start(message.dispatch)
        elif kind == "dispatches":
            logger.debug("dispatches read together count=%d", len(message.dispatches.dispatches))
            for dispatch in message.dispatches.dispatches:
                self._start(dispatch)
        elif kind == "cancel":
            cancel = message.cancel
            running = self.running.get(cancel.dispatch_id)
            if running is not None and running.attempt == cancel.attempt:
                logger.info(
                    "dispatch cancelled dispatch_id=%s attempt=%d reason=%s",
                    cancel.dispatch_id,
                    cancel.attempt,
                    cancel.reason,
                )
                running.cancellation.set(cancel.reason or "cancelled")
        elif kind == "result_ack":
            ack = message.result_ack
            pending = self.suspensions.get(ack.dispatch_id)
            if pending is not None and pending[0] == ack.attempt:
                del self.suspensions[ack.dispatch_id]
                self._answered(ack, pending[1])
            elif not ack.accepted:
                logger.warning(
                    "result not recorded dispatch_id=%s attempt=%d reason=%s",
                    ack.dispatch_id,
                    ack.attempt,
                    ack.reason,
                )
        elif kind == "cache":
            waiting = self.cache_waiting.pop(message.cache.request_id, None)
            if waiting is not None and not waiting.done():
                waiting.set_result(message.cache)
        elif kind == "run":
            self._start_run(message.run)
        elif kind == "approval_question":
            question = message.approval_question
            asking = asyncio.create_task(self._answer(question))
            self.questions.add(asking)
            asking.add_done_callback(self.questions.discard)
        elif kind == "welcome":
            logger.warning("second welcome on an open session ignored")

    def _answered(self, ack: workers_pb2.ResultAck, waiting: asyncio.Future[bool]) -> None:
        """The kernel's word on a suspension, to the handler that sent it."""
        kept = not ack.accepted and ack.still_held
        if ack.accepted:
            logger.debug(
                "suspension recorded dispatch_id=%s attempt=%d", ack.dispatch_id, ack.attempt
            )
        elif kept:
            logger.info(
                "suspension refused, the dispatch goes on here dispatch_id=%s attempt=%d reason=%s",
                ack.dispatch_id,
                ack.attempt,
                ack.reason,
            )
        else:
            logger.warning(
                "suspension not recorded, the dispatch is no longer ours dispatch_id=%s attempt=%d "
                "reason=%s",
                ack.dispatch_id,
                ack.attempt,
                ack.reason,
            )
        if not waiting.done():
            waiting.set_result(kept)

    async def _suspend(
        self,
        dispatch: workers_pb2.RunDispatch | workers_pb2.Dispatch,
        waiting_on: list[str],
        cancellation: Cancellation,
    ) -> bool:
        """Offers a dispatch's slot back while its handler (or a tool body) waits on
        `waiting_on`; tells whether the kernel refused and left the dispatch ours, so the handler
        goes on. A cancellation while the answer is awaited counts as kept: the caller handles it
        as any cancellation."""
        if self.closed:
            return False
        answer: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self.suspensions[dispatch.dispatch_id] = (dispatch.attempt, answer)
        logger.info(
            "dispatch waits durably, giving back its slot run_id=%s waiting_on=%s",
            dispatch.run_id,
            ",".join(waiting_on),
        )
        self.send(wire.suspended(dispatch.dispatch_id, dispatch.attempt, waiting_on))
        try:
            if not await _first(answer, cancellation.wait()):
                return True
            return answer.result()
        finally:
            if self.suspensions.get(dispatch.dispatch_id) == (dispatch.attempt, answer):
                del self.suspensions[dispatch.dispatch_id]

    async def _answer(self, question: workers_pb2.ApprovalQuestion) -> None:
        """Evaluates a tool's Python approval predicate on a call's arguments, for the kernel to
        decide whether the call is asked about; one that raises, or returns no bool, asks."""
        tool = self.worker.tools.get(question.tool)
        predicate = None if tool is None else tool.definition.options.requires_approval
        if not callable(predicate):
            self.send(
                wire.approval_answer(
                    question.question_id,
                    True,
                    f"this worker has no approval predicate for tool '{question.tool}'",
                )
            )
            return
        try:
            arguments = json.loads(question.arguments_json or "{}")
            if inspect.iscoroutinefunction(predicate):
                answer = await predicate(arguments)
            else:
                answer = await asyncio.to_thread(predicate, arguments)
                if inspect.isawaitable(answer):
                    answer = await answer
            if not isinstance(answer, bool):
                raise TypeError(f"it returned {answer!r}, not a bool")
        except Exception as error:
            logger.warning(
                "approval predicate raised tool=%s error=%s; the call is asked about",
                question.tool,
                _headline(error),
                exc_info=error,
            )
            self.send(wire.approval_answer(question.question_id, True, _headline(error)))
            return
        self.send(wire.approval_answer(question.question_id, answer))

    def _start_run(self, run: workers_pb2.RunDispatch) -> None:
        running = self.running.get(run.dispatch_id)
        if running is not None and running.attempt == run.attempt:
            return
        entry = _Running(run.attempt, Cancellation())
        self.running[run.dispatch_id] = entry
        entry.task = asyncio.create_task(self._host(run, entry.cancellation))
        entry.task.add_done_callback(lambda _: self._finished(run.dispatch_id, entry))

    async def _host(self, run: workers_pb2.RunDispatch, cancellation: Cancellation) -> None:
        """One dispatch of a hosted run's handler: its outcome, or its slot given back while
        everything it awaits waits on something durable."""
        started = time.monotonic()
        try:
            outcome: Any = await self._execute_run(run, cancellation)
        except ToolError as error:
            outcome = error
        except AgentError as error:
            outcome = ToolError.fatal(str(error))
        except Exception as error:  # the handler's own failure fails the run
            logger.warning(
                "agent handler raised agent=%s run_id=%s attempt=%d error=%s",
                run.agent,
                run.run_id,
                run.attempt,
                _headline(error),
                exc_info=error,
            )
            outcome = ToolError.fatal(_failure(error))
        elapsed_ms = (time.monotonic() - started) * 1000
        if isinstance(outcome, _Suspend):
            # The kernel took the suspension already.
            logger.info(
                "dispatch waits durably, slot given back run_id=%s elapsed_ms=%d waiting_on=%s",
                run.run_id,
                elapsed_ms,
                ",".join(outcome.waiting_on),
            )
            return
        if isinstance(outcome, ToolError):
            logger.info(
                "run dispatch failed agent=%s run_id=%s attempt=%d elapsed_ms=%d error=%s",
                run.agent,
                run.run_id,
                run.attempt,
                elapsed_ms,
                outcome.message,
            )
        else:
            logger.info(
                "run dispatch succeeded agent=%s run_id=%s attempt=%d elapsed_ms=%d",
                run.agent,
                run.run_id,
                run.attempt,
                elapsed_ms,
            )
        self.send(wire.result(run.dispatch_id, run.attempt, outcome))

    async def _execute_run(self, run: workers_pb2.RunDispatch, cancellation: Cancellation) -> Any:
        hosted = self.worker.agents.get(run.agent)
        if hosted is None:
            raise ToolError.fatal(f"worker does not host agent '{run.agent}'")
        try:
            input = json.loads(run.input_json) if run.input_json.strip() else None
        except json.JSONDecodeError as error:
            raise ToolError.fatal(
                f"the input of agent '{run.agent}' is not JSON: {error}"
            ) from None
        if not await _first(self.slots.acquire(), cancellation.wait()):
            raise ToolError.retryable("run cancelled before its handler started")
        try:
            dispatch = hosted_pb2.HostedDispatch(
                run_id=run.run_id, dispatch_id=run.dispatch_id, attempt=run.attempt
            )
            auth = metadata(self.worker._api_key)
            stub = self.hosted
            assert stub is not None, "a session has its hosted stub before its first dispatch"
            try:
                history = [
                    entry
                    async for entry in stub.LoadHistory(
                        hosted_pb2.LoadHistoryRequest(dispatch=dispatch), metadata=auth
                    )
                ]
            except grpc.aio.AioRpcError as error:
                raise ToolError.retryable(
                    f"cannot load the run's history: {error.code().name}: {error.details()}"
                ) from None
            ctx = AgentContext(
                dispatch, stub, auth, history, cancellation, traceparent=run.traceparent
            )
            handler = asyncio.ensure_future(hosted.handle(ctx, input))
            stop = asyncio.ensure_future(cancellation.wait())
            # A suspension the kernel refused (a step settled on the way) leaves the handler
            # running: it goes on waiting, and gets that step's outcome as it would have.
            refused: list[str] = []
            try:
                while True:
                    suspendable = asyncio.ensure_future(ctx._suspendable(refused))
                    try:
                        done, _ = await asyncio.wait(
                            {handler, suspendable, stop}, return_when=asyncio.FIRST_COMPLETED
                        )
                    finally:
                        suspendable.cancel()
                    if handler in done or stop in done:
                        break
                    waiting_on = suspendable.result()
                    if not await self._suspend(run, waiting_on, cancellation):
                        # Given back: the handler is dropped where it waits; its recorded steps
                        # stand, and it runs again from the start when dispatched again.
                        handler.cancel()
                        return _Suspend(waiting_on)
                    refused = waiting_on
            finally:
                stop.cancel()
            if handler not in done:
                handler.cancel()
                raise ToolError.retryable("run dispatch cancelled, handler dropped")
            # A handler that diverged fails the run with the divergence, even if it caught it.
            if ctx.diverged is not None:
                raise ToolError.fatal(ctx.diverged)
            return handler.result()
        finally:
            self.slots.release()

    def _start(self, dispatch: workers_pb2.Dispatch) -> None:
        running = self.running.get(dispatch.dispatch_id)
        if running is not None:
            if running.attempt == dispatch.attempt:
                return
            # A newer attempt supersedes the one still running here.
            running.cancellation.set("superseded by a newer attempt")
        entry = _Running(dispatch.attempt, Cancellation())
        self.running[dispatch.dispatch_id] = entry
        entry.task = asyncio.create_task(self._call(dispatch, entry.cancellation))
        entry.task.add_done_callback(lambda _: self._finished(dispatch.dispatch_id, entry))

    def _finished(self, dispatch_id: str, entry: _Running) -> None:
        if self.running.get(dispatch_id) is entry:
            del self.running[dispatch_id]

    async def _call(self, dispatch: workers_pb2.Dispatch, cancellation: Cancellation) -> None:
        started = time.monotonic()
        raised: Exception | None = None
        try:
            outcome: Any = await self._execute(dispatch, cancellation)
        except ToolError as error:
            outcome = error
        except Exception as error:  # noqa: BLE001 (a tool's own failure: retryable, as the seeds treat it)
            raised = error
            outcome = ToolError.retryable(_failure(error))
        if isinstance(outcome, _Suspend):
            # The kernel took the suspension already.
            logger.info(
                "dispatch waits durably, slot given back tool=%s run_id=%s attempt=%d "
                "elapsed_ms=%d waiting_on=%s",
                dispatch.tool,
                dispatch.run_id,
                dispatch.attempt,
                (time.monotonic() - started) * 1000,
                ",".join(outcome.waiting_on),
            )
            return
        try:
            message = wire.result(dispatch.dispatch_id, dispatch.attempt, outcome)
        except (TypeError, ValueError) as error:
            outcome = ToolError.fatal(
                f"tool '{dispatch.tool}' returned a value that is not JSON: {error}"
            )
            message = wire.result(dispatch.dispatch_id, dispatch.attempt, outcome)
        elapsed_ms = (time.monotonic() - started) * 1000
        if isinstance(outcome, ToolError):
            # A tool that raised is a bug to look into: said with its traceback, where a user sees it.
            logger.log(
                logging.INFO if raised is None else logging.WARNING,
                "dispatch failed tool=%s run_id=%s attempt=%d elapsed_ms=%d kind=%s error=%s",
                dispatch.tool,
                dispatch.run_id,
                dispatch.attempt,
                elapsed_ms,
                outcome.kind,
                outcome.message if raised is None else _headline(raised),
                exc_info=raised,
            )
        else:
            # One line per call at INFO would cost more than many a tool (and flood the log).
            logger.debug(
                "dispatch succeeded tool=%s run_id=%s attempt=%d elapsed_ms=%d",
                dispatch.tool,
                dispatch.run_id,
                dispatch.attempt,
                elapsed_ms,
            )
        self.send(message)

    async def _execute(self, dispatch: workers_pb2.Dispatch, cancellation: Cancellation) -> Any:
        tool = self.worker.tools.get(dispatch.tool)
        if tool is None:
            raise ToolError.fatal(f"worker does not offer tool '{dispatch.tool}'")
        args = wire.arguments(dispatch)
        # The kernel never sends more than max_concurrency calls, but calls a lost session left
        # running may still hold slots: wait for one rather than overrun the limit. A free slot
        # is taken at once, without a task to race the cancel.
        if self.slots.locked():
            if not await _first(self.slots.acquire(), cancellation.future()):
                raise ToolError.retryable("call cancelled before it started")
        else:
            await self.slots.acquire()
        watcher: asyncio.Task[None] | None = None
        try:
            ctx = ToolContext(
                wire.call_info(dispatch),
                progress=self._progress_sink(dispatch),
                cache=_SessionCache(self, dispatch.dispatch_id, dispatch.attempt),
                shared=self.worker._shared,
                cancelled=cancellation,
                kernel=_CallKernel(self, dispatch),
            )
            given_back: list[list[str]] = []
            if tool.definition.options.idempotency != "at_most_once":
                # A call that may run again gives back its slot while its body waits on
                # subagents alone; the watch starts with the body's first wait on one.
                def watch() -> None:
                    nonlocal watcher
                    running = self.running.get(dispatch.dispatch_id)
                    if (
                        watcher is None
                        and running is not None
                        and running.attempt == dispatch.attempt
                        and running.task is not None
                    ):
                        watcher = asyncio.create_task(
                            self._watch(dispatch, ctx, cancellation, running.task, given_back)
                        )

                ctx._on_subagent_wait = watch
            # A tool function the body calls directly goes through the kernel (ctx.call).
            calls_through = current_run.set(ctx)
            try:
                return await _within_grace(
                    tool.invoke(ctx, args, executor=self.threads), cancellation
                )
            except asyncio.CancelledError:
                if not given_back:
                    raise
                # Given back: the body is dropped where it waits; it runs again from the start
                # (the next attempt) once a subagent it awaits settles.
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()
                return _Suspend(given_back[0])
            finally:
                current_run.reset(calls_through)
        finally:
            if watcher is not None:
                watcher.cancel()
            self.slots.release()

    async def _watch(
        self,
        dispatch: workers_pb2.Dispatch,
        ctx: ToolContext,
        cancellation: Cancellation,
        body: asyncio.Task[Any],
        given_back: list[list[str]],
    ) -> None:
        """Offers a call's slot back each time its body has waited on the same subagents alone
        for a while; once the kernel takes it, the body is cancelled where it waits."""
        refused: list[str] = []
        while True:
            waiting_on = await ctx._subagents().suspendable(refused)
            if not await self._suspend(dispatch, waiting_on, cancellation):
                given_back.append(waiting_on)
                body.cancel()
                return
            refused = waiting_on

    def _progress_sink(self, dispatch: workers_pb2.Dispatch) -> Any:
        loop = asyncio.get_running_loop()
        loop_thread = threading.get_ident()

        def sink(report: Progress) -> None:
            message = wire.progress(dispatch.dispatch_id, dispatch.attempt, report)
            if threading.get_ident() == loop_thread:
                self.send(message)
            else:
                loop.call_soon_threadsafe(self.send, message)

        return sink

    def _end(self) -> None:
        """The session is gone: calls still running are told, cache requests fail."""
        self.closed = True
        for running in self.running.values():
            running.cancellation.set("worker session lost")
        for waiting in self.cache_waiting.values():
            if not waiting.done():
                waiting.set_exception(ToolError.retryable("cache unavailable: worker session lost"))
        self.cache_waiting.clear()
        for _, answer in self.suspensions.values():
            if not answer.done():
                answer.set_result(False)
        self.suspensions.clear()


async def _within_grace(work: Coroutine[Any, Any, Any], cancellation: Cancellation) -> Any:
    """Runs a call's `work` in the calling task (no task of its own: a call is hot). Once the
    call is cancelled the tool has `_CANCEL_GRACE` seconds to end on its own (it sees
    `ctx.cancelled`), then it is dropped: a plain def's thread cannot be interrupted and runs on,
    its result going nowhere."""
    task = asyncio.current_task()
    assert task is not None, "a call runs in a task"
    loop = asyncio.get_running_loop()
    dropped = False
    timer: asyncio.TimerHandle | None = None

    def drop() -> None:
        nonlocal dropped
        dropped = True
        task.cancel()

    def grace(stop: asyncio.Future[None]) -> None:
        nonlocal timer
        if not stop.cancelled():
            timer = loop.call_later(_CANCEL_GRACE, drop)

    stop = cancellation.future()
    stop.add_done_callback(grace)
    try:
        result = await work
    except asyncio.CancelledError:
        if not dropped:
            raise
        task.uncancel()
        raise ToolError.retryable(
            f"call cancelled before it finished: {cancellation.reason}"
        ) from None
    finally:
        stop.cancel()
        if timer is not None:
            timer.cancel()
    if dropped:
        # The tool swallowed the cancel and returned late: its result goes nowhere.
        task.uncancel()
        raise ToolError.retryable(f"call cancelled before it finished: {cancellation.reason}")
    return result


async def _first(awaitable: Any, cancelled: Any) -> bool:
    """Awaits `awaitable` unless `cancelled` comes first; tells whether it finished."""
    work = asyncio.ensure_future(awaitable)
    stop = asyncio.ensure_future(cancelled)
    try:
        done, _ = await asyncio.wait({work, stop}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stop.cancel()
    if work in done:
        return True
    if isinstance(awaitable, asyncio.Future):
        return False
    work.cancel()
    return False


@dataclass
class _CallKernel:
    """A call's body reaching the kernel for its subagents, under the call's dispatch."""

    session: _Session
    dispatch: workers_pb2.Dispatch

    def _hosted(self) -> tuple[hosted_pb2_grpc.HostedServiceStub, hosted_pb2.HostedDispatch]:
        stub = self.session.hosted
        if stub is None or self.session.closed:
            raise ToolError.retryable("subagent: worker session lost")
        dispatch = self.dispatch
        return stub, hosted_pb2.HostedDispatch(
            run_id=dispatch.run_id, dispatch_id=dispatch.dispatch_id, attempt=dispatch.attempt
        )

    async def start(self, agent: str, input_json: str, session: str, occurrence: int) -> ChildStep:
        stub, dispatch = self._hosted()
        request = hosted_pb2.StartSubagentRequest(
            dispatch=dispatch,
            seq=0,
            agent=agent,
            input_json=input_json,
            session_key=session,
            occurrence=occurrence,
        )
        try:
            response = await stub.StartSubagent(
                request, metadata=metadata(self.session.worker._api_key)
            )
        except grpc.aio.AioRpcError as error:
            raise _subagent_error(f"subagent '{agent}'", error) from None
        if response.diverged:
            raise ToolError.fatal(f"subagent '{agent}': {response.diverged}")
        return _child(response.step)

    async def ask(self, fields: dict[str, Any], occurrence: int) -> ChildStep:
        stub, dispatch = self._hosted()
        request = hosted_pb2.AskPersonRequest(dispatch=dispatch, occurrence=occurrence, **fields)
        try:
            response = await stub.AskPerson(
                request, metadata=metadata(self.session.worker._api_key)
            )
        except grpc.aio.AioRpcError as error:
            raise _subagent_error("ctx.ask", error) from None
        return _child(response.step)

    async def call(
        self, tool: str, arguments_json: str, timeout_ms: int, occurrence: int
    ) -> NestedCall:
        stub, dispatch = self._hosted()
        request = hosted_pb2.CallToolRequest(
            dispatch=dispatch,
            occurrence=occurrence,
            call=tool_calls_pb2.ToolCall(
                tool=tool, arguments_json=arguments_json, timeout_ms=timeout_ms
            ),
        )
        try:
            response = await stub.CallTool(request, metadata=metadata(self.session.worker._api_key))
        except grpc.aio.AioRpcError as error:
            raise _subagent_error(f"ctx.call '{tool}'", error) from None
        result = call_result(response.result) if response.HasField("result") else None
        return NestedCall(response.step.step_key, result)

    async def await_call(self, key: str) -> CallResult:
        answer = await self._awaited(key, f"ctx.call step {key}")
        if not answer.HasField("result"):
            raise ToolError.fatal(f"ctx.call step {key}: the kernel answered without its result")
        return call_result(answer.result)

    async def await_step(self, key: str) -> ChildStep:
        return _child((await self._awaited(key, f"subagent step {key}")).step)

    async def _awaited(self, key: str, what: str) -> hosted_pb2.AwaitStepResponse:
        """The kernel's answer once step `key` has settled; a failure is `what`'s error."""
        stub, dispatch = self._hosted()
        request = hosted_pb2.AwaitStepRequest(dispatch=dispatch, step_key=key)
        try:
            answer: hosted_pb2.AwaitStepResponse = await stub.AwaitStep(
                request, metadata=metadata(self.session.worker._api_key)
            )
        except grpc.aio.AioRpcError as error:
            raise _subagent_error(what, error) from None
        return answer


def _child(step: Any) -> ChildStep:
    return ChildStep(
        key=step.step_key,
        child_run_id=step.child_run_id,
        settled=step.status in SETTLED,
        succeeded=step.status == common_pb2.STEP_STATUS_SUCCEEDED,
        output_json=step.output_json,
        error=step.error,
    )


def _subagent_error(what: str, error: grpc.aio.AioRpcError) -> ToolError:
    """A refused or failed request about a subagent, as the call's error: retryable when the
    kernel could not be reached, fatal when it refused (no `runs:write`, no such agent)."""
    text = f"{what}: {error.code().name}: {error.details()}"
    if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return ToolError.retryable(text)
    return ToolError.fatal(text)


@dataclass
class _SessionCache:
    """A call's cache requests, carried on its session and answered by request id."""

    session: _Session
    dispatch_id: str
    attempt: int

    async def _ask(self, message: workers_pb2.OpenSessionRequest, request_id: int) -> Any:
        session = self.session
        if session.closed:
            raise ToolError.retryable("cache unavailable: worker session lost")
        future: asyncio.Future[workers_pb2.CacheResponse] = (
            asyncio.get_running_loop().create_future()
        )
        session.cache_waiting[request_id] = future
        session.send(message)
        try:
            answer = await asyncio.wait_for(future, _CACHE_TIMEOUT)
        except TimeoutError:
            raise ToolError.retryable("cache request unanswered by the kernel") from None
        finally:
            session.cache_waiting.pop(request_id, None)
        if answer.error:
            raise ToolError.retryable(f"cache request refused: {answer.error}")
        return answer

    def _request_id(self) -> int:
        self.session.next_request += 1
        return self.session.next_request

    async def get(self, key: str) -> str | None:
        request_id = self._request_id()
        answer = await self._ask(
            wire.cache_get(request_id, self.dispatch_id, self.attempt, key), request_id
        )
        return str(answer.value_json) if answer.found else None

    async def set(self, key: str, value_json: str, ttl_ms: int) -> None:
        request_id = self._request_id()
        await self._ask(
            wire.cache_set(request_id, self.dispatch_id, self.attempt, key, value_json, ttl_ms),
            request_id,
        )


def _describe(kernel: str, error: grpc.aio.AioRpcError) -> str:
    text = f"{error.code().name}: {error.details()}"
    if error.code() == grpc.StatusCode.UNAVAILABLE:
        return f"{text} (is a kernel listening on {kernel}?)"
    return text


def _show_logs_by_default() -> None:
    """With no logging configured, the worker's lines go to stderr at INFO.

    A worker is a process's main loop, as a server is: left to Python's defaults it would say
    nothing below WARNING, so neither that it connected nor that it drains. uvicorn gives its own
    loggers a stderr handler at INFO; Temporal's Python SDK adds none and its users see nothing
    until they call `logging.basicConfig`. This does what uvicorn does, but only when the
    application configured no handler (none on the root logger or on `kernel_sdk`), so an
    application that configured logging gets what it configured. Setting the `kernel_sdk`
    logger's level before `run` still decides what is shown.
    """
    package = logging.getLogger("kernel_sdk")
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    package.addHandler(handler)
    if package.level == logging.NOTSET:
        package.setLevel(logging.INFO)


# Frames of the SDK and of the machinery that ran the tool say nothing about the tool's bug.
_MACHINERY = tuple(
    str(Path(path).parent) + os.sep
    for path in (asyncio.__file__, concurrent.futures.__file__, __file__)
    if path
)
_TRACEBACK_FRAMES = 30


def _headline(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"


def _failure(error: BaseException) -> str:
    """What a tool's exception records: its type and text, then its traceback (the tool's own
    frames, the last `_TRACEBACK_FRAMES` of each exception in a chain) on the lines after.

    The protocol has no field of its own for a traceback yet, so it travels in the error text,
    which the kernel withholds at capture `none` and shows at `metadata` and `io`.
    """
    shown = traceback.TracebackException.from_exception(error)
    chain: traceback.TracebackException | None = shown
    frames_left = 0
    while chain is not None:
        frames = [f for f in chain.stack if not f.filename.startswith(_MACHINERY)]
        chain.stack = traceback.StackSummary.from_list(frames[-_TRACEBACK_FRAMES:])
        frames_left += len(chain.stack)
        chain = chain.__cause__ or (None if chain.__suppress_context__ else chain.__context__)
    if not frames_left:
        return _headline(error)
    return f"{_headline(error)}\n{''.join(shown.format()).rstrip()}"
