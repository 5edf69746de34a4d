from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CallStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    CALL_STATUS_UNSPECIFIED: _ClassVar[CallStatus]
    CALL_STATUS_OK: _ClassVar[CallStatus]
    CALL_STATUS_ERROR: _ClassVar[CallStatus]
    CALL_STATUS_CANCELLED: _ClassVar[CallStatus]
CALL_STATUS_UNSPECIFIED: CallStatus
CALL_STATUS_OK: CallStatus
CALL_STATUS_ERROR: CallStatus
CALL_STATUS_CANCELLED: CallStatus

class AgentAskRequest(_message.Message):
    __slots__ = ("run_id", "question_id", "question", "answer_schema_json", "choices", "default_answer_json", "approvers", "timeout_ms")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_ID_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ANSWER_JSON_FIELD_NUMBER: _ClassVar[int]
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    question_id: str
    question: str
    answer_schema_json: str
    choices: _containers.RepeatedScalarFieldContainer[str]
    default_answer_json: str
    approvers: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    def __init__(self, run_id: _Optional[str] = ..., question_id: _Optional[str] = ..., question: _Optional[str] = ..., answer_schema_json: _Optional[str] = ..., choices: _Optional[_Iterable[str]] = ..., default_answer_json: _Optional[str] = ..., approvers: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class AgentAskResponse(_message.Message):
    __slots__ = ("step", "replayed")
    STEP_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    step: _common_pb2.Step
    replayed: bool
    def __init__(self, step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., replayed: _Optional[bool] = ...) -> None: ...

class CancelCallRequest(_message.Message):
    __slots__ = ("run_id", "step_key", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    step_key: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., step_key: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelCallResponse(_message.Message):
    __slots__ = ("step",)
    STEP_FIELD_NUMBER: _ClassVar[int]
    step: _common_pb2.Step
    def __init__(self, step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ...) -> None: ...

class ToolCall(_message.Message):
    __slots__ = ("tool", "arguments_json", "call_id", "timeout_ms")
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    CALL_ID_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    tool: str
    arguments_json: str
    call_id: str
    timeout_ms: int
    def __init__(self, tool: _Optional[str] = ..., arguments_json: _Optional[str] = ..., call_id: _Optional[str] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class SubmitTurnRequest(_message.Message):
    __slots__ = ("run_id", "turn", "calls", "offered_tools", "max_concurrency")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    CALLS_FIELD_NUMBER: _ClassVar[int]
    OFFERED_TOOLS_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    turn: int
    calls: _containers.RepeatedCompositeFieldContainer[ToolCall]
    offered_tools: _containers.RepeatedScalarFieldContainer[str]
    max_concurrency: int
    def __init__(self, run_id: _Optional[str] = ..., turn: _Optional[int] = ..., calls: _Optional[_Iterable[_Union[ToolCall, _Mapping]]] = ..., offered_tools: _Optional[_Iterable[str]] = ..., max_concurrency: _Optional[int] = ...) -> None: ...

class CallResult(_message.Message):
    __slots__ = ("position", "step_key", "tool", "status", "content", "output_json", "error_kind", "replayed", "attempts", "outcome", "decided_by", "approval")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    CONTENT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_KIND_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    ATTEMPTS_FIELD_NUMBER: _ClassVar[int]
    OUTCOME_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    position: int
    step_key: str
    tool: str
    status: CallStatus
    content: str
    output_json: str
    error_kind: _common_pb2.ErrorKind
    replayed: bool
    attempts: int
    outcome: _common_pb2.CallOutcome
    decided_by: str
    approval: _common_pb2.ApprovalDecision
    def __init__(self, position: _Optional[int] = ..., step_key: _Optional[str] = ..., tool: _Optional[str] = ..., status: _Optional[_Union[CallStatus, str]] = ..., content: _Optional[str] = ..., output_json: _Optional[str] = ..., error_kind: _Optional[_Union[_common_pb2.ErrorKind, str]] = ..., replayed: _Optional[bool] = ..., attempts: _Optional[int] = ..., outcome: _Optional[_Union[_common_pb2.CallOutcome, str]] = ..., decided_by: _Optional[str] = ..., approval: _Optional[_Union[_common_pb2.ApprovalDecision, _Mapping]] = ...) -> None: ...

class Interruption(_message.Message):
    __slots__ = ("position", "step_key", "tool", "reason", "approval_id", "arguments_json", "message")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    ARGUMENTS_JSON_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    position: int
    step_key: str
    tool: str
    reason: str
    approval_id: str
    arguments_json: str
    message: str
    def __init__(self, position: _Optional[int] = ..., step_key: _Optional[str] = ..., tool: _Optional[str] = ..., reason: _Optional[str] = ..., approval_id: _Optional[str] = ..., arguments_json: _Optional[str] = ..., message: _Optional[str] = ...) -> None: ...

class CallTurnRequest(_message.Message):
    __slots__ = ("turn",)
    TURN_FIELD_NUMBER: _ClassVar[int]
    turn: SubmitTurnRequest
    def __init__(self, turn: _Optional[_Union[SubmitTurnRequest, _Mapping]] = ...) -> None: ...

class CallTurnResponse(_message.Message):
    __slots__ = ("results", "progress", "interruptions")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTIONS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[CallResult]
    progress: _containers.RepeatedCompositeFieldContainer[_common_pb2.Progress]
    interruptions: _containers.RepeatedCompositeFieldContainer[Interruption]
    def __init__(self, results: _Optional[_Iterable[_Union[CallResult, _Mapping]]] = ..., progress: _Optional[_Iterable[_Union[_common_pb2.Progress, _Mapping]]] = ..., interruptions: _Optional[_Iterable[_Union[Interruption, _Mapping]]] = ...) -> None: ...

class SubmitTurnResponse(_message.Message):
    __slots__ = ("result", "progress", "interrupted")
    RESULT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    INTERRUPTED_FIELD_NUMBER: _ClassVar[int]
    result: CallResult
    progress: _common_pb2.Progress
    interrupted: Interruption
    def __init__(self, result: _Optional[_Union[CallResult, _Mapping]] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ..., interrupted: _Optional[_Union[Interruption, _Mapping]] = ...) -> None: ...
