"""Fair shares against the real kernel from Python: one tenant's burst queued for a tool limit
does not starve another tenant's single call, the steps read back their run's share, and
`/metrics` says what each tenant spent."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import serving
from harness import Kernel, kernel_with_policy, scrape

from kernel_sdk import AgentClient, ToolCall, tool

POLICY = """
default: allow
limits:
  - tools: "py_fetch"
    at_once: 1
fair_shares:
  label: tenant
"""

BURST = 40
ORDER: list[str] = []


@tool(cost_per_call=0.25)
async def py_fetch(tenant: str, n: int) -> str:
    """Fetches page `n` for `tenant` from a provider that serves one call at a time."""
    ORDER.append(tenant)
    await asyncio.sleep(0.01)
    return f"page {n} for {tenant}"


@pytest.fixture
def shared(tmp_path: Path) -> Iterator[Kernel]:
    """A kernel whose policy runs one `py_fetch` at a time, shared by the runs' `tenant` label."""
    with kernel_with_policy(tmp_path, POLICY) as started:
        yield started


async def test_a_single_call_is_not_starved_by_another_tenant_s_burst(shared: Kernel) -> None:
    ORDER.clear()
    async with AgentClient(shared.addr) as client, serving(shared, py_fetch, max_concurrency=4):
        burst = await client.create_run("crawler", labels={"tenant": "a"})
        single = await client.create_run("lookup", labels={"tenant": "b"})
        calls = [ToolCall("py_fetch", {"tenant": "a", "n": n}) for n in range(BURST)]
        burst_turn = asyncio.create_task(client.call_turn(burst.id, 0, calls))
        while len(ORDER) < 3:
            await asyncio.sleep(0.005)
        ran_before = len(ORDER)
        done = await client.call_turn(single.id, 0, [ToolCall("py_fetch", {"tenant": "b", "n": 0})])
        assert done.results[0].ok, done.results
        assert all(r.ok for r in (await burst_turn).results)
        # The burst's calls that ran after the single call was submitted and before it: the one
        # being handed out then, and the burst's next, level with it in virtual time.
        passed = ORDER.index("b") - ran_before
        assert passed <= 3, f"{passed} of the burst's calls went first: {ORDER}"
        assert ORDER.count("a") == BURST
        steps = (await client.get_run(single.id)).steps
        assert [step.share for step in steps] == ["b"]
        assert {step.share for step in (await client.get_run(burst.id)).steps} == {"a"}
        # What each tenant spent, from the kernel's metrics.
        samples = scrape(shared)
        by_share = 'kernel_tool_{}_by_share_total{{share="{}",tool="py_fetch"}}'
        assert samples[by_share.format("calls", "a")] == BURST
        assert samples[by_share.format("calls", "b")] == 1
        assert samples[by_share.format("cost", "a")] == BURST * 0.25
        assert samples[by_share.format("cost", "b")] == 0.25
