import datetime

from google.protobuf import timestamp_pb2 as _timestamp_pb2
from . import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ListReplicasRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListReplicasResponse(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedCompositeFieldContainer[Replica]
    def __init__(self, replicas: _Optional[_Iterable[_Union[Replica, _Mapping]]] = ...) -> None: ...

class Replica(_message.Message):
    __slots__ = ("id", "address", "started_at", "heartbeat_at", "alive", "shards", "worker_sessions", "answering")
    ID_FIELD_NUMBER: _ClassVar[int]
    ADDRESS_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_AT_FIELD_NUMBER: _ClassVar[int]
    ALIVE_FIELD_NUMBER: _ClassVar[int]
    SHARDS_FIELD_NUMBER: _ClassVar[int]
    WORKER_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    ANSWERING_FIELD_NUMBER: _ClassVar[int]
    id: str
    address: str
    started_at: _timestamp_pb2.Timestamp
    heartbeat_at: _timestamp_pb2.Timestamp
    alive: bool
    shards: int
    worker_sessions: int
    answering: bool
    def __init__(self, id: _Optional[str] = ..., address: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., heartbeat_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., alive: _Optional[bool] = ..., shards: _Optional[int] = ..., worker_sessions: _Optional[int] = ..., answering: _Optional[bool] = ...) -> None: ...

class RunDeletion(_message.Message):
    __slots__ = ("runs", "events", "steps", "approvals", "cache_entries")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    EVENTS_FIELD_NUMBER: _ClassVar[int]
    STEPS_FIELD_NUMBER: _ClassVar[int]
    APPROVALS_FIELD_NUMBER: _ClassVar[int]
    CACHE_ENTRIES_FIELD_NUMBER: _ClassVar[int]
    runs: int
    events: int
    steps: int
    approvals: int
    cache_entries: int
    def __init__(self, runs: _Optional[int] = ..., events: _Optional[int] = ..., steps: _Optional[int] = ..., approvals: _Optional[int] = ..., cache_entries: _Optional[int] = ...) -> None: ...

class DeleteRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class DeleteRunResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: RunDeletion
    def __init__(self, deleted: _Optional[_Union[RunDeletion, _Mapping]] = ...) -> None: ...

class PruneRunsRequest(_message.Message):
    __slots__ = ("min_age_ms",)
    MIN_AGE_MS_FIELD_NUMBER: _ClassVar[int]
    min_age_ms: int
    def __init__(self, min_age_ms: _Optional[int] = ...) -> None: ...

class PruneRunsResponse(_message.Message):
    __slots__ = ("deleted",)
    DELETED_FIELD_NUMBER: _ClassVar[int]
    deleted: RunDeletion
    def __init__(self, deleted: _Optional[_Union[RunDeletion, _Mapping]] = ...) -> None: ...

class ForgetToolRequest(_message.Message):
    __slots__ = ("name",)
    NAME_FIELD_NUMBER: _ClassVar[int]
    name: str
    def __init__(self, name: _Optional[str] = ...) -> None: ...

class ForgetToolResponse(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: _common_pb2.ToolSpec
    def __init__(self, spec: _Optional[_Union[_common_pb2.ToolSpec, _Mapping]] = ...) -> None: ...

class ReloadPolicyRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ReloadPolicyResponse(_message.Message):
    __slots__ = ("path", "rules")
    PATH_FIELD_NUMBER: _ClassVar[int]
    RULES_FIELD_NUMBER: _ClassVar[int]
    path: str
    rules: int
    def __init__(self, path: _Optional[str] = ..., rules: _Optional[int] = ...) -> None: ...

class GetStatusRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetStatusResponse(_message.Message):
    __slots__ = ("version", "started_at", "worker_sessions", "queued_calls", "leased_calls", "live_runs", "resident_bytes", "allocated_bytes", "in_flight_scans", "lost_calls_found", "resource_locks", "cpu_micros", "store_commits", "store_syncs", "store_statements", "disk_write_bytes", "log_lines_dropped", "writes_forwarded", "writes_applied_for_others", "tool_limits", "fair_shares")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    WORKER_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_CALLS_FIELD_NUMBER: _ClassVar[int]
    LEASED_CALLS_FIELD_NUMBER: _ClassVar[int]
    LIVE_RUNS_FIELD_NUMBER: _ClassVar[int]
    RESIDENT_BYTES_FIELD_NUMBER: _ClassVar[int]
    ALLOCATED_BYTES_FIELD_NUMBER: _ClassVar[int]
    IN_FLIGHT_SCANS_FIELD_NUMBER: _ClassVar[int]
    LOST_CALLS_FOUND_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_LOCKS_FIELD_NUMBER: _ClassVar[int]
    CPU_MICROS_FIELD_NUMBER: _ClassVar[int]
    STORE_COMMITS_FIELD_NUMBER: _ClassVar[int]
    STORE_SYNCS_FIELD_NUMBER: _ClassVar[int]
    STORE_STATEMENTS_FIELD_NUMBER: _ClassVar[int]
    DISK_WRITE_BYTES_FIELD_NUMBER: _ClassVar[int]
    LOG_LINES_DROPPED_FIELD_NUMBER: _ClassVar[int]
    WRITES_FORWARDED_FIELD_NUMBER: _ClassVar[int]
    WRITES_APPLIED_FOR_OTHERS_FIELD_NUMBER: _ClassVar[int]
    TOOL_LIMITS_FIELD_NUMBER: _ClassVar[int]
    FAIR_SHARES_FIELD_NUMBER: _ClassVar[int]
    version: str
    started_at: _timestamp_pb2.Timestamp
    worker_sessions: int
    queued_calls: int
    leased_calls: int
    live_runs: int
    resident_bytes: int
    allocated_bytes: int
    in_flight_scans: int
    lost_calls_found: int
    resource_locks: _containers.RepeatedCompositeFieldContainer[ResourceLock]
    cpu_micros: int
    store_commits: int
    store_syncs: int
    store_statements: int
    disk_write_bytes: int
    log_lines_dropped: int
    writes_forwarded: int
    writes_applied_for_others: int
    tool_limits: _containers.RepeatedCompositeFieldContainer[ToolLimitStatus]
    fair_shares: FairShareStatus
    def __init__(self, version: _Optional[str] = ..., started_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., worker_sessions: _Optional[int] = ..., queued_calls: _Optional[int] = ..., leased_calls: _Optional[int] = ..., live_runs: _Optional[int] = ..., resident_bytes: _Optional[int] = ..., allocated_bytes: _Optional[int] = ..., in_flight_scans: _Optional[int] = ..., lost_calls_found: _Optional[int] = ..., resource_locks: _Optional[_Iterable[_Union[ResourceLock, _Mapping]]] = ..., cpu_micros: _Optional[int] = ..., store_commits: _Optional[int] = ..., store_syncs: _Optional[int] = ..., store_statements: _Optional[int] = ..., disk_write_bytes: _Optional[int] = ..., log_lines_dropped: _Optional[int] = ..., writes_forwarded: _Optional[int] = ..., writes_applied_for_others: _Optional[int] = ..., tool_limits: _Optional[_Iterable[_Union[ToolLimitStatus, _Mapping]]] = ..., fair_shares: _Optional[_Union[FairShareStatus, _Mapping]] = ...) -> None: ...

class FairShareStatus(_message.Message):
    __slots__ = ("label", "shares")
    LABEL_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    label: str
    shares: _containers.RepeatedCompositeFieldContainer[ShareStatus]
    def __init__(self, label: _Optional[str] = ..., shares: _Optional[_Iterable[_Union[ShareStatus, _Mapping]]] = ...) -> None: ...

class ShareStatus(_message.Message):
    __slots__ = ("value", "weight", "queued")
    VALUE_FIELD_NUMBER: _ClassVar[int]
    WEIGHT_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    value: str
    weight: int
    queued: int
    def __init__(self, value: _Optional[str] = ..., weight: _Optional[int] = ..., queued: _Optional[int] = ...) -> None: ...

class ToolLimitStatus(_message.Message):
    __slots__ = ("tools", "per_second", "burst", "at_once", "running", "tokens", "queued")
    TOOLS_FIELD_NUMBER: _ClassVar[int]
    PER_SECOND_FIELD_NUMBER: _ClassVar[int]
    BURST_FIELD_NUMBER: _ClassVar[int]
    AT_ONCE_FIELD_NUMBER: _ClassVar[int]
    RUNNING_FIELD_NUMBER: _ClassVar[int]
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    QUEUED_FIELD_NUMBER: _ClassVar[int]
    tools: str
    per_second: float
    burst: float
    at_once: int
    running: int
    tokens: float
    queued: int
    def __init__(self, tools: _Optional[str] = ..., per_second: _Optional[float] = ..., burst: _Optional[float] = ..., at_once: _Optional[int] = ..., running: _Optional[int] = ..., tokens: _Optional[float] = ..., queued: _Optional[int] = ...) -> None: ...

class ResourceLock(_message.Message):
    __slots__ = ("resource", "run_id", "step_key", "tool", "attempt", "acquired_at", "waiting")
    RESOURCE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STEP_KEY_FIELD_NUMBER: _ClassVar[int]
    TOOL_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    ACQUIRED_AT_FIELD_NUMBER: _ClassVar[int]
    WAITING_FIELD_NUMBER: _ClassVar[int]
    resource: str
    run_id: str
    step_key: str
    tool: str
    attempt: int
    acquired_at: _timestamp_pb2.Timestamp
    waiting: int
    def __init__(self, resource: _Optional[str] = ..., run_id: _Optional[str] = ..., step_key: _Optional[str] = ..., tool: _Optional[str] = ..., attempt: _Optional[int] = ..., acquired_at: _Optional[_Union[datetime.datetime, _timestamp_pb2.Timestamp, _Mapping]] = ..., waiting: _Optional[int] = ...) -> None: ...
