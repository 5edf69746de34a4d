"""Hosted agents: an agent's handler runs on a worker, as a durable execution the kernel
dispatches.

`@agent` makes an agent of `async def handler(ctx: AgentContext, input: T) -> U`; a `Worker` given
it (`Worker(kernel, tools, agents=[...])`) is sent every run created for that agent. The handler's
return value completes the run; an exception fails it.

Everything the handler does through its `AgentContext` is a recorded step: tool calls
(`ctx.call`, `ctx.call_turn`), local steps (`ctx.step`, `ctx.once`) and subagents
(`ctx.subagent`), each durable before the handler sees its outcome. When the worker dies or the
kernel restarts, the run is dispatched again and the handler runs again from the start: each
recorded step returns its recorded outcome without running again, in order, and the handler goes
on live from the first step that was not recorded.

**The replay rule.** Between steps a handler must be deterministic: given the same input and the
same step outcomes it must reach the same steps in the same order with the same arguments.
Anything that can differ from one run of the code to the next (the time, a random number, a
model's answer, a read of the world) belongs in a step. A handler that reaches a recorded place
with another step, tool or arguments fails the run with `replay_input_changed` naming the place;
it never gets a wrong recorded result. A local step that was running when its worker died was
never recorded, so it runs again: give a `write` step's effect `StepInfo.idempotency_key`.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

import grpc
import pydantic
import pydantic_core

from ._agent_wire import SETTLED, CallLike, call_result, kernel_error, tool_call
from ._proto import common_pb2, hosted_pb2, hosted_pb2_grpc, tool_calls_pb2
from ._question import NO_DEFAULT, question_fields
from ._tool_subagents import SUSPEND_AFTER as _SUSPEND_AFTER
from ._typed import Typed as _Typed
from .canonical import idempotency_key, to_canonical, tool_fingerprint
from .context import Cancellation, _carrier, current_run
from .errors import ConcurrentCallIdError
from .records import CallOutcome, CallResult
from .tools import (
    ToolDefinitionError,
    _description,
    _return_annotation,
    _schema_option,
    _summary,
    _takes,
    _tool_name,
    _version,
    _whole,
)

logger = logging.getLogger("kernel_sdk.hosted")

StepEffect = Literal["read", "pure", "write"]
# How long every operation must wait durably before the handler gives back its slot (for a child
# or an answer, `_SUSPEND_AFTER`, as long as a tool body waits): one that comes quickly costs no
# redispatch. Tool calls alone usually answer quickly.
_SUSPEND_AFTER_CALLS = 1.0


class AgentError(Exception):
    """What a hosted handler's operation can fail with."""


class ReplayInputChanged(AgentError):
    """The handler reached a recorded place with another step: it is not deterministic. The run
    fails with this even if the handler catches it."""


class StepFailed(AgentError):
    """A local step raised; its error was recorded and replays as the same error."""

    def __init__(self, step_key: str, message: str) -> None:
        super().__init__(f"step {step_key} failed: {message}")
        self.step_key = step_key
        self.message = message


class PolicyError(AgentError):
    """The policy refused an operation of the handler (the Pyrula page's name)."""


class StepDenied(PolicyError):
    """The policy denied a local step; the denial was recorded and replays as the same one."""

    def __init__(self, step_key: str, message: str) -> None:
        super().__init__(f"step {step_key} denied: {message}")
        self.step_key = step_key
        self.message = message


class SubagentFailed(AgentError):
    """A subagent's run failed or was cancelled."""

    def __init__(self, agent: str, run_id: str, message: str) -> None:
        super().__init__(f"subagent '{agent}' (run {run_id}) failed: {message}")
        self.agent = agent
        self.run_id = run_id
        self.message = message


class QuestionUnanswered(AgentError):
    """A hosted handler's question to a person got no answer: declined, expired without a
    default, or withdrawn with its run."""

    def __init__(self, step_key: str, message: str) -> None:
        super().__init__(message)
        self.step_key = step_key
        self.message = message


class NestedDurableOperationError(AgentError):
    """A tool call, step or subagent inside a local step: nothing inside a step may wait on
    something durable; call it from the handler, between steps. The handler gets this error
    itself, not a failure of the step, which is not recorded."""


NestedDurableOperation = NestedDurableOperationError
"""The earlier name of `NestedDurableOperationError`."""


