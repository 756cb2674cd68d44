"""The engine's processes on record, so that none outlives the service that started them.

vLLM runs its engine core in a child process. Under systemd a SIGKILLed or OOM-killed
service takes its cgroup with it; anywhere else (a developer's shell, the demo, a test
harness, a container without a reaper) the core of a service that died without its
shutdown is orphaned, holding gigabytes of the very memory the watchdog protects. So the
supervisor records the core's process ids (with their start times, so a reused id is not
mistaken for ours) in `engine-cores.json` in the state directory once it serves, clears
the record after a clean stop, and at its first start reaps what a previous run left:
a recorded process still alive with the same start time and an engine-core command line
is killed, and said (`engine.orphan_reaped`).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from dataclasses import dataclass
from pathlib import Path

import structlog

__all__ = ["CoreRecord", "children", "ours_alive", "reap_engine_children"]

log = structlog.get_logger(__name__)
_CORE_NAMES = ("EngineCore", "VLLM::")


def _start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])


def _cmdline(pid: int) -> str:
    try:
        return (
            Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        )
    except OSError:
        return ""


def children(parent: int | None = None) -> dict[int, str]:
    """This process's live children (or `parent`'s), with their command lines."""
    return {pid: _cmdline(pid)[:100] for pid in ours_alive(parent)}


def ours_alive(parent: int | None = None) -> list[int]:
    """Live processes whose parent is `parent` (default: this process)."""
    parent = os.getpid() if parent is None else parent
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        if int(fields[1]) == parent and fields[0] != "Z":
            out.append(int(entry.name))
    return sorted(out)


def reap_engine_children() -> list[int]:
    """Kill this process's children that are engine cores (at the very end of a stop);
    returns their ids (none, when every shutdown joined its core)."""
    reaped = []
    for pid in ours_alive():
        if any(n in _cmdline(pid) for n in _CORE_NAMES):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                reaped.append(pid)
    return reaped


@dataclass
class CoreRecord:
    path: Path

    def record(self, pids: list[int]) -> None:
        """Write the serving engine's core processes (best effort: a full disk only costs
        the reaping after a crash)."""
        entries = [{"pid": p, "start": _start_time(p)} for p in pids]
        try:
            tmp = self.path.with_name(self.path.name + ".tmp")
            tmp.write_text(json.dumps({"owner": os.getpid(), "cores": entries}), encoding="utf-8")
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("engine.cores_unrecorded", path=str(self.path), error=str(exc))

    def clear(self) -> None:
        with contextlib.suppress(OSError):
            self.path.unlink()

    def reap(self) -> list[int]:
        """Kill the engine cores a previous run recorded and left alive; returns their ids."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return []
        reaped = []
        for entry in data.get("cores", []) if isinstance(data, dict) else []:
            pid, start = entry.get("pid"), entry.get("start")
            if not isinstance(pid, int) or pid == os.getpid():
                continue
            if _start_time(pid) != start or not any(n in _cmdline(pid) for n in _CORE_NAMES):
                continue  # gone, or the id now belongs to another process
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
                reaped.append(pid)
                log.error("engine.orphan_reaped", pid=pid, owner=data.get("owner"),
                          record=str(self.path))  # fmt: skip
        self.clear()
        return reaped
