from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OpenSessionRequest(_message.Message):
    __slots__ = ("hello", "heartbeat", "progress", "result", "drain", "cache", "approval_answer", "results")
    HELLO_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    DRAIN_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ANSWER_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    hello: Hello
    heartbeat: Heartbeat
    progress: DispatchProgress
    result: DispatchResult
    drain: Drain
    cache: CacheRequest
    approval_answer: ApprovalAnswer
    results: DispatchResults
    def __init__(self, hello: _Optional[_Union[Hello, _Mapping]] = ..., heartbeat: _Optional[_Union[Heartbeat, _Mapping]] = ..., progress: _Optional[_Union[DispatchProgress, _Mapping]] = ..., result: _Optional[_Union[DispatchResult, _Mapping]] = ..., drain: _Optional[_Union[Drain, _Mapping]] = ..., cache: _Optional[_Union[CacheRequest, _Mapping]] = ..., approval_answer: _Optional[_Union[ApprovalAnswer, _Mapping]] = ..., results: _Optional[_Union[DispatchResults, _Mapping]] = ...) -> None: ...

class OpenSessionResponse(_message.Message):
    __slots__ = ("welcome", "dispatch", "cancel", "result_ack", "cache", "run", "approval_question", "dispatches")
    WELCOME_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    RESULT_ACK_FIELD_NUMBER: _ClassVar[int]
    CACHE_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_QUESTION_FIELD_NUMBER: _ClassVar[int]
    DISPATCHES_FIELD_NUMBER: _ClassVar[int]
    welcome: Welcome
    dispatch: Dispatch
    cancel: CancelDispatch
    result_ack: ResultAck
    cache: CacheResponse
    run: RunDispatch
    approval_question: ApprovalQuestion
    dispatches: Dispatches
    def __init__(self, welcome: _Optional[_Union[Welcome, _Mapping]] = ..., dispatch: _Optional[_Union[Dispatch, _Mapping]] = ..., cancel: _Optional[_Union[CancelDispatch, _Mapping]] = ..., result_ack: _Optional[_Union[ResultAck, _Mapping]] = ..., cache: _Optional[_Union[CacheResponse, _Mapping]] = ..., run: _Optional[_Union[RunDispatch, _Mapping]] = ..., approval_question: _Optional[_Union[ApprovalQuestion, _Mapping]] = ..., dispatches: _Optional[_Union[Dispatches, _Mapping]] = ...) -> None: ...

