"""Times tool calls through the kernel to a Python worker, and prints the figures.

    python3 python/scripts/bench.py --kernel 127.0.0.1:50051 [--calls 1000] [--runs 32]

A worker serves `py_bench_echo` (an `async def` that returns its argument), in this process or
in another one (`--worker only` there, `--worker elsewhere` here); an agent client submits one
call per turn, first one run at a time (latency: p50, p99), then `--runs` runs at once
(throughput). The figures include the SDK's cost on both ends.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from kernel_sdk import AgentClient, ToolCall, ToolContext, Worker, tool


@tool(read_only=True)
async def py_bench_echo(ctx: ToolContext, n: int) -> int:
    """Returns its argument."""
    return n


async def _run_calls(client: AgentClient, calls: int, latencies: list[float]) -> None:
    run = await client.create_run("py-bench")
    for turn in range(calls):
        started = time.perf_counter()
        result = await client.call_turn(run.id, turn, [ToolCall("py_bench_echo", {"n": turn})])
        latencies.append(time.perf_counter() - started)
        if result.results[0].output != turn:
            raise RuntimeError(f"call {turn} returned {result.results[0]}")
    await client.complete_run(run.id)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernel", default="127.0.0.1:50051")
    parser.add_argument("--calls", type=int, default=1000, help="calls in each phase")
    parser.add_argument("--runs", type=int, default=32, help="runs at once in the second phase")
    parser.add_argument(
        "--worker",
        choices=["here", "only", "elsewhere"],
        default="here",
        help="serve the tool in this process (here), only serve it (only: run the timing from "
        "another process with --worker elsewhere), or time a worker started so",
    )
    args = parser.parse_args()

    worker = Worker(
        args.kernel, [py_bench_echo], name="py-bench", max_concurrency=64, ephemeral_tools=True
    )
    if args.worker == "only":
        await worker.run()
        return
    serving = None
    if args.worker == "here":
        serving = asyncio.create_task(worker.run(handle_signals=False))
        await worker.wait_ready()
    async with AgentClient(args.kernel) as client:
        await _run_calls(client, 20, [])  # warm-up: connections, caches
        latencies: list[float] = []
        await _run_calls(client, args.calls, latencies)
        cuts = statistics.quantiles(latencies, n=100)
        print(f"sequential: {args.calls} calls, p50 {_ms(cuts[49])}, p99 {_ms(cuts[98])}")

        per_run = max(1, args.calls // args.runs)
        started = time.perf_counter()
        await asyncio.gather(*(_run_calls(client, per_run, []) for _ in range(args.runs)))
        elapsed = time.perf_counter() - started
        total = per_run * args.runs
        print(
            f"{args.runs} runs at once: {total} calls in {elapsed:.2f} s, {total / elapsed:.0f} calls/s"
        )
    if serving is not None:
        worker.stop()
        await serving


if __name__ == "__main__":
    asyncio.run(main())
