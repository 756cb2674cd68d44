"""pipelines.bounded_json: untrusted JSON is bounded before the parser sees it."""

from __future__ import annotations

import json
import sys

import pytest

from pipelines.bounded_json import MAX_DEPTH, JsonRejected, nesting_depth, parse_json


def test_nested_brackets_are_refused_before_parsing() -> None:
    """5,000 nested brackets in 10 KB (RecursionError in json.loads) are `too_deep`."""
    payload = b"[" * 5000 + b"]" * 5000
    with pytest.raises(RecursionError):
        json.loads(payload)  # what took the service down
    with pytest.raises(JsonRejected) as err:
        parse_json(payload, max_bytes=64 << 10)
    assert err.value.reason == "too_deep"


@pytest.mark.parametrize("opener", ["[", '{"a":'])
def test_depth_is_counted_for_arrays_and_objects(opener: str) -> None:
    closer = "]" if opener == "[" else "}"
    ok = opener * MAX_DEPTH + "1" + closer * MAX_DEPTH
    assert nesting_depth(ok) == MAX_DEPTH
    parse_json(ok, max_bytes=1 << 20)
    deep = opener * (MAX_DEPTH + 1) + "1" + closer * (MAX_DEPTH + 1)
    with pytest.raises(JsonRejected, match="too_deep"):
        parse_json(deep, max_bytes=1 << 20)


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"text": "[" * 5000 + '\\" ]]] {{{', "n": [1, [2]]})
    assert nesting_depth(text) == 3
    assert parse_json(text, max_bytes=1 << 20)["n"] == [1, [2]]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"x" * 101, "too_large"),
        (b'{"a": "\xff"}', "not_utf8"),
        (b"{not json", "invalid_json"),
        (b'"unterminated [[[[', "invalid_json"),
        (b"1" * 5000, "invalid_json"),  # past int()'s digit limit: a ValueError, refused
    ],
)
def test_each_refusal_has_its_reason(payload: bytes, reason: str) -> None:
    with pytest.raises(JsonRejected) as err:
        parse_json(payload, max_bytes=100 if reason == "too_large" else 1 << 20)
    assert err.value.reason == reason
    assert err.value.detail


def test_values_are_exactly_json_loads() -> None:
    """The parser is the standard one (the fleet's signatures are computed over it)."""
    doc = {"f": 0.1, "big": 10**30, "nan": float("inf"), "s": "温度 \u0000", "l": [True, None]}
    text = json.dumps(doc)
    assert parse_json(text, max_bytes=1 << 20) == json.loads(text)


def test_depth_scan_is_linear_and_uses_no_recursion() -> None:
    """A payload far deeper than the interpreter's recursion limit scans fine."""
    deep = "[" * (sys.getrecursionlimit() * 50)
    assert nesting_depth(deep, limit=MAX_DEPTH) == MAX_DEPTH + 1
    assert nesting_depth(deep) == sys.getrecursionlimit() * 50
