"""Deep merge of plain config mappings (the layering rule of every config source)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["deep_merge"]


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Return `base` with `over` merged into it: mappings merge key by key, anything else
    (lists included) in `over` replaces the value in `base`. Neither input is modified."""
    out: dict[str, Any] = dict(base)
    for key, value in over.items():
        current = out.get(key)
        if isinstance(current, Mapping) and isinstance(value, Mapping):
            out[key] = deep_merge(current, value)
        else:
            out[key] = value
    return out
