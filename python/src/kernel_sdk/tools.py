"""Tools: `@tool` makes a tool from a typed function, the way the seeds' `@tool` does.

The JSON Schema of the arguments comes from the type hints (through pydantic: models, dataclasses,
`Literal`, `Annotated[..., Field(description=...)]`, defaults), the description from the
docstring's first paragraph, and the options from the decorator's keyword arguments. The decorated
function stays callable as itself, so unit tests call it directly. Its fingerprint is the one the
kernel checks, and equals what the Rust SDK computes for the same definition.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

import pydantic

from .canonical import tool_fingerprint

Idempotency = Literal["safe_to_retry", "at_most_once"]
Risk = Literal["low", "medium", "high", "critical"]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ToolDefinitionError(ValueError):
    """A tool definition the kernel would refuse, named and explained."""


class ToolContext:
    """What a call knows about itself: its run, identity, attempt and idempotency key.

    The worker builds one per call; `ToolContext.for_test()` makes one for unit tests. A tool takes
    it as its first parameter (annotated `ToolContext`), or not at all.
    """

    def __init__(
        self,
        *,
        run_id: str,
        step_key: str,
        call_id: str | None,
        turn: int,
        attempt: int,
        idempotency_key: str,
    ) -> None:
        self.run_id = run_id
        self.step_key = step_key
        self.call_id = call_id
        self.turn = turn
        self.attempt = attempt
        self.idempotency_key = idempotency_key

    @classmethod
    def for_test(cls) -> ToolContext:
        """A context for calling a tool in a unit test: run `test-run`, step `t0/p0`, attempt 1."""
        return cls(
            run_id="test-run",
            step_key="t0/p0",
            call_id=None,
            turn=0,
            attempt=1,
            idempotency_key="ik_test",
        )


@dataclass(frozen=True)
class ToolOptions:
    """A tool's declared behaviour; the kernel enforces it."""

    timeout: float | None = None
    """Seconds per attempt; `None` takes the kernel's default."""
    retries: int | None = None
    """Retries of a retryable error after the first attempt."""
    idempotency: Idempotency = "safe_to_retry"
    read_only: bool = False
    writes: bool = False
    owner: str | None = None
    risk: Risk | None = None
    permissions: tuple[str, ...] = ()
    resources: tuple[str, ...] = ()
    cost_per_call: float = 0.0
    cache_ttl: float | None = None
    """Seconds a `read_only` tool's success is served again for identical calls."""
    requires_approval: bool | str = False
    """`True` asks a person before every call; a string is a CEL predicate over `args`."""
    approval_timeout: float | None = None
    strip_nulls: bool = False


@dataclass(frozen=True)
class ToolDefinition:
    """What the kernel and the model see of a tool."""

    name: str
    description: str
    input_schema: dict[str, Any]
    version: str = "1"
    options: ToolOptions = field(default_factory=ToolOptions)

    @property
    def fingerprint(self) -> str:
        """sha256 over the canonical JSON of name, description, input schema and version."""
        return tool_fingerprint(self.name, self.description, self.input_schema, self.version)


class Tool:
    """A tool: its definition and the function that runs it; calling it calls the function."""

    def __init__(
        self, definition: ToolDefinition, function: Callable[..., Any], takes_context: bool
    ):
        self.definition = definition
        self.function = function
        self.takes_context = takes_context
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    @property
    def name(self) -> str:
        """The tool id the model and the kernel see."""
        return self.definition.name

    @property
    def fingerprint(self) -> str:
        """The fingerprint the kernel checks at registration."""
        return self.definition.fingerprint


def _summary(doc: str | None) -> str:
    """The docstring's first paragraph, its lines joined."""
    if not doc:
        return ""
    lines = inspect.cleandoc(doc).splitlines()
    paragraph: list[str] = []
    for line in lines:
        if not line.strip():
            if paragraph:
                break
            continue
        paragraph.append(line.strip())
    return " ".join(paragraph)


