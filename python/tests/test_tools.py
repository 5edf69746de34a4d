"""`@tool`, `wrap_tool`: schemas from type hints, descriptions from docstrings, the decorator's
forms, and every option checked when it is applied, named with what it takes."""

import asyncio
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Annotated, Any, Literal

import pydantic
import pytest

from kernel_sdk import (
    RetryPolicy,
    ToolContext,
    ToolDefinitionError,
    tool,
    tool_fingerprint,
    wrap_tool,
)
from kernel_sdk._wire import tool_options, tool_spec


class Address(pydantic.BaseModel):
    street: str
    city: str


@dataclass
class Window:
    start: int
    end: int


@tool(
    timeout=10,
    retries=2,
    idempotency="at_most_once",
    writes=True,
    risk="high",
    owner="payments",
    permissions=["billing:write"],
    resources=["ledger:{customer_id}"],
    cost_per_call=0.25,
    requires_approval="args.cents > 10000",
    version="3",
)
async def refund(ctx: ToolContext, customer_id: str, cents: int, reason: str | None = None) -> str:
    """Issue a refund to a customer.
    Amounts are in cents.

    This paragraph is for people, not the model.
    """
    return f"refunded {cents} to {customer_id} under {ctx.idempotency_key}"


@tool
def forecast(
    city: Annotated[str, pydantic.Field(description="Where")],
    days: Annotated[int, pydantic.Field(ge=1, le=14)] = 3,
    units: Literal["metric", "imperial"] = "metric",
    ship_to: Address | None = None,
    window: Window | None = None,
    tags: list[str] | None = None,
) -> dict[str, Any]:
    """Weather for a city."""
    return {"city": city, "days": days}


def test_the_schema_comes_from_the_type_hints() -> None:
    schema = forecast.definition.input_schema
    assert schema["type"] == "object"
    assert schema["required"] == ["city"]
    assert schema["additionalProperties"] is False
    props = schema["properties"]
    assert props["city"] == {"type": "string", "description": "Where"}
    assert props["days"]["minimum"] == 1 and props["days"]["maximum"] == 14
    assert props["days"]["default"] == 3
    assert props["units"]["enum"] == ["metric", "imperial"]
    assert "$defs" in schema and {"Address", "Window"} <= set(schema["$defs"])
    assert "title" not in schema and all("title" not in p for p in props.values())


def test_an_unannotated_parameter_takes_anything_and_says_nothing_to_the_model() -> None:
    @tool
    async def vague(ctx: ToolContext, anything, count: int = 2) -> str:  # type: ignore[no-untyped-def]
        """Takes anything."""
        return str(anything)

    props = vague.definition.input_schema["properties"]
    assert props["anything"] == {}, "no type: any JSON value, and nothing for the model to go on"
    assert props["count"] == {"type": "integer", "default": 2}
    assert vague.definition.input_schema["required"] == ["anything"]


def test_the_seed_pages_spellings_schema_and_risk_level_are_options_too() -> None:
    given = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}

    @tool(schema=given, risk_level="high")
    async def search(ctx: ToolContext, q: str) -> str:
        """Searches."""
        return q

    assert search.definition.input_schema["properties"] == given["properties"]
    assert search.definition.options.risk == "high"
    with pytest.raises(ToolDefinitionError, match=r"the schema is given twice"):
        tool(schema=given, args_schema=given)(search.function)
    with pytest.raises(ToolDefinitionError, match=r"\(risk_level and risk are the same option\)"):
        tool(risk="low", risk_level="high")(search.function)


def test_the_context_is_not_an_argument_and_the_description_is_the_first_paragraph() -> None:
    definition = refund.definition
    assert refund.takes_context
    assert set(definition.input_schema["properties"]) == {"customer_id", "cents", "reason"}
    assert definition.input_schema["required"] == ["customer_id", "cents"]
    assert definition.description == "Issue a refund to a customer. Amounts are in cents."
    options = definition.options
    assert (options.timeout, options.retries, options.idempotency) == (10, 2, "at_most_once")
    assert options.writes and not options.read_only
    assert options.permissions == ("billing:write",)
    assert options.resources == ("ledger:{customer_id}",)
    assert options.requires_approval == "args.cents > 10000"
    # A tool may also take no context at all: every parameter is then an argument.
    assert not forecast.takes_context
    assert forecast("Oslo", days=2) == {"city": "Oslo", "days": 2}


