"""The agent's side: create runs, submit the tool calls of each model turn, answer approvals,
watch events, and finish runs. Every method maps a kernel refusal to `KernelError`, whose code
and message name the field at fault.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self

import grpc

from . import _agent_wire as wire
from ._agent_wire import CallLike, Capture
from ._proto import (
    approvals_pb2,
    approvals_pb2_grpc,
    common_pb2,
    registry_pb2,
    registry_pb2_grpc,
    runs_pb2,
    runs_pb2_grpc,
    tool_calls_pb2,
    tool_calls_pb2_grpc,
)
from ._question import NO_DEFAULT, question_fields
from ._typed import Typed
from .canonical import to_canonical
from .errors import KernelError
from .hosted import QuestionUnanswered
from .records import (
    Approval,
    BudgetLimit,
    CallResult,
    Event,
    Interruption,
    RegisteredTool,
    Run,
    RunDetail,
    RunPage,
    Step,
    Turn,
    TurnEvent,
    TurnProgress,
)
from .transport import Tls, channel, metadata

logger = logging.getLogger("kernel_sdk.client")

_WENT_AWAY = frozenset({"UNAVAILABLE", "UNKNOWN"})
"""Codes of a kernel that went away (draining to stop, restarting, unreachable) rather than
refused the request: the same request, sent again, may succeed."""


class AgentClient:
    """A connection to the kernel for an agent (or anything that drives or inspects runs).

    ```python
    async with AgentClient("127.0.0.1:50051") as kernel:
        run = await kernel.create_run("support-bot", input={"ticket": 42})
        turn = await kernel.call_turn(run.id, 0, [ToolCall("add", {"a": 1, "b": 2})])
        await kernel.complete_run(run.id, turn.results[0].output)
    ```
    """

    def __init__(
        self,
        kernel: str,
        *,
        api_key: str | None = None,
        tls: Tls | None = None,
        reconnect_timeout: float = 60.0,
    ):
        self.kernel = kernel
        self.reconnect_timeout = reconnect_timeout
        """Seconds `call_turn` goes on submitting a turn again while the kernel is away (it
        drains to stop, restarts, or the replica behind the address changes); 0 turns it off."""
        self._metadata = metadata(api_key)
        self._channel = channel(kernel, tls)
        self._runs = runs_pb2_grpc.RunServiceStub(self._channel)
        self._calls = tool_calls_pb2_grpc.ToolCallServiceStub(self._channel)
        self._approvals = approvals_pb2_grpc.ApprovalServiceStub(self._channel)
        self._registry = registry_pb2_grpc.RegistryServiceStub(self._channel)
        self._unary_turns = True
        """`call_turn` asks for the whole turn in one answer (`CallTurn`), which costs less
        than the stream, unless the kernel predates it."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the connection."""
        await self._channel.close()

    async def _unary(self, method: Any, request: Any, *, traceparent: str | None = None) -> Any:
        metadata = self._metadata
        if traceparent:
            metadata = (*metadata, ("traceparent", traceparent))
        try:
            return await method(request, metadata=metadata)
        except grpc.aio.AioRpcError as error:
            raise wire.kernel_error(error) from None

    async def create_run(
        self,
        agent: str,
        *,
        input: Any = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        max_tool_calls: int = 0,
        max_concurrency: int = 0,
        non_interactive: bool = False,
        permissions: Sequence[str] = (),
        capture: Capture | None = None,
        hosted: bool = False,
        allow: Sequence[str] = (),
        traceparent: str | None = None,
        budget: Sequence[BudgetLimit] = (),
    ) -> Run:
        """Starts a run of `agent` (every `CreateRun` field): a repeated create with the same
        `idempotency_key` returns the first run. `capture` is what inspection shows of arguments
        and results (`io` by default); `max_concurrency` bounds the calls of one turn running at
        once; `non_interactive` runs cannot wait for a person. Allow tokens (`tool:<name>`,
        `step:<id>`) make a case run: only reads run live, besides what a token names, and any
        other effect is refused with `write_tool_blocked`, which ends the run. A W3C
        `traceparent` (the agent's current span) parents the run's spans, and tools are handed
        it (`ToolContext.trace_context()`). Each `BudgetLimit` of `budget` holds beside those
        the kernel's policy gives runs with these labels: a call past one does not run, and its
        outcome is `budget_exceeded`."""
        response = await self._unary(
            self._runs.CreateRun,
            runs_pb2.CreateRunRequest(
                agent=agent,
                input_json="" if input is None else to_canonical(input),
                labels=dict(labels or {}),
                idempotency_key=idempotency_key or "",
                max_tool_calls=max_tool_calls,
                max_concurrency=max_concurrency,
                non_interactive=non_interactive,
                permissions=list(permissions),
                capture=wire.CAPTURE[capture],
                hosted=hosted,
                allow=list(allow),
                budget=wire.budget(budget),
            ),
            traceparent=traceparent,
        )
        return wire.run(response.run)

    async def fork_run(
        self,
        run_id: str,
        *,
        at: str | None = None,
        input: Any = None,
        set_results: Mapping[str, Any] | None = None,
        labels: Mapping[str, str] | None = None,
        idempotency_key: str | None = None,
        budget: Sequence[BudgetLimit] = (),
    ) -> Run:
        """Makes a branch of recorded run `run_id`: a new run that replays the parent's recorded
        steps up to and including step `at` (all of them by default), with a new `input` or with
        the recorded results of the steps in `set_results` replaced. Only reads run live in a
        branch; any other effect the parent never recorded is refused with `write_tool_blocked`,
        which ends it. A hosted parent's branch is dispatched by the kernel; drive any other with
        `submit_turn` on the returned run's id. The branch spends a `budget` of its own: the
        limits given, else its parent's, with nothing spent."""
        response = await self._unary(
            self._runs.ForkRun,
            runs_pb2.ForkRunRequest(
                run_id=run_id,
                at_step_key=at or "",
                input_json="" if input is None else to_canonical(input),
                set_results={
                    key: to_canonical(value) for key, value in (set_results or {}).items()
                },
                labels=dict(labels or {}),
                idempotency_key=idempotency_key or "",
                budget=wire.budget(budget),
            ),
        )
        return wire.run(response.run)

    async def get_run(self, run_id: str) -> RunDetail:
        """A run with its recorded steps and cost."""
        response = await self._unary(self._runs.GetRun, runs_pb2.GetRunRequest(run_id=run_id))
        return RunDetail(
            run=wire.run(response.run),
            steps=[wire.step(step) for step in response.steps],
            total_cost=response.manifest.total_cost,
            cost_by_tool=dict(response.manifest.cost_by_tool),
        )

    async def list_runs(
        self,
        *,
        status: str | None = None,
        agent: str = "",
        labels: Mapping[str, str] | None = None,
        parent_run_id: str = "",
        branch_of: str = "",
        tool: str = "",
        created_after: datetime | None = None,
        created_before: datetime | None = None,
        page_size: int = 50,
        page_token: str = "",
    ) -> RunPage:
        """Runs, newest first, that meet every filter given: a status (`running`, `completed`,
        ...), an agent, labels (each `key: value` carried), the subagent runs of a parent, the
        branches forked from a run, a tool the run called, created at or after `created_after`
        and before `created_before` (timezone-aware datetimes). `page_size` runs at most (the
        kernel caps it at 1000); pass the page's `next_page_token` as `page_token` for the next.
        An unknown status or a naive datetime raises `ValueError` before anything is sent; a
        malformed run id is the kernel's `INVALID_ARGUMENT`, naming the field."""
        request = runs_pb2.ListRunsRequest(
            status=wire.run_status(status),
            agent=agent,
            labels=[f"{key}={value}" for key, value in (labels or {}).items()],
            page_size=page_size,
            page_token=page_token,
            parent_run_id=parent_run_id,
            forked_from_run_id=branch_of,
            tool=tool,
        )
        if created_after is not None:
            request.created_after.FromDatetime(wire.aware(created_after, "created_after"))
        if created_before is not None:
            request.created_before.FromDatetime(wire.aware(created_before, "created_before"))
        response = await self._unary(self._runs.ListRuns, request)
        return RunPage(
            runs=[wire.run(run) for run in response.runs],
            next_page_token=response.next_page_token,
        )

    async def receipts(self, run_id: str) -> list[dict[str, Any]]:
        """A signed receipt of each settled call of the run, in the order the calls settled: each
        `{"receipt": {...}, "hash": ..., "signature": ..., "key": ...}`, the receipt holding the
        call's identity, tool, version and fingerprint, the SHA-256 of its arguments and of its
        result, its outcome, what decided it and when, and `prev`, the hash of the receipt before
        it. Written one canonical JSON object a line (`json.dumps(r, separators=(",", ":"),
        sort_keys=True)`), they are what `kernelctl receipts verify` checks offline."""
        response = await self._unary(
            self._runs.ListReceipts, runs_pb2.ListReceiptsRequest(run_id=run_id)
        )
        return [json.loads(line) for line in response.receipts_json]

    async def submit_turn(
        self,
        run_id: str,
        turn: int,
        calls: Iterable[CallLike],
        *,
        offered_tools: Sequence[str] = (),
        max_concurrency: int = 0,
    ) -> AsyncIterator[TurnEvent]:
        """Records and runs one model turn's calls, yielding progress and interruptions as they
        happen and each call's `CallResult` in position order. Submitting the same turn again
        (after a crash) yields the recorded results without running anything again.
        `offered_tools` names the tools the model was offered; a call outside them is an unknown
        tool."""
        request = _turn_request(run_id, turn, calls, offered_tools, max_concurrency)
        stream = self._calls.SubmitTurn(request, metadata=self._metadata)
        try:
            async for response in stream:
                item = response.WhichOneof("item")
                if item == "result":
                    yield wire.call_result(response.result)
                elif item == "progress":
                    yield wire.progress(response.progress)
                elif item == "interrupted":
                    yield wire.interruption(response.interrupted)
        except grpc.aio.AioRpcError as error:
            raise wire.kernel_error(error) from None

    async def call_turn(
        self,
        run_id: str,
        turn: int,
        calls: Iterable[CallLike],
        *,
        offered_tools: Sequence[str] = (),
        max_concurrency: int = 0,
    ) -> Turn:
        """`submit_turn`, collected: returns once every call has settled, with the progress
        (the last 1,000 reports) and interruptions that came meanwhile. It asks for the turn in
        one answer, which costs less than the stream. When the kernel goes away meanwhile (it
        drains to stop, or the connection breaks), the turn is submitted again, with a backoff,
        for up to `reconnect_timeout` seconds: the kernel answers a resubmitted turn from its
        record, so no call runs twice."""
        calls = list(calls)
        deadline = time.monotonic() + self.reconnect_timeout
        backoff = 0.1
        while True:
            try:
                return await self._collect_turn(
                    run_id,
                    turn,
                    calls,
                    offered_tools=offered_tools,
                    max_concurrency=max_concurrency,
                )
            except KernelError as error:
                if error.code not in _WENT_AWAY or time.monotonic() + backoff >= deadline:
                    raise
                logger.warning(
                    "the kernel went away during the turn; submitting it again "
                    "run_id=%s turn=%d retry_in_ms=%d error=%s",
                    run_id,
                    turn,
                    backoff * 1000,
                    error,
                )
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)

    async def _collect_turn(
        self,
        run_id: str,
        turn: int,
        calls: list[CallLike],
        *,
        offered_tools: Sequence[str],
        max_concurrency: int,
    ) -> Turn:
        if self._unary_turns:
            request = tool_calls_pb2.CallTurnRequest(
                turn=_turn_request(run_id, turn, calls, offered_tools, max_concurrency)
            )
            try:
                response = await self._calls.CallTurn(request, metadata=self._metadata)
            except grpc.aio.AioRpcError as error:
                if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                    # A kernel from before CallTurn: the stream, from now on.
                    self._unary_turns = False
                elif error.code() != grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise wire.kernel_error(error) from None
                # Too big for one answer: the stream again, which the kernel answers from its
                # record, one result at a time.
            else:
                return Turn(
                    [wire.call_result(result) for result in response.results],
                    [wire.progress(report) for report in response.progress],
                    [wire.interruption(item) for item in response.interruptions],
                )
        results: list[CallResult] = []
        progress: list[TurnProgress] = []
        interruptions: list[Interruption] = []
        async for event in self.submit_turn(
            run_id, turn, calls, offered_tools=offered_tools, max_concurrency=max_concurrency
        ):
            if isinstance(event, CallResult):
                results.append(event)
            elif isinstance(event, TurnProgress):
                progress.append(event)
            else:
                interruptions.append(event)
        return Turn(results, progress, interruptions)

    async def complete_run(self, run_id: str, output: Any = None) -> Run:
        """Ends the run with its output."""
        response = await self._unary(
            self._runs.CompleteRun,
            runs_pb2.CompleteRunRequest(
                run_id=run_id, output_json="" if output is None else to_canonical(output)
            ),
        )
        return wire.run(response.run)

    async def fail_run(self, run_id: str, reason: str) -> Run:
        """Ends the run as failed, with why."""
        response = await self._unary(
            self._runs.FailRun, runs_pb2.FailRunRequest(run_id=run_id, reason=reason)
        )
        return wire.run(response.run)

    async def cancel_run(self, run_id: str, reason: str = "") -> Run:
        """Cancels the run: its calls in flight are told, its waiting approvals withdrawn."""
        response = await self._unary(
            self._runs.CancelRun, runs_pb2.CancelRunRequest(run_id=run_id, reason=reason)
        )
        return wire.run(response.run)

    async def cancel_call(self, run_id: str, step_key: str, reason: str = "") -> Step:
        """Cancels one call of a run and leaves the run going.

        `step_key` is the call's key (`t<turn>/p<position>`, or `id:<call id>`). A call pending,
        waiting for a slot or for a person (its question withdrawn), or running (its worker told
        to stop) ends with one result, status cancelled, that the model reads as
        `cancelled: <reason>`; the turn waiting on it gets that result. Returns the call as it now
        stands. A call already settled raises `KernelError` (`FAILED_PRECONDITION`, naming how it
        ended), an unknown run or call `NOT_FOUND`.
        """
        response = await self._unary(
            self._calls.CancelCall,
            tool_calls_pb2.CancelCallRequest(run_id=run_id, step_key=step_key, reason=reason),
        )
        return wire.step(response.step)

    async def ask(
        self,
        run_id: str,
        question_id: str,
        question: str,
        *,
        schema: dict[str, Any] | None = None,
        returns: Any = None,
        choices: Sequence[str] = (),
        default: Any = NO_DEFAULT,
        approvers: Sequence[str] = (),
        timeout: float | None = None,
    ) -> Any:
        """Asks a person `question` from the agent's own code (the Pyrula page's
        `ctx.interrupt`) and returns the answer, once a person gave it. `question_id` is the
        question's identity in the run (1 to 128 of `A-Z a-z 0-9 _ . -`), which the agent keeps
        across its restarts: asked again under it, the recorded answer comes back (or the open
        question is waited on again) and nobody is asked twice; another question under it raises
        `KernelError` (`FAILED_PRECONDITION`, `replay_input_changed`). The run is blocked with
        `run:interrupted` (reason `human_input`) until someone answers: `kernelctl runs answer RUN
        question:run#<id> --with JSON`, the console, `answer` or an MCP client's input.

        The answer meets `schema` (with `returns`, a pydantic model or any type pydantic
        validates, the schema is the type's and the answer comes back as that type) and is one of
        `choices` when given. Past `timeout` (seconds) the question records `default` if given.
        Declined, or expired without a default, it raises `QuestionUnanswered`. When the kernel
        goes away meanwhile, the question is asked again for up to `reconnect_timeout` seconds,
        which waits on the one recorded. A hosted run asks from its handler (`AgentContext.ask`).
        The key needs `runs:write`."""
        typed = Typed(returns)
        request = tool_calls_pb2.AgentAskRequest(
            run_id=run_id,
            question_id=question_id,
            **question_fields(
                question,
                schema=schema,
                returns=returns,
                choices=choices,
                default=default,
                approvers=approvers,
                timeout=timeout,
            ),
        )
        # A person may take hours: the window to reconnect opens when the kernel goes away.
        gone_until: float | None = None
        backoff = 0.1
        while True:
            asked_at = time.monotonic()
            try:
                response = await self._unary(self._calls.AskPerson, request)
                break
            except KernelError as error:
                if error.code not in _WENT_AWAY:
                    raise
                now = time.monotonic()
                if now - asked_at >= 1.0:
                    # An ask that waited a while was answered by a kernel: a new outage.
                    gone_until, backoff = None, 0.1
                if gone_until is None:
                    gone_until = now + self.reconnect_timeout
                if now + backoff >= gone_until:
                    raise
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
        step = response.step
        if step.status != common_pb2.STEP_STATUS_SUCCEEDED:
            raise QuestionUnanswered(step.step_key, step.error)
        return typed.of(json.loads(step.output_json or "null"))

    async def list_approvals(
        self, *, run_id: str | None = None, status: str | None = "pending"
    ) -> list[Approval]:
        """Approvals in one status (`pending`, `approved`, `consumed`, `rejected`, `expired`,
        `cancelled`); the waiting ones by default, and for `None` too: the kernel lists one status
        at a time."""
        response = await self._unary(
            self._approvals.ListApprovals,
            approvals_pb2.ListApprovalsRequest(
                run_id=run_id or "",
                status=wire.approval_status(status),
            ),
        )
        return [wire.approval(approval) for approval in response.approvals]

    async def approve(self, approval_id: str, *, decider: str = "", reason: str = "") -> Approval:
        """Approves a waiting call: it runs (once)."""
        request = approvals_pb2.ApproveCallRequest(
            approval_id=approval_id, decider=decider, reason=reason
        )
        return await self._answer(self._approvals.ApproveCall, request)

    async def answer(
        self, approval_id: str, answer: Any, *, decider: str = "", reason: str = ""
    ) -> Approval:
        """Answers a tool's question to a person (an approval whose `question` is set) with
        `answer` (JSON), which must meet the question's `answer_schema`; else `KernelError`
        (`INVALID_ARGUMENT`, naming `answer_json`) and nothing is written. The tool body that
        asked gets the answer; `reject` declines to answer. An approval that asks to raise a budget
        (interruption reason `budget_exceeded`) is answered the same way with the limit's new
        bounds, such as `{"max_cost": 10.0}`: the call then runs under them."""
        request = approvals_pb2.ApproveCallRequest(
            approval_id=approval_id,
            decider=decider,
            reason=reason,
            answer_json=to_canonical(answer),
        )
        return await self._answer(self._approvals.ApproveCall, request)

    async def reject(self, approval_id: str, *, decider: str = "", reason: str = "") -> Approval:
        """Rejects a waiting call: the model reads the reason. For a question, declines to
        answer: the tool body that asked gets an error."""
        request = approvals_pb2.RejectCallRequest(
            approval_id=approval_id, decider=decider, reason=reason
        )
        return await self._answer(self._approvals.RejectCall, request)

    async def _answer(self, method: Any, request: Any) -> Approval:
        response = await self._unary(method, request)
        return wire.approval(response.approval)

    async def list_events(self, run_id: str, *, from_seq: int = 0) -> list[Event]:
        """The run's event log from `from_seq` on, every page of it."""
        events: list[Event] = []
        seq = from_seq
        while True:
            response = await self._unary(
                self._runs.ListRunEvents,
                runs_pb2.ListRunEventsRequest(run_id=run_id, from_seq=seq, page_size=1000),
            )
            events.extend(wire.event(event) for event in response.events)
            if not response.next_seq or not response.events:
                return events
            seq = response.next_seq

    async def watch_events(
        self, run_id: str, *, from_seq: int = 0, include_progress: bool = False
    ) -> AsyncIterator[Event | TurnProgress]:
        """The run's events from `from_seq` on, then each new one as it is recorded, until the
        run ends (and, with `include_progress`, running calls' progress too)."""
        stream = self._runs.WatchRunEvents(
            runs_pb2.WatchRunEventsRequest(
                run_id=run_id, from_seq=from_seq, include_progress=include_progress
            ),
            metadata=self._metadata,
        )
        try:
            async for response in stream:
                if response.WhichOneof("item") == "event":
                    yield wire.event(response.event)
                else:
                    yield wire.progress(response.progress)
        except grpc.aio.AioRpcError as error:
            raise wire.kernel_error(error) from None

    async def list_tools(self) -> list[RegisteredTool]:
        """The tools the kernel knows, with the workers offering each now."""
        response = await self._unary(self._registry.ListTools, registry_pb2.ListToolsRequest())
        return [wire.registered(tool) for tool in response.tools]


def _turn_request(
    run_id: str,
    turn: int,
    calls: Iterable[CallLike],
    offered_tools: Sequence[str],
    max_concurrency: int,
) -> tool_calls_pb2.SubmitTurnRequest:
    return tool_calls_pb2.SubmitTurnRequest(
        run_id=run_id,
        turn=turn,
        calls=[wire.tool_call(call) for call in calls],
        offered_tools=list(offered_tools),
        max_concurrency=max_concurrency,
    )
