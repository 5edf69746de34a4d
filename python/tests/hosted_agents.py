"""Hosted agents the tests run, in this process or in `worker_process.py --agents`."""

from __future__ import annotations

import asyncio
import os

from pydantic import BaseModel

from kernel_sdk import AgentContext, StepFailed, StepInfo, ToolContext, ToolError, agent, tool

# Set by worker_process.py: a first worker hangs in the `wait` step, so it can be killed there.
HANG_IN_STEP = asyncio.Event()
HANGS = {"value": False}


class Trip(BaseModel):
    destination: str
    days: int


class Plan(BaseModel):
    stops: list[str]


class Count(BaseModel):
    count: int
    session: str | None


@tool(read_only=True)
async def py_weather(ctx: ToolContext, city: str) -> str:
    """Says the weather in a city."""
    return f"sunny in {city}"


@agent
async def py_planner(ctx: AgentContext, trip: Trip) -> dict[str, object]:
    """Plans a trip: asks a model once, checks the weather, waits, writes the plan."""

    def ask_model(info: StepInfo) -> Plan:
        print(f"model asked run={ctx.run_id} attempt={ctx.attempt}", flush=True)
        return Plan(stops=[trip.destination, "coast"])

    plan = await ctx.once("model:plan", ask_model)
    # The declared type, live and after a crash (a replay), not the recorded dict.
    assert isinstance(plan, Plan), f"the step gave back {plan!r}"
    [weather] = await ctx.call_turn([("py_weather", {"city": trip.destination})])

    async def wait(info: StepInfo) -> str:
        print(f"waiting run={ctx.run_id} attempt={ctx.attempt}", flush=True)
        if HANGS["value"]:
            await asyncio.Event().wait()
        return "waited"

    waited = await ctx.step("wait", wait)
    try:
        await ctx.step("flaky", lambda info: 1 / 0)
    except StepFailed as failed:
        flaky = failed.message
    return {
        "plan": plan,
        "weather": weather.output,
        "waited": waited,
        "flaky": flaky,
        "days": trip.days,
    }


@agent
async def py_counter(ctx: AgentContext, step: int) -> dict[str, object]:
    """Counts on from the last run of its session; fails on a negative step."""
    if step < 0:
        raise ValueError("cannot count backwards")
    session = ctx.session
    previous = session.previous_output["count"] if session and session.previous_output else 0
    return {"count": previous + step, "session": session.key if session else None}


@agent
async def py_parent(ctx: AgentContext, input: None) -> list[object]:
    """Runs two counters one after the other on one session, and one without."""
    key = f"counter:{ctx.run_id}"
    first = await ctx.subagent("py_counter", 1, session=key, returns=Count)
    second = await ctx.subagent("py_counter", 10, session=key, returns=Count)
    alone = await ctx.subagent("py_counter", 100)
    assert isinstance(second, Count) and isinstance(alone, dict), "typed only when asked"
    return [first, second, alone]


@agent
async def py_drifting(ctx: AgentContext, input: None) -> str:
    """Not deterministic: which step it takes depends on the process (a replay diverges)."""
    await ctx.step(f"pick:{os.getpid()}", lambda info: "picked")
    if HANGS["value"]:
        await asyncio.Event().wait()
    return "done"


class Research(BaseModel):
    steps: list[object]
    session: bool = False


@tool
async def py_research(ctx: ToolContext, step: object, session: bool = False) -> Count:
    """Counts through a subagent started from the tool's body, and gives back what it counted."""
    key = f"research:{ctx.run_id}" if session else None
    counted = await ctx.subagent("py_counter", step, session=key, returns=Count)
    assert isinstance(counted, Count), "typed as asked"
    return counted


@tool
async def py_research_or_say(ctx: ToolContext, step: object) -> str:
    """Counts through a subagent; says why when the subagent failed."""
    try:
        counted = await ctx.subagent("py_counter", step)
    except ToolError as failed:
        return f"caught {failed.kind}: {failed.message}"
    return f"counted {counted['count']}"


@agent
async def py_researcher(ctx: AgentContext, research: Research) -> list[object]:
    """One turn of research calls, each of whose bodies starts a subagent."""
    calls = [("py_research", {"step": s, "session": research.session}) for s in research.steps]
    results = await ctx.call_turn(calls)
    return [result.output if result.ok else result.content for result in results]


@agent
async def py_careful_researcher(ctx: AgentContext, input: None) -> list[str]:
    """Subagents that fail (one in its handler, one refused at its start), caught or not."""
    results = await ctx.call_turn(
        [
            ("py_research_or_say", {"step": -1}),
            ("py_research", {"step": -1}),
            ("py_research_or_say", {"step": "nope"}),
        ]
    )
    return [result.content for result in results]


@agent
async def py_sleeper(ctx: AgentContext, input: None) -> str:
    """Says it started, then hangs in a worker started with `--hang`."""
    print(f"sleeper started run={ctx.run_id} attempt={ctx.attempt}", flush=True)
    if HANGS["value"]:
        await asyncio.Event().wait()
    return "slept"


@tool
async def py_delegate(ctx: ToolContext, agent: str) -> object:
    """Gives back what a subagent of `agent` gives."""
    print(f"delegating run={ctx.run_id} attempt={ctx.attempt}", flush=True)
    return await ctx.subagent(agent)


@agent
async def py_delegating(ctx: AgentContext, input: None) -> object:
    """Calls one tool whose body starts a subagent."""
    [result] = await ctx.call_turn([("py_delegate", {"agent": "py_sleeper"})])
    return result.output if result.ok else result.content


AGENTS = [
    py_planner,
    py_counter,
    py_parent,
    py_drifting,
    py_researcher,
    py_careful_researcher,
    py_sleeper,
    py_delegating,
]
TOOLS = [py_weather, py_research, py_research_or_say, py_delegate]
