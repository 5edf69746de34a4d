"""Tools: `@tool` makes a tool from a typed function, the way the seeds' `@tool` does.

The JSON Schema of the arguments comes from the type hints (through pydantic: models, dataclasses,
`Literal`, `Annotated[..., Field(description=...)]`, defaults), the description from the
docstring's first paragraph, and the options from the decorator's keyword arguments, each checked
when the decorator is applied. The decorated function stays callable as itself, so unit tests call
it directly. Its fingerprint is the one the kernel checks, and equals what the Rust SDK computes
for the same definition.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import math
import re
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Literal, get_args, get_type_hints, overload

import pydantic
import pydantic_core

from ._typed import Typed as _Typed
from .canonical import tool_fingerprint
from .context import RunCalls, ToolContext, current_run
from .errors import ToolCallRejected, ToolError

Idempotency = Literal["safe_to_retry", "at_most_once"]
Risk = Literal["low", "medium", "high", "critical"]
ApprovalPredicate = Callable[[dict[str, Any]], Any]
"""A tool's approval predicate as Python code: takes the call's arguments, returns whether a
person must approve the call (a bool, or an awaitable of one). Pure: it sees nothing but the
arguments, and its answer is recorded with the call."""

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


class ToolDefinitionError(ValueError):
    """A tool definition the kernel would refuse, or an option with a value it does not take,
    named and explained."""


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

    def __post_init__(self) -> None:
        if not _whole(self.max_attempts) or self.max_attempts < 1:
            raise ValueError(
                _takes("RetryPolicy.max_attempts", "a whole number >= 1", self.max_attempts)
            )
        for name in ("initial_interval", "max_interval"):
            value = getattr(self, name)
            if not _finite(value) or value < 0:
                raise ValueError(_takes(f"RetryPolicy.{name}", "seconds (a number >= 0)", value))
        if not _finite(self.backoff_coefficient) or self.backoff_coefficient < 1:
            raise ValueError(
                _takes("RetryPolicy.backoff_coefficient", "a number >= 1", self.backoff_coefficient)
            )

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
    """A tool's declared behaviour; the kernel enforces it.

    Built, each option is checked: a value it does not take raises `ToolDefinitionError` naming
    the option and what it takes. Durations are given in seconds or as a `datetime.timedelta`
    and kept in seconds.
    """

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
    secret: tuple[str, ...] = ()
    """Secret fields, by name: a top-level field of the arguments, or of a dict result, that the
    kernel never records, shows or exports in clear (a keyed hash is recorded in its place; an
    argument's value reaches the tool only in its dispatch, a result's reaches nobody). A
    parameter typed `pydantic.SecretStr` is secret without being named: its schema says
    `writeOnly`."""
    cost_per_call: float = 0.0
    cache_ttl: float | None = None
    """Seconds a `read_only` tool's success is served again for identical calls."""
    requires_approval: bool | str | ApprovalPredicate = False
    """`True` asks a person before every call; a string is a CEL predicate over `args`, which the
    kernel evaluates; a callable is a predicate over the arguments (a dict) that the worker
    evaluates when the kernel asks, before the call is recorded."""
    approval_timeout: float | None = None
    """Seconds an unanswered approval waits before the call is denied; `None` waits for ever."""
    strip_nulls: bool = False
    per_second: float | None = None
    """The tool's own limit: at most this many calls start each second on average, counted by the
    kernel across every worker, run and replica; calls past it wait in the kernel's queue."""
    burst: int | None = None
    """At most this many calls start at once after a quiet spell (needs `per_second`); `None`
    takes one second's worth."""
    at_once: int | None = None
    """The tool's own limit: at most this many calls run at once, across every worker, run and
    replica; calls past it wait in the kernel's queue."""

    def __post_init__(self) -> None:
        for option in fields(self):
            checked = _OPTION_CHECKS[option.name](option.name, getattr(self, option.name))
            object.__setattr__(self, option.name, checked)
        if self.burst is not None and self.per_second is None:
            raise ToolDefinitionError("burst bounds a rate: set per_second too")
        if self.read_only and self.writes:
            raise ToolDefinitionError(
                "read_only and writes cannot both be set: a tool with side effects is not read_only"
            )
        if self.cache_ttl is not None and not self.read_only:
            raise ToolDefinitionError(
                "cache_ttl needs read_only: only a tool without side effects may have its "
                "results served again"
            )


