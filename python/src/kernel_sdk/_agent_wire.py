"""The agent side's messages: requests built from plain values, and the kernel's answers read
into the records of `kernel_sdk.records`. The proto types stop here."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

import grpc

from ._proto import common_pb2, registry_pb2, tool_calls_pb2
from ._wire import ERROR_KIND_NAMES, millis
from .canonical import to_canonical
from .errors import ConcurrentCallIdError, KernelError
from .records import (
    Approval,
    ApprovalDecision,
    BudgetLimit,
    CallResult,
    Event,
    Interruption,
    RegisteredTool,
    Run,
    Step,
    ToolCall,
    TurnProgress,
)

Capture = Literal["none", "metadata", "io"]
CallLike = ToolCall | tuple[str, Mapping[str, Any]] | Mapping[str, Any]


CAPTURE: dict[Capture | None, Any] = {
    None: common_pb2.CAPTURE_UNSPECIFIED,
    "none": common_pb2.CAPTURE_NONE,
    "metadata": common_pb2.CAPTURE_METADATA,
    "io": common_pb2.CAPTURE_IO,
}


SETTLED = frozenset(
    {
        common_pb2.STEP_STATUS_SUCCEEDED,
        common_pb2.STEP_STATUS_FAILED,
        common_pb2.STEP_STATUS_CANCELLED,
    }
)
"""Step statuses that are a step's one terminal outcome."""


def kernel_error(error: grpc.aio.AioRpcError) -> KernelError:
    """The kernel's refusal as the SDK raises it: `ConcurrentCallIdError` for a call id another
    call holds in flight, else `KernelError`."""
    code, message = error.code().name, error.details() or ""
    if code == "ALREADY_EXISTS" and message.startswith("concurrent_call_id:"):
        return ConcurrentCallIdError(code, message)
    return KernelError(code, message)


def _name(enum: Any, value: int, prefix: str) -> str:
    """`CALL_OUTCOME_TIMED_OUT` as `timed_out`; a value this SDK does not know as its number."""
    try:
        return str(enum.Name(value)).removeprefix(prefix).lower()
    except ValueError:
        return str(value)


def _value(enum: Any, name: str | None, prefix: str, what: str) -> Any:
    """`timed_out` as `CALL_OUTCOME_TIMED_OUT`'s number (`_name` the other way); `None` as the
    enum's unspecified value; a name the enum does not hold is a `ValueError` naming `what`."""
    try:
        return enum.Value(f"{prefix}{(name or 'unspecified').upper()}")
    except ValueError:
        raise ValueError(f"unknown {what} '{name}'") from None


def approval_status(status: str | None) -> Any:
    return _value(common_pb2.ApprovalStatus, status, "APPROVAL_STATUS_", "approval status")


def run_status(status: str | None) -> Any:
    return _value(common_pb2.RunStatus, status, "RUN_STATUS_", "run status")


def aware(at: datetime, field: str) -> datetime:
    """`at`, which must be timezone-aware: a naive datetime names no moment."""
    if at.tzinfo is None:
        raise ValueError(f"{field}: give a timezone-aware datetime (such as datetime.now(UTC))")
    return at


def _time(message: Any, name: str) -> datetime | None:
    if not message.HasField(name):
        return None
    value: datetime = getattr(message, name).ToDatetime()
    return value


def _json(text: str) -> Any:
    return json.loads(text) if text.strip() else None


def tool_call(call: CallLike) -> tool_calls_pb2.ToolCall:
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


def call_result(result: tool_calls_pb2.CallResult) -> CallResult:
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


def progress(progress: common_pb2.Progress) -> TurnProgress:
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


def interruption(interruption: tool_calls_pb2.Interruption) -> Interruption:
    return Interruption(
        position=interruption.position,
        step_key=interruption.step_key,
        tool=interruption.tool,
        reason=interruption.reason,
        approval_id=interruption.approval_id,
        arguments=_json(interruption.arguments_json),
        message=interruption.message,
    )


def run(run: common_pb2.Run) -> Run:
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
        forked_from_run_id=run.forked_from_run_id,
        fork_at_step_key=run.fork_at_step_key,
        allow=tuple(run.allow),
        trace_id=run.trace_id,
        budget=tuple(
            BudgetLimit(
                max_calls=limit.max_calls if limit.HasField("max_calls") else None,
                max_cost=limit.max_cost if limit.HasField("max_cost") else None,
                tools=limit.tools or None,
                set_by=limit.set_by,
                spent_calls=limit.spent_calls,
                spent_cost=limit.spent_cost,
                max_time=limit.max_time_ms / 1000 if limit.HasField("max_time_ms") else None,
                spent_time=limit.spent_time_ms / 1000,
                reserved_time=limit.reserved_time_ms / 1000,
            )
            for limit in run.budget
        ),
        budget_under_parent=run.budget_under_parent,
    )


def budget(limits: Sequence[BudgetLimit]) -> list[common_pb2.BudgetLimit]:
    """A request's budget limits; what a limit read back says it spent is not sent."""
    return [
        common_pb2.BudgetLimit(
            tools=limit.tools or "",
            max_calls=limit.max_calls,
            max_cost=limit.max_cost,
            max_time_ms=_budget_millis(limit.max_time, index),
        )
        for index, limit in enumerate(limits)
    ]


def _budget_millis(seconds: float | None, index: int) -> int | None:
    """A limit's time in whole milliseconds; refused when negative, naming the limit."""
    if seconds is None:
        return None
    if seconds < 0:
        raise ValueError(f"budget[{index}].max_time: {seconds} is not a duration >= 0")
    return round(seconds * 1000)


def step(step: common_pb2.Step) -> Step:
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
        replayed_from_run_id=step.replayed_from_run_id,
        child_run_id=step.child_run_id,
        limited_by=tuple(step.limited_by),
        limit_wait_ms=step.limit_wait_ms,
        share=step.share if step.HasField("share") else None,
        started_at=_time(step, "started_at"),
        finished_at=_time(step, "finished_at"),
        caller_step_key=step.caller_step_key,
    )


def approval(approval: common_pb2.Approval) -> Approval:
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
        question=approval.question,
        answer_schema=_json(approval.answer_schema_json) if approval.question else None,
        answer=_json(approval.answer_json) if approval.answer_json else None,
    )


def event(event: common_pb2.Event) -> Event:
    return Event(
        run_id=event.run_id,
        seq=event.seq,
        type=event.type,
        at=_time(event, "at"),
        payload=_json(event.payload_json),
    )


def registered(tool: registry_pb2.RegisteredTool) -> RegisteredTool:
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
