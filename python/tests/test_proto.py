"""The generated `kernel.v1` code loads with the installed grpcio and protobuf, and a tool
definition becomes the `ToolSpec` a worker announces, with the fingerprint the kernel checks."""

import json

from kernel_sdk import tool
from kernel_sdk._proto import common_pb2, tool_calls_pb2, tool_calls_pb2_grpc, workers_pb2_grpc


@tool(read_only=True)
def add(a: int, b: int) -> int:
    """Adds two integers."""
    return a + b


def test_the_protocol_messages_and_services_are_generated() -> None:
    request = tool_calls_pb2.SubmitTurnRequest(
        run_id="r1",
        turn=0,
        calls=[tool_calls_pb2.ToolCall(tool="add", arguments_json='{"a":1,"b":2}')],
    )
    assert tool_calls_pb2.SubmitTurnRequest.FromString(request.SerializeToString()) == request
    assert hasattr(tool_calls_pb2_grpc, "ToolCallServiceStub")
    assert hasattr(workers_pb2_grpc, "WorkerServiceStub")


def test_a_definition_fits_the_tool_spec_the_kernel_checks() -> None:
    d = add.definition
    spec = common_pb2.ToolSpec(
        name=d.name,
        description=d.description,
        input_schema_json=json.dumps(d.input_schema),
        version=d.version,
        fingerprint=d.fingerprint,
        options=common_pb2.ToolOptions(read_only=d.options.read_only),
    )
    assert spec.fingerprint == add.fingerprint and spec.options.read_only
