"""JSON from untrusted bytes, bounded before it is parsed.

`json.loads` recurses once per nesting level: 5,000 opening brackets in a 10 KB payload
raise RecursionError, which is not a ValueError, and took the whole service down from one
MQTT message. So every payload that crosses a boundary (transcripts, fleet documents, the
control socket) is checked first, in linear time and without recursion: its size, its
encoding and the deepest nesting of brackets outside strings. Only then does the standard
parser see it, so the values and their semantics are exactly `json.loads`'s (the fleet's
signatures are computed over them).

Errors are `JsonRejected` (a ValueError) with a `reason` a counter can use.
"""

from __future__ import annotations

import json
import re
from typing import Any, Literal

__all__ = ["MAX_DEPTH", "JsonRejected", "nesting_depth", "parse_json"]

MAX_DEPTH = 32  # far more than any of our documents needs, far less than the stack allows

Reason = Literal["too_large", "not_utf8", "invalid_json", "too_deep"]

# A JSON string (escapes included) or one bracket. Strings are matched whole so that
# brackets inside them do not count; the pattern is linear (no nested quantifiers).
_TOKEN = re.compile(r'"(?:[^"\\]|\\.)*"?|[\[\]{}]', re.DOTALL)


class JsonRejected(ValueError):
    """The payload is not JSON we accept; `reason` names why, `detail` says where."""

    def __init__(self, reason: Reason, detail: str) -> None:
        self.reason: Reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


def nesting_depth(text: str, limit: int | None = None) -> int:
    """The deepest bracket nesting outside strings; stops early once past `limit`."""
    depth = deepest = 0
    for match in _TOKEN.finditer(text):
        ch = match.group()
        if ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if limit is not None and deepest > limit:
                    return deepest
        elif ch in "]}":
            depth -= 1
    return deepest


def parse_json(data: bytes | str, *, max_bytes: int, max_depth: int = MAX_DEPTH) -> Any:
    """Parse one untrusted JSON document.

    Raises:
        JsonRejected: over `max_bytes`, not UTF-8, nested deeper than `max_depth`, or not
            JSON. Nothing else: the checks come before the parser.
    """
    size = len(data)
    if size > max_bytes:
        raise JsonRejected("too_large", f"{size} bytes > limit {max_bytes}")
    if isinstance(data, bytes | bytearray):
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise JsonRejected("not_utf8", f"byte {exc.start} is not UTF-8") from exc
    else:
        text = data
    if nesting_depth(text, max_depth) > max_depth:
        raise JsonRejected("too_deep", f"nested deeper than {max_depth} levels")
    try:
        return json.loads(text)
    except ValueError as exc:  # JSONDecodeError, and int() past its digit limit
        detail = (
            f"{exc.msg} at char {exc.pos}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        )
        raise JsonRejected("invalid_json", detail) from exc
