from . import common_pb2 as _common_pb2
from . import tool_calls_pb2 as _tool_calls_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class CallToolRequest(_message.Message):
    __slots__ = ("dispatch", "occurrence", "call")
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    CALL_FIELD_NUMBER: _ClassVar[int]
    dispatch: HostedDispatch
    occurrence: int
    call: _tool_calls_pb2.ToolCall
    def __init__(self, dispatch: _Optional[_Union[HostedDispatch, _Mapping]] = ..., occurrence: _Optional[int] = ..., call: _Optional[_Union[_tool_calls_pb2.ToolCall, _Mapping]] = ...) -> None: ...

class CallToolResponse(_message.Message):
    __slots__ = ("step", "result")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    step: _common_pb2.Step
    result: _tool_calls_pb2.CallResult
    def __init__(self, step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., result: _Optional[_Union[_tool_calls_pb2.CallResult, _Mapping]] = ...) -> None: ...

class AskPersonRequest(_message.Message):
    __slots__ = ("dispatch", "occurrence", "question", "answer_schema_json", "approvers", "timeout_ms", "seq", "choices", "default_answer_json")
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    QUESTION_FIELD_NUMBER: _ClassVar[int]
    ANSWER_SCHEMA_JSON_FIELD_NUMBER: _ClassVar[int]
    APPROVERS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    CHOICES_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_ANSWER_JSON_FIELD_NUMBER: _ClassVar[int]
    dispatch: HostedDispatch
    occurrence: int
    question: str
    answer_schema_json: str
    approvers: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    seq: int
    choices: _containers.RepeatedScalarFieldContainer[str]
    default_answer_json: str
    def __init__(self, dispatch: _Optional[_Union[HostedDispatch, _Mapping]] = ..., occurrence: _Optional[int] = ..., question: _Optional[str] = ..., answer_schema_json: _Optional[str] = ..., approvers: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ..., seq: _Optional[int] = ..., choices: _Optional[_Iterable[str]] = ..., default_answer_json: _Optional[str] = ...) -> None: ...

class AskPersonResponse(_message.Message):
    __slots__ = ("step", "replayed", "diverged")
    STEP_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    DIVERGED_FIELD_NUMBER: _ClassVar[int]
    step: _common_pb2.Step
    replayed: bool
    diverged: str
    def __init__(self, step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., replayed: _Optional[bool] = ..., diverged: _Optional[str] = ...) -> None: ...

class CheckStepRequest(_message.Message):
    __slots__ = ("dispatch", "seq", "step_id", "occurrence", "effect", "once")
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    ONCE_FIELD_NUMBER: _ClassVar[int]
    dispatch: HostedDispatch
    seq: int
    step_id: str
    occurrence: int
    effect: str
    once: bool
    def __init__(self, dispatch: _Optional[_Union[HostedDispatch, _Mapping]] = ..., seq: _Optional[int] = ..., step_id: _Optional[str] = ..., occurrence: _Optional[int] = ..., effect: _Optional[str] = ..., once: _Optional[bool] = ...) -> None: ...

class CheckStepResponse(_message.Message):
    __slots__ = ("allowed", "decided_by", "step", "diverged")
    ALLOWED_FIELD_NUMBER: _ClassVar[int]
    DECIDED_BY_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    DIVERGED_FIELD_NUMBER: _ClassVar[int]
    allowed: bool
    decided_by: str
    step: _common_pb2.Step
    diverged: str
    def __init__(self, allowed: _Optional[bool] = ..., decided_by: _Optional[str] = ..., step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., diverged: _Optional[str] = ...) -> None: ...

class RunContext(_message.Message):
    __slots__ = ("parent_run_id", "session_key", "previous_run_id", "previous_output_json", "check_steps")
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    CHECK_STEPS_FIELD_NUMBER: _ClassVar[int]
    parent_run_id: str
    session_key: str
    previous_run_id: str
    previous_output_json: str
    check_steps: bool
    def __init__(self, parent_run_id: _Optional[str] = ..., session_key: _Optional[str] = ..., previous_run_id: _Optional[str] = ..., previous_output_json: _Optional[str] = ..., check_steps: _Optional[bool] = ...) -> None: ...

class StartSubagentRequest(_message.Message):
    __slots__ = ("dispatch", "seq", "agent", "input_json", "session_key", "occurrence")
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    SESSION_KEY_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    dispatch: HostedDispatch
    seq: int
    agent: str
    input_json: str
    session_key: str
    occurrence: int
    def __init__(self, dispatch: _Optional[_Union[HostedDispatch, _Mapping]] = ..., seq: _Optional[int] = ..., agent: _Optional[str] = ..., input_json: _Optional[str] = ..., session_key: _Optional[str] = ..., occurrence: _Optional[int] = ...) -> None: ...