def test_the_fingerprint_is_the_kernels_formula() -> None:
    d = forecast.definition
    assert forecast.fingerprint == tool_fingerprint(d.name, d.description, d.input_schema, "1")
    assert refund.fingerprint != tool_fingerprint(
        "refund", refund.definition.description, refund.definition.input_schema, "1"
    ), "the version is part of it"


def test_a_decorated_function_is_still_the_function() -> None:
    assert forecast("Oslo") == {"city": "Oslo", "days": 3}
    assert forecast.__name__ == "forecast" and forecast.__doc__ == "Weather for a city."


def test_named_forms() -> None:
    @tool(name="lookup_order", read_only=True, cache_ttl=30)
    def find(order_id: str) -> str:
        """Look an order up."""
        return order_id

    assert find.name == "lookup_order"
    assert find.definition.options.cache_ttl == 30

    @tool()
    def ping() -> str:
        """Ping."""
        return "pong"

    assert ping.name == "ping"
    assert ping.definition.input_schema["properties"] == {}


def test_every_decorator_form_of_the_seeds_makes_a_tool() -> None:
    @tool
    async def search(query: str, limit: int = 10) -> list[str]:
        """Searches."""
        return [query] * limit

    @tool()
    async def called(query: str) -> str:
        """Called with no options."""
        return query

    @tool("custom_id")
    async def named_first(query: str) -> str:
        """Named by its first argument."""
        return query

    @tool("charge", idempotency="at_most_once")
    async def charge_card(cents: int) -> str:
        """Charges a card."""
        return str(cents)

    @tool("write_file", resources=["workspace"])
    async def write_file(path: str, content: str) -> str:
        """Writes a file."""
        return path

    @tool(retry=0, timeout=10.0)
    async def pyrula_search(ctx: ToolContext, query: str) -> str:
        """Pyrula's spelling of retries."""
        return query

    @tool(read_only=True)
    async def lookup_order(ctx: ToolContext, order_id: str) -> dict[str, Any]:
        """Looks an order up."""
        return {"order_id": order_id}

    made = [search, called, named_first, charge_card, write_file, pyrula_search, lookup_order]
    assert [t.name for t in made] == [
        "search",
        "called",
        "custom_id",
        "charge",
        "write_file",
        "pyrula_search",
        "lookup_order",
    ]
    assert charge_card.definition.options.idempotency == "at_most_once"
    assert write_file.definition.options.resources == ("workspace",)
    assert pyrula_search.definition.options.retries == 0
    assert pyrula_search.definition.options.timeout == 10.0
    assert lookup_order.definition.options.read_only
    # Each stays callable as the function it decorates.
    assert asyncio.run(named_first("q")) == "q" and named_first.__name__ == "named_first"
    assert asyncio.run(search("q", limit=2)) == ["q", "q"]


def test_durations_take_seconds_or_a_timedelta_and_keep_seconds() -> None:
    @tool(
        timeout=timedelta(milliseconds=2500),
        requires_approval="args.cents > 10000",
        approval_timeout=timedelta(hours=1),
    )
    async def refund(cents: int) -> str:
        """Refunds."""
        return "ok"

    options = refund.definition.options
    assert options.timeout == 2.5 and options.approval_timeout == 3600.0
    spec = tool_spec(refund).options
    assert spec.timeout_ms == 2500 and spec.approval_timeout_ms == 3_600_000

    @tool(read_only=True, cache_ttl=timedelta(minutes=5), approval_timeout=90)
    async def rates() -> dict[str, Any]:
        """Exchange rates."""
        return {}

    assert rates.definition.options.cache_ttl == 300.0
    assert rates.definition.options.approval_timeout == 90.0


APPROVAL_TIMEOUT_MESSAGE = (
    "tool 'refund': approval_timeout takes seconds (a number > 0) or a datetime.timedelta, "
    "not 'soon'"
)


def test_an_option_with_a_value_it_does_not_take_is_named_with_what_it_takes() -> None:
    with pytest.raises(ToolDefinitionError) as refused:

        @tool(approval_timeout="soon")  # type: ignore[call-overload, untyped-decorator]
        async def refund(cents: int) -> str:
            """Refunds."""
            return "ok"

    assert str(refused.value) == APPROVAL_TIMEOUT_MESSAGE


