"""A Python tool body asking a person mid-call (`ctx.ask`) against the real kernel: answered with
`AgentClient.answer` as the declared type, refused when the answer does not meet the schema, and
declined; a hosted handler asking (`ctx.interrupt`), answered once across its suspension; and
choices, with the default a question records when it expires."""

from __future__ import annotations

import asyncio

import pytest
from conftest import ended_events, pending_approval, serving
from harness import Kernel, within
from pydantic import BaseModel

from kernel_sdk import (
    NO_DEFAULT,
    AgentClient,
    AgentContext,
    KernelError,
    NestedDurableOperationError,
    QuestionUnanswered,
    ToolCall,
    ToolContext,
    ToolError,
    agent,
    tool,
)


class Shipping(BaseModel):
    """What the person decides."""

    ok: bool
    note: str = ""


STARTS: list[str] = []


@tool
async def py_confirm(ctx: ToolContext, release: str) -> dict[str, object]:
    """Ships `release` once a person says so."""
    STARTS.append(ctx.idempotency_key)
    answer = await ctx.ask(f"Ship {release}?", returns=Shipping, approvers=["ops"])
    return {"ok": answer.ok, "note": answer.note}


async def test_a_tool_asks_a_person_and_gets_the_answer_as_its_declared_type(
    kernel: Kernel, client: AgentClient
) -> None:
    STARTS.clear()
    async with serving(kernel, py_confirm):
        run = await client.create_run("shipper")
        turn = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("py_confirm", {"release": "4.2"})])
        )
        approval_id = await pending_approval(client, run.id, "the question to a person")
        [asked] = await client.list_approvals(run_id=run.id)
        assert asked.question and asked.message == "Ship 4.2?", asked
        assert asked.step_key == "question:t0/p0#0"
        assert asked.approvers == ["ops"]
        assert asked.answer_schema["properties"]["ok"]["type"] == "boolean", asked.answer_schema
        assert (await client.get_run(run.id)).run.status == "blocked"

        # An answer that does not fit the schema is refused, naming the field; nothing changes.
        with pytest.raises(KernelError) as refused:
            await client.answer(approval_id, {"ok": "yes"}, decider="alice")
        assert refused.value.code == "INVALID_ARGUMENT"
        assert "answer_json" in str(refused.value)
        assert len(await client.list_approvals(run_id=run.id)) == 1

        answered = await client.answer(approval_id, {"ok": True, "note": "go"}, decider="alice")
        assert answered.status == "approved" and answered.answer == {"ok": True, "note": "go"}
        result = (await asyncio.wait_for(turn, 30)).results[0]
        assert result.outcome == "ok", result
        assert result.output == {"ok": True, "note": "go"}
        detail = await client.get_run(run.id)
        assert detail.run.status == "running"
        [question] = [step for step in detail.steps if step.step_key.startswith("question:")]
        assert question.status == "succeeded"
        events = await client.list_events(run.id)
        assert [e.type for e in events].count("question:asked") == 1
        # However often the body ran (it gives back its slot while it waits), one call.
        assert len(set(STARTS)) == 1, STARTS


async def test_a_declined_question_is_the_tool_bodys_error(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, py_confirm):
        run = await client.create_run("shipper")
        turn = asyncio.ensure_future(
            client.call_turn(run.id, 0, [ToolCall("py_confirm", {"release": "5.0"})])
        )
        approval_id = await pending_approval(client, run.id, "the question to a person")
        await client.reject(approval_id, decider="bob", reason="freeze")
        result = (await asyncio.wait_for(turn, 30)).results[0]
        assert result.outcome == "tool_error", result
        assert "the question of 'py_confirm' was declined by bob (freeze)" in result.content


async def test_asking_from_a_test_context_is_a_tool_error() -> None:
    with pytest.raises(ToolError) as raised:
        await py_confirm(ToolContext.for_test(), release="1.0")
    assert raised.value.kind == "fatal"
    assert "this context has no kernel" in raised.value.message


ASKS: list[str] = []


@agent
async def py_interviewer(ctx: AgentContext, input: dict[str, object]) -> dict[str, object]:
    """Asks a person whether to refund or replace (the seed page's `ctx.interrupt`)."""
    ASKS.append(ctx.run_id)
    timeout = input.get("timeout")
    try:
        answer = await ctx.interrupt(
            "Refund or replace the order?",
            choices=["refund", "replace"],
            timeout=float(timeout) if isinstance(timeout, (int, float)) else None,
            default=input.get("default", NO_DEFAULT),
        )
    except QuestionUnanswered as unanswered:
        return {"unanswered": unanswered.step_key, "why": unanswered.message}
    return {"answer": answer}


