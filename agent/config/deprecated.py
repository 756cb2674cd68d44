"""Keys a config may still carry from an earlier release: accepted, not used, reported.

A fleet document or a device's agent.yaml written for an older release must not stop a
newer one from starting, and `extra="forbid"` would refuse a key the schema no longer has.
So each retired key is listed here with why it went; the loader drops it before
validation and reports a located deprecation (`agentctl config validate` prints it, the
daemon logs `config.deprecated` at start). A key that moved is carried to its new place
when that place is not set.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["DEPRECATED", "Deprecation", "Retired", "strip_deprecated"]

KeyPath = tuple[str, ...]


@dataclass(frozen=True)
class Retired:
    """A key that no longer means anything, or that moved to `moved_to`."""

    why: str
    moved_to: KeyPath | None = None


DEPRECATED: Mapping[KeyPath, Retired] = {
    ("llm", "min_quote_chars"): Retired(
        "answers point at a segment and the service takes its text; nothing is quoted"
    ),
    ("llm", "max_quote_chars"): Retired(
        "answers point at a segment and the service takes its text; nothing is quoted"
    ),
}


@dataclass(frozen=True)
class Deprecation:
    path: KeyPath
    why: str
    moved_to: KeyPath | None

    def __str__(self) -> str:
        dotted = ".".join(self.path)
        where = f"; now {'.'.join(self.moved_to)}" if self.moved_to else " (ignored)"
        return f"{dotted} is deprecated{where}: {self.why}"


def strip_deprecated(data: dict[str, Any]) -> list[Deprecation]:
    """Remove (or move) the retired keys of `data` in place; what was found, in order."""
    found: list[Deprecation] = []
    for path, retired in DEPRECATED.items():
        parent: Any = data
        for key in path[:-1]:
            parent = parent.get(key) if isinstance(parent, dict) else None
        if not isinstance(parent, dict) or path[-1] not in parent:
            continue
        value = parent.pop(path[-1])
        if retired.moved_to is not None:
            target: Any = data
            for key in retired.moved_to[:-1]:
                target = target.setdefault(key, {}) if isinstance(target, dict) else None
            if isinstance(target, dict):
                target.setdefault(retired.moved_to[-1], value)
        found.append(Deprecation(path, retired.why, retired.moved_to))
    return found
