"""Write tools for the kernel in Python.

This first part of the package defines tools: `@tool` derives a tool's JSON Schema from its type
hints and its description from its docstring, and computes the fingerprint the kernel checks
(`kernel_sdk.canonical` holds the canonical JSON and hashes, equal to the kernel's byte for byte).
"""

from .canonical import call_hash, idempotency_key, to_canonical, tool_fingerprint
from .tools import (
    Tool,
    ToolContext,
    ToolDefinition,
    ToolDefinitionError,
    ToolOptions,
    tool,
    wrap_tool,
)

__all__ = [
    "Tool",
    "ToolContext",
    "ToolDefinition",
    "ToolDefinitionError",
    "ToolOptions",
    "call_hash",
    "idempotency_key",
    "to_canonical",
    "tool",
    "tool_fingerprint",
    "wrap_tool",
]
