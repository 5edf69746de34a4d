"""The Python quickstart of docs/getting-started/python.md, as a new user runs it: the example
worker and agent against the kernel, then `kernelctl runs show` on the run the agent printed;
and the LangGraph example of docs/guides/frameworks.md, started and shown with kernelctl."""

from __future__ import annotations

import asyncio
import subprocess
import sys

from harness import REPO, Kernel, Process, binary


async def test_the_example_worker_and_agent_run_and_kernelctl_shows_the_calls(
    kernel: Kernel,
) -> None:
    worker = Process(
        [sys.executable, str(REPO / "python/examples/worker.py"), "--kernel", kernel.addr],
        "example worker",
    )
    try:
        await worker.said("worker session open")
        agent = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, str(REPO / "python/examples/agent.py"), "--kernel", kernel.addr],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert agent.returncode == 0, agent.stderr
        run_id = agent.stdout.strip()
        assert "turn 1 #0 summarize: " in agent.stderr, "the stream's progress came live"
        assert "turn 2 #0 refund_order ok: refunded 500 cents" in agent.stderr

        show = [str(binary("kernelctl")), "--addr", f"http://{kernel.addr}", "runs", "show", run_id]
        shown = (
            await asyncio.to_thread(
                subprocess.run, show, capture_output=True, text=True, timeout=30, check=True
            )
        ).stdout
        assert "status:      completed" in shown
        for tool in ("lookup_order", "word_count", "summarize", "refund_order"):
            assert tool in shown
        assert "py-demo-worker" in shown and "at_most_once" in shown

        # The example worker's hosted agent, started the way the Python getting-started guide shows.
        start = [
            str(binary("kernelctl")),
            "--addr",
            f"http://{kernel.addr}",
            "runs",
            "start",
            "py_trip_planner",
            "--input",
            '{"destination": "Lisbon"}',
            "--follow",
        ]
        followed = await asyncio.to_thread(
            subprocess.run, start, capture_output=True, text=True, timeout=60
        )
        assert followed.returncode == 0, followed.stderr
        assert "subagent:result" in followed.stdout and "run:completed" in followed.stdout
        assert '"notes":["visit Lisbon","visit the coast"]' in followed.stdout

        assert await asyncio.to_thread(worker.terminate) == 0, worker.log()
        assert any("worker stopped" in line for line in worker.lines)
    finally:
        worker.stop()


async def test_the_langgraph_example_runs_as_the_frameworks_guide_says(kernel: Kernel) -> None:
    worker = Process(
        [sys.executable, str(REPO / "python/examples/langgraph_agent.py"), "--kernel", kernel.addr],
        "langgraph example worker",
    )
    kernelctl = [str(binary("kernelctl")), "--addr", f"http://{kernel.addr}"]
    try:
        await worker.said("worker session open")
        start = [*kernelctl, "runs", "start", "support_graph"]
        start += ["--input", '"refund order A-1001"', "--follow"]
        followed = await asyncio.to_thread(
            subprocess.run, start, capture_output=True, text=True, timeout=60
        )
        assert followed.returncode == 0, (followed.stderr, worker.log())
        assert "run:completed" in followed.stdout, followed.stdout
        assert "refunded 4200 cents on A-1001" in followed.stdout, followed.stdout
        # kernelctl says `run <id> started` on stderr.
        run_id = followed.stderr.split()[1]

        show = [*kernelctl, "runs", "show", run_id]
        shown = (
            await asyncio.to_thread(
                subprocess.run, show, capture_output=True, text=True, timeout=30, check=True
            )
        ).stdout
        assert "status:      completed" in shown, shown
        for step in ("lookup_order", "refund_order", "step:model#0", "step:model#2"):
            assert step in shown, shown
        assert "py-langgraph-worker" in shown and "at_most_once" in shown
    finally:
        worker.stop()