class _HostedProtocol(AgentError):
    """The kernel answered in a way this SDK does not expect, or refused an operation."""


@dataclass(frozen=True)
class StepInfo:
    """What a local step's function gets."""

    id: str
    occurrence: int
    """How many steps with this id ran before this one in the run."""
    idempotency_key: str
    """Stable across every rerun of this step: deduplicate a `write` step's effect with it."""


@dataclass(frozen=True)
class SessionInfo:
    """For a subagent started on a session: the session and the run it continues from."""

    key: str
    previous_run_id: str | None
    previous_output: Any


@dataclass(frozen=True)
class AgentDefinition:
    """What the kernel sees of a hosted agent."""

    name: str
    description: str
    input_schema: dict[str, Any]
    version: str = "1"
    max_concurrency: int = 0
    """Runs of this agent the worker hosts at once (within its own bound); 0: no bound of its own."""

    @property
    def fingerprint(self) -> str:
        """sha256 over the canonical JSON of name, description, input schema and version."""
        return tool_fingerprint(self.name, self.description, self.input_schema, self.version)


class Agent:
    """A hosted agent: its definition and its handler; calling it calls the handler."""

    def __init__(
        self,
        definition: AgentDefinition,
        handler: Callable[..., Awaitable[Any]],
        input_type: Any,
    ) -> None:
        self.definition = definition
        self.handler = handler
        self._input = pydantic.TypeAdapter(input_type)

    def __call__(self, ctx: AgentContext, input: Any) -> Awaitable[Any]:
        return self.handler(ctx, input)

    @property
    def name(self) -> str:
        """The name runs are created with."""
        return self.definition.name

    async def handle(self, ctx: AgentContext, input: Any) -> Any:
        """Runs the handler on a run's JSON input; returns its output as JSON data."""
        try:
            value = self._input.validate_python(input)
        except pydantic.ValidationError as error:
            raise AgentError(f"agent '{self.name}': input does not fit its type: {error}") from None
        # A tool the handler calls directly goes through the kernel (`Tool.__call__`); so does one
        # called in a task the handler starts, which copies this context.
        entered = current_run.set(ctx)
        try:
            output = await self.handler(ctx, value)
        finally:
            current_run.reset(entered)
        try:
            return pydantic_core.to_jsonable_python(output)
        except pydantic_core.PydanticSerializationError as error:
            raise AgentError(
                f"agent '{self.name}' returned an output that is not JSON: {error}"
            ) from None


def agent(
    handler: Callable[..., Awaitable[Any]] | str | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    version: str | int = "1",
    max_concurrency: int = 0,
    input_schema: dict[str, Any] | None = None,
) -> Any:
    """Makes a hosted agent of `async def handler(ctx: AgentContext, input: T) -> U`: `@agent`,
    `@agent("planner")` (the agent's name first) or `@agent(name="planner", version="2")`. The
    input's JSON Schema comes from `T`'s type hint (any JSON without one), the description from
    the docstring. Every option is checked when the decorator is applied: a value it does not
    take raises `ToolDefinitionError` naming the agent, the option and what it takes."""
    if isinstance(handler, str):
        if name is not None:
            raise ToolDefinitionError(
                f"agent '{handler}': the name is given twice, first and as name={name!r}"
            )
        handler, name = None, handler
    elif handler is not None and not callable(handler):
        raise ToolDefinitionError(
            f"@agent takes a handler, or the agent's name as a string, not {handler!r}"
        )

    def decorate(function: Callable[..., Awaitable[Any]]) -> Agent:
        shown = name if name is not None else getattr(function, "__name__", repr(function))
        what = f"agent '{shown}'"
        agent_name = _tool_name(what, shown)
        if not inspect.iscoroutinefunction(function):
            raise ToolDefinitionError(f"{what}: the handler must be an async def")
        parameters = list(inspect.signature(function).parameters)
        if len(parameters) != 2:
            raise ToolDefinitionError(
                f"{what}: the handler takes (ctx: AgentContext, input), "
                f"not {len(parameters)} parameters"
            )
        if not _whole(max_concurrency) or max_concurrency < 0:
            raise ToolDefinitionError(
                f"{what}: "
                + _takes(
                    "max_concurrency",
                    "a whole number >= 0 (0: no bound of its own)",
                    max_concurrency,
                )
            )
        input_type = get_type_hints(function).get(parameters[1], Any)
        schema = _schema_option(what, "input_schema", input_schema)
        if schema is None:
            schema = pydantic.TypeAdapter(input_type).json_schema()
            schema.pop("title", None)
        text = _description(
            what, description if description is not None else _summary(function.__doc__)
        )
        definition = AgentDefinition(
            agent_name, text, schema, _version(what, version), max_concurrency
        )
        return Agent(definition, function, input_type)

    if handler is not None:
        return decorate(handler)
    return decorate


