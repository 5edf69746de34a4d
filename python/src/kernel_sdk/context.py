"""What a call knows about itself, and what it may do while it runs: report progress, read and
write its tool's cache, reach the app's objects and a shared HTTP client, and see a cancel.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pydantic

from ._question import NO_DEFAULT, question_fields
from ._tool_subagents import ChildStep, KernelLink, SubagentWaits
from ._typed import Typed
from .canonical import to_canonical
from .errors import ToolError

if TYPE_CHECKING:
    import httpx

    from .records import CallResult


class RunCalls(Protocol):
    """What the run around some code offers a tool called directly in it: a hosted handler's
    context, which calls the tool through the kernel."""

    def call(
        self, tool: str, arguments: dict[str, Any] | str | None = None
    ) -> Coroutine[Any, Any, CallResult]: ...


current_run: contextvars.ContextVar[RunCalls | None] = contextvars.ContextVar(
    "kernel_sdk_current_run", default=None
)
"""The run the running code belongs to: set while a hosted handler runs (and in the tasks it
starts), and while a dispatched tool's async body runs (its context, which calls through the
kernel); unset in a sync tool's thread, a test, and anywhere else."""

_MAX_CACHE_KEY = 256


@dataclass(frozen=True)
class Progress:
    """One progress report: a status line, and optionally data and a step count."""

    message: str
    data: Any = None
    current: int | None = None
    total: int | None = None


