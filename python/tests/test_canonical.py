"""The canonical JSON and hashes equal the kernel's: the vectors in `proto/testdata/canonical.json`
are checked by the Rust side too (`kernel-proto`'s `the_shared_vectors_hold`)."""

import json
from pathlib import Path
from typing import Any

import pytest

from kernel_sdk import call_hash, idempotency_key, to_canonical, tool_fingerprint

VECTORS = json.loads(
    (Path(__file__).parents[2] / "proto" / "testdata" / "canonical.json").read_text("utf-8")
)


@pytest.mark.parametrize("case", VECTORS["canonical"])
def test_canonical_text_is_the_kernels(case: dict[str, Any]) -> None:
    assert to_canonical(case["value"]) == case["canonical"]


@pytest.mark.parametrize("case", VECTORS["fingerprints"])
def test_fingerprints_are_the_kernels(case: dict[str, Any]) -> None:
    got = tool_fingerprint(case["name"], case["description"], case["input_schema"], case["version"])
    assert got == case["fingerprint"]


def test_call_hashes_and_idempotency_keys_are_the_kernels() -> None:
    for case in VECTORS["call_hashes"]:
        assert call_hash(case["tool"], case["fingerprint"], case["arguments"]) == case["call_hash"]
    for case in VECTORS["idempotency_keys"]:
        assert idempotency_key(case["run_id"], case["step_key"]) == case["key"]


def test_what_is_not_json_is_refused() -> None:
    with pytest.raises(ValueError, match="finite"):
        to_canonical(float("nan"))
    with pytest.raises(TypeError, match="object keys must be strings"):
        to_canonical({1: "x"})
    with pytest.raises(TypeError, match="set is not JSON"):
        to_canonical({1, 2})