def _schema(function: Callable[..., Any]) -> tuple[dict[str, Any], bool]:
    """The arguments' JSON Schema, and whether the first parameter is the context."""
    signature = inspect.signature(function)
    hints = get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {}
    takes_context = False
    for index, (name, parameter) in enumerate(signature.parameters.items()):
        annotation = hints.get(name, Any)
        if index == 0 and annotation is ToolContext:
            takes_context = True
            continue
        if parameter.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise ToolDefinitionError(
                f"tool '{function.__name__}': *{name} cannot be described to a model; "
                "name each argument"
            )
        default = ... if parameter.default is inspect.Parameter.empty else parameter.default
        fields[name] = (annotation, default)
    model = pydantic.create_model(
        f"{function.__name__}_arguments",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    schema = model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        # pydantic titles each property after its name; the name is already the key.
        if isinstance(prop, dict):
            prop.pop("title", None)
    schema.setdefault("properties", {})
    return schema, takes_context


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    version: str = "1",
    timeout: float | None = None,
    retries: int | None = None,
    idempotency: Idempotency = "safe_to_retry",
    read_only: bool = False,
    writes: bool = False,
    owner: str | None = None,
    risk: Risk | None = None,
    permissions: tuple[str, ...] | list[str] = (),
    resources: tuple[str, ...] | list[str] = (),
    cost_per_call: float = 0.0,
    cache_ttl: float | None = None,
    requires_approval: bool | str = False,
    approval_timeout: float | None = None,
    strip_nulls: bool = False,
) -> Any:
    """Makes a tool of a function: `@tool`, `@tool()`, or `@tool(name="charge", writes=True)`.

    Refuses at decoration what the kernel would refuse at registration: an invalid name, no
    description (the model would see none), `read_only` with `writes`, and a `cache_ttl` on a tool
    that is not `read_only`.
    """

    def decorate(function: Callable[..., Any]) -> Tool:
        tool_name = name or function.__name__
        text = description if description is not None else _summary(function.__doc__)
        schema, takes_context = _schema(function)
        options = ToolOptions(
            timeout=timeout,
            retries=retries,
            idempotency=idempotency,
            read_only=read_only,
            writes=writes,
            owner=owner,
            risk=risk,
            permissions=tuple(permissions),
            resources=tuple(resources),
            cost_per_call=cost_per_call,
            cache_ttl=cache_ttl,
            requires_approval=requires_approval,
            approval_timeout=approval_timeout,
            strip_nulls=strip_nulls,
        )
        return Tool(_checked(tool_name, text, schema, version, options), function, takes_context)

    if function is not None:
        return decorate(function)
    return decorate


def _checked(
    name: str, description: str, schema: dict[str, Any], version: str, options: ToolOptions
) -> ToolDefinition:
    """The definition, once it holds nothing the kernel would refuse at registration."""
    if not _NAME.match(name):
        raise ToolDefinitionError(
            f"invalid tool name '{name}': use 1 to 64 characters from [a-zA-Z0-9_-]"
        )
    if not description.strip():
        raise ToolDefinitionError(
            f"tool '{name}': the model would see no description; add a docstring or description=..."
        )
    if schema.get("type", "object") != "object":
        raise ToolDefinitionError(f"tool '{name}': the arguments' schema must describe an object")
    if options.read_only and options.writes:
        raise ToolDefinitionError(f"tool '{name}' cannot be both read_only and writes")
    if options.cache_ttl is not None and not options.read_only:
        raise ToolDefinitionError(
            f"tool '{name}' has a cache_ttl but is not read_only: only a tool without "
            "side effects may have its results served again"
        )
    if isinstance(options.requires_approval, str) and not options.requires_approval.strip():
        raise ToolDefinitionError(f"tool '{name}' has an empty requires_approval predicate")
    return ToolDefinition(name, description, schema, version, options)


def wrap_tool(
    name: str,
    invoke: Callable[[dict[str, Any]], Any],
    *,
    description: str,
    args_schema: dict[str, Any],
    version: str = "1",
    to_result: Callable[[Any], Any] | None = None,
    **options: Any,
) -> Tool:
    """A tool that is not a plain function (Rebuno's `wrap_tool`): `invoke` takes the arguments as
    a dict (and may return an awaitable); `args_schema` is their JSON Schema, given whole or as
    just `properties` and `required`; `to_result` maps what `invoke` returns before it is recorded.
    The keyword options are `@tool`'s.
    """
    schema = dict(args_schema)
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    definition = _checked(name, description, schema, version, ToolOptions(**options))

    def call(args: dict[str, Any]) -> Any:
        result = invoke(args)
        if to_result is None:
            return result
        if inspect.isawaitable(result):
            awaited = result

            async def mapped() -> Any:
                return to_result(await awaited)

            return mapped()
        return to_result(result)

    return Tool(definition, call, takes_context=False)
