"""What every benchmark needs: percentiles, a description of the machine, markdown tables."""

from __future__ import annotations

import contextlib
import importlib
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["machine", "md_table", "percentile"]


def percentile(values: Sequence[float], q: float) -> float | None:
    """Linear interpolation between closest ranks (q=0.5 is the median); None if empty."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def revision(repo: Path | None = None) -> str:
    """The commit a result was measured at, `+changes` when the tracked tree differs."""
    root = str(repo or Path(__file__).resolve().parents[1])
    try:
        rev = subprocess.run(
            ["git", "-C", root, "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return f"{rev}{'+changes' if dirty else ''}"


def machine() -> str:
    """`<GPU>, <n> CPU cores (<model>)`: where a result was measured."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    desc = f"{cores} CPU cores ({cpu})"
    try:  # NVML does not create a CUDA context in this process
        pynvml: Any = importlib.import_module("pynvml")
        pynvml.nvmlInit()
        name = pynvml.nvmlDeviceGetName(pynvml.nvmlDeviceGetHandleByIndex(0))
        desc = f"{name.decode() if isinstance(name, bytes) else name}, {desc}"
    except Exception:
        pass
    return desc


def md_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A markdown table; None prints as an em dash, floats with three significant places, a
    string as it is (format a measured value before, to keep its digits)."""

    def cell(value: object) -> str:
        if value is None:
            return "\u2014"
        if isinstance(value, float):
            return f"{value:.3g}" if abs(value) < 1000 else f"{value:.0f}"
        return str(value)

    def line(cells: Sequence[str]) -> str:  # an empty cell is "| |"
        return "|" + "|".join(f" {c} " if c else " " for c in cells) + "|"

    lines = [line(headers), "|" + "---|" * len(headers)]
    lines += [line([cell(v) for v in row]) for row in rows]
    return "\n".join(lines)
