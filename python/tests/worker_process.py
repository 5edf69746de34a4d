"""A Python worker in its own process, for the tests that kill one or read what it says:
`worker_process.py ADDR [--hang] [--slow SECONDS] [--name NAME] [--agents | --frameworks]
[--no-logging-config]`. Each tool prints `started tool=... key=... attempt=...` before its effect;
with `--hang` it then waits for ever (until the process is killed), else it returns after `--slow`
seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import logging

import hosted_agents

from kernel_sdk import ToolContext, Worker, tool

HANG = False
SLOW = 0.0


async def _effect(ctx: ToolContext, value: object) -> dict[str, object]:
    """Says it started, then hangs or takes `SLOW` seconds."""
    print(
        f"started tool={ctx.tool_name} key={ctx.idempotency_key} attempt={ctx.attempt}", flush=True
    )
    if HANG:
        await asyncio.Event().wait()
    await asyncio.sleep(SLOW)
    return {"value": value, "key": ctx.idempotency_key, "attempt": ctx.attempt}


@tool(idempotency="at_most_once", writes=True, timeout=60)
async def py_charge(ctx: ToolContext, cents: int) -> dict[str, object]:
    """Charges a card once: a lost worker makes the call indeterminate, never a second charge."""
    return await _effect(ctx, cents)


@tool(retries=3, timeout=60)
async def py_fetch(ctx: ToolContext, url: str) -> dict[str, object]:
    """Fetches a page: safe to run again, so a lost worker's call runs elsewhere."""
    return await _effect(ctx, url)


async def main() -> None:
    global HANG, SLOW
    parser = argparse.ArgumentParser()
    parser.add_argument("kernel")
    parser.add_argument("--hang", action="store_true")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds each call takes")
    parser.add_argument("--name", default="py-worker")
    parser.add_argument("--agents", action="store_true", help="host the tests' agents too")
    parser.add_argument(
        "--frameworks",
        action="store_true",
        help="serve framework_agents.py's agents and tools, and nothing else",
    )
    parser.add_argument("--max-concurrency", type=int, default=8)
    parser.add_argument(
        "--no-logging-config",
        action="store_true",
        help="configure no logging, as a worker built from the Python guide's snippets does",
    )
    args = parser.parse_args()
    HANG, SLOW = args.hang, args.slow
    if not args.no_logging_config:
        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s %(message)s")
    tools = [py_charge, py_fetch]
    hosted = []
    if args.agents:
        hosted_agents.HANGS["value"] = HANG
        tools += hosted_agents.TOOLS
        hosted = hosted_agents.AGENTS
    if args.frameworks:
        # Imported only here: the frameworks take seconds to import.
        import framework_agents

        tools, hosted = list(framework_agents.TOOLS), list(framework_agents.AGENTS)
    worker = Worker(
        args.kernel,
        tools,
        agents=hosted,
        name=args.name,
        max_concurrency=args.max_concurrency,
    )
    await worker.run()


if __name__ == "__main__":
    asyncio.run(main())
