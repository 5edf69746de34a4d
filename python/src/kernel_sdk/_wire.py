"""The boundary with the generated protocol code: definitions to `ToolSpec`, session messages
to and from plain values. Nothing outside this module and the clients builds a proto message.
"""

from __future__ import annotations

import json
from typing import Any

from ._proto import common_pb2, workers_pb2
from .canonical import to_canonical
from .context import CallInfo, Progress
from .errors import ErrorKind, ToolError
from .tools import RetryPolicy, Tool, ToolOptions

_IDEMPOTENCY = {
    "safe_to_retry": common_pb2.IDEMPOTENCY_SAFE_TO_RETRY,
    "at_most_once": common_pb2.IDEMPOTENCY_AT_MOST_ONCE,
}
_RISK = {
    None: common_pb2.RISK_LEVEL_UNSPECIFIED,
    "low": common_pb2.RISK_LEVEL_LOW,
    "medium": common_pb2.RISK_LEVEL_MEDIUM,
    "high": common_pb2.RISK_LEVEL_HIGH,
    "critical": common_pb2.RISK_LEVEL_CRITICAL,
}
_ERROR_KIND: dict[ErrorKind, Any] = {
    "retryable": common_pb2.ERROR_KIND_RETRYABLE,
    "fatal": common_pb2.ERROR_KIND_FATAL,
    "poison": common_pb2.ERROR_KIND_POISON,
}
ERROR_KIND_NAMES: dict[Any, ErrorKind] = {value: name for name, value in _ERROR_KIND.items()}


def millis(seconds: float | None) -> int:
    """Seconds as whole milliseconds for the wire; `None` (the kernel's default) is 0."""
    if seconds is None:
        return 0
    if seconds < 0:
        raise ValueError(f"a duration cannot be negative, got {seconds}")
    return max(1, round(seconds * 1000)) if seconds else 0


def tool_spec(tool: Tool) -> common_pb2.ToolSpec:
    """What a worker's Hello announces of one tool."""
    definition = tool.definition
    return common_pb2.ToolSpec(
        name=definition.name,
        description=definition.description,
        input_schema_json=to_canonical(definition.input_schema),
        version=definition.version,
        fingerprint=definition.fingerprint,
        options=tool_options(definition.options, blocking=tool.blocking),
    )


def tool_options(options: ToolOptions, *, blocking: bool = False) -> common_pb2.ToolOptions:
    """A tool's options as the kernel registers them."""
    # The predicate alone decides when it is set; `requires_approval` then stays false so a
    # kernel reading either field asks only when the predicate holds.
    approval = options.requires_approval
    return common_pb2.ToolOptions(
        timeout_ms=millis(options.timeout),
        retry=retry_policy(options.retries),
        idempotency=_IDEMPOTENCY[options.idempotency],
        read_only=options.read_only,
        writes=options.writes,
        owner=options.owner or "",
        risk=_RISK[options.risk],
        permissions=list(options.permissions),
        resources=list(options.resources),
        secret=list(options.secret),
        cost_per_call=options.cost_per_call,
        cache_ttl_ms=millis(options.cache_ttl),
        requires_approval=approval is True,
        requires_approval_expr=approval if isinstance(approval, str) else "",
        approval_predicate_in_worker=callable(approval),
        approval_timeout_ms=millis(options.approval_timeout),
        blocking=blocking,
        strip_nulls=options.strip_nulls,
        limit=_limit(options),
    )


def _limit(options: ToolOptions) -> common_pb2.ToolLimitOptions | None:
    """The tool's own limit, when it sets one."""
    if options.per_second is None and options.at_once is None:
        return None
    return common_pb2.ToolLimitOptions(
        per_second=options.per_second, burst=options.burst, at_once=options.at_once
    )


def retry_policy(retries: int | RetryPolicy | None) -> common_pb2.RetryPolicy | None:
    """A count of retries or a whole policy; `None` leaves the kernel's default."""
    if retries is None:
        return None
    policy = RetryPolicy.retries(retries) if isinstance(retries, int) else retries
    return common_pb2.RetryPolicy(
        max_attempts=policy.max_attempts,
        initial_interval_ms=millis(policy.initial_interval),
        backoff_coefficient=policy.backoff_coefficient,
        max_interval_ms=millis(policy.max_interval),
    )


def hello(
    name: str,
    tools: list[Tool],
    agents: list[workers_pb2.AgentSpec],
    max_concurrency: int,
    ephemeral_tools: bool,
    sdk_version: str,
) -> workers_pb2.OpenSessionRequest:
    """The first message of a session."""
    return workers_pb2.OpenSessionRequest(
        hello=workers_pb2.Hello(
            worker_name=name,
            tools=[tool_spec(tool) for tool in tools],
            agents=agents,
            max_concurrency=max_concurrency,
            sdk_version=sdk_version,
            ephemeral_tools=ephemeral_tools,
            # Each message costs a Python worker more than its contents: several in one, please.
            batches=True,
        )
    )


