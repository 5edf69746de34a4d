"""A model loop in Python over the kernel, with a scripted "model" that answers in the OpenAI
Chat Completions shape (no network, no key): each of its tool calls runs through the kernel,
and the results go back as `tool` messages. Prints the run id on stdout.

    python python/examples/agent.py --kernel 127.0.0.1:50051
    cargo run -p kernelctl -- runs show <RUN_ID>

With `--refund-cents 25000` the refund waits for a person: the agent prints the approval's id
and the `kernelctl approvals approve` command, and goes on once someone answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
from typing import Any

from kernel_sdk import AgentClient, CallResult, Interruption, TurnProgress
from kernel_sdk.adapters import calls_from_openai_chat, openai_chat_results, openai_chat_tools


def scripted_model(messages: list[dict[str, Any]], refund_cents: int) -> dict[str, Any]:
    """What a model would answer: tool calls for each step of the task, then the final text."""
    asked = sum(1 for m in messages if m["role"] == "assistant")

    def call(n: int, name: str, **arguments: Any) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        return {"id": f"call_{asked}_{n}", "type": "function", "function": function}

    script = [
        [call(0, "lookup_order", order_id="A-1001"), call(1, "word_count", text="where is it")],
        [call(0, "summarize", order_id="A-1001")],
        [call(0, "refund_order", order_id="A-1001", cents=refund_cents)],
    ]
    if asked < len(script):
        return {"role": "assistant", "content": None, "tool_calls": script[asked]}
    return {"role": "assistant", "content": "Refunded; the customer was told."}


async def main() -> None:
    parser = argparse.ArgumentParser(description="A scripted model loop over the kernel")
    parser.add_argument("--kernel", default=os.environ.get("KERNEL_ADDR", "127.0.0.1:50051"))
    parser.add_argument("--api-key", default=os.environ.get("KERNEL_API_KEY"))
    parser.add_argument("--refund-cents", type=int, default=500)
    args = parser.parse_args()

    async with AgentClient(args.kernel, api_key=args.api_key) as kernel:
        offered = [t for t in await kernel.list_tools() if t.workers]
        tools = openai_chat_tools(offered)  # what a real model request would pass as tools=
        print(f"offering {len(tools)} tools to the model", file=sys.stderr)
        run = await kernel.create_run("py-support-agent", input={"ticket": 42})
        messages: list[dict[str, Any]] = [{"role": "user", "content": "Refund order A-1001."}]
        for turn in range(10):
            reply = scripted_model(messages, args.refund_cents)
            messages.append(reply)
            calls = calls_from_openai_chat(reply)
            if not calls:
                break
            results: list[CallResult] = []
            async for event in kernel.submit_turn(run.id, turn, calls):
                if isinstance(event, TurnProgress):
                    print(
                        f"turn {turn} #{event.position} {event.tool}: {event.message}",
                        file=sys.stderr,
                    )
                elif isinstance(event, Interruption):
                    print(
                        f"turn {turn} #{event.position} {event.tool} waits for approval "
                        f"{event.approval_id}; answer it with:\n"
                        f"    cargo run -p kernelctl -- approvals approve {event.approval_id} "
                        '--as alice --reason "ticket 42"',
                        file=sys.stderr,
                    )
                else:
                    results.append(event)
                    print(
                        f"turn {turn} #{event.position} {event.tool} {event.outcome}: {event.content}",
                        file=sys.stderr,
                    )
            messages.extend(openai_chat_results(calls, results))
        await kernel.complete_run(run.id, {"answer": messages[-1]["content"]})
        print(run.id)


if __name__ == "__main__":
    asyncio.run(main())
