"""What the kernel answers an agent with, as plain values: runs, steps, call results, progress,
interruptions, approvals and events. Enum values are lower-case names (`"ok"`, `"tool_error"`,
`"completed"`); compare them with `CallOutcome` and `RunStatus`, and treat an outcome you do not
know as a failure of the call (the kernel may add values).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any


class CallOutcome(StrEnum):
    """Why a settled call ended as it did, for programs (the model reads `content`)."""

    UNSPECIFIED = "unspecified"
    OK = "ok"
    TOOL_ERROR = "tool_error"
    INVALID_ARGUMENTS = "invalid_arguments"
    UNKNOWN_TOOL = "unknown_tool"
    DENIED = "denied"
    REJECTED = "rejected"
    EXPIRED = "expired"
    TIMED_OUT = "timed_out"
    INDETERMINATE = "indeterminate"
    POISON = "poison"
    CANCELLED = "cancelled"
    REPLAY_INPUT_CHANGED = "replay_input_changed"
    LIMIT_EXCEEDED = "limit_exceeded"
    NO_WORKER = "no_worker"
    WRITE_TOOL_BLOCKED = "write_tool_blocked"
    BUDGET_EXCEEDED = "budget_exceeded"
    """The call would have gone past a limit of its run's budget (or an ancestor's); it did
    not run, and the model reads which limit."""


class RunStatus(StrEnum):
    """Where a run stands."""

    UNSPECIFIED = "unspecified"
    PENDING = "pending"
    RUNNING = "running"
    BLOCKED = "blocked"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUSPENDED = "suspended"


@dataclass(frozen=True)
class ToolCall:
    """One call the model made: the tool, its arguments, and optionally the model's call id
    (which then identifies the step instead of its turn and position) and a timeout in seconds.

    `arguments` is a dict, or the model's JSON text as it came. The kernel checks the text: if it
    is not JSON, the whole turn is refused (`KernelError` `INVALID_ARGUMENT` naming
    `calls[i].arguments_json`) and nothing is recorded, so the loop can ask the model again."""

    tool: str
    arguments: dict[str, Any] | str = field(default_factory=dict)
    call_id: str | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class ApprovalDecision:
    """The answer to a gated call's approval."""

    approval_id: str
    answer: str
    decider: str
    reason: str


@dataclass(frozen=True)
class CallResult:
    """How one call of a turn ended: `content` is what the model reads."""

    position: int
    step_key: str
    tool: str
    status: str
    """`ok`, `error` or `cancelled`."""
    content: str
    output: Any
    """The result as JSON data when `ok`, else `None`."""
    error_kind: str | None
    replayed: bool
    """Served from the log: the call had already run."""
    attempts: int
    outcome: str
    """A `CallOutcome` value."""
    decided_by: str
    approval: ApprovalDecision | None

    @property
    def ok(self) -> bool:
        """Whether the tool returned a result."""
        return self.outcome == CallOutcome.OK


@dataclass(frozen=True)
class TurnProgress:
    """A running call's progress, live."""

    run_id: str
    step_key: str
    position: int
    tool: str
    message: str
    data: Any
    current: int
    total: int


@dataclass(frozen=True)
class Interruption:
    """A call of the turn waits for a person; its result follows once answered."""

    position: int
    step_key: str
    tool: str
    reason: str
    approval_id: str
    arguments: Any
    message: str


TurnEvent = CallResult | TurnProgress | Interruption


@dataclass(frozen=True)
class Turn:
    """A whole turn, once every call settled: results in position order, and what came before."""

    results: list[CallResult]
    progress: list[TurnProgress]
    interruptions: list[Interruption]


@dataclass(frozen=True)
class BudgetLimit:
    """One limit of a run's budget: at most `max_calls` calls, at most `max_cost` cost (each
    attempt at its tool's price), at most `max_time` seconds of tool run time, over every tool or
    over the tools the glob `tools` names. A call that would go past it does not run: its outcome
    is `budget_exceeded` and the model reads why. A subagent is charged to its parent's budget too.

    A limit on time holds each attempt's whole timeout while it runs and spends what it ran as it
    ends: a call whose timeout does not fit waits while running calls hold time, and does not run
    once none do. A call with no timeout cannot run under it.

    Read back on a `Run`, a limit also says what set it and what it has spent."""

    max_calls: int | None = None
    max_cost: float | None = None
    tools: str | None = None
    max_time: float | None = None
    """Seconds of tool run time, to the millisecond (each attempt at most its timeout)."""
    set_by: str = ""
    """`request`, `parent` (a branch's), or the policy file's `policy:budgets[i]`."""
    spent_calls: int = 0
    spent_cost: float = 0.0
    spent_time: float = 0.0
    """Seconds the attempts that ended ran, each at most its timeout."""
    reserved_time: float = 0.0
    """Seconds the running attempts hold: their timeouts."""


