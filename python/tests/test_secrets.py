"""Secret fields from Python against the real kernel: a parameter typed `pydantic.SecretStr` (secret
by its schema's `writeOnly`) and a result field named by `@tool(secret=...)`. The tool gets the
planted value; the record holds keyed hashes in their places, so a resubmitted call is still
replayed; and nothing the kernel keeps or shows holds the value: its SQLite files, the API's run
and events, the console's page."""

from __future__ import annotations

import asyncio
import urllib.request
from pathlib import Path
from typing import Any

import pydantic
from conftest import serving
from harness import Kernel
from pydantic import SecretStr

from kernel_sdk import AgentClient, CallOutcome, ToolCall, ToolContext, tool

PLANTED = "hunter2-QZ7xK"
SEEN: list[int] = []


@tool(secret=("session_token",))
async def py_login(ctx: ToolContext, user: str, api_key: SecretStr) -> dict[str, Any]:
    """Signs `user` in with `api_key`, returning a session token."""
    SEEN.append(len(api_key.get_secret_value()))
    return {"user": user, "session_token": f"tok-{api_key.get_secret_value()}"}


def _read(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        text: str = response.read().decode()
        return text


def _database(folder: Path) -> str:
    data = b"".join(
        (folder / name).read_bytes()
        for name in ("kernel.db", "kernel.db-wal", "kernel.db-shm")
        if (folder / name).exists()
    )
    return data.decode("utf-8", "replace")


async def test_a_secret_str_reaches_the_tool_and_nothing_the_kernel_keeps_or_shows_holds_it(
    tmp_path: Path,
) -> None:
    SEEN.clear()
    kernel = Kernel(tmp_path, "--http-listen", "127.0.0.1:0")
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, py_login):
            run = await client.create_run("signing-in")
            turn = [ToolCall("py_login", {"user": "ada", "api_key": PLANTED})]
            [result] = (await client.call_turn(run.id, 0, turn)).results
            assert result.outcome == CallOutcome.OK, result
            assert [len(PLANTED)] == SEEN, "the tool got the value"
            assert result.output["user"] == "ada"
            assert result.output["session_token"]["$secret"].startswith("hmac-sha256:")
            [again] = (await client.call_turn(run.id, 0, turn)).results
            assert again.replayed and [len(PLANTED)] == SEEN, "a replay, by the keyed hash"

            detail = await client.get_run(run.id)
            [step] = detail.steps
            assert step.arguments["api_key"]["$secret"].startswith("hmac-sha256:")
            events = await client.list_events(run.id)
            page = await asyncio.to_thread(_read, f"http://{kernel.http}/runs/{run.id}")
        for what, text in (
            ("the call's result", result.content),
            ("the run", repr(detail)),
            ("the events", repr(events)),
            ("the console's page", page),
            ("the database", _database(tmp_path)),
        ):
            assert "hunter2" not in text, f"{what} holds the secret"
    finally:
        kernel.stop()


class Card(pydantic.BaseModel):
    holder: str
    number: SecretStr


CHARGED: list[str] = []


@tool
async def py_charge_cards(ctx: ToolContext, cards: list[Card]) -> int:
    """Charges each card."""
    CHARGED.extend(card.number.get_secret_value() for card in cards)
    return len(cards)


async def test_a_secret_inside_each_element_of_a_list_is_marked_and_reaches_the_tool(
    tmp_path: Path,
) -> None:
    CHARGED.clear()
    kernel = Kernel(tmp_path)
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, py_charge_cards):
            run = await client.create_run("charging")
            cards = [
                {"holder": "ada", "number": "4111-hunter2"},
                {"holder": "bo", "number": "5500-hunter2"},
            ]
            turn = [ToolCall("py_charge_cards", {"cards": cards})]
            [result] = (await client.call_turn(run.id, 0, turn)).results
            assert result.outcome == CallOutcome.OK and result.output == 2, result
            assert CHARGED == ["4111-hunter2", "5500-hunter2"], "the tool got each value"
            [step] = (await client.get_run(run.id)).steps
            recorded = step.arguments["cards"]
            assert [card["holder"] for card in recorded] == ["ada", "bo"]
            assert all(card["number"]["$secret"].startswith("hmac-sha256:") for card in recorded)
        assert "hunter2" not in _database(tmp_path), "the database holds a card's number"
    finally:
        kernel.stop()