class Cancellation:
    """Whether the kernel cancelled the call (a cancel, a timeout, a lost lease): a flag any
    thread may read, and an event a coroutine may await.

    `if ctx.cancelled:` and `ctx.cancelled.is_set()` read the flag; `await ctx.cancelled.wait()`
    returns once it is set. A sync tool in its thread checks the flag between steps.
    """

    def __init__(self) -> None:
        self._flag = threading.Event()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []
        self._lock = threading.Lock()
        self.reason = ""

    def is_set(self) -> bool:
        """Whether the call was cancelled."""
        return self._flag.is_set()

    def __bool__(self) -> bool:
        return self._flag.is_set()

    def set(self, reason: str = "cancelled") -> None:
        """Cancels: sets the flag and wakes every waiter (the worker calls this)."""
        with self._lock:
            if self._flag.is_set():
                return
            self.reason = reason
            self._flag.set()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_resolve, future)

    async def wait(self) -> None:
        """Returns once the call is cancelled."""
        await self.future()

    def future(self) -> asyncio.Future[None]:
        """A future of the running loop resolved once the call is cancelled (at once when it
        is): to wait on beside other work without a task of its own."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        with self._lock:
            if self._flag.is_set():
                future.set_result(None)
            else:
                self._waiters.append((loop, future))
        return future

    def wait_sync(self, timeout: float | None = None) -> bool:
        """Blocks a thread until the call is cancelled or `timeout` seconds pass; tells which."""
        return self._flag.wait(timeout)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class CacheBackend(Protocol):
    """Where a context's cache reads and writes go: the kernel's store, or memory in tests."""

    async def get(self, key: str) -> str | None: ...

    async def set(self, key: str, value_json: str, ttl_ms: int) -> None: ...


class MemoryCache:
    """A cache in memory, with expiry: what `ToolContext.for_test` uses."""

    def __init__(self) -> None:
        self._entries: dict[str, tuple[str, float | None]] = {}

    async def get(self, key: str) -> str | None:
        entry = self._entries.get(key)
        if entry is None:
            return None
        value, expires = entry
        if expires is not None and time.monotonic() >= expires:
            del self._entries[key]
            return None
        return value

    async def set(self, key: str, value_json: str, ttl_ms: int) -> None:
        expires = time.monotonic() + ttl_ms / 1000 if ttl_ms else None
        self._entries[key] = (value_json, expires)


class ToolCache:
    """The calling tool's own key-value cache, kept by the kernel in its store (so every worker
    offering the tool shares it, and it outlives restarts). Values are JSON; a `ttl` (seconds)
    makes an entry expire. Keys are 1 to 256 bytes.
    """

    def __init__(self, backend: CacheBackend) -> None:
        self._backend = backend

    async def get(self, key: str, default: Any = None) -> Any:
        """The live value under `key`, or `default`."""
        _check_key(key)
        text = await self._backend.get(key)
        return default if text is None else json.loads(text)

    async def set(self, key: str, value: Any, *, ttl: float | None = None) -> None:
        """Writes (or replaces) `key`, living `ttl` seconds (for ever without one)."""
        _check_key(key)
        if ttl is not None and ttl <= 0:
            raise ToolError.fatal(f"cache ttl for '{key}' must be positive, got {ttl}")
        ttl_ms = 0 if ttl is None else max(1, round(ttl * 1000))
        await self._backend.set(key, to_canonical(value), ttl_ms)


def _check_key(key: str) -> None:
    size = len(key.encode())
    if not 1 <= size <= _MAX_CACHE_KEY:
        raise ToolError.fatal(f"cache key must be 1 to {_MAX_CACHE_KEY} bytes, got {size}")


ProgressSink = Callable[[Progress], None]


def _carrier(traceparent: str) -> dict[str, str]:
    """A `traceparent` as a propagation carrier; nothing when the kernel sent none."""
    return {"traceparent": traceparent} if traceparent else {}


@dataclass
class CallInfo:
    """The identity of one attempt of one call."""

    run_id: str
    step_key: str
    call_id: str | None
    turn: int
    position: int
    attempt: int
    idempotency_key: str
    dispatch_id: str
    tool: str
    timeout: float | None = None
    traceparent: str = ""


@dataclass
class _Shared:
    """What the contexts of one worker share."""

    deps: Any = None
    http: httpx.AsyncClient | None = None
    http_lock: threading.Lock = field(default_factory=threading.Lock)

    def http_client(self) -> httpx.AsyncClient:
        with self.http_lock:
            if self.http is None:
                import httpx

                self.http = httpx.AsyncClient(timeout=30.0)
            return self.http

    async def aclose(self) -> None:
        if self.http is not None:
            await self.http.aclose()
            self.http = None


class ToolContext:
    """What a call knows about itself and may do while it runs.

    The worker builds one per attempt; `ToolContext.for_test()` makes one for unit tests. A tool
    takes it as its first parameter (annotated `ToolContext`), or not at all.
    """

    def __init__(
        self,
        call: CallInfo,
        *,
        progress: ProgressSink,
        cache: CacheBackend,
        shared: _Shared,
        cancelled: Cancellation | None = None,
        kernel: KernelLink | None = None,
    ) -> None:
        self._call = call
        self._kernel = kernel
        # Made by the first subagent the body starts: most calls start none.
        self._subagent_waits: SubagentWaits | None = None
        self._on_subagent_wait: Callable[[], None] | None = None
        self._progress = progress
        self._shared = shared
        self.cache = ToolCache(cache)
        """The tool's cache in the kernel's store (see `ToolCache`)."""
        # Not `cancelled or ...`: an unset Cancellation is falsy.
        self.cancelled = cancelled if cancelled is not None else Cancellation()
        """Set when the kernel cancels the call (see `Cancellation`)."""
        self.progress_log: list[Progress] = []
        """What the call reported, kept only by a `for_test` context."""

    @classmethod
    def for_test(
        cls,
        *,
        deps: Any = None,
        run_id: str = "test-run",
        attempt: int = 1,
        idempotency_key: str = "ik_test",
        tool: str = "test",
    ) -> ToolContext:
        """A context for calling a tool in a unit test: run `test-run`, step `t0/p0`, attempt 1,
        a cache in memory, and its progress kept in `progress_log`.
        """
        call = CallInfo(
            run_id=run_id,
            step_key="t0/p0",
            call_id=None,
            turn=0,
            position=0,
            attempt=attempt,
            idempotency_key=idempotency_key,
            dispatch_id="test-dispatch",
            tool=tool,
        )
        context: ToolContext
        context = cls(
            call,
            progress=lambda p: context.progress_log.append(p),
            cache=MemoryCache(),
            shared=_Shared(deps=deps),
        )
        return context

    @property
    def run_id(self) -> str:
        """The run the call belongs to."""
        return self._call.run_id

    @property
    def step_key(self) -> str:
        """The call's step in the run: its call id, or `t{turn}/p{position}`."""
        return self._call.step_key

    @property
    def call_id(self) -> str | None:
        """The agent's id for the call, when it gave one."""
        return self._call.call_id

    @property
    def turn(self) -> int:
        """The turn the call was submitted in."""
        return self._call.turn

    @property
    def turn_id(self) -> int:
        """The turn the call was submitted in, by the seed pages' name (`turn`)."""
        return self._call.turn

    @property
    def position(self) -> int:
        """The call's position within its turn."""
        return self._call.position

    @property
    def attempt(self) -> int:
        """This attempt's number, from 1."""
        return self._call.attempt

    @property
    def idempotency_key(self) -> str:
        """Stable across retries, redispatches and resubmissions of the call: pass it to the
        service the tool changes, so a second attempt is recognised there.
        """
        return self._call.idempotency_key

    @property
    def dispatch_id(self) -> str:
        """The kernel's id for the call's dispatch."""
        return self._call.dispatch_id

    @property
    def tool_name(self) -> str:
        """The tool being called."""
        return self._call.tool

    @property
    def timeout(self) -> float | None:
        """Seconds this attempt may run before the kernel times it out, when it has a bound."""
        return self._call.timeout

    def trace_context(self) -> dict[str, str]:
        """The W3C trace context the tool's own spans should join, as a propagation carrier:
        `{"traceparent": ...}` naming the attempt's span when the kernel exports traces, else the
        agent's own `traceparent`; `{}` when there is neither. Hand it to OpenTelemetry with
        `opentelemetry.propagate.extract(ctx.trace_context())`.
        """
        return _carrier(self._call.traceparent)

    @property
    def deps(self) -> Any:
        """The app's objects, as given to the worker (`Worker(..., deps=...)`)."""
        return self._shared.deps

    @property
    def http(self) -> httpx.AsyncClient:
        """An `httpx.AsyncClient` every call of the worker shares (its connections pooled)."""
        return self._shared.http_client()

    def progress(
        self,
        message: str,
        *,
        data: Any = None,
        current: int | None = None,
        total: int | None = None,
    ) -> None:
        """Reports progress; the agent sees it live and the count lands on the call's record.
        Safe to call from a sync tool's thread.
        """
        self._progress(Progress(message, data, current, total))

    async def emit_status(self, message: str) -> None:
        """Reports a status line (the seeds' `emit_status`)."""
        self.progress(message)

    def subagent(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        returns: Any = None,
    ) -> Coroutine[Any, Any, Any]:
        """Starts a subagent from the tool's body: a child run of the hosted agent `agent`,
        linked to this call's run and step, and returns its output, so the tool's result can be
        the subagent's. A child that fails or is cancelled raises `ToolError` (fatal: the call
        fails unless the body catches it). With `session`, subagents of one session key run one
        at a time in order of start, each continuing from the last that completed; derive the key
        from the run's id (`ctx.run_id`) so no other run reuses it. With `returns` (a pydantic
        model, a dataclass, any type pydantic validates) the output comes back as that type.

        The same call run again (a retry, a redispatch) gets back the children it started, never
        second ones. While the body waits on its subagents alone, a `safe_to_retry` call gives
        back its worker slot after 100 ms, so children can run on the same worker: the body is
        dropped, and once a child ends the call runs again from the start (next attempt, same
        idempotency key) and gets the children's outcomes at once. So start subagents before the
        body's effects, or make those idempotent. An `at_most_once` call keeps its slot.

        The worker's key needs `runs:write`. A test context (`for_test`) has no kernel: there it
        raises `ToolError`.
        """
        typed = Typed(returns)

        async def run() -> Any:
            output = await self._subagent(agent, input, session)
            return _as_declared(typed, output, f"subagent '{agent}': its output")

        return run()

    def ask(
        self,
        question: str,
        *,
        schema: dict[str, Any] | None = None,
        returns: Any = None,
        approvers: Sequence[str] = (),
        timeout: float | None = None,
        choices: Sequence[str] = (),
        default: Any = NO_DEFAULT,
    ) -> Coroutine[Any, Any, Any]:
        """Asks a person `question` mid-call and returns their answer (the Pyrula page's
        `ctx.interrupt`, from a tool body). The run blocks with `run:interrupted` (reason
        `human_input`) until someone answers with `kernelctl approvals answer ID --with JSON`, the
        console, `AgentClient.answer` or an MCP client's input. The answer meets `schema` (a JSON
        Schema; with `returns`, a pydantic model or any type pydantic validates, the schema is the
        type's and the answer comes back as that type); the kernel refuses one that does not.
        `approvers` names the keys (or groups) that may answer; `choices` are the answers a person
        picks from; `timeout` (seconds) lets the question expire, recording `default` if given. A
        declined question, or one expired without a default, raises `ToolError` (fatal: the call
        fails unless the body catches it), naming who declined.

        The answer is recorded: the same call run again (a retry, a redispatch after its worker
        was lost) gets it back at once, and the person is asked once. Questions are told apart
        by their order in the body, so ask the same questions in the same order each time; a
        different question in the place of a recorded one is refused (`replay_input_changed`).
        While the body waits on a person alone, a `safe_to_retry` call gives back its worker
        slot after 100 ms and runs again from the start once answered, as with `subagent`; an
        `at_most_once` call keeps its slot, and its timeout counts the wait.

        The worker's key needs `runs:write`. A test context (`for_test`) has no kernel: there it
        raises `ToolError`.
        """
        typed = Typed(returns)
        fields = question_fields(
            question,
            schema=schema,
            returns=returns,
            choices=choices,
            default=default,
            approvers=approvers,
            timeout=timeout,
        )

        async def run() -> Any:
            answer = await self._ask(fields)
            return _as_declared(typed, answer, "ctx.ask: the answer")

        return run()

    def call(
        self,
        tool: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, CallResult]:
        """Calls `tool` through the kernel from this call's body and returns how it ended, as a
        hosted handler's call does (the Pyrula page's gated call "inside another tool"). The
        callee is a step of the run nested under this one (`call:<this step's key>#<n>` for the
        body's n-th call, shown under it by `kernelctl runs show`), checked against its own
        declaration: argument validation, the policy, a person's approval (the body waits for
        the answer), tool limits, the run's budget, and in a branch the branch rule (a call the
        branch may not make ends the branch with `write_tool_blocked`). Its idempotency key
        derives from this call's and `n`. `timeout` (seconds) overrides the callee's own.

        A denial, a rejection or the callee's failure is a result (`outcome` says which), not an
        exception. Calling a tool function directly in an async body, `await refund(ctx,
        cents=5)`, goes through here too, and raises `ToolCallRejected` on a rejection as it does
        in a handler. The outcome is recorded: the same body run again (a retry, a redispatch)
        gets it back at once, and the callee runs once; calls are told apart by their order in
        the body, and another tool or other arguments in a recorded call's place end as
        `replay_input_changed` with nothing run. A call still open when this one settles for
        good is cancelled. While the body waits on the callee alone, a `safe_to_retry` call gives
        back its worker slot after 100 ms and runs again from the start once the callee has
        settled, as with `subagent`; an `at_most_once` call keeps its slot.

        The worker's key needs `tools:call`. A test context (`for_test`) has no kernel: there it
        raises `ToolError`, and a tool function called directly just runs.
        """
        return self._call_through(tool, arguments, timeout)

    async def _call_through(
        self, tool: str, arguments: dict[str, Any] | str | None, timeout: float | None
    ) -> CallResult:
        kernel = self._kernel
        if kernel is None:
            raise ToolError.fatal(
                f"ctx.call '{tool}': this context has no kernel (a test context); "
                "a dispatched call has one"
            )
        # Calls count apart from subagents and questions: no agent name starts with "?".
        occurrence = self._subagents().occurrence("?call")
        arguments_json = arguments if isinstance(arguments, str) else to_canonical(arguments or {})
        timeout_ms = 0 if timeout is None else max(1, round(timeout * 1000))
        called = await kernel.call(tool, arguments_json, timeout_ms, occurrence)
        if called.result is not None:
            return called.result
        with self._subagents().waiting(called.key):
            return await kernel.await_call(called.key)

    async def _ask(self, fields: dict[str, Any]) -> Any:
        kernel = self._kernel
        if kernel is None:
            raise ToolError.fatal(
                "ctx.ask: this context has no kernel (a test context); a dispatched call has one"
            )
        # Questions count apart from subagents: no agent name starts with "?".
        occurrence = self._subagents().occurrence("?question")
        step = await self._settled(kernel, await kernel.ask(fields, occurrence))
        if step.succeeded:
            return json.loads(step.output_json or "null")
        raise ToolError.fatal(step.error)

    async def _settled(self, kernel: KernelLink, step: ChildStep) -> ChildStep:
        """`step` once it has settled, awaited from the kernel; while it waits, the call may give
        back its slot."""
        if step.settled:
            return step
        with self._subagents().waiting(step.key):
            return await kernel.await_step(step.key)

    def _subagents(self) -> SubagentWaits:
        """What the body started and waits on, made when first needed."""
        if self._subagent_waits is None:
            self._subagent_waits = SubagentWaits()
            self._subagent_waits.on_wait = self._on_subagent_wait
        return self._subagent_waits

    async def _subagent(self, agent: str, input: Any, session: str | None) -> Any:
        kernel = self._kernel
        if kernel is None:
            raise ToolError.fatal(
                f"subagent '{agent}': this context has no kernel (a test context); "
                "a dispatched call has one"
            )
        occurrence = self._subagents().occurrence(agent)
        input_json = "" if input is None else to_canonical(input)
        step = await self._settled(
            kernel, await kernel.start(agent, input_json, session or "", occurrence)
        )
        if step.succeeded:
            return json.loads(step.output_json or "null")
        raise ToolError.fatal(f"subagent '{agent}' (run {step.child_run_id}) failed: {step.error}")


def _as_declared(typed: Typed, value: Any, what: str) -> Any:
    """`value` as its declared type; a value that does not fit is the call's fatal error."""
    try:
        return typed.of(value)
    except pydantic.ValidationError as error:
        raise ToolError.fatal(f"{what} does not fit its declared type: {error}") from None