def agent_spec(agent: Agent) -> Any:
    """What a worker's Hello announces of one agent."""
    from ._proto import workers_pb2

    d = agent.definition
    return workers_pb2.AgentSpec(
        name=d.name,
        description=d.description,
        input_schema_json=to_canonical(d.input_schema) if d.input_schema else "",
        version=d.version,
        max_concurrency=d.max_concurrency,
        fingerprint=d.fingerprint,
    )


@dataclass
class _Waits:
    """What the handler's operations are doing now, to tell when all of them wait on something
    durable (then the handler may give back its slot)."""

    active: int = 0
    durable: int = 0
    long: int = 0
    in_step: int = 0
    keys: dict[str, int] = field(default_factory=dict)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def touch(self) -> None:
        self.changed.set()

    def add_keys(self, keys: Iterable[str]) -> None:
        for key in keys:
            self.keys[key] = self.keys.get(key, 0) + 1

    def drop_key(self, key: str) -> None:
        count = self.keys.get(key, 0) - 1
        if count <= 0:
            self.keys.pop(key, None)
        else:
            self.keys[key] = count

    def after(self) -> float | None:
        """How long the handler may wait as it waits now before it gives back its slot: `None`
        while something it awaits is not durable (a local step running, a call not recorded)."""
        if self.active == 0 or self.durable < self.active:
            return None
        return _SUSPEND_AFTER if self.long else _SUSPEND_AFTER_CALLS


class _Durable:
    """An active operation waiting durably on `keys`, until `end`."""

    def __init__(self, waits: _Waits, keys: list[str], long: bool) -> None:
        self.waits, self.keys, self.long = waits, list(keys), long
        waits.durable += 1
        waits.long += long
        waits.add_keys(self.keys)
        waits.touch()

    def resolved(self, key: str) -> None:
        """`key` has its result: a suspension must not name a settled step."""
        if key in self.keys:
            self.keys.remove(key)
            self.waits.drop_key(key)
            # A handler holding its slot after a refused suspension may offer the rest now.
            self.waits.touch()

    def end(self) -> None:
        self.waits.durable -= 1
        self.waits.long -= self.long
        for key in self.keys:
            self.waits.drop_key(key)
        self.keys = []
        self.waits.touch()


@dataclass
class _Batch:
    """Calls gathered in one pass of the event loop, to submit as the turn at `seq`."""

    seq: int
    results: asyncio.Future[list[CallResult]]
    calls: list[tool_calls_pb2.ToolCall] = field(default_factory=list)

    def settle(self, turn: asyncio.Future[list[CallResult]]) -> None:
        """Hands the turn's results, or its error, to the batch's callers."""
        if self.results.done():
            return
        if turn.cancelled():
            self.results.cancel()
        elif (error := turn.exception()) is not None:
            self.results.set_exception(error)
            # Its callers may all be gone (cancelled): the error is theirs, not the loop's to log.
            self.results.add_done_callback(_retrieved)
        else:
            self.results.set_result(turn.result())


_BLOCKED_FIRST_WAIT = 0.02
_BLOCKED_LAST_WAIT = 1.0
"""Seconds between tries of a turn the kernel refused because the run waits for a person: the
first, and at most."""


def _blocked(error: grpc.aio.AioRpcError) -> bool:
    """The kernel refused a turn because the run is blocked on an approval."""
    return error.code() == grpc.StatusCode.FAILED_PRECONDITION and (
        error.details() or ""
    ).startswith("run_blocked:")


