"""Tools: `@tool` makes a tool from a typed function, the way the seeds' `@tool` does.

The JSON Schema of the arguments comes from the type hints (through pydantic: models, dataclasses,
`Literal`, `Annotated[..., Field(description=...)]`, defaults), the description from the
docstring's first paragraph, and the options from the decorator's keyword arguments. The decorated
function stays callable as itself, so unit tests call it directly. Its fingerprint is the one the
kernel checks, and equals what the Rust SDK computes for the same definition.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import re
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Literal, get_type_hints

import pydantic
import pydantic_core

from .canonical import tool_fingerprint
from .context import ToolContext
from .errors import ToolError

Idempotency = Literal["safe_to_retry", "at_most_once"]
Risk = Literal["low", "medium", "high", "critical"]

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ToolDefinitionError(ValueError):
    """A tool definition the kernel would refuse, named and explained."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how fast the kernel tries a failed call again. Fatal and poison errors are
    never retried.
    """

    max_attempts: int
    """Attempts in all, the first included; 1 means no retry."""
    initial_interval: float = 0.0
    """Seconds before the first retry."""
    backoff_coefficient: float = 1.0
    """What the wait is multiplied by after each retry."""
    max_interval: float = 0.0
    """The longest wait, in seconds."""

    @classmethod
    def retries(cls, retries: int) -> RetryPolicy:
        """`retries` retries after the first attempt, with no wait in between."""
        return cls(max_attempts=retries + 1)

    @classmethod
    def exponential(
        cls, max_attempts: int, initial_interval: float, max_interval: float
    ) -> RetryPolicy:
        """Up to `max_attempts` attempts, waiting `initial_interval` seconds, doubling up to
        `max_interval`."""
        return cls(max_attempts, initial_interval, 2.0, max_interval)


@dataclass(frozen=True)
class ToolOptions:
    """A tool's declared behaviour; the kernel enforces it."""

    timeout: float | None = None
    """Seconds per attempt; `None` takes the kernel's default."""
    retries: int | RetryPolicy | None = None
    """Retries of a retryable error after the first attempt, or a whole `RetryPolicy`; `None`
    takes the kernel's default."""
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
    """A tool: its definition and the function that runs it; calling it calls the function.

    The worker runs it with `invoke`: the arguments are validated into the function's parameter
    types (pydantic models and dataclasses built from their JSON), a plain `def` runs in a
    thread, an `async def` on the worker's loop, and an async generator streams (each item but
    the last is progress, the last is the result).
    """

    def __init__(
        self,
        definition: ToolDefinition,
        function: Callable[..., Any],
        takes_context: bool,
        arguments: type[pydantic.BaseModel] | None = None,
    ):
        self.definition = definition
        self.function = function
        self.takes_context = takes_context
        self.arguments = arguments
        """The model the arguments are validated into; `None` passes them as one dict."""
        self.streams = inspect.isasyncgenfunction(function)
        self.blocking = not (self.streams or inspect.iscoroutinefunction(function))
        """A plain `def`: it runs in a thread, which a cancel cannot interrupt."""
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

    async def invoke(
        self, ctx: ToolContext, args: dict[str, Any], *, executor: Executor | None = None
    ) -> Any:
        """Runs one call with its JSON arguments; returns the result as JSON-ready data, or
        raises `ToolError` (any other exception is a retryable error naming its type). A plain
        `def` runs on `executor` (the loop's default without one).
        """
        positional: list[Any] = [ctx] if self.takes_context else []
        if self.arguments is None:
            positional.append(args)
            keywords: dict[str, Any] = {}
        else:
            keywords = self._validated(args)
        if self.streams:
            result = await self._streamed(ctx, self.function(*positional, **keywords))
        elif inspect.iscoroutinefunction(self.function):
            result = await self.function(*positional, **keywords)
        else:
            call = functools.partial(self.function, *positional, **keywords)
            result = await asyncio.get_running_loop().run_in_executor(
                executor, contextvars.copy_context().run, call
            )
        if inspect.isawaitable(result):
            result = await result
        return _jsonable(self.name, result)

    def _validated(self, args: dict[str, Any]) -> dict[str, Any]:
        assert self.arguments is not None
        try:
            model = self.arguments.model_validate(args)
        except pydantic.ValidationError as error:
            raise ToolError.fatal(f"invalid arguments for tool '{self.name}': {error}") from None
        return {name: getattr(model, name) for name in type(model).model_fields}

    async def _streamed(self, ctx: ToolContext, items: AsyncIterator[Any]) -> Any:
        """Every item but the last goes out as progress; the last is the result."""
        last: Any = _NOTHING
        async for item in items:
            if last is not _NOTHING:
                _report(ctx, self.name, last)
            last = item
        if last is _NOTHING:
            raise ToolError.fatal(
                f"tool '{self.name}' streamed nothing: its last item is the call's result"
            )
        return last


_NOTHING = object()


def _report(ctx: ToolContext, name: str, item: Any) -> None:
    """A string item is a status line; any other is data, with its JSON as the line."""
    if isinstance(item, str):
        ctx.progress(item)
        return
    data = _jsonable(name, item)
    ctx.progress(pydantic_core.to_json(data).decode(), data=data)


def _jsonable(name: str, value: Any) -> Any:
    """A tool's value as JSON data: models, dataclasses, dates and the like converted."""
    try:
        return pydantic_core.to_jsonable_python(value)
    except pydantic_core.PydanticSerializationError as error:
        raise ToolError.fatal(f"tool '{name}' returned a value that is not JSON: {error}") from None


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


def _schema(
    function: Callable[..., Any],
) -> tuple[dict[str, Any], bool, type[pydantic.BaseModel]]:
    """The arguments' JSON Schema, whether the first parameter is the context, and the model
    the arguments are validated into."""
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
    return schema, takes_context, model


def tool(
    function: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    version: str = "1",
    args_schema: dict[str, Any] | None = None,
    timeout: float | None = None,
    retries: int | RetryPolicy | None = None,
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
        if inspect.isgeneratorfunction(function):
            raise ToolDefinitionError(
                f"tool '{function.__name__}' is a plain generator: make it an async generator "
                "(async def ... yield) to stream its progress"
            )
        derived, takes_context, arguments = _schema(function)
        schema = derived if args_schema is None else _object_schema(args_schema)
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
        definition = _checked(tool_name, text, schema, version, options)
        return Tool(definition, function, takes_context, arguments)

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


def _object_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A schema given whole, or as just `properties` and `required`."""
    whole = dict(schema)
    whole.setdefault("type", "object")
    whole.setdefault("properties", {})
    return whole


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
    definition = _checked(
        name, description, _object_schema(args_schema), version, ToolOptions(**options)
    )

    def mapped(result: Any) -> Any:
        return result if to_result is None else to_result(result)

    call: Callable[[dict[str, Any]], Any]
    if inspect.iscoroutinefunction(invoke):

        async def call_async(args: dict[str, Any]) -> Any:
            return mapped(await invoke(args))

        call = call_async
    else:
        # Run in a thread by the worker; an awaitable it returns is awaited on the loop.
        def call_sync(args: dict[str, Any]) -> Any:
            result = invoke(args)
            if inspect.isawaitable(result):
                awaited = result

                async def later() -> Any:
                    return mapped(await awaited)

                return later()
            return mapped(result)

        call = call_sync

    return Tool(definition, call, takes_context=False)
