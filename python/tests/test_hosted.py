"""Hosted agents on a Python worker against the real kernel: steps recorded and replayed across a
SIGKILLed worker, subagents on sessions with the handler suspended, and divergence caught."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

import hosted_agents
import pytest
from conftest import ended_events, pending_approval, serving
from harness import Kernel, Process, eventually, python_worker, within
from pydantic import BaseModel

from kernel_sdk import (
    AgentClient,
    AgentContext,
    ConcurrentCallIdError,
    Event,
    NestedDurableOperationError,
    PolicyError,
    StepDenied,
    StepInfo,
    ToolCallRejected,
    ToolContext,
    ToolDefinitionError,
    ToolError,
    agent,
    tool,
)


async def test_a_hosted_run_records_its_steps_and_completes(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, *hosted_agents.TOOLS, agents=hosted_agents.AGENTS):
        run = await client.create_run(
            "py_planner", input={"destination": "Lisbon", "days": 3}, hosted=True
        )
        assert run.hosted
        events = await within("the run to end", ended_events(client, run.id), 30)
        assert events[-1].type == "run:completed"
        detail = await client.get_run(run.id)
        assert detail.run.output == {
            "plan": {"stops": ["Lisbon", "coast"]},
            "weather": "sunny in Lisbon",
            "waited": "waited",
            "flaky": "ZeroDivisionError: division by zero",
            "days": 3,
        }
        by_key = {step.step_key: step for step in detail.steps}
        assert by_key["step:model:plan#0"].status == "succeeded"
        assert by_key["step:flaky#0"].status == "failed"
        assert "ZeroDivisionError" in by_key["step:flaky#0"].error
        assert any(step.tool == "py_weather" for step in detail.steps)


async def test_a_handler_replays_its_recorded_steps_on_another_worker_after_a_sigkill(
    kernel: Kernel, client: AgentClient
) -> None:
    first = python_worker(kernel, "--agents", "--hang", "--name", "first")
    second: Process | None = None
    try:
        await first.said("worker session open")
        run = await client.create_run(
            "py_planner", input={"destination": "Porto", "days": 2}, hosted=True
        )
        await first.said("model asked")
        await first.said("waiting")
        first.kill9()

        second = python_worker(kernel, "--agents", "--name", "second")
        await within("the run to end", ended_events(client, run.id), 30)
        detail = await client.get_run(run.id)
        assert detail.run.status == "completed", detail.run
        assert detail.run.output["plan"] == {"stops": ["Porto", "coast"]}
        # The model was asked once: the second dispatch replayed the recorded answer.
        assert not any("model asked" in line for line in second.lines)
        assert any("waiting" in line for line in second.lines), "the unrecorded step ran again"
        weather = [step for step in detail.steps if step.tool == "py_weather"]
        assert len(weather) == 1 and weather[0].attempts == 1
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_subagents_on_a_session_run_in_order_while_the_parent_gives_back_its_slot(
    kernel: Kernel, client: AgentClient
) -> None:
    # One slot: the parent must give it back while it waits, or its children could never run.
    async with serving(
        kernel, *hosted_agents.TOOLS, agents=hosted_agents.AGENTS, max_concurrency=1
    ):
        run = await client.create_run("py_parent", hosted=True)
        events = await within("the run to end", ended_events(client, run.id), 60)
        assert events[-1].type == "run:completed", [e.type for e in events]
        output = (await client.get_run(run.id)).run.output
        key = f"counter:{run.id}"
        assert output == [
            {"count": 1, "session": key},
            {"count": 11, "session": key},
            {"count": 100, "session": None},
        ]
        assert any(e.type == "agent:suspended" for e in events)


async def test_tool_bodies_start_subagents_and_give_back_their_slots_while_they_wait(
    kernel: Kernel, client: AgentClient
) -> None:
    # Two slots for a handler, three calls and three children: a call must give back its slot
    # while its body waits on its child, or the children could never run.
    async with serving(
        kernel, *hosted_agents.TOOLS, agents=hosted_agents.AGENTS, max_concurrency=2
    ):
        research = {"steps": [1, 10, 100], "session": True}
        run = await client.create_run("py_researcher", input=research, hosted=True)
        events = await within("the run to end", ended_events(client, run.id), 60)
        kinds = [event.type for event in events]
        assert kinds[-1] == "run:completed", kinds
        assert "tool:suspended" in kinds, "a call gave back its slot"
        detail = await client.get_run(run.id)
        key = f"research:{run.id}"
        # One session: the children ran one at a time, each counting on from the last.
        counts = sorted(item["count"] for item in detail.run.output)
        assert counts[-1] == 111 and len(counts) == 3, detail.run.output
        assert all(item["session"] == key for item in detail.run.output), detail.run.output
        children = [step for step in detail.steps if step.step_key.startswith("subagent:")]
        assert len(children) == 3, "one child per call, never a second"
        assert len({step.child_run_id for step in children}) == 3, children
        for step in children:
            child = await client.get_run(step.child_run_id)
            assert child.run.parent_run_id == run.id and child.run.status == "completed"
        # A call that gave back its slot ran again from the start: its next attempt got its
        # child's outcome from the kernel, without starting another.
        calls = [step for step in detail.steps if step.tool == "py_research"]
        assert any(step.attempts >= 2 for step in calls), calls


async def test_a_failed_subagent_raises_tool_error_in_the_tool_body(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, *hosted_agents.TOOLS, agents=hosted_agents.AGENTS):
        run = await client.create_run("py_careful_researcher", hosted=True)
        await within("the run to end", ended_events(client, run.id), 60)
        detail = await client.get_run(run.id)
        caught, uncaught, refused = detail.run.output
        assert caught.startswith("caught fatal: subagent 'py_counter' (run "), caught
        assert "failed: ValueError: cannot count backwards" in caught, caught
        assert "subagent 'py_counter' (run " in uncaught, uncaught
        assert "ValueError: cannot count backwards" in uncaught, uncaught
        [failed] = [step for step in detail.steps if step.tool == "py_research"]
        assert failed.status == "failed" and failed.attempts == 1, "fatal: never retried"
        # A child the kernel refuses to start is the body's error too, naming the field.
        assert refused.startswith("caught fatal: subagent 'py_counter': INVALID_ARGUMENT"), refused
        assert '"nope" is not of type "integer"' in refused, refused


async def test_a_tool_bodys_subagent_outlives_a_sigkill_and_is_never_started_twice(
    kernel: Kernel, client: AgentClient
) -> None:
    first = python_worker(kernel, "--agents", "--hang", "--name", "first")
    second: Process | None = None
    try:
        await first.said("worker session open")
        run = await client.create_run("py_delegating", hosted=True)
        await first.said("delegating")
        await first.said("sleeper started")
        first.kill9()

        second = python_worker(kernel, "--agents", "--name", "second")
        await within("the run to end", ended_events(client, run.id), 60)
        detail = await client.get_run(run.id)
        assert detail.run.status == "completed", detail.run
        assert detail.run.output == "slept"
        [child] = [step for step in detail.steps if step.step_key.startswith("subagent:")]
        # The call ran again on the second worker and got back the child its first attempt
        # started: that child's run was dispatched again, not started anew.
        assert any("delegating" in line for line in second.lines)
        sleeper = await client.get_run(child.child_run_id)
        assert sleeper.run.status == "completed" and sleeper.run.parent_run_id == run.id
        assert sum("sleeper started" in line for line in second.lines) == 1, second.lines
    finally:
        first.stop()
        if second is not None:
            second.stop()


async def test_a_subagent_from_a_test_context_is_a_tool_error() -> None:
    with pytest.raises(ToolError) as raised:
        await hosted_agents.py_research(ToolContext.for_test(), step=1)
    assert raised.value.kind == "fatal"
    assert "this context has no kernel" in raised.value.message


async def test_a_handler_that_is_not_deterministic_fails_with_replay_input_changed(
    kernel: Kernel, client: AgentClient
) -> None:
    first = python_worker(kernel, "--agents", "--hang", "--name", "first")
    second: Process | None = None
    try:
        await first.said("worker session open")
        run = await client.create_run("py_drifting", hosted=True)
        # Its step is recorded under the first process's id; then it hangs.
        await within("a step:result event", _event(client, run.id, "step:result"), 30)
        first.kill9()
        second = python_worker(kernel, "--agents", "--name", "second")
        events = await within("the run to end", ended_events(client, run.id), 30)
        assert events[-1].type == "run:failed"
        detail = await client.get_run(run.id)
        assert "replay_input_changed" in detail.run.reason, detail.run.reason
    finally:
        first.stop()
        if second is not None:
            second.stop()


def _route(destination: str) -> str:
    raise LookupError(f"no route to {destination}")


@agent
async def py_lost(ctx: AgentContext, destination: str) -> str:
    """Plans a route, which its helper cannot find."""
    return _route(destination)


async def test_a_handlers_exception_fails_the_run_with_its_traceback(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, agents=[py_lost]):
        run = await client.create_run("py_lost", input="Atlantis", hosted=True)
        events = await within("the run to end", ended_events(client, run.id), 30)
    assert events[-1].type == "run:failed"
    reason = (await client.get_run(run.id)).run.reason
    assert reason.startswith("LookupError: no route to Atlantis\nTraceback"), reason
    last_frame = f'File "{__file__}", line {_route.__code__.co_firstlineno + 1}, in _route'
    assert last_frame in reason, reason


@agent
async def py_guarded(ctx: AgentContext, input: None) -> dict[str, object]:
    """Tries a step the policy denies, then one it allows."""
    ran: list[str] = []
    try:

        def charge(info: StepInfo) -> str:
            ran.append("charge")
            return "charged"

        await ctx.step("charge_card", charge)
    except PolicyError as denied:
        # The Pyrula page's name for it; the SDK raises its subclass.
        assert isinstance(denied, StepDenied)
        refusal = denied.message
    allowed = await ctx.step("note", lambda info: "noted", effect="read")
    return {"refusal": refusal, "ran": ran, "allowed": allowed}


async def test_a_policy_denies_a_local_step_before_it_runs(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text('deny_list: ["step:charge*"]\n')
    kernel = Kernel(tmp_path, "--policy", str(policy))
    try:
        async with (
            AgentClient(kernel.addr) as client,
            serving(kernel, agents=[py_guarded]),
        ):
            run = await client.create_run("py_guarded", hosted=True)
            await within("the run to end", ended_events(client, run.id), 30)
            detail = await client.get_run(run.id)
            output = detail.run.output
            assert output["ran"] == [], "a denied step never runs"
            assert "not allowed" in output["refusal"] and output["allowed"] == "noted"
            by_key = {step.step_key: step for step in detail.steps}
            assert by_key["step:charge_card#0"].outcome == "denied"
    finally:
        kernel.stop()


class Doubled(BaseModel):
    n: int


@tool
async def py_double(ctx: ToolContext, n: int) -> Doubled:
    """Doubles a number."""
    return Doubled(n=n * 2)


@tool(writes=True)
async def py_wipe(ctx: ToolContext, path: str) -> str:
    """Wipes a path (the policy denies it)."""
    raise AssertionError("a denied tool never runs")


@tool(requires_approval=True)
async def py_wire(ctx: ToolContext, cents: int) -> str:
    """Wires money, once a person approves."""
    raise AssertionError("a rejected tool never runs")


@agent
async def py_direct(ctx: AgentContext, input: None) -> dict[str, object]:
    """Calls tools as plain functions: each call goes through the kernel."""
    doubled = await py_double(ctx, n=21)
    assert isinstance(doubled, Doubled), "the declared return type comes back"
    denied = await py_wipe(ctx, path="/")
    try:
        await py_wire(ctx, cents=500)
        rejected: object = None
    except ToolCallRejected as error:
        rejected = [error.tool_name, error.reason, error.expired]
    return {"doubled": doubled.n, "denied": denied, "rejected": rejected}


async def test_a_tool_called_as_a_function_in_a_handler_goes_through_the_kernel(
    tmp_path: Path,
) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text('deny_list: ["py_wipe"]\n')
    kernel = Kernel(tmp_path, "--policy", str(policy))
    try:
        async with (
            AgentClient(kernel.addr) as client,
            serving(kernel, py_double, py_wipe, py_wire, agents=[py_direct]),
        ):
            run = await client.create_run("py_direct", hosted=True)

            approval = await pending_approval(client, run.id, "the wire to wait for a person")
            await client.reject(approval, decider="ops", reason="not today")
            await within("the run to end", ended_events(client, run.id), 30)
            detail = await client.get_run(run.id)
            assert detail.run.status == "completed", detail.run.reason
            output = detail.run.output
            assert output["doubled"] == 42
            assert output["denied"].startswith("py_wipe not allowed. reason:"), output
            assert output["rejected"][0] == "py_wire" and output["rejected"][2] is False
            assert "rejected by ops" in output["rejected"][1], output
            # Each call is a step of the run, beside the handler's own dispatch.
            outcomes = {
                step.tool: step.outcome for step in detail.steps if step.tool != "py_direct"
            }
            assert outcomes == {"py_double": "ok", "py_wipe": "denied", "py_wire": "rejected"}
    finally:
        kernel.stop()


@agent
async def py_nested(ctx: AgentContext, input: None) -> dict[str, object]:
    """Calls a tool inside a local step, which nothing durable may be."""

    async def inside(info: StepInfo) -> object:
        return await py_double(ctx, n=1)

    try:
        await ctx.step("inside", inside)
        caught = "nothing"
    except NestedDurableOperationError as error:
        caught = type(error).__name__
    after = await py_double(ctx, n=2)
    return {"caught": caught, "after": after.n}


@tool(requires_approval=True)
async def py_send(ctx: ToolContext, cents: int) -> str:
    """Sends money, once a person approves."""
    return f"sent {cents}"


@agent
async def py_together(ctx: AgentContext, input: None) -> dict[str, object]:
    """Calls two tools together (one turn), then, while one of them waits for a person, a third,
    which goes in once the person answers."""
    gated = ctx.call("py_send", {"cents": 7}, together=True)
    first = ctx.call("py_double", {"n": 1}, together=True)
    waiting = asyncio.ensure_future(gated)
    # The kernel answers the double's call while the send waits, but a turn's results come in
    # position order: the double's comes with the send's. So wait here, long enough for the
    # send to block the run, and call again meanwhile.
    await asyncio.sleep(0.5)
    later = await py_double(ctx, n=2)
    return {"sent": (await waiting).output, "first": (await first).output, "later": later.n}


async def test_calls_made_together_are_one_turn_and_a_call_made_while_the_run_waits_goes_in_after(
    kernel: Kernel, client: AgentClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="kernel_sdk.hosted")
    async with serving(kernel, py_double, py_send, agents=[py_together]):
        run = await client.create_run("py_together", hosted=True)

        approval = await pending_approval(client, run.id, "the send to wait for a person")

        async def later_waits() -> bool:
            return any("turn waits for the run's approval" in m for m in caplog.messages)

        await eventually("the later call to wait for the answer", later_waits)
        # Nothing of it is recorded while the run waits.
        steps = (await client.get_run(run.id)).steps
        assert [s.arguments for s in steps if s.tool == "py_double"] == [{"n": 1}]
        await client.approve(approval, decider="ops")
        await within("the run to end", ended_events(client, run.id), 30)
        detail = await client.get_run(run.id)
        assert detail.run.status == "completed", detail.run.reason
        assert detail.run.output == {"sent": "sent 7", "first": {"n": 2}, "later": 4}
        calls = [s for s in detail.steps if s.tool in ("py_send", "py_double")]
        turns = {
            (s.tool, s.arguments["n"] if s.tool == "py_double" else None): s.turn for s in calls
        }
        assert turns[("py_send", None)] == turns[("py_double", 1)], "one pass, one turn"
        assert turns[("py_double", 2)] > turns[("py_send", None)]
        assert all(s.outcome == "ok" for s in calls), calls


@tool
async def py_nap(ctx: ToolContext, seconds: float) -> float:
    """Sleeps a while."""
    await asyncio.sleep(seconds)
    return seconds


@agent
async def py_same_id(ctx: AgentContext, input: None) -> dict[str, object]:
    """Makes two calls under one call id at once: the second is refused while the first runs."""
    first = asyncio.ensure_future(ctx.call("py_nap", {"seconds": 0.3}, call_id="nap"))
    await asyncio.sleep(0.1)
    try:
        await ctx.call("py_nap", {"seconds": 0.1}, call_id="nap")
        refused: object = None
    except ConcurrentCallIdError as error:
        refused = [error.code, error.message.split(":")[0]]
    return {"first": (await first).output, "refused": refused}


async def test_two_calls_under_one_call_id_at_once_raise_concurrent_call_id_error(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, py_nap, agents=[py_same_id]):
        run = await client.create_run("py_same_id", hosted=True)
        await within("the run to end", ended_events(client, run.id), 30)
        detail = await client.get_run(run.id)
        assert detail.run.status == "completed", detail.run.reason
        assert detail.run.output == {
            "first": 0.3,
            "refused": ["ALREADY_EXISTS", "concurrent_call_id"],
        }
        assert [s.arguments for s in detail.steps if s.tool == "py_nap"] == [{"seconds": 0.3}]


async def test_a_durable_operation_inside_a_step_raises_to_the_handler_and_records_nothing(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, py_double, agents=[py_nested]):
        run = await client.create_run("py_nested", hosted=True)
        await within("the run to end", ended_events(client, run.id), 30)
        detail = await client.get_run(run.id)
        assert detail.run.output == {"caught": "NestedDurableOperationError", "after": 4}
        keys = [step.step_key for step in detail.steps if step.tool != "py_nested"]
        assert not any(key.startswith("step:inside") for key in keys), keys
        assert [step.tool for step in detail.steps if step.tool == "py_double"] == ["py_double"]


async def test_a_tool_called_outside_any_run_just_runs() -> None:
    doubled = await py_double(None, n=4)
    assert doubled == Doubled(n=8)


async def _event(client: AgentClient, run_id: str, kind: str) -> Event:
    """The run's first event of type `kind`, waiting for it."""
    async for event in client.watch_events(run_id):
        if isinstance(event, Event) and event.type == kind:
            return event
    raise AssertionError(f"run {run_id} ended without a {kind} event")