def _retrieved(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


class AgentContext:
    """What a hosted handler does its work through.

    A tool turn or a step takes the next place in the handler's order when it is called (not when
    it is awaited), a subagent when it starts; so operations gathered together keep the order they
    were written in.
    """

    def __init__(
        self,
        dispatch: hosted_pb2.HostedDispatch,
        stub: hosted_pb2_grpc.HostedServiceStub,
        metadata: tuple[tuple[str, str], ...],
        history: Sequence[hosted_pb2.LoadHistoryResponse],
        cancelled: Cancellation,
        *,
        traceparent: str = "",
    ) -> None:
        self._dispatch = dispatch
        self._traceparent = traceparent
        self._stub = stub
        self._metadata = metadata
        self._places: dict[int, list[hosted_pb2.LoadHistoryResponse]] = {}
        self._keys: dict[str, int] = {}
        self._context = hosted_pb2.RunContext()
        for entry in history:
            if entry.HasField("context"):
                self._context = entry.context
            if entry.HasField("step"):
                self._keys[entry.step.step_key] = entry.step.turn
                self._places.setdefault(entry.step.turn, []).append(entry)
        self._next = 0
        self._occurrences: dict[str, int] = {}
        self._diverged: str | None = None
        self._waits = _Waits()
        self._batch: _Batch | None = None
        self._held_ids: dict[str, int] = {}
        self._starting: set[int] = set()
        self._started = asyncio.Condition()
        self.cancelled = cancelled
        """Set when the run is cancelled or this dispatch no longer holds it."""

    @property
    def run_id(self) -> str:
        """The run this handler executes."""
        return str(self._dispatch.run_id)

    @property
    def attempt(self) -> int:
        """Which dispatch of the run this is: 1 the first time, more after a redispatch."""
        return int(self._dispatch.attempt)

    def trace_context(self) -> dict[str, str]:
        """The W3C trace context the handler's own spans should join, as a propagation carrier:
        `{"traceparent": ...}` naming the dispatch's span when the kernel exports traces, else
        the agent's own `traceparent`; `{}` when there is neither.
        """
        return _carrier(self._traceparent)

    @property
    def parent_run_id(self) -> str | None:
        """The run that started this one as a subagent."""
        return self._context.parent_run_id or None

    @property
    def session(self) -> SessionInfo | None:
        """For a subagent started on a session: the session and the run it continues from."""
        context = self._context
        if not context.session_key:
            return None
        previous = context.previous_output_json
        return SessionInfo(
            context.session_key,
            context.previous_run_id or None,
            json.loads(previous) if previous else None,
        )

    @property
    def diverged(self) -> str | None:
        """The divergence this handler ran into; once set, every operation fails with it."""
        return self._diverged

    def _diverge(self, message: str) -> ReplayInputChanged:
        if self._diverged is None:
            self._diverged = message
        return ReplayInputChanged(message)

    def _check_place(self, what: str) -> None:
        if self._diverged is not None:
            raise ReplayInputChanged(self._diverged)
        if self._waits.in_step:
            raise NestedDurableOperationError(
                f"{what} inside a local step: nothing inside a step may wait on something "
                "durable; call it from the handler, between steps"
            )

    def _place(self, step_id: str | None, what: str) -> tuple[int, int]:
        self._check_place(what)
        seq = self._next
        self._next += 1
        occurrence = 0
        if step_id is not None:
            occurrence = self._occurrences.get(step_id, 0)
            self._occurrences[step_id] = occurrence + 1
        return seq, occurrence

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _HostedProtocol(f"{error.code().name}: {error.details()}") from None

    def call(
        self,
        tool: str,
        arguments: dict[str, Any] | str | None = None,
        *,
        call_id: str | None = None,
        timeout: float | None = None,
        together: bool = False,
    ) -> Coroutine[Any, Any, CallResult]:
        """Calls one tool through the kernel (validation, policy, approval and replay as for any
        agent); its result once recorded. A denied call is a result the model reads, not an
        error. `arguments` may be the model's JSON text, which the kernel parses (and records
        the call as `invalid_arguments` when it is not a JSON object).

        With `together`, the calls made so in the same pass of the event loop are one turn, as
        the calls of one model response are (the framework integrations call so, since the
        frameworks run a response's calls concurrently): the policy and a person see them
        together, and each result comes once the turn's earlier calls have theirs. Without it
        the call is a turn of its own, its result its own.
        """
        from .records import ToolCall

        call = ToolCall(tool, arguments or {}, call_id, timeout)
        if not together:
            turn = self.call_turn([call])

            async def alone() -> CallResult:
                [result] = await turn
                return result

            return alone()
        batch = self._batch
        if batch is None:
            seq, _ = self._place(None, "a tool call")
            loop = asyncio.get_running_loop()
            batch = self._batch = _Batch(seq, loop.create_future())
            loop.call_soon(self._flush, batch)
        else:
            self._check_place("a tool call")
        position = len(batch.calls)
        batch.calls.append(tool_call(call))

        async def one() -> CallResult:
            results = await asyncio.shield(batch.results)
            return results[position]

        return one()

    def _flush(self, batch: _Batch) -> None:
        """Submits the calls gathered in one pass of the loop as one turn."""
        if self._batch is batch:
            self._batch = None
        turn = asyncio.ensure_future(self._call_turn(batch.seq, batch.calls, 0))
        turn.add_done_callback(batch.settle)

    def call_turn(
        self, calls: Iterable[CallLike], *, max_concurrency: int = 0
    ) -> Coroutine[Any, Any, list[CallResult]]:
        """Calls a turn of tools at once (one model response); results in position order. At
        most `max_concurrency` run at once (0: the run's default)."""
        wire_calls = [tool_call(call) for call in calls]
        seq, _ = self._place(None, "a tool call")
        return self._call_turn(seq, wire_calls, max_concurrency)

    async def _call_turn(
        self, seq: int, calls: list[tool_calls_pb2.ToolCall], max_concurrency: int
    ) -> list[CallResult]:
        ids = self._hold_ids(seq, calls)
        # Counted from here, not from the call: a coroutine never awaited never runs its finally.
        self._waits.active += 1
        try:
            recorded = self._recorded_turn(seq, calls)
            if recorded is not None:
                return recorded
            keys = [
                f"id:{call.call_id}" if call.call_id else f"t{seq}/p{position}"
                for position, call in enumerate(calls)
            ]
            settled = {
                entry.step.step_key
                for entry in self._places.get(seq, [])
                if entry.HasField("result")
            }
            pending = [key for key in keys if key not in settled]
            request = hosted_pb2.CallToolsRequest(
                dispatch=self._dispatch,
                turn=tool_calls_pb2.SubmitTurnRequest(
                    run_id=self.run_id, turn=seq, calls=calls, max_concurrency=max_concurrency
                ),
            )
            waiting = _Durable(self._waits, pending, long=False)
            results: list[CallResult] = []
            blocked = _BLOCKED_FIRST_WAIT
            try:
                while True:
                    try:
                        async for response in self._stub.CallTools(
                            request, metadata=self._metadata
                        ):
                            item = response.item.WhichOneof("item")
                            if item == "result":
                                if len(results) < len(keys):
                                    waiting.resolved(keys[len(results)])
                                results.append(call_result(response.item.result))
                            elif item == "interrupted":
                                # A call waits for a person: the turn may wait long now.
                                left = waiting.keys
                                waiting.end()
                                waiting = _Durable(self._waits, left, long=True)
                        break
                    except grpc.aio.AioRpcError as error:
                        refused = kernel_error(error)
                        if isinstance(refused, ConcurrentCallIdError):
                            # The handler's own mistake, which it may catch and correct.
                            raise refused from None
                        if results or not _blocked(error):
                            raise _HostedProtocol(str(refused)) from None
                    # Another call of the handler waits for a person, and a blocked run takes
                    # no new call: this one waits for the answer too, then goes in. Nothing of
                    # it is recorded, so it names no step a suspension could wait on.
                    if blocked == _BLOCKED_FIRST_WAIT:
                        logger.info(
                            "turn waits for the run's approval run_id=%s turn=%d tools=%s",
                            self.run_id,
                            seq,
                            ",".join(call.tool for call in calls),
                        )
                    waiting.end()
                    waiting = _Durable(self._waits, [], long=True)
                    await asyncio.sleep(blocked)
                    blocked = min(blocked * 2, _BLOCKED_LAST_WAIT)
            finally:
                waiting.end()
            for result in results:
                if result.outcome == CallOutcome.REPLAY_INPUT_CHANGED:
                    raise self._diverge(result.content)
            return results
        finally:
            for call_id in ids:
                self._held_ids.pop(call_id, None)
            self._waits.active -= 1
            self._waits.touch()

    def _hold_ids(self, seq: int, calls: list[tool_calls_pb2.ToolCall]) -> list[str]:
        """Holds the turn's call ids while it runs; `ConcurrentCallIdError` when another turn of
        the handler holds one (a call id names one call: two running together under it are a
        mistake the handler may catch, where the kernel would see a call moved in the order)."""
        ids = [call.call_id for call in calls if call.call_id]
        for position, call in enumerate(calls):
            holder = self._held_ids.get(call.call_id) if call.call_id else None
            if holder is not None:
                raise ConcurrentCallIdError(
                    "ALREADY_EXISTS",
                    f"concurrent_call_id: calls[{position}] has call_id '{call.call_id}', which a call "
                    f"of turn {holder} holds in flight; give this call another id, or wait for "
                    "that one to settle",
                )
        for call_id in ids:
            self._held_ids[call_id] = seq
        return ids

    def _recorded_turn(
        self, seq: int, calls: list[tool_calls_pb2.ToolCall]
    ) -> list[CallResult] | None:
        """The recorded results of the turn at `seq` when the same calls were recorded there and
        all settled; `None` sends the turn to the kernel, which joins, replays or diverges."""
        recorded = self._places.get(seq)
        if recorded is None or len(recorded) != len(calls):
            return None
        results = []
        for position, (entry, call) in enumerate(zip(recorded, calls, strict=True)):
            key = f"id:{call.call_id}" if call.call_id else f"t{seq}/p{position}"
            step = entry.step
            try:
                arguments = to_canonical(json.loads(call.arguments_json or "{}"))
            except json.JSONDecodeError:
                return None
            same = (
                step.kind == common_pb2.STEP_KIND_TOOL
                and not entry.tool_changed
                and step.step_key == key
                and step.tool == call.tool
                and step.arguments_json == arguments
            )
            if not same or not entry.HasField("result"):
                return None
            results.append(call_result(entry.result))
        return results

    def step(
        self,
        id: str,
        function: Callable[[StepInfo], Any],
        *,
        effect: StepEffect = "write",
        returns: Any = None,
    ) -> Coroutine[Any, Any, Any]:
        """Runs `function(info)` (sync, or returning an awaitable) as a local step: its value
        (or error) is recorded before the handler sees it, and on replay the recorded outcome
        comes back without running it again. `effect` says what it does (`read`, `pure`, or
        `write`); a handler may run steps of one id many times, each occurrence its own step.

        The value comes back as the type `returns` names, else as `function`'s return annotation
        (a pydantic model, a dataclass, `list[Order]`), live and on replay alike; a function
        without one gives the recorded JSON (dicts and lists)."""
        return self._local(id, effect, False, function, returns)

    def once(
        self, id: str, function: Callable[[StepInfo], Any], *, returns: Any = None
    ) -> Coroutine[Any, Any, Any]:
        """Runs `function` once per run, for what must not be decided twice (a model's answer, an
        id, the time): a `write` step every branch of the run refuses to run again. Its value
        comes back typed as `step`'s does."""
        return self._local(id, "write", True, function, returns)

    def _local(
        self,
        id: str,
        effect: StepEffect,
        once: bool,
        function: Callable[[StepInfo], Any],
        returns: Any,
    ) -> Coroutine[Any, Any, Any]:
        seq, occurrence = self._place(id, f"step '{id}'")
        typed = _Typed(returns if returns is not None else _return_annotation(function))

        async def run() -> Any:
            value = await self._run_local(seq, id, occurrence, effect, once, function)
            return _typed_or_failed(typed, value, f"step:{id}#{occurrence}")

        return run()

    async def _run_local(
        self,
        seq: int,
        id: str,
        occurrence: int,
        effect: StepEffect,
        once: bool,
        function: Callable[[StepInfo], Any],
    ) -> Any:
        self._waits.active += 1
        try:
            key = f"step:{id}#{occurrence}"
            recorded = self._recorded_step(seq, key)
            if recorded is not None:
                return _step_outcome(recorded)
            if self._context.check_steps:
                checked = await self._unary(
                    self._stub.CheckStep,
                    hosted_pb2.CheckStepRequest(
                        dispatch=self._dispatch,
                        seq=seq,
                        step_id=id,
                        occurrence=occurrence,
                        effect=effect,
                        once=once,
                    ),
                )
                if checked.diverged:
                    raise self._diverge(checked.diverged)
                if not checked.allowed:
                    return _step_outcome(checked.step)
            info = StepInfo(id, occurrence, idempotency_key(self.run_id, key))
            request = hosted_pb2.RecordStepRequest(
                dispatch=self._dispatch,
                seq=seq,
                step_id=id,
                occurrence=occurrence,
                effect=effect,
                once=once,
            )
            self._waits.in_step += 1
            try:
                value = function(info)
                if inspect.isawaitable(value):
                    value = await value
                request.output_json = to_canonical(pydantic_core.to_jsonable_python(value))
            except NestedDurableOperationError:
                # The handler's mistake, not the step's outcome: it goes to the handler unrecorded,
                # and a replay reaches it again.
                raise
            except Exception as error:  # noqa: BLE001 (a step's failure is recorded, then replayed)
                request.error.message = f"{type(error).__name__}: {error}"
            finally:
                self._waits.in_step -= 1
            response = await self._unary(self._stub.RecordStep, request)
            if response.diverged:
                raise self._diverge(response.diverged)
            return _step_outcome(response.step)
        finally:
            self._waits.active -= 1
            self._waits.touch()

    def _recorded_step(self, seq: int, key: str) -> common_pb2.Step | None:
        """The recorded step at `seq` when it is this one; a divergence when the place (or this
        step's identity) holds something else; `None` when neither is recorded."""
        at_place = self._places.get(seq)
        elsewhere = self._keys.get(key)
        if elsewhere is not None and elsewhere != seq:
            raise self._diverge(
                f"replay_input_changed: step {key} was recorded at place {elsewhere} of the "
                f"handler's order, now it comes at place {seq}"
            )
        if at_place is None:
            return None
        if len(at_place) == 1 and at_place[0].step.step_key == key:
            return at_place[0].step
        was = ", ".join(entry.step.step_key for entry in at_place)
        raise self._diverge(
            f"replay_input_changed: place {seq} of the handler's order was recorded as {was}, "
            f"now it is {key}"
        )

    def subagent(
        self,
        agent: str,
        input: Any = None,
        *,
        session: str | None = None,
        returns: Any = None,
    ) -> Coroutine[Any, Any, Any]:
        """Starts a subagent: a child run of `agent` (hosted on any worker offering it), linked
        to this run, and returns its output; a failed or cancelled child raises
        `SubagentFailed`. With `session`, subagents of one session key run one at a time in order
        of start, each continuing from the last that completed (`ctx.session` in the child);
        derive the key from this run's id so no other parent reuses it. On replay the recorded
        child is returned (or joined while it runs), never a second one. While it waits, the
        handler may give back its slot (the run is suspended). Its place in the handler's order is
        taken when it is first awaited (or started by `asyncio.gather`), as the Rust SDK's is.
        With `returns` (a pydantic model, a dataclass, any type pydantic validates) the output
        comes back as that type, live and on replay alike."""
        typed = _Typed(returns)

        async def run() -> Any:
            output = await self._subagent(agent, input, session)
            return _typed_or_failed(typed, output, f"subagent:{agent}")

        return run()

    def ask(
        self,
        question: str,
        *,
        schema: dict[str, Any] | None = None,
        returns: Any = None,
        choices: Sequence[str] = (),
        default: Any = NO_DEFAULT,
        approvers: Sequence[str] = (),
        timeout: float | None = None,
    ) -> Coroutine[Any, Any, Any]:
        """Asks a person `question` and returns their answer (the Pyrula page's `ctx.interrupt`).
        The run blocks with `run:interrupted` (reason `human_input`) until someone answers with
        `kernelctl runs answer RUN question:agent#N --with '...'`, `kernelctl approvals answer`,
        the console, `AgentClient.answer` or an MCP client's input. The answer meets `schema` (a
        JSON Schema; with `returns`, a pydantic model or any type pydantic validates, the schema is
        the type's and the answer comes back as that type) and is one of `choices` when given; the
        kernel refuses one that does not. `approvers` names the keys (or groups) that may answer;
        past `timeout` (seconds) the question records `default` if given, else it fails. Declined,
        or expired without a default, it raises `QuestionUnanswered`.

        The question takes the next place in the handler's order, as a subagent does: on replay the
        recorded answer is returned and nobody is asked again, and another question in its place
        fails the run (`ReplayInputChanged`). While the person takes their time the handler may give
        back its slot (the run is suspended) and runs again once answered. Inside a local step it
        raises `NestedDurableOperationError`."""
        typed = _Typed(returns)
        request = hosted_pb2.AskPersonRequest(
            **question_fields(
                question,
                schema=schema,
                returns=returns,
                choices=choices,
                default=default,
                approvers=approvers,
                timeout=timeout,
            )
        )

        async def run() -> Any:
            answer = await self._ask(request)
            return _typed_or_failed(typed, answer, "the answer")

        return run()

    interrupt = ask
    """The Pyrula page's name for `ask`."""

    async def _ask(self, request: hosted_pb2.AskPersonRequest) -> Any:
        seq, occurrence = self._place("?question", "a question to a person")
        key = f"question:agent#{occurrence}"
        self._waits.active += 1
        try:
            step = self._recorded_step(seq, key)
            if step is None:
                request.dispatch.CopyFrom(self._dispatch)
                request.seq = seq
                request.occurrence = occurrence
                response = await self._unary(self._stub.AskPerson, request)
                if response.diverged:
                    raise self._diverge(response.diverged)
                step = response.step
            step = await self._settled(step, key)
            if step.status == common_pb2.STEP_STATUS_SUCCEEDED:
                return json.loads(step.output_json or "null")
            raise QuestionUnanswered(key, step.error)
        finally:
            self._waits.active -= 1
            self._waits.touch()

    async def _settled(self, step: common_pb2.Step, key: str) -> common_pb2.Step:
        """`step` once settled: awaited from the kernel while the handler may give back its slot."""
        if step.status in SETTLED:
            return step
        waiting = _Durable(self._waits, [key], long=True)
        try:
            answer = await self._unary(
                self._stub.AwaitStep,
                hosted_pb2.AwaitStepRequest(dispatch=self._dispatch, step_key=key),
            )
        finally:
            waiting.end()
        settled: common_pb2.Step = answer.step
        return settled

    async def _subagent(self, agent: str, input: Any, session: str | None) -> Any:
        seq, occurrence = self._place(f"subagent:{agent}", f"subagent '{agent}'")
        self._starting.add(seq)
        self._waits.active += 1
        key = f"subagent:{agent}#{occurrence}"
        try:
            try:
                recorded = self._recorded_step(seq, key)
                # Subagents start in place order, so a session's runs go in the order started.
                async with self._started:
                    await self._started.wait_for(lambda: min(self._starting) >= seq)
                step = recorded
                if step is None:
                    response = await self._unary(
                        self._stub.StartSubagent,
                        hosted_pb2.StartSubagentRequest(
                            dispatch=self._dispatch,
                            seq=seq,
                            agent=agent,
                            input_json="" if input is None else to_canonical(input),
                            session_key=session or "",
                            occurrence=occurrence,
                        ),
                    )
                    if response.diverged:
                        raise self._diverge(response.diverged)
                    step = response.step
            finally:
                self._starting.discard(seq)
                async with self._started:
                    self._started.notify_all()
            step = await self._settled(step, key)
            if step.status == common_pb2.STEP_STATUS_SUCCEEDED:
                return json.loads(step.output_json or "null")
            raise SubagentFailed(agent, step.child_run_id, step.error)
        finally:
            self._waits.active -= 1
            self._waits.touch()

    async def _suspendable(self, refused: Sequence[str] = ()) -> list[str]:
        """Returns the steps waited on once every active operation has waited durably long
        enough: the handler may then give back its slot. Never `refused`, the steps of a
        suspension the kernel refused: the handler waits on, holding its slot, until what it
        awaits changes."""
        waits = self._waits
        while True:
            waits.changed.clear()
            after = waits.after()
            if after is None:
                await waits.changed.wait()
                continue
            try:
                await asyncio.wait_for(waits.changed.wait(), after)
            except TimeoutError:
                if waits.after() == after:
                    keys = sorted(waits.keys)
                    if keys != list(refused):
                        return keys
                    await waits.changed.wait()


def _typed_or_failed(typed: _Typed, value: Any, key: str) -> Any:
    """A recorded value as its declared type; `StepFailed` when it no longer fits."""
    try:
        return typed.of(value)
    except pydantic.ValidationError as error:
        raise StepFailed(
            key, f"its recorded value does not fit its declared type: {error}"
        ) from None


def _step_outcome(step: common_pb2.Step) -> Any:
    """A recorded local step's outcome as the handler gets it."""
    if step.status == common_pb2.STEP_STATUS_SUCCEEDED:
        return json.loads(step.output_json or "null")
    if step.outcome == common_pb2.CALL_OUTCOME_DENIED:
        raise StepDenied(step.step_key, step.error)
    raise StepFailed(step.step_key, step.error)
