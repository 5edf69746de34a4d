"""The kernel's Python SDK: tools, workers and agents.

- `@tool` makes a tool of a typed function (its JSON Schema from the type hints, its description
  from the docstring, its fingerprint the one the kernel checks); `wrap_tool` makes one of any
  callable.
- `Worker` serves tools to the kernel: heartbeats, reconnects, drains on SIGTERM.
- `@agent` makes a hosted agent: the kernel dispatches its runs to a worker hosting it, and its
  handler's steps (`ctx.call_turn`, `ctx.step`, `ctx.once`, `ctx.subagent`) replay after a crash.
- `AgentClient` drives runs: create one, submit each model turn's tool calls and read their
  progress and results, answer approvals, watch events, finish the run.
- `kernel_sdk.canonical` holds the canonical JSON and hashes, equal to the kernel's byte for byte.
- `kernel_sdk.mcp` makes kernel tools of an MCP server's tools (`wrap_mcp_tools`).
- `kernel_sdk.integrations` hands kernel tools to LangGraph, the OpenAI Agents SDK and Pydantic AI.
"""

from ._question import NO_DEFAULT
from .canonical import call_hash, idempotency_key, to_canonical, tool_fingerprint
from .client import AgentClient
from .context import Cancellation, Progress, ToolCache, ToolContext
from .errors import ConcurrentCallIdError, KernelError, ToolCallRejected, ToolError, WorkerRefused
from .hosted import (
    Agent,
    AgentContext,
    AgentDefinition,
    AgentError,
    NestedDurableOperation,
    NestedDurableOperationError,
    PolicyError,
    QuestionUnanswered,
    ReplayInputChanged,
    SessionInfo,
    StepDenied,
    StepEffect,
    StepFailed,
    StepInfo,
    SubagentFailed,
    agent,
)
from .records import (
    Approval,
    ApprovalDecision,
    BudgetLimit,
    CallOutcome,
    CallResult,
    Event,
    Interruption,
    RegisteredTool,
    Run,
    RunDetail,
    RunPage,
    RunStatus,
    Step,
    ToolCall,
    Turn,
    TurnEvent,
    TurnProgress,
)
from .tools import (
    RetryPolicy,
    Tool,
    ToolDefinition,
    ToolDefinitionError,
    ToolOptions,
    tool,
    wrap_tool,
)
from .transport import Tls
from .worker import Worker

__all__ = [
    "NO_DEFAULT",
    "Agent",
    "AgentClient",
    "AgentContext",
    "AgentDefinition",
    "AgentError",
    "Approval",
    "ApprovalDecision",
    "BudgetLimit",
    "CallOutcome",
    "CallResult",
    "Cancellation",
    "ConcurrentCallIdError",
    "Event",
    "Interruption",
    "KernelError",
    "NestedDurableOperation",
    "NestedDurableOperationError",
    "PolicyError",
    "Progress",
    "QuestionUnanswered",
    "RegisteredTool",
    "ReplayInputChanged",
    "RetryPolicy",
    "Run",
    "RunDetail",
    "RunPage",
    "RunStatus",
    "SessionInfo",
    "Step",
    "StepDenied",
    "StepEffect",
    "StepFailed",
    "StepInfo",
    "SubagentFailed",
    "Tls",
    "Tool",
    "ToolCache",
    "ToolCall",
    "ToolCallRejected",
    "ToolContext",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolError",
    "ToolOptions",
    "Turn",
    "TurnEvent",
    "TurnProgress",
    "Worker",
    "WorkerRefused",
    "agent",
    "call_hash",
    "idempotency_key",
    "to_canonical",
    "tool",
    "tool_fingerprint",
    "wrap_tool",
]
