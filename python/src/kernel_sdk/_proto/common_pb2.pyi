import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RunStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RUN_STATUS_UNSPECIFIED: _ClassVar[RunStatus]
    RUN_STATUS_PENDING: _ClassVar[RunStatus]
    RUN_STATUS_RUNNING: _ClassVar[RunStatus]
    RUN_STATUS_BLOCKED: _ClassVar[RunStatus]
    RUN_STATUS_COMPLETED: _ClassVar[RunStatus]
    RUN_STATUS_FAILED: _ClassVar[RunStatus]
    RUN_STATUS_CANCELLED: _ClassVar[RunStatus]
    RUN_STATUS_SUSPENDED: _ClassVar[RunStatus]

class StepKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_KIND_UNSPECIFIED: _ClassVar[StepKind]
    STEP_KIND_TOOL: _ClassVar[StepKind]
    STEP_KIND_AGENT: _ClassVar[StepKind]
    STEP_KIND_LOCAL: _ClassVar[StepKind]
    STEP_KIND_SUBAGENT: _ClassVar[StepKind]
    STEP_KIND_QUESTION: _ClassVar[StepKind]

class StepStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    STEP_STATUS_UNSPECIFIED: _ClassVar[StepStatus]
    STEP_STATUS_PENDING: _ClassVar[StepStatus]
    STEP_STATUS_RUNNING: _ClassVar[StepStatus]
    STEP_STATUS_SUCCEEDED: _ClassVar[StepStatus]
    STEP_STATUS_FAILED: _ClassVar[StepStatus]
    STEP_STATUS_CANCELLED: _ClassVar[StepStatus]
    STEP_STATUS_AWAITING_APPROVAL: _ClassVar[StepStatus]
    STEP_STATUS_SUSPENDED: _ClassVar[StepStatus]

