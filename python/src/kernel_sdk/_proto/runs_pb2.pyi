import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListReceiptsRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListReceiptsResponse(_message.Message):
    __slots__ = ("receipts_json", "key")
    RECEIPTS_JSON_FIELD_NUMBER: _ClassVar[int]
    KEY_FIELD_NUMBER: _ClassVar[int]
    receipts_json: _containers.RepeatedScalarFieldContainer[str]
    key: str
    def __init__(self, receipts_json: _Optional[_Iterable[str]] = ..., key: _Optional[str] = ...) -> None: ...

class CreateRunRequest(_message.Message):
    __slots__ = ("agent", "input_json", "labels", "idempotency_key", "max_tool_calls", "non_interactive", "permissions", "capture", "max_concurrency", "hosted", "allow", "budget")
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    AGENT_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    MAX_TOOL_CALLS_FIELD_NUMBER: _ClassVar[int]
    NON_INTERACTIVE_FIELD_NUMBER: _ClassVar[int]
    PERMISSIONS_FIELD_NUMBER: _ClassVar[int]
    CAPTURE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONCURRENCY_FIELD_NUMBER: _ClassVar[int]
    HOSTED_FIELD_NUMBER: _ClassVar[int]
    ALLOW_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    agent: str
    input_json: str
    labels: _containers.ScalarMap[str, str]
    idempotency_key: str
    max_tool_calls: int
    non_interactive: bool
    permissions: _containers.RepeatedScalarFieldContainer[str]
    capture: _common_pb2.Capture
    max_concurrency: int
    hosted: bool
    allow: _containers.RepeatedScalarFieldContainer[str]
    budget: _containers.RepeatedCompositeFieldContainer[_common_pb2.BudgetLimit]
    def __init__(self, agent: _Optional[str] = ..., input_json: _Optional[str] = ..., labels: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., max_tool_calls: _Optional[int] = ..., non_interactive: _Optional[bool] = ..., permissions: _Optional[_Iterable[str]] = ..., capture: _Optional[_Union[_common_pb2.Capture, str]] = ..., max_concurrency: _Optional[int] = ..., hosted: _Optional[bool] = ..., allow: _Optional[_Iterable[str]] = ..., budget: _Optional[_Iterable[_Union[_common_pb2.BudgetLimit, _Mapping]]] = ...) -> None: ...

class ForkRunRequest(_message.Message):
    __slots__ = ("run_id", "at_step_key", "input_json", "set_results", "labels", "idempotency_key", "budget")
    class SetResultsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class LabelsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    AT_STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    INPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    SET_RESULTS_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    BUDGET_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    at_step_key: str
    input_json: str
    set_results: _containers.ScalarMap[str, str]
    labels: _containers.ScalarMap[str, str]
    idempotency_key: str
    budget: _containers.RepeatedCompositeFieldContainer[_common_pb2.BudgetLimit]
    def __init__(self, run_id: _Optional[str] = ..., at_step_key: _Optional[str] = ..., input_json: _Optional[str] = ..., set_results: _Optional[_Mapping[str, str]] = ..., labels: _Optional[_Mapping[str, str]] = ..., idempotency_key: _Optional[str] = ..., budget: _Optional[_Iterable[_Union[_common_pb2.BudgetLimit, _Mapping]]] = ...) -> None: ...