async def test_a_hosted_handler_asks_a_person_and_is_asked_once_across_its_suspension(
    kernel: Kernel, client: AgentClient
) -> None:
    ASKS.clear()
    async with serving(kernel, agents=[py_interviewer]):
        run = await client.create_run("py_interviewer", input={}, hosted=True)
        approval_id = await pending_approval(client, run.id, "the handler's question")
        [asked] = await client.list_approvals(run_id=run.id)
        assert asked.question and asked.step_key == "question:agent#0", asked
        assert asked.answer_schema == {"enum": ["refund", "replace"]}, asked.answer_schema
        with pytest.raises(KernelError) as refused:
            await client.answer(approval_id, "both", decider="alice")
        assert "answer_json" in str(refused.value)

        await client.answer(approval_id, "replace", decider="alice")
        events = await within("the run to end", ended_events(client, run.id), 30)
        assert events[-1].type == "run:completed", events[-1]
        assert (await client.get_run(run.id)).run.output == {"answer": "replace"}
        assert [e.type for e in events].count("question:asked") == 1
        assert ASKS.count(run.id) >= 1


async def test_a_handler_s_question_past_its_timeout_records_its_default_or_raises(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, agents=[py_interviewer]):
        defaulted = await client.create_run(
            "py_interviewer", input={"timeout": 0.3, "default": "refund"}, hosted=True
        )
        unanswered = await client.create_run("py_interviewer", input={"timeout": 0.3}, hosted=True)
        await within("the runs to end", ended_events(client, defaulted.id), 30)
        await within("the runs to end", ended_events(client, unanswered.id), 30)
        assert (await client.get_run(defaulted.id)).run.output == {"answer": "refund"}
        output = (await client.get_run(unanswered.id)).run.output
        assert output["unanswered"] == "question:agent#0", output
        assert "expired unanswered" in output["why"], output


@tool
async def py_pick(ctx: ToolContext) -> object:
    """Asks which box to ship, waiting briefly, and takes the default."""
    return await ctx.ask("Which box?", choices=["small", "large"], timeout=0.3, default="small")


async def test_a_tool_body_s_question_offers_choices_and_its_expiry_records_the_default(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, py_pick):
        run = await client.create_run("picker")
        [result] = (await client.call_turn(run.id, 0, [ToolCall("py_pick", {})])).results
        assert result.outcome == "ok" and result.output == "small", result


async def test_an_agent_s_own_code_asks_a_person_and_asked_again_gets_the_recorded_answer(
    kernel: Kernel, client: AgentClient
) -> None:
    run = await client.create_run("refunds")
    asking = asyncio.ensure_future(
        client.ask(run.id, "refund-1", "Refund order 9?", returns=Shipping, approvers=["ops"])
    )
    approval_id = await pending_approval(client, run.id, "the agent's question")
    [asked] = await client.list_approvals(run_id=run.id)
    assert asked.step_key == "question:run#refund-1" and asked.decided_by == "agent:refunds"
    with pytest.raises(KernelError) as other:
        await client.ask(run.id, "refund-1", "Refund order 10?")
    assert "replay_input_changed" in str(other.value)

    await client.answer(approval_id, {"ok": True, "note": "refund"}, decider="alice")
    answer = await asyncio.wait_for(asking, 30)
    assert answer == Shipping(ok=True, note="refund")
    again = await client.ask(run.id, "refund-1", "Refund order 9?", returns=Shipping)
    assert again == answer, "asked again, the recorded answer"
    events = await client.list_events(run.id)
    assert [e.type for e in events].count("question:asked") == 1

    declined = asyncio.ensure_future(client.ask(run.id, "refund-2", "Refund order 11?"))
    second = await pending_approval(client, run.id, "the second question")
    await client.reject(second, decider="bob", reason="not today")
    with pytest.raises(QuestionUnanswered) as unanswered:
        await asyncio.wait_for(declined, 30)
    assert unanswered.value.step_key == "question:run#refund-2"
    assert "declined by bob (not today)" in unanswered.value.message


@agent
async def py_asks_in_a_step(ctx: AgentContext, input: None) -> str:
    """Asks a person inside a local step, where nothing may wait on something durable."""

    async def inside(info: object) -> object:
        return await ctx.ask("Inside?")

    try:
        await ctx.step("inside", inside)
    except NestedDurableOperationError as error:
        return type(error).__name__
    return "asked"


async def test_a_question_inside_a_local_step_raises_to_the_handler_and_asks_nobody(
    kernel: Kernel, client: AgentClient
) -> None:
    async with serving(kernel, agents=[py_asks_in_a_step]):
        run = await client.create_run("py_asks_in_a_step", hosted=True)
        events = await within("the run to end", ended_events(client, run.id), 30)
        assert (await client.get_run(run.id)).run.output == "NestedDurableOperationError"
        assert not any(e.type == "question:asked" for e in events)