class Idempotency(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    IDEMPOTENCY_UNSPECIFIED: _ClassVar[Idempotency]
    IDEMPOTENCY_SAFE_TO_RETRY: _ClassVar[Idempotency]
    IDEMPOTENCY_AT_MOST_ONCE: _ClassVar[Idempotency]

class RiskLevel(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RISK_LEVEL_UNSPECIFIED: _ClassVar[RiskLevel]
    RISK_LEVEL_LOW: _ClassVar[RiskLevel]
    RISK_LEVEL_MEDIUM: _ClassVar[RiskLevel]
    RISK_LEVEL_HIGH: _ClassVar[RiskLevel]
    RISK_LEVEL_CRITICAL: _ClassVar[RiskLevel]

class ErrorKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ERROR_KIND_UNSPECIFIED: _ClassVar[ErrorKind]
    ERROR_KIND_RETRYABLE: _ClassVar[ErrorKind]
    ERROR_KIND_FATAL: _ClassVar[ErrorKind]
    ERROR_KIND_POISON: _ClassVar[ErrorKind]

class CallOutcome(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALL_OUTCOME_UNSPECIFIED: _ClassVar[CallOutcome]
    CALL_OUTCOME_OK: _ClassVar[CallOutcome]
    CALL_OUTCOME_TOOL_ERROR: _ClassVar[CallOutcome]
    CALL_OUTCOME_INVALID_ARGUMENTS: _ClassVar[CallOutcome]
    CALL_OUTCOME_UNKNOWN_TOOL: _ClassVar[CallOutcome]
    CALL_OUTCOME_DENIED: _ClassVar[CallOutcome]
    CALL_OUTCOME_REJECTED: _ClassVar[CallOutcome]
    CALL_OUTCOME_EXPIRED: _ClassVar[CallOutcome]
    CALL_OUTCOME_TIMED_OUT: _ClassVar[CallOutcome]
    CALL_OUTCOME_INDETERMINATE: _ClassVar[CallOutcome]
    CALL_OUTCOME_POISON: _ClassVar[CallOutcome]
    CALL_OUTCOME_CANCELLED: _ClassVar[CallOutcome]
    CALL_OUTCOME_REPLAY_INPUT_CHANGED: _ClassVar[CallOutcome]
    CALL_OUTCOME_LIMIT_EXCEEDED: _ClassVar[CallOutcome]
    CALL_OUTCOME_NO_WORKER: _ClassVar[CallOutcome]
    CALL_OUTCOME_WRITE_TOOL_BLOCKED: _ClassVar[CallOutcome]
    CALL_OUTCOME_BUDGET_EXCEEDED: _ClassVar[CallOutcome]

class Capture(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CAPTURE_UNSPECIFIED: _ClassVar[Capture]
    CAPTURE_NONE: _ClassVar[Capture]
    CAPTURE_METADATA: _ClassVar[Capture]
    CAPTURE_IO: _ClassVar[Capture]

class ApprovalStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    APPROVAL_STATUS_UNSPECIFIED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_PENDING: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_APPROVED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_CONSUMED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_REJECTED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_EXPIRED: _ClassVar[ApprovalStatus]
    APPROVAL_STATUS_CANCELLED: _ClassVar[ApprovalStatus]
RUN_STATUS_UNSPECIFIED: RunStatus
RUN_STATUS_PENDING: RunStatus
RUN_STATUS_RUNNING: RunStatus
RUN_STATUS_BLOCKED: RunStatus
RUN_STATUS_COMPLETED: RunStatus
RUN_STATUS_FAILED: RunStatus
RUN_STATUS_CANCELLED: RunStatus
RUN_STATUS_SUSPENDED: RunStatus
STEP_KIND_UNSPECIFIED: StepKind
STEP_KIND_TOOL: StepKind
STEP_KIND_AGENT: StepKind
STEP_KIND_LOCAL: StepKind
STEP_KIND_SUBAGENT: StepKind
STEP_KIND_QUESTION: StepKind
STEP_STATUS_UNSPECIFIED: StepStatus
STEP_STATUS_PENDING: StepStatus
STEP_STATUS_RUNNING: StepStatus
STEP_STATUS_SUCCEEDED: StepStatus
STEP_STATUS_FAILED: StepStatus
STEP_STATUS_CANCELLED: StepStatus
STEP_STATUS_AWAITING_APPROVAL: StepStatus
STEP_STATUS_SUSPENDED: StepStatus
IDEMPOTENCY_UNSPECIFIED: Idempotency
IDEMPOTENCY_SAFE_TO_RETRY: Idempotency
IDEMPOTENCY_AT_MOST_ONCE: Idempotency
RISK_LEVEL_UNSPECIFIED: RiskLevel
RISK_LEVEL_LOW: RiskLevel
RISK_LEVEL_MEDIUM: RiskLevel
RISK_LEVEL_HIGH: RiskLevel
RISK_LEVEL_CRITICAL: RiskLevel
ERROR_KIND_UNSPECIFIED: ErrorKind
ERROR_KIND_RETRYABLE: ErrorKind
ERROR_KIND_FATAL: ErrorKind
ERROR_KIND_POISON: ErrorKind
CALL_OUTCOME_UNSPECIFIED: CallOutcome
CALL_OUTCOME_OK: CallOutcome
CALL_OUTCOME_TOOL_ERROR: CallOutcome
CALL_OUTCOME_INVALID_ARGUMENTS: CallOutcome
CALL_OUTCOME_UNKNOWN_TOOL: CallOutcome
CALL_OUTCOME_DENIED: CallOutcome
CALL_OUTCOME_REJECTED: CallOutcome
CALL_OUTCOME_EXPIRED: CallOutcome
CALL_OUTCOME_TIMED_OUT: CallOutcome
CALL_OUTCOME_INDETERMINATE: CallOutcome
CALL_OUTCOME_POISON: CallOutcome
CALL_OUTCOME_CANCELLED: CallOutcome
CALL_OUTCOME_REPLAY_INPUT_CHANGED: CallOutcome
CALL_OUTCOME_LIMIT_EXCEEDED: CallOutcome
CALL_OUTCOME_NO_WORKER: CallOutcome
CALL_OUTCOME_WRITE_TOOL_BLOCKED: CallOutcome
CALL_OUTCOME_BUDGET_EXCEEDED: CallOutcome
CAPTURE_UNSPECIFIED: Capture
CAPTURE_NONE: Capture
CAPTURE_METADATA: Capture
CAPTURE_IO: Capture
APPROVAL_STATUS_UNSPECIFIED: ApprovalStatus
APPROVAL_STATUS_PENDING: ApprovalStatus
APPROVAL_STATUS_APPROVED: ApprovalStatus
APPROVAL_STATUS_CONSUMED: ApprovalStatus
APPROVAL_STATUS_REJECTED: ApprovalStatus
APPROVAL_STATUS_EXPIRED: ApprovalStatus
APPROVAL_STATUS_CANCELLED: ApprovalStatus

class ApprovalDecision(_message.Message):
    __slots__ = ("approval_id", "answer", "decider", "reason", "answered_at")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    ANSWER_FIELD_NUMBER: _ClassVar[int]
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_AT_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    answer: ApprovalStatus
    decider: str
    reason: str
    answered_at: _timestamp_pb2.Timestamp
    def __init__(self, approval_id: _Optional[str] = ..., answer: _Optional[_Union[ApprovalStatus, str]] = ..., decider: _Optional[str] = ..., reason: _Optional[str] = ..., answered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("id", "agent", "status", "input_json", "output_json", "reason", "labels", "idempotency_key", "max_tool_calls", "tool_calls", "last_seq", "created_at", "updated_at", "non_interactive", "permissions", "capture", "permissions_granted_by", "hosted", "dispatches", "parent_run_id", "parent_step_key", "session_key", "suspensions", "max_concurrency", "forked_from_run_id", "fork_at_step_key", "fork_results", "allow", "trace_id", "budget", "budget_under_parent")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class ForkResultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    LAST_SEQ_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    UPDATED_AT_FIELD_NUMBER: _ClassVar[int]
    NON_INTERACTIVE_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_GRANTED_BY_FIELD_NUMBER: _ClassVar[int]
    HOSTED_FIELD_NUMBER: _ClassVar[int]
    DISPATCHES_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PARENT_STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    SUSPENSIONS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FORK_AT_STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    FORK_RESULTS_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    TRACE_ID_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    BUDGET_UNDER_PARENT_FIELD_NUMBER: _ClassVar[int]
    id: str
    agent: str
    status: RunStatus
    input_json: str
    output_json: str
    reason: str
    labels: _containers.ScalarMap[str, str]
    idempotency_key: str
    max_tool_calls: int
    tool_calls: int
    last_seq: int
    created_at: _timestamp_pb2.Timestamp
    updated_at: _timestamp_pb2.Timestamp
    non_interactive: bool
    permissions: _containers.RepeatedScalarFieldContainer[str]
    capture: Capture
    permissions_granted_by: str
    hosted: bool
    dispatches: int
    parent_run_id: str
    parent_step_key: str
    session_key: str
    suspensions: int
    max_concurrency: int
    forked_from_run_id: str
    fork_at_step_key: str
    fork_results: _containers.ScalarMap[str, str]
    allow: _containers.RepeatedScalarFieldContainer[str]
    trace_id: str
    budget: _containers.RepeatedCompositeFieldContainer[BudgetLimit]
    budget_under_parent: bool
    def __init__(self, id: _Optional[str] = ..., agent: _Optional[str] = ..., status: _Optional[_Union[RunStatus, str]] = ..., input_json: _Optional[str] = ..., output_json: _Optional[str] = ..., reason: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., max_tool_calls: _Optional[int] = ..., tool_calls: _Optional[int] = ..., last_seq: _Optional[int] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., updated_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., non_interactive: _Optional[bool] = ..., permissions: _Optional[_Iterable[str]] = ..., capture: _Optional[_Union[Capture, str]] = ..., permissions_granted_by: _Optional[str] = ..., hosted: _Optional[bool] = ..., dispatches: _Optional[int] = ..., parent_run_id: _Optional[str] = ..., parent_step_key: _Optional[str] = ..., session_key: _Optional[str] = ..., suspensions: _Optional[int] = ..., max_concurrency: _Optional[int] = ..., forked_from_run_id: _Optional[str] = ..., fork_at_step_key: _Optional[str] = ..., fork_results: _Optional[_Mapping[str, str]] = ..., allow: _Optional[_Iterable[str]] = ..., trace_id: _Optional[str] = ..., budget: _Optional[_Iterable[_Union[BudgetLimit, _Mapping]]] = ..., budget_under_parent: _Optional[bool] = ...) -> None: ...

class BudgetLimit(_message.Message):
    __slots__ = ("tools", "max_calls", "max_cost", "set_by", "spent_calls", "spent_cost", "max_time_ms", "spent_time_ms", "reserved_time_ms")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MAX_CALLS_FIELD_NUMBER: _ClassVar[int]
    MAX_COST_FIELD_NUMBER: _ClassVar[int]
    SET_BY_FIELD_NUMBER: _ClassVar[int]
    SPENT_CALLS_FIELD_NUMBER: _ClassVar[int]
    SPENT_COST_FIELD_NUMBER: _ClassVar[int]
    MAX_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    SPENT_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    RESERVED_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    tools: str
    max_calls: int
    max_cost: float
    set_by: str
    spent_calls: int
    spent_cost: float
    max_time_ms: int
    spent_time_ms: int
    reserved_time_ms: int
    def __init__(self, tools: _Optional[str] = ..., max_calls: _Optional[int] = ..., max_cost: _Optional[float] = ..., set_by: _Optional[str] = ..., spent_calls: _Optional[int] = ..., spent_cost: _Optional[float] = ..., max_time_ms: _Optional[int] = ..., spent_time_ms: _Optional[int] = ..., reserved_time_ms: _Optional[int] = ...) -> None: ...

class Step(_message.Message):
    __slots__ = ("step_key", "turn", "position", "call_id", "tool", "tool_fingerprint", "tool_version", "arguments_json", "call_hash", "idempotency_key", "status", "attempts", "output_json", "error", "error_kind", "worker", "dispatch_id", "lease_expires_at", "created_at", "started_at", "finished_at", "replays", "progress_count", "next_attempt_at", "lease_losses", "max_attempts", "timeout_ms", "idempotency", "cost", "unit_cost", "decided_by", "outcome", "approval", "kind", "effect", "child_run_id", "max_concurrency", "resources", "replayed_from_run_id", "limited_by", "limit_wait_ms", "share", "caller_step_key")
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    TOOL_FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    TOOL_VERSION_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CALL_HASH_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    WORKER_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    LEASE_EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    CREATED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    FINISHED_AT_FIELD_NUMBER: _ClassVar[int]
    REPLAYS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_COUNT_FIELD_NUMBER: _ClassVar[int]
    NEXT_ATTEMPT_AT_FIELD_NUMBER: _ClassVar[int]
    LEASE_LOSSES_FIELD_NUMBER: _ClassVar[int]
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_FIELD_NUMBER: _ClassVar[int]
    COST_FIELD_NUMBER: _ClassVar[int]
    UNIT_COST_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    CHILD_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FROM_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    LIMITED_BY_FIELD_NUMBER: _ClassVar[int]
    LIMIT_WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    SHARE_FIELD_NUMBER: _ClassVar[int]
    CALLER_STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    step_key: str
    turn: int
    position: int
    call_id: str
    tool: str
    tool_fingerprint: str
    tool_version: str
    arguments_json: str
    call_hash: str
    idempotency_key: str
    status: StepStatus
    attempts: int
    output_json: str
    error: str
    error_kind: ErrorKind
    worker: str
    dispatch_id: str
    lease_expires_at: _timestamp_pb2.Timestamp
    created_at: _timestamp_pb2.Timestamp
    started_at: _timestamp_pb2.Timestamp
    finished_at: _timestamp_pb2.Timestamp
    replays: int
    progress_count: int
    next_attempt_at: _timestamp_pb2.Timestamp
    lease_losses: int
    max_attempts: int
    timeout_ms: int
    idempotency: str
    cost: float
    unit_cost: float
    decided_by: str
    outcome: CallOutcome
    approval: ApprovalDecision
    kind: StepKind
    effect: str
    child_run_id: str
    max_concurrency: int
    resources: _containers.RepeatedScalarFieldContainer[str]
    replayed_from_run_id: str
    limited_by: _containers.RepeatedScalarFieldContainer[str]
    limit_wait_ms: int
    share: str
    caller_step_key: str
    def __init__(self, step_key: _Optional[str] = ..., turn: _Optional[int] = ..., position: _Optional[int] = ..., call_id: _Optional[str] = ..., tool: _Optional[str] = ..., tool_fingerprint: _Optional[str] = ..., tool_version: _Optional[str] = ..., arguments_json: _Optional[str] = ..., call_hash: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., status: _Optional[_Union[StepStatus, str]] = ..., attempts: _Optional[int] = ..., output_json: _Optional[str] = ..., error: _Optional[str] = ..., error_kind: _Optional[_Union[ErrorKind, str]] = ..., worker: _Optional[str] = ..., dispatch_id: _Optional[str] = ..., lease_expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., finished_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., replays: _Optional[int] = ..., progress_count: _Optional[int] = ..., next_attempt_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., lease_losses: _Optional[int] = ..., max_attempts: _Optional[int] = ..., timeout_ms: _Optional[int] = ..., idempotency: _Optional[str] = ..., cost: _Optional[float] = ..., unit_cost: _Optional[float] = ..., decided_by: _Optional[str] = ..., outcome: _Optional[_Union[CallOutcome, str]] = ..., approval: _Optional[_Union[ApprovalDecision, _Mapping]] = ..., kind: _Optional[_Union[StepKind, str]] = ..., effect: _Optional[str] = ..., child_run_id: _Optional[str] = ..., max_concurrency: _Optional[int] = ..., resources: _Optional[_Iterable[str]] = ..., replayed_from_run_id: _Optional[str] = ..., limited_by: _Optional[_Iterable[str]] = ..., limit_wait_ms: _Optional[int] = ..., share: _Optional[str] = ..., caller_step_key: _Optional[str] = ...) -> None: ...

class Approval(_message.Message):
    __slots__ = ("id", "run_id", "step_key", "tool", "arguments_json", "call_hash", "status", "approvers", "message", "decided_by", "requested_at", "expires_at", "answered_at", "decider", "reason", "question", "answer_schema_json", "answer_json")
    ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CALL_HASH_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_AT_FIELD_NUMBER: _ClassVar[int]
    EXPIRES_AT_FIELD_NUMBER: _ClassVar[int]
    ANSWERED_AT_FIELD_NUMBER: _ClassVar[int]
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    ANSWER_JSON_FIELD_NUMBER: _ClassVar[int]
    id: str
    run_id: str
    step_key: str
    tool: str
    arguments_json: str
    call_hash: str
    status: ApprovalStatus
    approvers: _containers.RepeatedScalarFieldContainer[str]
    message: str
    decided_by: str
    requested_at: _timestamp_pb2.Timestamp
    expires_at: _timestamp_pb2.Timestamp
    answered_at: _timestamp_pb2.Timestamp
    decider: str
    reason: str
    question: bool
    answer_schema_json: str
    answer_json: str
    def __init__(self, id: _Optional[str] = ..., run_id: _Optional[str] = ..., step_key: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., call_hash: _Optional[str] = ..., status: _Optional[_Union[ApprovalStatus, str]] = ..., approvers: _Optional[_Iterable[str]] = ..., message: _Optional[str] = ..., decided_by: _Optional[str] = ..., requested_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., expires_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., answered_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., decider: _Optional[str] = ..., reason: _Optional[str] = ..., question: _Optional[bool] = ..., answer_schema_json: _Optional[str] = ..., answer_json: _Optional[str] = ...) -> None: ...

class RunManifest(_message.Message):
    __slots__ = ("total_cost", "cost_by_tool")
    class CostByToolEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    TOTAL_COST_FIELD_NUMBER: _ClassVar[int]
    COST_BY_TOOL_FIELD_NUMBER: _ClassVar[int]
    total_cost: float
    cost_by_tool: _containers.ScalarMap[str, float]
    def __init__(self, total_cost: _Optional[float] = ..., cost_by_tool: _Optional[_Mapping[str, float]] = ...) -> None: ...

class Event(_message.Message):
    __slots__ = ("run_id", "seq", "type", "schema_version", "at", "payload_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    TYPE_FIELD_NUMBER: _ClassVar[int]
    SCHEMA_VERSION_FIELD_NUMBER: _ClassVar[int]
    AT_FIELD_NUMBER: _ClassVar[int]
    PAYLOAD_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    seq: int
    type: str
    schema_version: int
    at: _timestamp_pb2.Timestamp
    payload_json: str
    def __init__(self, run_id: _Optional[str] = ..., seq: _Optional[int] = ..., type: _Optional[str] = ..., schema_version: _Optional[int] = ..., at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., payload_json: _Optional[str] = ...) -> None: ...

class Progress(_message.Message):
    __slots__ = ("run_id", "step_key", "position", "tool", "message", "data_json", "current", "total")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_key: str
    position: int
    tool: str
    message: str
    data_json: str
    current: int
    total: int
    def __init__(self, run_id: _Optional[str] = ..., step_key: _Optional[str] = ..., position: _Optional[int] = ..., tool: _Optional[str] = ..., message: _Optional[str] = ..., data_json: _Optional[str] = ..., current: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class RetryPolicy(_message.Message):
    __slots__ = ("max_attempts", "initial_interval_ms", "backoff_coefficient", "max_interval_ms")
    MAX_ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    INITIAL_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    BACKOFF_COEFFICIENT_FIELD_NUMBER: _ClassVar[int]
    MAX_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    max_attempts: int
    initial_interval_ms: int
    backoff_coefficient: float
    max_interval_ms: int
    def __init__(self, max_attempts: _Optional[int] = ..., initial_interval_ms: _Optional[int] = ..., backoff_coefficient: _Optional[float] = ..., max_interval_ms: _Optional[int] = ...) -> None: ...

class ToolOptions(_message.Message):
    __slots__ = ("timeout_ms", "retry", "idempotency", "read_only", "writes", "owner", "risk", "permissions", "resources", "cost_per_call", "cache_ttl_ms", "requires_approval", "requires_approval_expr", "approval_timeout_ms", "blocking", "strip_nulls", "approval_predicate_in_worker", "limit", "secret")
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    RETRY_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_FIELD_NUMBER: _ClassVar[int]
    READ_ONLY_FIELD_NUMBER: _ClassVar[int]
    WRITES_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    RISK_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    COST_PER_CALL_FIELD_NUMBER: _ClassVar[int]
    CACHE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_APPROVAL_FIELD_NUMBER: _ClassVar[int]
    REQUIRES_APPROVAL_EXPR_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    BLOCKING_FIELD_NUMBER: _ClassVar[int]
    STRIP_NULLS_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_PREDICATE_IN_WORKER_FIELD_NUMBER: _ClassVar[int]
    LIMIT_FIELD_NUMBER: _ClassVar[int]
    SECRET_FIELD_NUMBER: _ClassVar[int]
    timeout_ms: int
    retry: RetryPolicy
    idempotency: Idempotency
    read_only: bool
    writes: bool
    owner: str
    risk: RiskLevel
    permissions: _containers.RepeatedScalarFieldContainer[str]
    resources: _containers.RepeatedScalarFieldContainer[str]
    cost_per_call: float
    cache_ttl_ms: int
    requires_approval: bool
    requires_approval_expr: str
    approval_timeout_ms: int
    blocking: bool
    strip_nulls: bool
    approval_predicate_in_worker: bool
    limit: ToolLimitOptions
    secret: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, timeout_ms: _Optional[int] = ..., retry: _Optional[_Union[RetryPolicy, _Mapping]] = ..., idempotency: _Optional[_Union[Idempotency, str]] = ..., read_only: _Optional[bool] = ..., writes: _Optional[bool] = ..., owner: _Optional[str] = ..., risk: _Optional[_Union[RiskLevel, str]] = ..., permissions: _Optional[_Iterable[str]] = ..., resources: _Optional[_Iterable[str]] = ..., cost_per_call: _Optional[float] = ..., cache_ttl_ms: _Optional[int] = ..., requires_approval: _Optional[bool] = ..., requires_approval_expr: _Optional[str] = ..., approval_timeout_ms: _Optional[int] = ..., blocking: _Optional[bool] = ..., strip_nulls: _Optional[bool] = ..., approval_predicate_in_worker: _Optional[bool] = ..., limit: _Optional[_Union[ToolLimitOptions, _Mapping]] = ..., secret: _Optional[_Iterable[str]] = ...) -> None: ...

class ToolLimitOptions(_message.Message):
    __slots__ = ("per_second", "burst", "at_once")
    PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    AT_ONCE_FIELD_NUMBER: _ClassVar[int]
    per_second: float
    burst: int
    at_once: int
    def __init__(self, per_second: _Optional[float] = ..., burst: _Optional[int] = ..., at_once: _Optional[int] = ...) -> None: ...

class ToolSpec(_message.Message):
    __slots__ = ("name", "description", "input_schema_json", "version", "fingerprint", "options")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    OPTIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    version: str
    fingerprint: str
    options: ToolOptions
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., version: _Optional[str] = ..., fingerprint: _Optional[str] = ..., options: _Optional[_Union[ToolOptions, _Mapping]] = ...) -> None: ...