class ForkRunResponse(_message.Message):
    __slots__ = ("run", "created")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    created: bool
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class CreateRunResponse(_message.Message):
    __slots__ = ("run", "created")
    RUN_FIELD_NUMBER: _ClassVar[int]
    CREATED_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    created: bool
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., created: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class GetRunResponse(_message.Message):
    __slots__ = ("run", "steps", "manifest", "approvals")
    RUN_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    MANIFEST_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    steps: _containers.RepeatedCompositeFieldContainer[_common_pb2.Step]
    manifest: _common_pb2.RunManifest
    approvals: _containers.RepeatedCompositeFieldContainer[_common_pb2.Approval]
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ..., steps: _Optional[_Iterable[_Union[_common_pb2.Step, _Mapping]]] = ..., manifest: _Optional[_Union[_common_pb2.RunManifest, _Mapping]] = ..., approvals: _Optional[_Iterable[_Union[_common_pb2.Approval, _Mapping]]] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("status", "agent", "labels", "page_size", "page_token", "parent_run_id", "tool", "created_after", "created_before", "forked_from_run_id")
    STATUS_FIELD_NUMBER: _ClassVar[int]
    AGENT_FIELD_NUMBER: _ClassVar[int]
    LABELS_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    PARENT_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    CREATED_AFTER_FIELD_NUMBER: _ClassVar[int]
    CREATED_BEFORE_FIELD_NUMBER: _ClassVar[int]
    FORKED_FROM_RUN_ID_FIELD_NUMBER: _ClassVar[int]
    status: _common_pb2.RunStatus
    agent: str
    labels: _containers.RepeatedScalarFieldContainer[str]
    page_size: int
    page_token: str
    parent_run_id: str
    tool: str
    created_after: _timestamp_pb2.Timestamp
    created_before: _timestamp_pb2.Timestamp
    forked_from_run_id: str
    def __init__(self, status: _Optional[_Union[_common_pb2.RunStatus, str]] = ..., agent: _Optional[str] = ..., labels: _Optional[_Iterable[str]] = ..., page_size: _Optional[int] = ..., page_token: _Optional[str] = ..., parent_run_id: _Optional[str] = ..., tool: _Optional[str] = ..., created_after: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., created_before: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., forked_from_run_id: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[_common_pb2.Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[_common_pb2.Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class CancelRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class CancelRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class CompleteRunRequest(_message.Message):
    __slots__ = ("run_id", "output_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    OUTPUT_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    output_json: str
    def __init__(self, run_id: _Optional[str] = ..., output_json: _Optional[str] = ...) -> None: ...

class CompleteRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class FailRunRequest(_message.Message):
    __slots__ = ("run_id", "reason")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    reason: str
    def __init__(self, run_id: _Optional[str] = ..., reason: _Optional[str] = ...) -> None: ...

class FailRunResponse(_message.Message):
    __slots__ = ("run",)
    RUN_FIELD_NUMBER: _ClassVar[int]
    run: _common_pb2.Run
    def __init__(self, run: _Optional[_Union[_common_pb2.Run, _Mapping]] = ...) -> None: ...

class ListRunEventsRequest(_message.Message):
    __slots__ = ("run_id", "from_seq", "page_size")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_seq: int
    page_size: int
    def __init__(self, run_id: _Optional[str] = ..., from_seq: _Optional[int] = ..., page_size: _Optional[int] = ...) -> None: ...

class ListRunEventsResponse(_message.Message):
    __slots__ = ("events", "next_seq")
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_SEQ_FIELD_NUMBER: _ClassVar[int]
    events: _containers.RepeatedCompositeFieldContainer[_common_pb2.Event]
    next_seq: int
    def __init__(self, events: _Optional[_Iterable[_Union[_common_pb2.Event, _Mapping]]] = ..., next_seq: _Optional[int] = ...) -> None: ...

class WatchRunEventsRequest(_message.Message):
    __slots__ = ("run_id", "from_seq", "include_progress")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    FROM_SEQ_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_PROGRESS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    from_seq: int
    include_progress: bool
    def __init__(self, run_id: _Optional[str] = ..., from_seq: _Optional[int] = ..., include_progress: _Optional[bool] = ...) -> None: ...

class WatchRunEventsResponse(_message.Message):
    __slots__ = ("event", "progress")
    EVENT_FIELD_NUMBER: _ClassVar[int]
    PROGRESS_FIELD_NUMBER: _ClassVar[int]
    event: _common_pb2.Event
    progress: _common_pb2.Progress
    def __init__(self, event: _Optional[_Union[_common_pb2.Event, _Mapping]] = ..., progress: _Optional[_Union[_common_pb2.Progress, _Mapping]] = ...) -> None: ...