def _refund() -> Callable[..., Any]:
    async def refund(cents: int) -> str:
        """Refunds."""
        return "ok"

    return refund


DURATION = "seconds (a number > 0) or a datetime.timedelta"


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({"timeout": "soon"}, f"timeout takes {DURATION}, not 'soon'"),
        ({"timeout": 0}, f"timeout takes {DURATION}, not 0"),
        ({"timeout": -1.5}, f"timeout takes {DURATION}, not -1.5"),
        ({"timeout": float("inf")}, f"timeout takes {DURATION}, not inf"),
        ({"timeout": True}, f"timeout takes {DURATION}, not True"),
        ({"timeout": timedelta(0)}, f"timeout takes {DURATION}, not datetime.timedelta(0)"),
        ({"read_only": True, "cache_ttl": "1h"}, f"cache_ttl takes {DURATION}, not '1h'"),
        (
            {"approval_timeout": timedelta(seconds=-1)},
            f"approval_timeout takes {DURATION}, not datetime.timedelta(days=-1, seconds=86399)",
        ),
        (
            {"retries": -1},
            "retries takes a number of retries (a whole number >= 0) or a RetryPolicy, not -1",
        ),
        ({"retries": 1.5}, "retries takes a number of retries"),
        ({"retries": "3"}, "retries takes a number of retries"),
        ({"retries": True}, "retries takes a number of retries"),
        ({"retry": "3"}, "retries takes a number of retries"),
        (
            {"idempotency": "once"},
            'idempotency takes one of "safe_to_retry", "at_most_once", not \'once\'',
        ),
        ({"read_only": "yes"}, "read_only takes True or False, not 'yes'"),
        ({"writes": 1}, "writes takes True or False, not 1"),
        ({"strip_nulls": None}, "strip_nulls takes True or False, not None"),
        ({"owner": ""}, "owner takes a non-empty string, not ''"),
        ({"owner": 5}, "owner takes a non-empty string, not 5"),
        (
            {"risk": "severe"},
            'risk takes one of "low", "medium", "high", "critical", not \'severe\'',
        ),
        (
            {"permissions": "billing:write"},
            (
                "permissions takes a list of non-empty strings, not 'billing:write' "
                "(write ['billing:write'] for one)"
            ),
        ),
        ({"permissions": [""]}, "permissions takes a list of non-empty strings, not ['']"),
        ({"resources": "ledger"}, "resources takes a list of non-empty strings, not 'ledger'"),
        ({"resources": [1]}, "resources takes a list of non-empty strings, not [1]"),
        ({"cost_per_call": -1}, "cost_per_call takes a finite number >= 0, not -1"),
        ({"cost_per_call": float("nan")}, "cost_per_call takes a finite number >= 0, not nan"),
        ({"cost_per_call": "1"}, "cost_per_call takes a finite number >= 0, not '1'"),
        (
            {"requires_approval": 1},
            (
                "requires_approval takes True, False, a CEL predicate over args such as "
                '"args.cents > 10000", or a function of the arguments, not 1'
            ),
        ),
        ({"requires_approval": " "}, "requires_approval takes True, False, a CEL predicate"),
        ({"requires_approval": None}, "requires_approval takes True, False, a CEL predicate"),
        ({"version": ""}, "version takes a non-empty string such as \"2\", not ''"),
        ({"version": 1.5}, 'version takes a non-empty string such as "2", not 1.5'),
        ({"description": 3}, "description takes a string, not 3"),
        (
            {"args_schema": "query: str"},
            "args_schema takes a JSON Schema as a dict, not 'query: str'",
        ),
    ],
)
def test_each_option_is_checked_when_the_decorator_is_applied(
    options: dict[str, Any], expected: str
) -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        tool(**options)(_refund())
    assert str(refused.value).startswith(f"tool 'refund': {expected}"), str(refused.value)


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda: tool(name="has space")(_refund()),
            "tool 'has space': name takes 1 to 64 characters from [a-zA-Z0-9_-], not 'has space'",
        ),
        (
            lambda: tool("has space")(_refund()),
            "tool 'has space': name takes 1 to 64 characters",
        ),
        (
            lambda: tool(name=3)(_refund()),  # type: ignore[call-overload]
            "tool '3': name takes 1 to 64 characters",
        ),
        (
            lambda: tool("refund", name="refund_v2"),
            "tool 'refund': the name is given twice, first and as name='refund_v2'",
        ),
        (
            lambda: tool(3),  # type: ignore[call-overload]
            "@tool takes a function, or the tool's name as a string, not 3",
        ),
        (
            lambda: tool("refund")(3),  # type: ignore[arg-type]
            "tool 'refund': @tool decorates a function, not 3",
        ),
        (
            lambda: tool(retry=1, retries=2)(_refund()),
            "tool 'refund': retries is given twice (retry and retries are the same option)",
        ),
        (
            lambda: tool(colour="red")(_refund()),  # type: ignore[call-overload]
            "tool 'refund': there is no option 'colour'; the options are ",
        ),
        (
            lambda: tool(name="refund")(lambda cents: cents),
            "tool 'refund' has no description: add a docstring or description=...",
        ),
        (
            lambda: tool(read_only=True, writes=True)(_refund()),
            "tool 'refund': read_only and writes cannot both be set",
        ),
        (lambda: tool(cache_ttl=5)(_refund()), "tool 'refund': cache_ttl needs read_only"),
        (
            lambda: tool(args_schema={"type": "array"})(_refund()),
            "tool 'refund': the arguments' schema must describe an object",
        ),
    ],
)
def test_what_the_kernel_would_refuse_is_refused_at_decoration(  # type: ignore[no-untyped-def]
    make, expected: str
) -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        make()
    assert str(refused.value).startswith(expected), str(refused.value)


