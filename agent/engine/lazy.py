"""Lazy imports of the heavy optional stack (vllm, torch, transformers).

They are imported by name, at the moment they are needed, for two reasons:
- `import agent.engine` must work where vLLM is not installed (CI's Python 3.10 job, the
  CLI's `plan` command, tools), and importing vLLM costs seconds;
- the modules come back typed as Any, so mypy neither needs them installed nor walks
  vLLM's and torch's sources (their interfaces used here are few and version-dependent,
  and are checked by the tests against the real engine instead).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["optional_module", "require_module"]


def require_module(name: str) -> Any:
    """Import `name` (ImportError propagates)."""
    return importlib.import_module(name)


def optional_module(name: str) -> Any | None:
    """Import `name`, or None where it does not exist in the installed version."""
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
