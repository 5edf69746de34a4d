"""The kernel's HTTP listener without a browser: `/metrics` after known work, its gauges across a
kernel SIGKILL, and `/healthz` and `/readyz`."""

from __future__ import annotations

import asyncio
import re
import urllib.error
import urllib.request
from pathlib import Path

from conftest import serving
from harness import Kernel, Process, binary, eventually, scrape

from kernel_sdk import AgentClient, ToolCall, ToolContext, tool


def get(kernel: Kernel, path: str) -> tuple[int, str]:
    with urllib.request.urlopen(f"http://{kernel.http}{path}", timeout=10) as response:
        return response.status, response.read().decode()


@tool(cost_per_call=0.5)
async def add(ctx: ToolContext, a: int, b: int) -> int:
    """Adds, at a price."""
    return a + b


@tool(requires_approval=True)
async def wire_money(ctx: ToolContext, cents: int) -> int:
    """Waits for a person."""
    return cents


async def test_metrics_count_known_work_and_the_gauges_survive_a_restart(tmp_path: Path) -> None:
    kernel = Kernel(tmp_path, "--http-listen", "127.0.0.1:0")
    try:
        async with AgentClient(kernel.addr) as client, serving(kernel, add, wire_money):
            done = await client.create_run("counted")
            calls = [ToolCall("add", {"a": n, "b": 1}) for n in range(3)]
            calls.append(ToolCall("add", {"a": "two", "b": 1}))
            await client.call_turn(done.id, 0, calls)
            await client.complete_run(done.id, None)
            failed = await client.create_run("counted")
            await client.fail_run(failed.id, "on purpose")
            waiting = await client.create_run("counted")
            gated = asyncio.create_task(
                client.call_turn(waiting.id, 0, [ToolCall("wire_money", {"cents": 5})])
            )
            await eventually(
                "the gated call's approval to be asked",
                lambda: client.list_approvals(run_id=waiting.id),
            )

            samples = scrape(kernel)
            assert samples['kernel_tool_calls_total{tool="add",outcome="ok"}'] == 3
            assert samples['kernel_tool_calls_total{tool="add",outcome="invalid_arguments"}'] == 1
            # Three attempts ran at 0.5 each; the refused call cost nothing.
            assert samples['kernel_tool_cost_total{tool="add"}'] == 1.5
            assert samples['kernel_tool_call_duration_seconds_count{tool="add"}'] == 4
            # Three ran on the worker; the refused one never started.
            assert samples["kernel_tool_call_run_seconds_count"] == 3
            assert samples["kernel_tool_call_schedule_to_start_seconds_count"] == 3
            assert samples["kernel_store_commit_seconds_count"] >= 1
            assert (
                samples["kernel_store_batch_commands_sum"]
                >= samples["kernel_store_batch_commands_count"]
            )
            assert samples["kernel_worker_sessions"] == 1
            assert samples["kernel_leased_calls"] == 0
            assert samples["kernel_approvals_waiting"] == 1
            assert samples['kernel_runs{status="completed"}'] == 1
            assert samples['kernel_runs{status="failed"}'] == 1
            assert samples['kernel_runs{status="blocked"}'] == 1
            gated.cancel()

        kernel.restart()
        # Counters start again with the process; what the store holds does not drift.
        samples = scrape(kernel)
        assert samples['kernel_runs{status="completed"}'] == 1
        assert samples['kernel_runs{status="failed"}'] == 1
        assert samples['kernel_runs{status="blocked"}'] == 1
        assert samples["kernel_approvals_waiting"] == 1
        assert samples["kernel_worker_sessions"] == 0
        assert not any(name.startswith("kernel_tool_calls_total") for name in samples)
    finally:
        kernel.stop()


async def test_health_and_readiness_answer_for_load_balancers(tmp_path: Path) -> None:
    kernel = Kernel(tmp_path, "--http-listen", "127.0.0.1:0")
    try:
        assert await asyncio.to_thread(get, kernel, "/healthz") == (200, "ok\n")
        assert await asyncio.to_thread(get, kernel, "/readyz") == (200, "ready\n")
        status, body = await asyncio.to_thread(get, kernel, "/metrics")
        assert status == 200 and re.search(
            r"^kernel_runs\{status=\"running\"\} 0$", body, re.MULTILINE
        )
    finally:
        kernel.stop()


def test_a_page_asked_for_by_another_name_or_posted_from_another_site_is_refused(
    tmp_path: Path,
) -> None:
    kernel = Kernel(tmp_path, "--http-listen", "127.0.0.1:0")
    try:
        rebound = urllib.request.Request(
            f"http://{kernel.http}/runs",
            headers={"Host": f"evil.example:{kernel.http.split(':')[1]}"},
        )
        try:
            urllib.request.urlopen(rebound, timeout=10)
            raise AssertionError("a request for another host name was answered")
        except urllib.error.HTTPError as refused:
            assert refused.code == 421
        forged = urllib.request.Request(
            f"http://{kernel.http}/approvals/any",
            data=b"decision=approve&decider=mallory",
            headers={"Origin": "https://evil.example"},
        )
        try:
            urllib.request.urlopen(forged, timeout=10)
            raise AssertionError("a cross-site post was answered")
        except urllib.error.HTTPError as refused:
            assert refused.code == 403
    finally:
        kernel.stop()


def test_a_console_beyond_loopback_needs_keys(tmp_path: Path) -> None:
    kernel = Process(
        [
            str(binary("kernel")),
            "--db",
            str(tmp_path / "k.db"),
            "--listen",
            "127.0.0.1:0",
            "--http-listen",
            "0.0.0.0:0",
        ],
        "kernel",
    )
    assert kernel.process.wait(timeout=30) != 0
    assert any("--http-listen" in line and "--auth-file" in line for line in kernel.lines), (
        kernel.log()
    )
