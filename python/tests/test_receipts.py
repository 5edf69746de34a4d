"""Receipts from Python against the real kernel: a run's calls exported with `client.receipts`,
chained by hash, and checked offline by `kernelctl receipts verify`; a changed answer is refused."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

from conftest import serving
from harness import Kernel, binary

from kernel_sdk import AgentClient, ToolCall, tool


@tool
async def py_charge(cents: int) -> dict[str, int]:
    """Charges `cents`."""
    return {"charged": cents}


def line(receipt: dict[str, Any]) -> str:
    """A receipt as `runs receipts` prints it: canonical JSON."""
    return json.dumps(receipt, separators=(",", ":"), sort_keys=True, ensure_ascii=False)


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary("kernelctl")), "receipts", "verify", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )


async def test_a_runs_receipts_chain_and_verify_offline_and_a_changed_one_is_refused(
    kernel: Kernel, client: AgentClient, tmp_path: Path
) -> None:
    async with serving(kernel, py_charge):
        run = await client.create_run("billing")
        calls = [ToolCall("py_charge", {"cents": cents}) for cents in (100, 250)]
        await client.call_turn(run.id, 0, calls)
        receipts = await client.receipts(run.id)
    assert [r["receipt"]["n"] for r in receipts] == [1, 2]
    assert (
        receipts[0]["receipt"]["prev"] == ""
        and receipts[1]["receipt"]["prev"] == receipts[0]["hash"]
    )
    first = receipts[0]["receipt"]
    assert first["tool"] == "py_charge" and first["status"] == "succeeded", first
    arguments = {json.dumps({"cents": c}, separators=(",", ":")) for c in (100, 250)}
    hashed = {hashlib.sha256(a.encode()).hexdigest() for a in arguments}
    assert {r["receipt"]["arguments_sha256"] for r in receipts} == hashed

    path = tmp_path / "receipts.jsonl"
    path.write_text("".join(line(r) + "\n" for r in receipts))
    checked = verify(path)
    assert checked.returncode == 0, checked.stderr
    assert f"ok: 2 receipts of run {run.id}" in checked.stdout

    receipts[1]["receipt"]["cost"] = 0.01
    path.write_text("".join(line(r) + "\n" for r in receipts))
    refused = verify(path)
    assert refused.returncode == 1 and "line 2" in refused.stderr, refused.stderr