class StartSubagentResponse(_message.Message):
    __slots__ = ("step", "replayed", "diverged")
    STEP_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    DIVERGED_FIELD_NUMBER: _ClassVar[int]
    step: _common_pb2.Step
    replayed: bool
    diverged: str
    def __init__(self, step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., replayed: _Optional[bool] = ..., diverged: _Optional[str] = ...) -> None: ...

class AwaitStepRequest(_message.Message):
    __slots__ = ("dispatch", "step_key")
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    dispatch: HostedDispatch
    step_key: str
    def __init__(self, dispatch: _Optional[_Union[HostedDispatch, _Mapping]] = ..., step_key: _Optional[str] = ...) -> None: ...

class AwaitStepResponse(_message.Message):
    __slots__ = ("step", "result")
    STEP_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    step: _common_pb2.Step
    result: _tool_calls_pb2.CallResult
    def __init__(self, step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., result: _Optional[_Union[_tool_calls_pb2.CallResult, _Mapping]] = ...) -> None: ...

class HostedDispatch(_message.Message):
    __slots__ = ("run_id", "dispatch_id", "attempt")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    DISPATCH_ID_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    dispatch_id: str
    attempt: int
    def __init__(self, run_id: _Optional[str] = ..., dispatch_id: _Optional[str] = ..., attempt: _Optional[int] = ...) -> None: ...

class LoadHistoryRequest(_message.Message):
    __slots__ = ("dispatch",)
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    dispatch: HostedDispatch
    def __init__(self, dispatch: _Optional[_Union[HostedDispatch, _Mapping]] = ...) -> None: ...

class LoadHistoryResponse(_message.Message):
    __slots__ = ("step", "tool_changed", "result", "context")
    STEP_FIELD_NUMBER: _ClassVar[int]
    TOOL_CHANGED_FIELD_NUMBER: _ClassVar[int]
    RESULT_FIELD_NUMBER: _ClassVar[int]
    CONTEXT_FIELD_NUMBER: _ClassVar[int]
    step: _common_pb2.Step
    tool_changed: bool
    result: _tool_calls_pb2.CallResult
    context: RunContext
    def __init__(self, step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., tool_changed: _Optional[bool] = ..., result: _Optional[_Union[_tool_calls_pb2.CallResult, _Mapping]] = ..., context: _Optional[_Union[RunContext, _Mapping]] = ...) -> None: ...

class CallToolsRequest(_message.Message):
    __slots__ = ("dispatch", "turn")
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    TURN_FIELD_NUMBER: _ClassVar[int]
    dispatch: HostedDispatch
    turn: _tool_calls_pb2.SubmitTurnRequest
    def __init__(self, dispatch: _Optional[_Union[HostedDispatch, _Mapping]] = ..., turn: _Optional[_Union[_tool_calls_pb2.SubmitTurnRequest, _Mapping]] = ...) -> None: ...

class CallToolsResponse(_message.Message):
    __slots__ = ("item",)
    ITEM_FIELD_NUMBER: _ClassVar[int]
    item: _tool_calls_pb2.SubmitTurnResponse
    def __init__(self, item: _Optional[_Union[_tool_calls_pb2.SubmitTurnResponse, _Mapping]] = ...) -> None: ...

class StepFailure(_message.Message):
    __slots__ = ("message",)
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    message: str
    def __init__(self, message: _Optional[str] = ...) -> None: ...

class RecordStepRequest(_message.Message):
    __slots__ = ("dispatch", "seq", "step_id", "occurrence", "effect", "output_json", "error", "once")
    DISPATCH_FIELD_NUMBER: _ClassVar[int]
    SEQ_FIELD_NUMBER: _ClassVar[int]
    STEP_ID_FIELD_NUMBER: _ClassVar[int]
    OCCURRENCE_FIELD_NUMBER: _ClassVar[int]
    EFFECT_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    ERROR_FIELD_NUMBER: _ClassVar[int]
    ONCE_FIELD_NUMBER: _ClassVar[int]
    dispatch: HostedDispatch
    seq: int
    step_id: str
    occurrence: int
    effect: str
    output_json: str
    error: StepFailure
    once: bool
    def __init__(self, dispatch: _Optional[_Union[HostedDispatch, _Mapping]] = ..., seq: _Optional[int] = ..., step_id: _Optional[str] = ..., occurrence: _Optional[int] = ..., effect: _Optional[str] = ..., output_json: _Optional[str] = ..., error: _Optional[_Union[StepFailure, _Mapping]] = ..., once: _Optional[bool] = ...) -> None: ...

class RecordStepResponse(_message.Message):
    __slots__ = ("step", "replayed", "diverged")
    STEP_FIELD_NUMBER: _ClassVar[int]
    REPLAYED_FIELD_NUMBER: _ClassVar[int]
    DIVERGED_FIELD_NUMBER: _ClassVar[int]
    step: _common_pb2.Step
    replayed: bool
    diverged: str
    def __init__(self, step: _Optional[_Union[_common_pb2.Step, _Mapping]] = ..., replayed: _Optional[bool] = ..., diverged: _Optional[str] = ...) -> None: ...