# What each option takes, said after "<option> takes ".
_DURATION = "seconds (a number > 0) or a datetime.timedelta"
_FLAG = "True or False"
_STRINGS = "a list of non-empty strings"
_NAME_RULE = "1 to 64 characters from [a-zA-Z0-9_-]"
_CEL_EXAMPLE = '"args.cents > 10000"'
_VERSION = 'a non-empty string such as "2"'
_ALIASES = {"retry": "retries", "risk_level": "risk"}
"""Other spellings of an option: Pyrula's and the Rust SDK's `retry`, Rewyn's `risk_level`."""


def _takes(option: str, what: str, value: Any) -> str:
    return f"{option} takes {what}, not {value!r}"


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _finite(value: Any) -> bool:
    return _number(value) and math.isfinite(value)


def _seconds(option: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif _number(value):
        seconds = float(value)
    else:
        raise ToolDefinitionError(_takes(option, _DURATION, value))
    if not math.isfinite(seconds) or seconds <= 0:
        raise ToolDefinitionError(_takes(option, _DURATION, value))
    return seconds


def _retries(option: str, value: Any) -> int | RetryPolicy | None:
    if value is None or isinstance(value, RetryPolicy) or (_whole(value) and value >= 0):
        return value  # type: ignore[no-any-return]
    raise ToolDefinitionError(
        _takes(option, "a number of retries (a whole number >= 0) or a RetryPolicy", value)
    )


def _flag(option: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ToolDefinitionError(_takes(option, _FLAG, value))
    return value


def _one_of(choices: tuple[str, ...], *, optional: bool = False) -> Callable[[str, Any], Any]:
    shown = ", ".join(f'"{choice}"' for choice in choices)

    def check(option: str, value: Any) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, str) or value not in choices:
            raise ToolDefinitionError(_takes(option, f"one of {shown}", value))
        return value

    return check


def _owner(option: str, value: Any) -> str | None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise ToolDefinitionError(_takes(option, "a non-empty string", value))
    return value


def _strings(option: str, value: Any) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ToolDefinitionError(_takes(option, _STRINGS, value) + f" (write [{value!r}] for one)")
    if not isinstance(value, list | tuple) or not all(
        isinstance(item, str) and item.strip() for item in value
    ):
        raise ToolDefinitionError(_takes(option, _STRINGS, value))
    return tuple(value)


def _cost(option: str, value: Any) -> float:
    if not _finite(value) or value < 0:
        raise ToolDefinitionError(_takes(option, "a finite number >= 0", value))
    return value  # type: ignore[no-any-return]


def _rate(option: str, value: Any) -> float | None:
    if value is not None and (not _finite(value) or not 0 < value <= 1_000_000):
        raise ToolDefinitionError(
            _takes(option, "a number of calls a second above 0, or None", value)
        )
    return value  # type: ignore[no-any-return]


def _calls(option: str, value: Any) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise ToolDefinitionError(
            _takes(option, "a whole number of calls, 1 or more, or None", value)
        )
    return value


def _approval(option: str, value: Any) -> bool | str | ApprovalPredicate:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip():
        return value
    if callable(value):
        return value  # type: ignore[no-any-return]
    raise ToolDefinitionError(
        _takes(
            option,
            f"True, False, a CEL predicate over args such as {_CEL_EXAMPLE}, "
            "or a function of the arguments",
            value,
        )
    )


_OPTION_CHECKS: dict[str, Callable[[str, Any], Any]] = {
    "timeout": _seconds,
    "retries": _retries,
    "idempotency": _one_of(get_args(Idempotency)),
    "read_only": _flag,
    "writes": _flag,
    "owner": _owner,
    "risk": _one_of(get_args(Risk), optional=True),
    "permissions": _strings,
    "resources": _strings,
    "secret": _strings,
    "cost_per_call": _cost,
    "cache_ttl": _seconds,
    "requires_approval": _approval,
    "approval_timeout": _seconds,
    "strip_nulls": _flag,
    "per_second": _rate,
    "burst": _calls,
    "at_once": _calls,
}


def _options(what: str, given: Mapping[str, Any]) -> ToolOptions:
    """`given` as a tool's options, each checked; an error names `what` (`tool 'refund'`), the
    option and what it takes. Refuses an option there is no such thing as."""
    options: dict[str, Any] = {}
    for option, value in given.items():
        canonical = _ALIASES.get(option, option)
        if canonical not in _OPTION_CHECKS:
            raise ToolDefinitionError(
                f"{what}: there is no option '{option}'; the options are "
                f"{', '.join(_OPTION_CHECKS)} (and retry, the same as retries; risk_level, the "
                "same as risk)"
            )
        if canonical in options:
            aliases = [alias for alias, same in _ALIASES.items() if same == canonical]
            twins = " and ".join([*aliases, canonical])
            raise ToolDefinitionError(
                f"{what}: {canonical} is given twice ({twins} are the same option)"
            )
        options[canonical] = value
    try:
        return ToolOptions(**options)
    except ToolDefinitionError as error:
        raise ToolDefinitionError(f"{what}: {error}") from None


def _tool_name(what: str, value: Any) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ToolDefinitionError(f"{what}: {_takes('name', _NAME_RULE, value)}")
    return value


def _description(what: str, value: Any) -> str:
    if not isinstance(value, str):
        raise ToolDefinitionError(f"{what}: {_takes('description', 'a string', value)}")
    if not value.strip():
        raise ToolDefinitionError(f"{what} has no description: add a docstring or description=...")
    return value


def _version(what: str, value: Any) -> str:
    """A version is a string; a whole number is taken as its digits, as the Rust SDK does."""
    if _whole(value) and value >= 0:
        return str(value)
    if not isinstance(value, str) or not value.strip():
        raise ToolDefinitionError(f"{what}: {_takes('version', _VERSION, value)}")
    return value


def _schema_option(what: str, option: str, value: Any) -> dict[str, Any] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ToolDefinitionError(f"{what}: {_takes(option, 'a JSON Schema as a dict', value)}")
    return dict(value)


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


def _return_annotation(function: Callable[..., Any]) -> Any:
    """What `function` says it returns (an `async def`'s awaited value), or `None` when it says
    nothing a type checker could resolve (a lambda, a partial, a forward reference)."""
    try:
        hint = get_type_hints(function).get("return")
    except Exception:  # noqa: BLE001 (an annotation that cannot be resolved is no annotation)
        return None
    return None if hint is Any else hint


class Tool:
    """A tool: its definition and the function that runs it; calling it calls the function.

    The worker runs it with `invoke`: the arguments are validated into the function's parameter
    types (pydantic models and dataclasses built from their JSON), a plain `def` runs in a
    thread, an `async def` on the worker's loop, and an async generator streams (each item but
    the last is progress, the last is the result).
    """

    __name__: str
    """The function's name, as `functools.wraps` copies it (frameworks read a tool's name here)."""

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
        # What a call through the kernel gives back: a stream's last item as recorded.
        self._returns = _Typed(None if self.streams else _return_annotation(function))
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the tool. Inside a run (a hosted handler, and the tasks it starts) the call goes
        through the kernel, as the model's calls do: recorded as a step, checked by the policy,
        asked of a person when the tool or a rule says so, and replayed from the record after a
        crash; it is then awaited whatever the function's kind, and gives the function's return
        type back. Outside any run (a unit test, a script) the function just runs.
        """
        run = current_run.get()
        if run is None:
            return self.function(*args, **kwargs)
        return self._through(run, args, kwargs)

    async def _through(self, run: RunCalls, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        result = await run.call(self.name, self._arguments_of(args, kwargs))
        outcome = result.outcome
        if outcome == "ok":
            return self._typed(result.output)
        if outcome == "denied":
            # What the model would read (the Rebuno page's "<tool> not allowed. reason: ...").
            return result.content
        if outcome in ("rejected", "expired"):
            raise ToolCallRejected(self.name, result.content, expired=outcome == "expired")
        raise ToolError(result.content, "fatal")

    def _prepared(self, arguments: dict[str, Any]) -> dict[str, Any]:
        """Arguments a model gave, as the kernel should record them (`wrap_tool`'s
        `transform_args`; as they are for any other tool)."""
        return arguments

    def _arguments_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        """A direct call's arguments as the JSON the kernel records. The context parameter may be
        passed (any value: the handler's own context, as `await refund(ctx, cents=5)`) or left
        out; parameters left out keep their defaults, filled in where the tool runs."""
        signature = inspect.signature(self.function)
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            if not self.takes_context:
                raise
            bound = signature.bind(None, *args, **kwargs)
        values = dict(bound.arguments)
        if self.takes_context:
            values.pop(next(iter(signature.parameters)), None)
        if self.arguments is None:
            # The function takes the arguments as one dict.
            [whole] = values.values() or [{}]
            values = dict(whole)
        jsonable: dict[str, Any] = pydantic_core.to_jsonable_python(values)
        return jsonable

    def _typed(self, output: Any) -> Any:
        """A recorded result as the function's declared return type (a model, a dataclass), as
        the tool itself returned it."""
        try:
            return self._returns.of(output)
        except pydantic.ValidationError as error:
            raise ToolError(
                f"tool '{self.name}': its recorded result does not fit its return type: {error}",
                "fatal",
            ) from None

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


@overload
def tool(function: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    function: str | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    version: str | int = "1",
    args_schema: dict[str, Any] | None = None,
    schema: dict[str, Any] | None = None,
    timeout: float | timedelta | None = None,
    retries: int | RetryPolicy | None = None,
    retry: int | RetryPolicy | None = None,
    idempotency: Idempotency = "safe_to_retry",
    read_only: bool = False,
    writes: bool = False,
    owner: str | None = None,
    risk: Risk | None = None,
    risk_level: Risk | None = None,
    permissions: tuple[str, ...] | list[str] = (),
    resources: tuple[str, ...] | list[str] = (),
    secret: tuple[str, ...] | list[str] = (),
    cost_per_call: float = 0.0,
    cache_ttl: float | timedelta | None = None,
    requires_approval: bool | str | ApprovalPredicate = False,
    approval_timeout: float | timedelta | None = None,
    strip_nulls: bool = False,
    per_second: float | None = None,
    burst: int | None = None,
    at_once: int | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    function: Callable[..., Any] | str | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    version: str | int = "1",
    args_schema: dict[str, Any] | None = None,
    schema: dict[str, Any] | None = None,
    **options: Any,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Makes a tool of a function: `@tool`, `@tool()`, `@tool("charge")` (the tool's name first),
    `@tool("charge", idempotency="at_most_once")` or `@tool(name="charge", writes=True)`.

    Every option is checked when the decorator is applied: a value it does not take raises
    `ToolDefinitionError` naming the tool, the option and what it takes, and so does what the
    kernel would refuse at registration (an invalid name, no description, `read_only` with
    `writes`, a `cache_ttl` on a tool that is not `read_only`). Durations (`timeout`, `cache_ttl`,
    `approval_timeout`) are seconds or a `datetime.timedelta`; the seed pages' spellings work too:
    `retry` for `retries`, `risk_level` for `risk`, `schema` for `args_schema` (the JSON Schema
    that replaces the one derived from the signature).
    """
    if isinstance(function, str):
        if name is not None:
            raise ToolDefinitionError(
                f"tool '{function}': the name is given twice, first and as name={name!r}"
            )
        function, name = None, function
    elif function is not None and not callable(function):
        raise ToolDefinitionError(
            f"@tool takes a function, or the tool's name as a string, not {function!r}"
        )
    # The options given, as the overload above types them, each checked as `wrap_tool`'s are: an
    # option there is no such thing as is refused naming the options there are. Unset ones keep
    # `ToolOptions`'s defaults; `retry` and `retries` (`risk` and `risk_level`) count only when not
    # None, so giving both is refused as given twice.
    given = {
        option: value
        for option, value in options.items()
        if value is not None or option not in ("retry", "retries", "risk", "risk_level")
    }

    def decorate(function: Callable[..., Any]) -> Tool:
        shown = name if name is not None else getattr(function, "__name__", repr(function))
        what = f"tool '{shown}'"
        if isinstance(function, Tool) or not callable(function):
            raise ToolDefinitionError(f"{what}: @tool decorates a function, not {function!r}")
        tool_name = _tool_name(what, shown)
        options = _options(what, given)
        text = _description(
            what, description if description is not None else _summary(function.__doc__)
        )
        if inspect.isgeneratorfunction(function):
            raise ToolDefinitionError(
                f"{what} is a plain generator: make it an async generator "
                "(async def ... yield) to stream its progress"
            )
        if schema is not None and args_schema is not None:
            raise ToolDefinitionError(
                f"{what}: the schema is given twice (schema and args_schema are the same option)"
            )
        if schema is not None:
            override = _schema_option(what, "schema", schema)
        else:
            override = _schema_option(what, "args_schema", args_schema)
        derived, takes_context, arguments = _schema(function)
        given_schema = derived if override is None else _object_schema(override)
        definition = _checked(tool_name, text, given_schema, _version(what, version), options)
        return Tool(definition, function, takes_context, arguments)

    if function is not None:
        return decorate(function)
    return decorate


def _checked(
    name: str, description: str, schema: dict[str, Any], version: str, options: ToolOptions
) -> ToolDefinition:
    """The definition, once it holds nothing the kernel would refuse at registration."""
    if schema.get("type", "object") != "object":
        raise ToolDefinitionError(f"tool '{name}': the arguments' schema must describe an object")
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
    version: str | int = "1",
    to_result: Callable[[Any], Any] | None = None,
    transform_args: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    **options: Any,
) -> Tool:
    """A tool that is not a plain function (Rebuno's `wrap_tool`): `invoke` takes the arguments as
    a dict (and may return an awaitable); `args_schema` is their JSON Schema, given whole or as
    just `properties` and `required`; `to_result` maps what `invoke` returns before it is
    recorded; `transform_args` maps the arguments before a direct call records them and before
    `invoke` runs (so it should give the same dict when given its own output: stripping nulls,
    say). The keyword options are `@tool`'s, each checked as `@tool` checks it; one `@tool` does
    not have is refused.

    The tool looks to a framework like a function of its schema: `__name__` is `name`, `__doc__`
    the description, `__input_schema__` the schema, and its signature takes each property as a
    keyword (the required ones without a default), and any other keyword too, which is passed
    through. Called directly it takes those keywords, or the arguments as one dict.
    """
    what = f"tool '{name}'"
    tool_name = _tool_name(what, name)
    for option, value, wanted in (
        ("invoke", invoke, "a callable over the arguments dict"),
        ("to_result", to_result, "a callable over what invoke returns, or None"),
        ("transform_args", transform_args, "a callable over the arguments dict, or None"),
    ):
        if not callable(value) and (option == "invoke" or value is not None):
            raise ToolDefinitionError(f"{what}: {_takes(option, wanted, value)}")
    schema = _schema_option(what, "args_schema", args_schema)
    if schema is None:
        raise ToolDefinitionError(
            f"{what}: {_takes('args_schema', 'a JSON Schema as a dict', None)}"
        )
    definition = _checked(
        tool_name,
        _description(what, description),
        _object_schema(schema),
        _version(what, version),
        _options(what, options),
    )

    def mapped(result: Any) -> Any:
        return result if to_result is None else to_result(result)

    def given(args: dict[str, Any]) -> dict[str, Any]:
        return dict(args) if transform_args is None else transform_args(dict(args))

    call: Callable[[dict[str, Any]], Any]
    if inspect.iscoroutinefunction(invoke):

        async def call_async(args: dict[str, Any]) -> Any:
            return mapped(await invoke(given(args)))

        call = call_async
    else:
        # Run in a thread by the worker; an awaitable it returns is awaited on the loop.
        def call_sync(args: dict[str, Any]) -> Any:
            result = invoke(given(args))
            if inspect.isawaitable(result):
                awaited = result

                async def later() -> Any:
                    return mapped(await awaited)

                return later()
            return mapped(result)

        call = call_sync

    return _WrappedTool(definition, call, given)


_JSON_TYPES: dict[str, Any] = {
    "string": str,
    "integer": int,
    "number": float,
    "boolean": bool,
    "array": list,
    "object": dict,
    "null": type(None),
}


def _signature_of(schema: dict[str, Any]) -> inspect.Signature:
    """A keyword-only signature of a schema's properties (required ones first, without a
    default), and `**kwargs` for the rest, as frameworks read a function's parameters."""
    properties = schema.get("properties") or {}
    required = [name for name in schema.get("required") or [] if name in properties]
    optional = [name for name in properties if name not in required]
    parameters = []
    for name in [*required, *optional]:
        if not name.isidentifier():
            continue
        kind = (properties[name] or {}).get("type") if isinstance(properties[name], dict) else None
        annotation = _JSON_TYPES.get(kind, Any) if isinstance(kind, str) else Any
        default = inspect.Parameter.empty if name in required else None
        if default is None and annotation is not Any:
            annotation = annotation | None
        parameters.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
            )
        )
    parameters.append(inspect.Parameter("kwargs", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(parameters)


class _WrappedTool(Tool):
    """A `wrap_tool` tool: a function of its schema to anything that introspects it."""

    def __init__(
        self,
        definition: ToolDefinition,
        call: Callable[[dict[str, Any]], Any],
        given: Callable[[dict[str, Any]], dict[str, Any]],
    ) -> None:
        super().__init__(definition, call, takes_context=False)
        self._given = given
        self.__name__ = definition.name
        self.__qualname__ = definition.name
        self.__doc__ = definition.description
        self.__signature__ = _signature_of(definition.input_schema)
        self.__input_schema__ = definition.input_schema
        # functools.update_wrapper pointed it at the inner closure, whose signature is not
        # the tool's.
        vars(self).pop("__wrapped__", None)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Calls the tool with its arguments as keywords (or as one dict): through the kernel
        inside a run, as any tool; outside one, `invoke` just runs."""
        arguments = self._one_dict(args, kwargs)
        run = current_run.get()
        if run is None:
            return self.function(arguments)
        return self._through(run, (), arguments)

    def _one_dict(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        if not args:
            return dict(kwargs)
        if len(args) == 1 and isinstance(args[0], Mapping) and not kwargs:
            return dict(args[0])
        raise TypeError(f"{self.name}() takes its arguments as keywords, or as one dict")

    def _prepared(self, arguments: dict[str, Any]) -> dict[str, Any]:
        return self._given(arguments)

    def _arguments_of(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
        jsonable: dict[str, Any] = pydantic_core.to_jsonable_python(self._given(kwargs))
        return jsonable
