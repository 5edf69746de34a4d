"""The client side of MCP's tasks extension (`io.modelcontextprotocol/tasks`, MCP 2026-07-28) for
the official `mcp` package, which ships none: with it, a client of the kernel's MCP bridge takes a
slow call, or one that waits for a person, as a task, and `call_tool` still returns the call's
result.

```python
from mcp import Client
from kernel_sdk.mcp_tasks import TasksExtension

async with Client(url, mode="2026-07-28", extensions=[TasksExtension()],
                  elicitation_callback=ask_a_person) as mcp:
    result = await mcp.call_tool("refund", {"customer": "c1", "cents": 25000})
```

A task is polled with `tasks/get` at the interval the server asks. A form it waits on (the kernel's
approval of the call) goes to the client's `elicitation_callback`, and the answer back with
`tasks/update`. A completed task's result is the call's result; a failed or cancelled one raises
`TaskEnded`. Cancelling the awaiting code (`asyncio` or `anyio` cancellation, a timeout around
`call_tool`) sends `tasks/cancel` first. A server that cannot be reached for a while (a kernel
restarting) is polled again, for `unreachable_for` seconds. Needs `kernel-sdk[mcp]`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal

import anyio
import mcp_types
import pydantic
from mcp.client.extension import ClaimContext, ClientExtension, ResultClaim
from mcp.client.session import ClientRequestContext, ClientSession

_INPUT_REQUEST: pydantic.TypeAdapter[mcp_types.InputRequest] = pydantic.TypeAdapter(
    mcp_types.InputRequest
)

TASKS_EXTENSION = "io.modelcontextprotocol/tasks"
"""The extension's identifier, as a client declares it and a server advertises it."""

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]
"""A task's status: `working` and `input_required` until it ends in one of the other three."""


class _TaskFields(mcp_types.Result):
    task_id: str
    status: TaskStatus
    status_message: str | None = None
    created_at: str
    last_updated_at: str
    ttl_ms: int | None
    poll_interval_ms: int | None = None


class CreateTaskResult(_TaskFields):
    """A `tools/call` the server answered with a task (`resultType: "task"`)."""

    result_type: Literal["task"]


class Task(_TaskFields):
    """A task as `tasks/get` describes it: its status, and what that status carries."""

    result_type: str = "complete"
    input_requests: dict[str, Any] | None = None
    """While `input_required`: what the server asks, by key."""
    result: dict[str, Any] | None = None
    """Once `completed`: the call's `CallToolResult`."""
    error: dict[str, Any] | None = None
    """Once `failed`: the JSON-RPC error."""


class _TaskId(mcp_types.RequestParams):
    task_id: str


class _Responses(_TaskId):
    input_responses: dict[str, Any]


class _GetTask(mcp_types.Request[_TaskId, Literal["tasks/get"]]):
    method: Literal["tasks/get"] = "tasks/get"
    params: _TaskId
    name_param = "taskId"


class _UpdateTask(mcp_types.Request[_Responses, Literal["tasks/update"]]):
    method: Literal["tasks/update"] = "tasks/update"
    params: _Responses
    name_param = "taskId"


class _CancelTask(mcp_types.Request[_TaskId, Literal["tasks/cancel"]]):
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: _TaskId
    name_param = "taskId"


class TaskEnded(Exception):
    """A task that ended without a result: `failed` (`error` is its JSON-RPC error) or
    `cancelled`."""

    def __init__(self, task: Task) -> None:
        self.task = task
        why = task.status_message or (task.error or {}).get("message") or task.status
        super().__init__(f"task {task.task_id} {task.status}: {why}")


class TasksExtension(ClientExtension):
    """Declares the tasks extension on every request and finishes each task a `tools/call` is
    answered with. `on_status` is called with each task status seen (the task as `tasks/get`
    gave it), for a client that shows progress, and `on_unreachable` with each poll that failed;
    `unreachable_for` is how long polls may fail in a row before the error is raised."""

    identifier = TASKS_EXTENSION

    def __init__(
        self,
        *,
        on_status: Callable[[Task | CreateTaskResult], None] | None = None,
        on_unreachable: Callable[[Exception], None] | None = None,
        unreachable_for: float = 60.0,
    ) -> None:
        self._on_status = on_status
        self._on_unreachable = on_unreachable
        self._unreachable_for = unreachable_for

    def claims(self) -> list[ResultClaim[Any]]:
        """The `resultType: "task"` answer to `tools/call`, finished by polling."""
        return [ResultClaim(result_type="task", model=CreateTaskResult, resolve=self._finish)]

    async def _finish(
        self, created: CreateTaskResult, context: ClaimContext
    ) -> mcp_types.CallToolResult:
        session = context.session
        self._seen(created)
        try:
            return await self._poll(session, created)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                await session.send_request(
                    _CancelTask(params=_TaskId(task_id=created.task_id)),
                    mcp_types.EmptyResult,
                )
            raise

    async def _poll(
        self, session: ClientSession, created: CreateTaskResult
    ) -> mcp_types.CallToolResult:
        task_id, interval = created.task_id, _interval(created.poll_interval_ms)
        answered: set[str] = set()
        last: str = created.status
        failing_since: float | None = None
        while True:
            await anyio.sleep(interval)
            try:
                task = await session.send_request(_GetTask(params=_TaskId(task_id=task_id)), Task)
            except Exception as error:
                failing_since = failing_since or time.monotonic()
                if time.monotonic() - failing_since > self._unreachable_for:
                    raise
                if self._on_unreachable is not None:
                    self._on_unreachable(error)
                continue
            failing_since = None
            interval = _interval(task.poll_interval_ms)
            if task.status != last:
                last = task.status
                self._seen(task)
            if task.status == "completed":
                return mcp_types.CallToolResult.model_validate(task.result or {}, by_name=False)
            if task.status in ("failed", "cancelled"):
                raise TaskEnded(task)
            if task.status == "input_required":
                await _answer(session, task, answered)

    def _seen(self, task: Task | CreateTaskResult) -> None:
        if self._on_status is not None:
            self._on_status(task)


async def _answer(session: ClientSession, task: Task, answered: set[str]) -> None:
    """Puts the task's outstanding input requests to the client's callbacks (its elicitation
    callback for a form) and sends their answers with `tasks/update`."""
    responses: dict[str, Any] = {}
    for key, request in (task.input_requests or {}).items():
        if key in answered:
            continue
        parsed = _INPUT_REQUEST.validate_python(request)
        result = await session.dispatch_input_request(
            ClientRequestContext(session=session, request_id=key), parsed
        )
        if isinstance(result, mcp_types.ErrorData):
            continue
        responses[key] = result.model_dump(by_alias=True, exclude_none=True, mode="json")
    if responses:
        await session.send_request(
            _UpdateTask(params=_Responses(task_id=task.task_id, input_responses=responses)),
            mcp_types.EmptyResult,
        )
        answered |= responses.keys()


def _interval(suggested_ms: int | None) -> float:
    """The poll interval the server suggests, in seconds, kept within 0.05 to 10."""
    return min(max((suggested_ms or 1000) / 1000, 0.05), 10.0)
