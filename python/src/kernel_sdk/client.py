"""The agent's side: create runs, submit the tool calls of each model turn, answer approvals,
watch events, and finish runs. Every method maps a kernel refusal to `KernelError`, whose code
and message name the field at fault.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Literal, Self

import grpc

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
from ._wire import ERROR_KIND_NAMES, millis
from .canonical import to_canonical
from .errors import KernelError
from .records import (
    Approval,
    ApprovalDecision,
    CallResult,
    Event,
    Interruption,
    RegisteredTool,
    Run,
    RunDetail,
    Step,
    ToolCall,
    Turn,
    TurnEvent,
    TurnProgress,
)
from .transport import Tls, channel, metadata

Capture = Literal["none", "metadata", "io"]
CallLike = ToolCall | tuple[str, Mapping[str, Any]] | Mapping[str, Any]


class AgentClient:
    """A connection to the kernel for an agent (or anything that drives or inspects runs).

    ```python
    async with AgentClient("127.0.0.1:50051") as kernel:
        run = await kernel.create_run("support-bot", input={"ticket": 42})
        turn = await kernel.call_turn(run.id, 0, [ToolCall("add", {"a": 1, "b": 2})])
        await kernel.complete_run(run.id, turn.results[0].output)
    ```
    """

    def __init__(self, kernel: str, *, api_key: str | None = None, tls: Tls | None = None):
        self.kernel = kernel
        self._metadata = metadata(api_key)
        self._channel = channel(kernel, tls)
        self._runs = runs_pb2_grpc.RunServiceStub(self._channel)
        self._calls = tool_calls_pb2_grpc.ToolCallServiceStub(self._channel)
        self._approvals = approvals_pb2_grpc.ApprovalServiceStub(self._channel)
        self._registry = registry_pb2_grpc.RegistryServiceStub(self._channel)

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

    async def _unary(self, method: Any, request: Any) -> Any:
        try:
            return await method(request, metadata=self._metadata)
        except grpc.aio.AioRpcError as error:
            raise _kernel_error(error) from None

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
    ) -> Run:
        """Starts a run of `agent` (every `CreateRun` field): a repeated create with the same
        `idempotency_key` returns the first run. `capture` is what inspection shows of arguments
        and results (`io` by default); `max_concurrency` bounds the calls of one turn running at
        once; `non_interactive` runs cannot wait for a person."""
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
                capture=_CAPTURE[capture],
                hosted=hosted,
            ),
        )
        return _run(response.run)

    async def get_run(self, run_id: str) -> RunDetail:
        """A run with its recorded steps and cost."""
        response = await self._unary(self._runs.GetRun, runs_pb2.GetRunRequest(run_id=run_id))
        return RunDetail(
            run=_run(response.run),
            steps=[_step(step) for step in response.steps],
            total_cost=response.manifest.total_cost,
            cost_by_tool=dict(response.manifest.cost_by_tool),
        )

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
        request = tool_calls_pb2.SubmitTurnRequest(
            run_id=run_id,
            turn=turn,
            calls=[_tool_call(call) for call in calls],
            offered_tools=list(offered_tools),
            max_concurrency=max_concurrency,
        )
        stream = self._calls.SubmitTurn(request, metadata=self._metadata)
        try:
            async for response in stream:
                item = response.WhichOneof("item")
                if item == "result":
                    yield _call_result(response.result)
                elif item == "progress":
                    yield _progress(response.progress)
                elif item == "interrupted":
                    yield _interruption(response.interrupted)
        except grpc.aio.AioRpcError as error:
            raise _kernel_error(error) from None

    async def call_turn(
        self,
        run_id: str,
        turn: int,
        calls: Iterable[CallLike],
        *,
        offered_tools: Sequence[str] = (),
        max_concurrency: int = 0,
    ) -> Turn:
        """`submit_turn`, collected: returns once every call has settled."""
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
        return _run(response.run)

    async def fail_run(self, run_id: str, reason: str) -> Run:
        """Ends the run as failed, with why."""
        response = await self._unary(
            self._runs.FailRun, runs_pb2.FailRunRequest(run_id=run_id, reason=reason)
        )
        return _run(response.run)

    async def cancel_run(self, run_id: str, reason: str = "") -> Run:
        """Cancels the run: its calls in flight are told, its waiting approvals withdrawn."""
        response = await self._unary(
            self._runs.CancelRun, runs_pb2.CancelRunRequest(run_id=run_id, reason=reason)
        )
        return _run(response.run)

    async def list_approvals(
        self, *, run_id: str | None = None, status: str | None = "pending"
    ) -> list[Approval]:
        """Approvals, the waiting ones by default (`status=None` for every one)."""
        response = await self._unary(
            self._approvals.ListApprovals,
            approvals_pb2.ListApprovalsRequest(
                run_id=run_id or "",
                status=_approval_status(status),
            ),
        )
        return [_approval(approval) for approval in response.approvals]

    async def approve(self, approval_id: str, *, decider: str = "", reason: str = "") -> Approval:
        """Approves a waiting call: it runs (once)."""
        response = await self._unary(
            self._approvals.ApproveCall,
            approvals_pb2.ApproveCallRequest(
                approval_id=approval_id, decider=decider, reason=reason
            ),
        )
        return _approval(response.approval)

    async def reject(self, approval_id: str, *, decider: str = "", reason: str = "") -> Approval:
        """Rejects a waiting call: the model reads the reason."""
        response = await self._unary(
            self._approvals.RejectCall,
            approvals_pb2.RejectCallRequest(
                approval_id=approval_id, decider=decider, reason=reason
            ),
        )
        return _approval(response.approval)

    async def list_events(self, run_id: str, *, from_seq: int = 0) -> list[Event]:
        """The run's event log from `from_seq` on, every page of it."""
        events: list[Event] = []
        seq = from_seq
        while True:
            response = await self._unary(
                self._runs.ListRunEvents,
                runs_pb2.ListRunEventsRequest(run_id=run_id, from_seq=seq, page_size=1000),
            )
            events.extend(_event(event) for event in response.events)
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
                    yield _event(response.event)
                else:
                    yield _progress(response.progress)
        except grpc.aio.AioRpcError as error:
            raise _kernel_error(error) from None

    async def list_tools(self) -> list[RegisteredTool]:
        """The tools the kernel knows, with the workers offering each now."""
        response = await self._unary(self._registry.ListTools, registry_pb2.ListToolsRequest())
        return [_registered(tool) for tool in response.tools]