def test_agent_definitions_refuse_what_the_kernel_would() -> None:
    async def two(ctx, a, b):  # type: ignore[no-untyped-def]
        """Too many parameters."""

    with pytest.raises(ToolDefinitionError, match="takes \\(ctx: AgentContext, input\\)"):
        agent(two)

    async def undocumented(ctx, input):  # type: ignore[no-untyped-def]
        return input

    with pytest.raises(ToolDefinitionError, match="no description"):
        agent(undocumented)
    schema = hosted_agents.py_planner.definition.input_schema
    assert schema["required"] == ["destination", "days"]
    assert (
        hosted_agents.py_planner.definition.fingerprint
        != hosted_agents.py_counter.definition.fingerprint
    )


async def _handler(ctx: AgentContext, input: dict) -> dict:  # type: ignore[type-arg]
    """Echoes its input."""
    return input


def test_an_agent_can_be_named_first_and_each_option_is_checked_when_applied() -> None:
    named = agent("planner", version=2)(_handler)
    assert named.name == "planner" and named.definition.version == "2"
    bounded = agent(name="bounded", max_concurrency=3)(_handler)
    assert bounded.definition.max_concurrency == 3

    refusals: list[tuple[Callable[[], object], str]] = [
        (
            lambda: agent(max_concurrency=-1)(_handler),
            (
                "agent '_handler': max_concurrency takes a whole number >= 0 "
                "(0: no bound of its own), not -1"
            ),
        ),
        (lambda: agent(max_concurrency=True)(_handler), "agent '_handler': max_concurrency takes"),
        (
            lambda: agent(version="")(_handler),
            "agent '_handler': version takes a non-empty string such as \"2\", not ''",
        ),
        (
            lambda: agent(input_schema="trip")(_handler),  # type: ignore[arg-type]
            "agent '_handler': input_schema takes a JSON Schema as a dict, not 'trip'",
        ),
        (
            lambda: agent(description=3)(_handler),  # type: ignore[arg-type]
            "agent '_handler': description takes a string",
        ),
        (
            lambda: agent("planner", name="other"),
            "agent 'planner': the name is given twice, first and as name='other'",
        ),
        (
            lambda: agent("has space")(_handler),
            "agent 'has space': name takes 1 to 64 characters from [a-zA-Z0-9_-]",
        ),
        (
            lambda: agent(3),  # type: ignore[arg-type]
            "@agent takes a handler, or the agent's name as a string, not 3",
        ),
    ]
    for make, expected in refusals:
        with pytest.raises(ToolDefinitionError) as refused:
            make()
        assert str(refused.value).startswith(expected), str(refused.value)