@dataclass(frozen=True)
class Run:
    """A run as the kernel records it."""

    id: str
    agent: str
    status: str
    """A `RunStatus` value."""
    input: Any
    output: Any
    reason: str
    labels: dict[str, str]
    tool_calls: int
    hosted: bool
    parent_run_id: str
    created_at: datetime | None
    updated_at: datetime | None
    forked_from_run_id: str = ""
    """A branch: the run whose record it replays."""
    fork_at_step_key: str = ""
    """A branch: the last step of that record it replays (empty: all of it)."""
    allow: tuple[str, ...] = ()
    """A case run's allow tokens."""
    trace_id: str = ""
    """The OpenTelemetry trace of its spans: the agent's `traceparent`'s, or its own."""
    budget: tuple[BudgetLimit, ...] = ()
    """What the run may spend on tool calls, each limit with what it has spent."""
    budget_under_parent: bool = False
    """A subagent whose calls are charged to its parent's budget too."""


@dataclass(frozen=True)
class Step:
    """One recorded step of a run (a tool call, for runs an agent drives)."""

    step_key: str
    turn: int
    position: int
    call_id: str
    tool: str
    tool_version: str
    tool_fingerprint: str
    arguments: Any
    idempotency_key: str
    status: str
    attempts: int
    output: Any
    error: str
    worker: str
    outcome: str
    decided_by: str
    cost: float
    progress_count: int
    replayed_from_run_id: str = ""
    """In a branch: the run whose recorded outcome the step replays (nothing ran)."""
    child_run_id: str = ""
    """For a subagent step (`subagent:...`): the child run."""
    limited_by: tuple[str, ...] = ()
    """The tool limits (the policy file's `limits`, by glob) its last attempt's start passed."""
    limit_wait_ms: int = 0
    """How long that start waited in the queue for those limits, in milliseconds."""
    share: str | None = None
    """The run's fair share when the call was recorded: its value of the run label the policy
    file's `fair_shares.label` names; `None` without fair shares or without that label."""
    started_at: datetime | None = None
    """When its last attempt started; `None` if none did."""
    finished_at: datetime | None = None
    """When it settled; `None` while it has not."""
    caller_step_key: str = ""
    """For a call a tool's body made through the kernel (`ctx.call`): the calling step's key."""


@dataclass(frozen=True)
class RunDetail:
    """A run with its steps and what it cost."""

    run: Run
    steps: list[Step]
    total_cost: float
    cost_by_tool: dict[str, float]


@dataclass(frozen=True)
class RunPage:
    """One page of `AgentClient.list_runs`: runs newest first, and the token of the next page
    (empty on the last)."""

    runs: list[Run]
    next_page_token: str


@dataclass(frozen=True)
class Approval:
    """A gated call's request for a person's answer."""

    id: str
    run_id: str
    step_key: str
    tool: str
    arguments: Any
    status: str
    """`pending`, `approved`, `consumed`, `rejected`, `expired` or `cancelled`."""
    approvers: list[str]
    message: str
    decided_by: str
    decider: str
    reason: str
    expires_at: datetime | None
    question: bool = False
    """A tool's question to a person (`message` is the question), answered with JSON
    (`AgentClient.answer`); else leave for a call to run."""
    answer_schema: Any = None
    """A question's JSON Schema for its answer."""
    answer: Any = None
    """A question's answer, once given."""


@dataclass(frozen=True)
class Event:
    """One entry of a run's append-only event log."""

    run_id: str
    seq: int
    type: str
    at: datetime | None
    payload: Any


@dataclass(frozen=True)
class RegisteredTool:
    """A tool the kernel knows, and the workers offering it now."""

    name: str
    description: str
    input_schema: dict[str, Any]
    version: str
    fingerprint: str
    read_only: bool
    writes: bool
    workers: list[str]
