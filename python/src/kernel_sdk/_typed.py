"""A recorded JSON value as the type its code declared: shared by tools, steps and subagents."""

from __future__ import annotations

from typing import Any

import pydantic


class Typed:
    """A recorded JSON value as the type a tool, a step or a subagent was declared to give (the
    JSON as it is without one). The validator is built when first needed."""

    def __init__(self, hint: Any) -> None:
        self._hint = hint
        self._adapter: pydantic.TypeAdapter[Any] | None = None

    def of(self, value: Any) -> Any:
        """`value` as the declared type; raises `pydantic.ValidationError` when it does not fit."""
        if self._hint is None:
            return value
        if self._adapter is None:
            self._adapter = pydantic.TypeAdapter(self._hint)
        return self._adapter.validate_python(value)