class _Refusals(logging.Handler):
    """Sets `seen` once the worker logs that the kernel refused a suspension."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen = asyncio.Event()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "suspension refused" in message:
            self.lines.append(message)
            self.seen.set()


_GATE: dict[str, asyncio.Event] = {}


@tool
async def py_held(ctx: ToolContext) -> str:
    """Answers once the test lets it."""
    await _GATE["held"].wait()
    return "held"


@tool
async def py_quick(ctx: ToolContext) -> str:
    """Answers at once."""
    return "quick"


@agent
async def py_crossing(ctx: AgentContext, input: None) -> list[str]:
    """Calls a held tool and a quick one in one turn."""
    results = await ctx.call_turn([("py_held", {}), ("py_quick", {})])
    return [result.content for result in results]


async def test_a_handler_whose_suspension_crosses_a_settle_is_refused_and_goes_on(
    kernel: Kernel, client: AgentClient
) -> None:
    # Results come in position order: the quick call settles first, but the handler still waits
    # on it when its patience runs out, so its suspension names a settled step and is refused.
    _GATE["held"] = asyncio.Event()
    refusals = _Refusals()
    logger = logging.getLogger("kernel_sdk.worker")
    level = logger.level
    logger.addHandler(refusals)
    logger.setLevel(logging.INFO)
    try:
        async with serving(kernel, py_held, py_quick, agents=[py_crossing]):
            run = await client.create_run("py_crossing", hosted=True)
            await within("the kernel to refuse the suspension", refusals.seen.wait(), 30)
            _GATE["held"].set()
            events = await within("the run to end", ended_events(client, run.id), 30)
    finally:
        logger.removeHandler(refusals)
        logger.setLevel(level)
    assert "has settled" in refusals.lines[0], refusals.lines
    kinds = [event.type for event in events]
    assert kinds[-1] == "run:completed", kinds
    assert "agent:suspended" not in kinds, kinds
    assert kinds.count("agent:dispatched") == 1, kinds
    assert (await client.get_run(run.id)).run.output == ["held", "quick"]