def test_a_python_predicate_for_approval_is_kept_and_announced_as_the_workers() -> None:
    @tool(requires_approval=lambda args: args["cents"] > 10_000)
    async def refund(cents: int) -> str:
        """Refunds."""
        return "ok"

    predicate = refund.definition.options.requires_approval
    assert callable(predicate) and predicate({"cents": 25_000}) is True
    options = tool_options(refund.definition.options)
    assert options.approval_predicate_in_worker
    assert not options.requires_approval and options.requires_approval_expr == ""

    with pytest.raises(ToolDefinitionError) as refused:

        @tool(requires_approval=3)  # type: ignore[call-overload, untyped-decorator]
        async def other(cents: int) -> str:
            """Refunds."""
            return "ok"

    assert "requires_approval takes True, False, a CEL predicate" in str(refused.value)


def test_a_retry_policy_checks_its_own_fields() -> None:
    with pytest.raises(
        ValueError, match=r"RetryPolicy.max_attempts takes a whole number >= 1, not 0"
    ):
        RetryPolicy(0)
    with pytest.raises(ValueError, match=r"RetryPolicy.initial_interval takes seconds"):
        RetryPolicy(3, initial_interval=-1)
    with pytest.raises(ValueError, match=r"RetryPolicy.backoff_coefficient takes a number >= 1"):
        RetryPolicy(3, backoff_coefficient=0.5)
    assert tool(retries=RetryPolicy.exponential(4, 0.5, 8))(_refund()).definition.options.retries


