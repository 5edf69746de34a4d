from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListApprovalsRequest(_message.Message):
    __slots__ = ("status", "run_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.ApprovalStatus
    run_id: str
    def __init__(self, status: _Optional[_Union[_common_pb2.ApprovalStatus, str]] = ..., run_id: _Optional[str] = ...) -> None: ...

class ListApprovalsResponse(_message.Message):
    __slots__ = ("approvals",)
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    approvals: _containers.RepeatedCompositeFieldContainer[_common_pb2.Approval]
    def __init__(self, approvals: _Optional[_Iterable[_Union[_common_pb2.Approval, _Mapping]]] = ...) -> None: ...

class ApproveCallRequest(_message.Message):
    __slots__ = ("approval_id", "decider", "reason", "answer_json")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    ANSWER_JSON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    decider: str
    reason: str
    answer_json: str
    def __init__(self, approval_id: _Optional[str] = ..., decider: _Optional[str] = ..., reason: _Optional[str] = ..., answer_json: _Optional[str] = ...) -> None: ...

class ApproveCallResponse(_message.Message):
    __slots__ = ("approval",)
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    approval: _common_pb2.Approval
    def __init__(self, approval: _Optional[_Union[_common_pb2.Approval, _Mapping]] = ...) -> None: ...

class RejectCallRequest(_message.Message):
    __slots__ = ("approval_id", "decider", "reason")
    APPROVAL_ID_FIELD_NUMBER: _ClassVar[int]
    DECIDER_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    approval_id: str
    decider: str
    reason: str
    def __init__(self, approval_id: _Optional[str] = ..., decider: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class RejectCallResponse(_message.Message):
    __slots__ = ("approval",)
    APPROVAL_FIELD_NUMBER: _ClassVar[int]
    approval: _common_pb2.Approval
    def __init__(self, approval: _Optional[_Union[_common_pb2.Approval, _Mapping]] = ...) -> None: ...
