"""Canonical JSON and the hashes built on it, byte for byte as the kernel computes them.

Canonical form is compact JSON with object keys sorted (by code point, which is UTF-8 byte order),
strings escaped as the kernel escapes them (only `"`, `\\` and control characters), and numbers as
the kernel writes them: integers as they are, floats in their shortest round-trip form. The shared
vectors in `proto/testdata/canonical.json` hold Rust and Python to the same answers.
"""

from __future__ import annotations

import decimal
import hashlib
import json
import math
from typing import Any


def _float(value: float) -> str:
    if not math.isfinite(value):
        raise ValueError(f"{value} has no JSON form: only finite numbers do")
    text = repr(value)
    if "e-" not in text:
        return text  # Both write 0.0001, 100.0, 1e+21 alike.
    mantissa, exponent = text.split("e-")
    if int(exponent) == 5:
        # The kernel writes an exponent of -5 out in full (0.00001234), Python as 1.234e-05.
        return format(decimal.Decimal(text), "f")
    # Python pads the exponent (1e-07); the kernel does not (1e-7).
    return f"{mantissa}e-{int(exponent)}"


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float):
        out.append(_float(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, dict):
        out.append("{")
        for index, key in enumerate(sorted(value)):
            if not isinstance(key, str):
                raise TypeError(f"object keys must be strings, got {key!r}")
            if index:
                out.append(",")
            out.append(json.dumps(key, ensure_ascii=False))
            out.append(":")
            _encode(value[key], out)
        out.append("}")
    elif isinstance(value, (list, tuple)):
        out.append("[")
        for index, item in enumerate(value):
            if index:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"{type(value).__name__} is not JSON")


def to_canonical(value: Any) -> str:
    """Renders a JSON value (dicts, lists, strings, numbers, booleans, None) as canonical JSON."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out)


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def tool_fingerprint(name: str, description: str, input_schema: Any, version: str) -> str:
    """The fingerprint of a tool: sha256 over the canonical JSON of its name, description, input
    schema and version, as the kernel checks it at registration."""
    return _sha256(
        to_canonical(
            {
                "name": name,
                "description": description,
                "input_schema": input_schema,
                "version": version,
            }
        )
    )


def call_hash(tool: str, fingerprint: str, arguments: Any) -> str:
    """The hash of one call (tool, its fingerprint, the arguments): what a resubmission must match."""
    return _sha256(to_canonical({"tool": tool, "fingerprint": fingerprint, "arguments": arguments}))


def idempotency_key(run_id: str, step_key: str) -> str:
    """The key a step's effect is deduplicated with, the same on every retry and replay."""
    return "ik_" + _sha256(f"{run_id}\n{step_key}")[:32]
