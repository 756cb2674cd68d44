"""Python 3.10 support: JetPack 6 and NVIDIA's vLLM builds for it are Python 3.10."""

from __future__ import annotations

import sys

if sys.version_info >= (3, 11):
    from asyncio import TaskGroup, timeout
else:  # pragma: no cover - exercised by the 3.10 CI job
    from taskgroup import TaskGroup, timeout

__all__ = ["TaskGroup", "timeout"]