_CAPTURE: dict[Capture | None, Any] = {
    None: common_pb2.CAPTURE_UNSPECIFIED,
    "none": common_pb2.CAPTURE_NONE,
    "metadata": common_pb2.CAPTURE_METADATA,
    "io": common_pb2.CAPTURE_IO,
}


def _kernel_error(error: grpc.aio.AioRpcError) -> KernelError:
    return KernelError(error.code().name, error.details() or "")


def _name(enum: Any, value: int, prefix: str) -> str:
    """`CALL_OUTCOME_TIMED_OUT` as `timed_out`; a value this SDK does not know as its number."""
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def _approval_status(status: str | None) -> Any:
    if status is None:
        return common_pb2.APPROVAL_STATUS_UNSPECIFIED
    try:
        return common_pb2.ApprovalStatus.Value(f"APPROVAL_STATUS_{status.upper()}")
    except ValueError:
        raise ValueError(f"unknown approval status '{status}'") from None


def _time(message: Any, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    value: datetime = getattr(message, name).ToDatetime()
    return value


def _json(text: str) -> Any:
    return json.loads(text) if text.strip() else None


def _tool_call(call: CallLike) -> tool_calls_pb2.ToolCall:
    if isinstance(call, tuple):
        call = ToolCall(call[0], dict(call[1]))
    elif not isinstance(call, ToolCall):
        arguments = call.get("arguments") or {}
        call = ToolCall(
            str(call["tool"]),
            arguments if isinstance(arguments, str) else dict(arguments),
            call.get("call_id"),
            call.get("timeout"),
        )
    text = call.arguments if isinstance(call.arguments, str) else to_canonical(call.arguments)
    return tool_calls_pb2.ToolCall(
        tool=call.tool,
        arguments_json=text,
        call_id=call.call_id or "",
        timeout_ms=millis(call.timeout),
    )


def _decision(decision: common_pb2.ApprovalDecision) -> ApprovalDecision:
    return ApprovalDecision(
        approval_id=decision.approval_id,
        answer=_name(common_pb2.ApprovalStatus, decision.answer, "APPROVAL_STATUS_"),
        decider=decision.decider,
        reason=decision.reason,
    )


def _call_result(result: tool_calls_pb2.CallResult) -> CallResult:
    return CallResult(
        position=result.position,
        step_key=result.step_key,
        tool=result.tool,
        status=_name(tool_calls_pb2.CallStatus, result.status, "CALL_STATUS_"),
        content=result.content,
        output=_json(result.output_json),
        error_kind=ERROR_KIND_NAMES.get(result.error_kind),
        replayed=result.replayed,
        attempts=result.attempts,
        outcome=_name(common_pb2.CallOutcome, result.outcome, "CALL_OUTCOME_"),
        decided_by=result.decided_by,
        approval=_decision(result.approval) if result.HasField("approval") else None,
    )


def _progress(progress: common_pb2.Progress) -> TurnProgress:
    return TurnProgress(
        run_id=progress.run_id,
        step_key=progress.step_key,
        position=progress.position,
        tool=progress.tool,
        message=progress.message,
        data=_json(progress.data_json),
        current=progress.current,
        total=progress.total,
    )


def _interruption(interruption: tool_calls_pb2.Interruption) -> Interruption:
    return Interruption(
        position=interruption.position,
        step_key=interruption.step_key,
        tool=interruption.tool,
        reason=interruption.reason,
        approval_id=interruption.approval_id,
        arguments=_json(interruption.arguments_json),
        message=interruption.message,
    )


def _run(run: common_pb2.Run) -> Run:
    return Run(
        id=run.id,
        agent=run.agent,
        status=_name(common_pb2.RunStatus, run.status, "RUN_STATUS_"),
        input=_json(run.input_json),
        output=_json(run.output_json),
        reason=run.reason,
        labels=dict(run.labels),
        tool_calls=run.tool_calls,
        hosted=run.hosted,
        parent_run_id=run.parent_run_id,
        created_at=_time(run, "created_at"),
        updated_at=_time(run, "updated_at"),
    )


def _step(step: common_pb2.Step) -> Step:
    return Step(
        step_key=step.step_key,
        turn=step.turn,
        position=step.position,
        call_id=step.call_id,
        tool=step.tool,
        tool_version=step.tool_version,
        tool_fingerprint=step.tool_fingerprint,
        arguments=_json(step.arguments_json),
        idempotency_key=step.idempotency_key,
        status=_name(common_pb2.StepStatus, step.status, "STEP_STATUS_"),
        attempts=step.attempts,
        output=_json(step.output_json),
        error=step.error,
        worker=step.worker,
        outcome=_name(common_pb2.CallOutcome, step.outcome, "CALL_OUTCOME_"),
        decided_by=step.decided_by,
        cost=step.cost,
        progress_count=step.progress_count,
    )


def _approval(approval: common_pb2.Approval) -> Approval:
    return Approval(
        id=approval.id,
        run_id=approval.run_id,
        step_key=approval.step_key,
        tool=approval.tool,
        arguments=_json(approval.arguments_json),
        status=_name(common_pb2.ApprovalStatus, approval.status, "APPROVAL_STATUS_"),
        approvers=list(approval.approvers),
        message=approval.message,
        decided_by=approval.decided_by,
        decider=approval.decider,
        reason=approval.reason,
        expires_at=_time(approval, "expires_at"),
    )


def _event(event: common_pb2.Event) -> Event:
    return Event(
        run_id=event.run_id,
        seq=event.seq,
        type=event.type,
        at=_time(event, "at"),
        payload=_json(event.payload_json),
    )


def _registered(tool: registry_pb2.RegisteredTool) -> RegisteredTool:
    spec = tool.spec
    return RegisteredTool(
        name=spec.name,
        description=spec.description,
        input_schema=_json(spec.input_schema_json) or {},
        version=spec.version,
        fingerprint=spec.fingerprint,
        read_only=spec.options.read_only,
        writes=spec.options.writes,
        workers=list(tool.workers),
    )