class DispatchResults(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[DispatchResult]
    def __init__(self, results: _Optional[_Iterable[_Union[DispatchResult, _Mapping]]] = ...) -> None: ...

class Dispatches(_message.Message):
    __slots__ = ("dispatches",)
    DISPATCHES_FIELD_NUMBER: _ClassVar[int]
    dispatches: _containers.RepeatedCompositeFieldContainer[Dispatch]
    def __init__(self, dispatches: _Optional[_Iterable[_Union[Dispatch, _Mapping]]] = ...) -> None: ...

class Hello(_message.Message):
    __slots__ = ("worker_name", "tools", "max_concurrency", "sdk_version", "ephemeral_tools", "agents", "batches")
    WORKER_NAME_FIELD_NUMBER: _ClassVar[int]
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    SDK_VERSION_FIELD_NUMBER: _ClassVar[int]
    EPHEMERAL_TOOLS_FIELD_NUMBER: _ClassVar[int]
    AGENTS_FIELD_NUMBER: _ClassVar[int]
    BATCHES_FIELD_NUMBER: _ClassVar[int]
    worker_name: str
    tools: _containers.RepeatedCompositeFieldContainer[_common_pb2.ToolSpec]
    max_concurrency: int
    sdk_version: str
    ephemeral_tools: bool
    agents: _containers.RepeatedCompositeFieldContainer[AgentSpec]
    batches: bool
    def __init__(self, worker_name: _Optional[str] = ..., tools: _Optional[_Iterable[_Union[_common_pb2.ToolSpec, _Mapping]]] = ..., max_concurrency: _Optional[int] = ..., sdk_version: _Optional[str] = ..., ephemeral_tools: _Optional[bool] = ..., agents: _Optional[_Iterable[_Union[AgentSpec, _Mapping]]] = ..., batches: _Optional[bool] = ...) -> None: ...

class AgentSpec(_message.Message):
    __slots__ = ("name", "description", "input_schema_json", "version", "max_concurrency", "fingerprint")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DESCRIPTION_FIELD_NUMBER: _ClassVar[int]
    INPUT_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    FINGERPRINT_FIELD_NUMBER: _ClassVar[int]
    name: str
    description: str
    input_schema_json: str
    version: str
    max_concurrency: int
    fingerprint: str
    def __init__(self, name: _Optional[str] = ..., description: _Optional[str] = ..., input_schema_json: _Optional[str] = ..., version: _Optional[str] = ..., max_concurrency: _Optional[int] = ..., fingerprint: _Optional[str] = ...) -> None: ...

class ApprovalQuestion(_message.Message):
    __slots__ = ("question_id", "tool", "arguments_json")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    tool: str
    arguments_json: str
    def __init__(self, question_id: _Optional[str] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[str] = ...) -> None: ...

class ApprovalAnswer(_message.Message):
    __slots__ = ("question_id", "required", "error")
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    REQUIRED_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    question_id: str
    required: bool
    error: str
    def __init__(self, question_id: _Optional[str] = ..., required: _Optional[bool] = ..., error: _Optional[str] = ...) -> None: ...

class RunDispatch(_message.Message):
    __slots__ = ("dispatch_id", "attempt", "run_id", "agent", "input_json", "traceparent")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: str
    attempt: int
    run_id: str
    agent: str
    input_json: str
    traceparent: str
    def __init__(self, dispatch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., run_id: _Optional[str] = ..., agent: _Optional[str] = ..., input_json: _Optional[str] = ..., traceparent: _Optional[str] = ...) -> None: ...

class Welcome(_message.Message):
    __slots__ = ("session_id", "heartbeat_interval_ms", "lease_ttl_ms")
    SESSION_ID_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    LEASE_TTL_MS_FIELD_NUMBER: _ClassVar[int]
    session_id: str
    heartbeat_interval_ms: int
    lease_ttl_ms: int
    def __init__(self, session_id: _Optional[str] = ..., heartbeat_interval_ms: _Optional[int] = ..., lease_ttl_ms: _Optional[int] = ...) -> None: ...

class Heartbeat(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Drain(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class Dispatch(_message.Message):
    __slots__ = ("dispatch_id", "attempt", "run_id", "step_key", "call_id", "turn", "position", "tool", "arguments_json", "idempotency_key", "timeout_ms", "traceparent")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    POSITION_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TRACEPARENT_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: str
    attempt: int
    run_id: str
    step_key: str
    call_id: str
    turn: int
    position: int
    tool: str
    arguments_json: str
    idempotency_key: str
    timeout_ms: int
    traceparent: str
    def __init__(self, dispatch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., run_id: _Optional[str] = ..., step_key: _Optional[str] = ..., call_id: _Optional[str] = ..., turn: _Optional[int] = ..., position: _Optional[int] = ..., tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., idempotency_key: _Optional[str] = ..., timeout_ms: _Optional[int] = ..., traceparent: _Optional[str] = ...) -> None: ...

class CancelDispatch(_message.Message):
    __slots__ = ("dispatch_id", "attempt", "reason")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: str
    attempt: int
    reason: str
    def __init__(self, dispatch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., reason: _Optional[str] = ...) -> None: ...

class DispatchProgress(_message.Message):
    __slots__ = ("dispatch_id", "attempt", "message", "data_json", "current", "total")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    DATA_JSON_FIELD_NUMBER: _ClassVar[int]
    CURRENT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: str
    attempt: int
    message: str
    data_json: str
    current: int
    total: int
    def __init__(self, dispatch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., message: _Optional[str] = ..., data_json: _Optional[str] = ..., current: _Optional[int] = ..., total: _Optional[int] = ...) -> None: ...

class ToolFailure(_message.Message):
    __slots__ = ("message", "kind")
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    message: str
    kind: _common_pb2.ErrorKind
    def __init__(self, message: _Optional[str] = ..., kind: _Optional[_Union[_common_pb2.ErrorKind, str]] = ...) -> None: ...

class DispatchResult(_message.Message):
    __slots__ = ("dispatch_id", "attempt", "output_json", "error", "suspended")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    SUSPENDED_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: str
    attempt: int
    output_json: str
    error: ToolFailure
    suspended: DispatchSuspended
    def __init__(self, dispatch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., output_json: _Optional[str] = ..., error: _Optional[_Union[ToolFailure, _Mapping]] = ..., suspended: _Optional[_Union[DispatchSuspended, _Mapping]] = ...) -> None: ...

class DispatchSuspended(_message.Message):
    __slots__ = ("waiting_on",)
    WAITING_ON_FIELD_NUMBER: _ClassVar[int]
    waiting_on: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, waiting_on: _Optional[_Iterable[str]] = ...) -> None: ...

class ResultAck(_message.Message):
    __slots__ = ("dispatch_id", "attempt", "accepted", "reason", "still_held")
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    STILL_HELD_FIELD_NUMBER: _ClassVar[int]
    dispatch_id: str
    attempt: int
    accepted: bool
    reason: str
    still_held: bool
    def __init__(self, dispatch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., accepted: _Optional[bool] = ..., reason: _Optional[str] = ..., still_held: _Optional[bool] = ...) -> None: ...

class CacheRequest(_message.Message):
    __slots__ = ("request_id", "dispatch_id", "attempt", "get", "set")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    GET_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    dispatch_id: str
    attempt: int
    get: CacheGet
    set: CacheSet
    def __init__(self, request_id: _Optional[int] = ..., dispatch_id: _Optional[str] = ..., attempt: _Optional[int] = ..., get: _Optional[_Union[CacheGet, _Mapping]] = ..., set: _Optional[_Union[CacheSet, _Mapping]] = ...) -> None: ...

class CacheGet(_message.Message):
    __slots__ = ("key",)
    KEY_FIELD_NUMBER: _ClassVar[int]
    key: str
    def __init__(self, key: _Optional[str] = ...) -> None: ...

class CacheSet(_message.Message):
    __slots__ = ("key", "value_json", "ttl_ms")
    KEY_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    TTL_MS_FIELD_NUMBER: _ClassVar[int]
    key: str
    value_json: str
    ttl_ms: int
    def __init__(self, key: _Optional[str] = ..., value_json: _Optional[str] = ..., ttl_ms: _Optional[int] = ...) -> None: ...

class CacheResponse(_message.Message):
    __slots__ = ("request_id", "found", "value_json", "error")
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    FOUND_FIELD_NUMBER: _ClassVar[int]
    VALUE_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    request_id: int
    found: bool
    value_json: str
    error: str
    def __init__(self, request_id: _Optional[int] = ..., found: _Optional[bool] = ..., value_json: _Optional[str] = ..., error: _Optional[str] = ...) -> None: ...
