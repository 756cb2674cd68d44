"""What every benchmark needs: percentiles, markdown tables, and where a result comes from
(its revision, command, machine and time: `provenance`, stamped into every result file by
`write_result`, so that a figure can be measured again from the repository alone)."""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

__all__ = [
    "Provenance",
    "machine",
    "md_table",
    "percentile",
    "provenance",
    "revision",
    "stamped",
    "write_result",
]


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


@dataclass(frozen=True)
class Provenance:
    """Where a result comes from: enough to measure it again."""

    revision: str  # the commit, `+changes` when the tracked tree differed
    command: str  # as run from the repository root
    machine: str
    at: str  # UTC, ISO 8601

    def line(self) -> str:
        """The markdown line a result file carries under its title."""
        return f"Revision {self.revision}; `{self.command}`; {self.machine}; {self.at}."


def provenance(module: str, argv: Sequence[str] | None = None) -> Provenance:
    """This run's provenance; `module` is the bench's `python -m` name and `argv` its
    arguments (the process's own by default)."""
    args = list(sys.argv[1:] if argv is None else argv)
    return Provenance(
        revision=revision(),
        command=shlex.join(["python", "-m", module, *args]),
        machine=machine(),
        at=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
    )


def stamped(text: str, prov: Provenance) -> str:
    """`text` with the provenance line under its first heading (or first of all)."""
    head, sep, rest = text.partition("\n")
    if head.startswith("#") and sep:
        return f"{head}\n\n{prov.line()}\n\n{rest.lstrip(chr(10))}"
    return f"{prov.line()}\n\n{text}"


def write_result(
    folder: Path,
    stem: str,
    prov: Provenance,
    *,
    text: str | None = None,
    data: Mapping[str, Any] | None = None,
) -> list[Path]:
    """`<folder>/<stem>.md` (the table, the provenance line under its title) and/or
    `<stem>.json` (`provenance` first, then `data`); the paths written."""
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    if text is not None:
        md = folder / f"{stem}.md"
        md.write_text(stamped(text, prov).rstrip("\n") + "\n", encoding="utf-8")
        written.append(md)
    if data is not None:
        body = {"provenance": asdict(prov), **data}
        js = folder / f"{stem}.json"
        js.write_text(json.dumps(body, indent=1, ensure_ascii=False, default=str) + "\n",
                      encoding="utf-8")  # fmt: skip
        written.append(js)
    return written


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
