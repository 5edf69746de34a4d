"""What a question to a person carries to the kernel, whoever asks it: a tool body
(`ToolContext.ask`), a hosted handler (`AgentContext.ask`) or an agent's own code
(`AgentClient.ask`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pydantic

from .canonical import to_canonical

NO_DEFAULT: Any = object()
"""`ask`'s `default` when none is given: an expiry raises (a default may be `None`, JSON null)."""


def question_fields(
    question: str,
    *,
    schema: dict[str, Any] | None,
    returns: Any,
    choices: Sequence[str],
    default: Any,
    approvers: Sequence[str],
    timeout: float | None,
) -> dict[str, Any]:
    """The fields a question's request shares (`AskPersonRequest`, `AgentAskRequest`): the schema is
    `returns`'s when no `schema` is given, the default and the schema canonical JSON, the timeout in
    milliseconds (0: none)."""
    if schema is None and returns is not None:
        schema = pydantic.TypeAdapter(returns).json_schema()
    return {
        "question": question,
        "answer_schema_json": "" if schema is None else to_canonical(schema),
        "choices": list(choices),
        "default_answer_json": "" if default is NO_DEFAULT else to_canonical(default),
        "approvers": list(approvers),
        "timeout_ms": 0 if timeout is None else max(1, round(timeout * 1000)),
    }
