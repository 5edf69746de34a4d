"""`@tool`: schemas from type hints, descriptions from docstrings, options, and refusals."""

from dataclasses import dataclass
from typing import Annotated, Literal

import pydantic
import pytest

from kernel_sdk import ToolContext, ToolDefinitionError, tool, tool_fingerprint, wrap_tool


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
) -> dict:
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


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: tool(name="x")(lambda: None), "the model would see no description"),
        (lambda: tool(name="has space", description="d")(lambda: None), "invalid tool name"),
        (
            lambda: tool(name="x", read_only=True, writes=True, description="d")(lambda: None),
            "both read_only",
        ),
        (lambda: tool(name="x", cache_ttl=5, description="d")(lambda: None), "not read_only"),
        (
            lambda: tool(name="x", requires_approval=" ", description="d")(lambda: None),
            "empty requires_approval",
        ),
    ],
)
def test_what_the_kernel_would_refuse_is_refused_at_decoration(make, message: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ToolDefinitionError, match=message):
        make()


def test_wrap_tool_takes_a_schema_and_maps_the_result() -> None:
    calls: list[dict] = []

    def search(args: dict) -> dict:
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
    import asyncio

    async def invoke(args: dict) -> int:
        return args["n"] * 2

    doubled = wrap_tool(
        "double",
        invoke,
        description="Doubles",
        args_schema={"properties": {"n": {"type": "integer"}}},
        to_result=lambda n: {"value": n},
    )
    assert asyncio.run(doubled({"n": 21})) == {"value": 42}


def test_wrap_tool_refuses_what_tool_refuses() -> None:
    with pytest.raises(ToolDefinitionError, match="no description"):
        wrap_tool("x", lambda a: a, description=" ", args_schema={})
    with pytest.raises(ToolDefinitionError, match="must describe an object"):
        wrap_tool("x", lambda a: a, description="d", args_schema={"type": "array"})
    with pytest.raises(TypeError):
        wrap_tool("x", lambda a: a, description="d", args_schema={}, colour="red")
