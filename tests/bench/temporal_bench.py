"""The kernel benchmark's workload on Temporal: N no-op activity calls in sequence, then N at once.

Run by temporal_compare.sh against a `temporal server start-dev`; prints one JSON object:

    python temporal_bench.py --address 127.0.0.1:7233 --n 300

A worker in this process serves the workflows and the activity on its own task queue. Each
workload runs once as a warm-up with a few calls, then once timed, from workflow start to result.
"""

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

TASK_QUEUE = "kernel-bench"
TIMEOUT = timedelta(seconds=60)


@activity.defn
async def noop() -> None:
    return None


@workflow.defn
class Sequential:
    @workflow.run
    async def run(self, n: int) -> int:
        for _ in range(n):
            await workflow.execute_activity(noop, start_to_close_timeout=TIMEOUT)
        return n


@workflow.defn
class Concurrent:
    @workflow.run
    async def run(self, n: int) -> int:
        calls = [
            workflow.execute_activity(noop, start_to_close_timeout=TIMEOUT)
            for _ in range(n)
        ]
        await asyncio.gather(*calls)
        return n


async def timed(client: Client, workflow_run, n: int) -> float:
    started = time.perf_counter()
    done = await client.execute_workflow(
        workflow_run,
        n,
        id=f"kernel-bench-{uuid.uuid4()}",
        task_queue=TASK_QUEUE,
    )
    elapsed = time.perf_counter() - started
    assert done == n, f"workflow returned {done}, expected {n}"
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--address", default="127.0.0.1:7233")
    parser.add_argument("--namespace", default="default")
    parser.add_argument("--n", type=int, default=300)
    args = parser.parse_args()

    client = await Client.connect(args.address, namespace=args.namespace)
    async with Worker(
        client,
        task_queue=TASK_QUEUE,
        workflows=[Sequential, Concurrent],
        activities=[noop],
        max_concurrent_activities=max(args.n, 100),
    ):
        await timed(client, Sequential.run, 5)
        await timed(client, Concurrent.run, 5)
        sequential = await timed(client, Sequential.run, args.n)
        concurrent = await timed(client, Concurrent.run, args.n)

    print(
        json.dumps(
            {
                "n": args.n,
                "sequential_s": sequential,
                "sequential_ms_per_call": sequential * 1000 / args.n,
                "concurrent_s": concurrent,
                "concurrent_calls_per_s": args.n / concurrent,
            }
        )
    )


if __name__ == "__main__":
    asyncio.run(main())
    # With the figures out, skip interpreter finalization: temporalio 1.35.0's core threads have
    # aborted it there ("PyGILState_Release: thread state ... must be current when releasing").
    sys.stdout.flush()
    os._exit(0)