def results(items: list[workers_pb2.DispatchResult]) -> workers_pb2.OpenSessionRequest:
    """Several results in one message."""
    return workers_pb2.OpenSessionRequest(results=workers_pb2.DispatchResults(results=items))


def heartbeat() -> workers_pb2.OpenSessionRequest:
    return workers_pb2.OpenSessionRequest(heartbeat=workers_pb2.Heartbeat())


def drain() -> workers_pb2.OpenSessionRequest:
    return workers_pb2.OpenSessionRequest(drain=workers_pb2.Drain())


def approval_answer(
    question_id: str, required: bool, error: str = ""
) -> workers_pb2.OpenSessionRequest:
    return workers_pb2.OpenSessionRequest(
        approval_answer=workers_pb2.ApprovalAnswer(
            question_id=question_id, required=required, error=error
        )
    )


def progress(dispatch_id: str, attempt: int, report: Progress) -> workers_pb2.OpenSessionRequest:
    return workers_pb2.OpenSessionRequest(
        progress=workers_pb2.DispatchProgress(
            dispatch_id=dispatch_id,
            attempt=attempt,
            message=report.message,
            data_json="" if report.data is None else to_canonical(report.data),
            current=report.current or 0,
            total=report.total or 0,
        )
    )


def suspended(
    dispatch_id: str, attempt: int, waiting_on: list[str]
) -> workers_pb2.OpenSessionRequest:
    """A hosted handler gives back its slot, waiting on these steps."""
    return workers_pb2.OpenSessionRequest(
        result=workers_pb2.DispatchResult(
            dispatch_id=dispatch_id,
            attempt=attempt,
            suspended=workers_pb2.DispatchSuspended(waiting_on=waiting_on),
        )
    )


def result(
    dispatch_id: str, attempt: int, outcome: Any | ToolError
) -> workers_pb2.OpenSessionRequest:
    """A call's outcome: its value as canonical JSON, or its error and kind."""
    message = workers_pb2.DispatchResult(dispatch_id=dispatch_id, attempt=attempt)
    if isinstance(outcome, ToolError):
        message.error.CopyFrom(
            workers_pb2.ToolFailure(message=outcome.message, kind=_ERROR_KIND[outcome.kind])
        )
    else:
        message.output_json = to_canonical(outcome)
    return workers_pb2.OpenSessionRequest(result=message)


def cache_get(
    request_id: int, dispatch_id: str, attempt: int, key: str
) -> workers_pb2.OpenSessionRequest:
    return workers_pb2.OpenSessionRequest(
        cache=workers_pb2.CacheRequest(
            request_id=request_id,
            dispatch_id=dispatch_id,
            attempt=attempt,
            get=workers_pb2.CacheGet(key=key),
        )
    )


def cache_set(
    request_id: int, dispatch_id: str, attempt: int, key: str, value_json: str, ttl_ms: int
) -> workers_pb2.OpenSessionRequest:
    return workers_pb2.OpenSessionRequest(
        cache=workers_pb2.CacheRequest(
            request_id=request_id,
            dispatch_id=dispatch_id,
            attempt=attempt,
            set=workers_pb2.CacheSet(key=key, value_json=value_json, ttl_ms=ttl_ms),
        )
    )


def call_info(dispatch: workers_pb2.Dispatch) -> CallInfo:
    """The identity of one dispatched attempt."""
    return CallInfo(
        run_id=dispatch.run_id,
        step_key=dispatch.step_key,
        call_id=dispatch.call_id or None,
        turn=dispatch.turn,
        position=dispatch.position,
        attempt=dispatch.attempt,
        idempotency_key=dispatch.idempotency_key,
        dispatch_id=dispatch.dispatch_id,
        tool=dispatch.tool,
        timeout=dispatch.timeout_ms / 1000 if dispatch.timeout_ms else None,
        traceparent=dispatch.traceparent,
    )


def arguments(dispatch: workers_pb2.Dispatch) -> dict[str, Any]:
    """The call's arguments; a fatal error when they are not a JSON object."""
    text = dispatch.arguments_json.strip()
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise ToolError.fatal(f"invalid arguments for tool '{dispatch.tool}': {error}") from None
    if not isinstance(value, dict):
        raise ToolError.fatal(f"invalid arguments for tool '{dispatch.tool}': not a JSON object")
    return value
