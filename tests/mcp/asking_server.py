"""An MCP server on the official `mcp` package whose tool asks its client's user before it acts:
`ship(release)` elicits a form (`ok`, a boolean, and a `note`) through a resolver, which the
package sends as the negotiated revision asks (at 2026-07-28, an `input_required` result whose
answer comes back with the retried call; at 2025-11-25, an `elicitation/create` request mid-call).
Each answer the tool acts on is appended to the file named by the first argument.

    python3 asking_server.py LEDGER_FILE
"""

import sys
from pathlib import Path
from typing import Annotated

from mcp.server.mcpserver import Elicit, ElicitationResult, MCPServer, Resolve
from pydantic import BaseModel

LEDGER = Path(sys.argv[1])
server = MCPServer("asking")


class Go(BaseModel):
    """What the user decides."""

    ok: bool
    note: str = ""


def ask(release: str) -> Elicit[Go]:
    """The question the tool needs answered before it ships."""
    return Elicit(f"Ship {release} to production?", Go)


@server.tool()
async def ship(
    release: str, decision: Annotated[ElicitationResult[Go], Resolve(ask)]
) -> str:
    """Ships `release` once its user says so."""
    if decision.action != "accept":
        outcome = f"held {release}: {decision.action}"
    elif decision.data.ok:
        outcome = f"shipped {release} ({decision.data.note})"
    else:
        outcome = f"held {release}: {decision.data.note}"
    record(outcome)
    return outcome


def record(outcome: str) -> None:
    """Appends what the tool did to the ledger (a line, synchronously: it is one small write)."""
    with LEDGER.open("a") as ledger:
        ledger.write(outcome + "\n")


if __name__ == "__main__":
    server.run()