def test_wrap_tool_takes_a_schema_and_maps_the_result() -> None:
    calls: list[dict[str, Any]] = []

    def search(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {"hits": [{"title": "a"}], "took_ms": 3}

    wrapped = wrap_tool(
        "search",
        search,
        description="Search the corpus",
        args_schema={"properties": {"query": {"type": "string"}}, "required": ["query"]},
        to_result=lambda raw: raw["hits"],
        read_only=True,
    )
    assert wrapped.definition.input_schema == {
        "type": "object",
        "properties": {"query": {"type": "string"}},
        "required": ["query"],
    }
    assert wrapped.definition.options.read_only
    assert wrapped({"query": "x"}) == [{"title": "a"}]
    assert calls == [{"query": "x"}]
    d = wrapped.definition
    assert wrapped.fingerprint == tool_fingerprint("search", d.description, d.input_schema, "1")


def test_wrap_tool_maps_an_awaitable_result_too() -> None:
    async def invoke(args: dict[str, Any]) -> int:
        n: int = args["n"]
        return n * 2

    doubled = wrap_tool(
        "double",
        invoke,
        description="Doubles",
        args_schema={"properties": {"n": {"type": "integer"}}},
        to_result=lambda n: {"value": n},
    )
    assert asyncio.run(doubled({"n": 21})) == {"value": 42}


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda: wrap_tool("x", lambda a: a, description=" ", args_schema={}),
            "tool 'x' has no description",
        ),
        (
            lambda: wrap_tool("x", lambda a: a, description="d", args_schema={"type": "array"}),
            "tool 'x': the arguments' schema must describe an object",
        ),
        (
            lambda: wrap_tool("x", lambda a: a, description="d", args_schema={}, colour="red"),
            "tool 'x': there is no option 'colour'; the options are timeout, retries,",
        ),
        (
            lambda: wrap_tool("x", lambda a: a, description="d", args_schema={}, timeout="1s"),
            f"tool 'x': timeout takes {DURATION}, not '1s'",
        ),
        (
            lambda: wrap_tool(
                "x", lambda a: a, description="d", args_schema={}, requires_approval=[]
            ),
            "tool 'x': requires_approval takes True, False, a CEL predicate",
        ),
        (
            lambda: wrap_tool("x", "search", description="d", args_schema={}),  # type: ignore[arg-type]
            "tool 'x': invoke takes a callable over the arguments dict, not 'search'",
        ),
        (
            lambda: wrap_tool("x", lambda a: a, description="d", args_schema=None),  # type: ignore[arg-type]
            "tool 'x': args_schema takes a JSON Schema as a dict, not None",
        ),
        (
            lambda: wrap_tool(
                "x",
                lambda a: a,
                description="d",
                args_schema={},
                to_result=1,  # type: ignore[arg-type]
            ),
            "tool 'x': to_result takes a callable over what invoke returns, or None, not 1",
        ),
        (
            lambda: wrap_tool("a b", lambda a: a, description="d", args_schema={}),
            "tool 'a b': name takes 1 to 64 characters",
        ),
    ],
)
def test_wrap_tool_checks_what_tool_checks_and_refuses_unknown_options(  # type: ignore[no-untyped-def]
    make, expected: str
) -> None:
    with pytest.raises(ToolDefinitionError) as refused:
        make()
    assert str(refused.value).startswith(expected), str(refused.value)


def test_wrap_tool_takes_durations_as_timedeltas_and_retry_as_retries() -> None:
    wrapped = wrap_tool(
        "slow_search",
        lambda args: args,
        description="Searches slowly",
        args_schema={"properties": {}},
        timeout=timedelta(minutes=2),
        retry=2,
    )
    assert wrapped.definition.options.timeout == 120.0
    assert wrapped.definition.options.retries == 2


def test_a_wrapped_tool_looks_like_a_function_of_its_schema() -> None:
    seen: list[dict[str, Any]] = []

    def search(args: dict[str, Any]) -> list[str]:
        seen.append(args)
        return [args["query"]]

    wrapped = wrap_tool(
        "docs_search",
        search,
        description="Searches the docs.",
        args_schema={
            "properties": {
                "limit": {"type": "integer"},
                "query": {"type": "string"},
                "not-a-name": {"type": "string"},
            },
            "required": ["query"],
        },
        transform_args=lambda args: {k: v for k, v in args.items() if v is not None},
    )
    assert wrapped.__name__ == "docs_search" and wrapped.__doc__ == "Searches the docs."
    assert wrapped.__input_schema__ == wrapped.definition.input_schema  # type: ignore[attr-defined]
    signature = inspect.signature(wrapped)
    assert str(signature) == "(*, query: str, limit: int | None = None, **kwargs)"
    # Keywords, an argument outside the schema passed through, nulls stripped before invoke.
    assert wrapped(query="x", limit=None, extra=1) == ["x"]
    assert seen == [{"query": "x", "extra": 1}]
    assert wrapped({"query": "y"}) == ["y"]
    with pytest.raises(TypeError, match="takes its arguments as keywords, or as one dict"):
        wrapped("x")
    with pytest.raises(ToolDefinitionError, match="transform_args"):
        wrap_tool("t", search, description="d", args_schema={}, transform_args="no")  # type: ignore[arg-type]
