"""Out-of-memory classification: does an engine error mean the allocator ran out?

By its text (CUDA OOM, torch's OutOfMemoryError, ENOMEM) or by a core killed with SIGKILL
while it started, which is what the kernel's OOM killer does. The supervisor takes one rung
down the ladder for these instead of retrying the same settings.
"""

from __future__ import annotations

import re

__all__ = ["is_out_of_memory"]

_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cannot allocate memory")
# vLLM's multiprocess start reports a core killed by a signal as its negative exit code:
# "Engine core initialization failed ... Failed core proc(s): {'EngineCore_DP0': -9}".
# SIGKILL during a start is what the kernel's OOM killer does.
_KILLED = re.compile(r"failed core proc.*:\s*-9\b|killed by signal 9|sigkill")


def is_out_of_memory(exc: BaseException) -> bool:
    """An error whose text (or cause's) says the allocator ran out: CUDA OOM, torch's
    OutOfMemoryError, ENOMEM from the machine's allocator."""
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{type(seen).__name__}: {seen}".lower()
        if any(marker in text for marker in _OOM_MARKERS) or _KILLED.search(text):
            return True
        seen = seen.__cause__
    return False
