"""What a test leaves running: processes of this session whose parent is gone.

conftest marks the session's environment (EDGE_AGENT_TEST_SESSION); every process a test
starts inherits it, with PYTEST_CURRENT_TEST naming the test. After each test, a process
that carries the mark but whose parent does not (it was orphaned: reparented to init or
another reaper) is a leak: an engine core whose service was killed, a daemon nobody
stopped. Zombies do not count (their parent reaps them)."""

from __future__ import annotations

import os
import time
from pathlib import Path

__all__ = ["MARK", "orphans", "settle"]

MARK = "EDGE_AGENT_TEST_SESSION"


def _environ(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    out = {}
    for item in raw.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            out[key.decode(errors="replace")] = value.decode(errors="replace")
    return out


def _stat(pid: int) -> tuple[str, int] | None:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return fields[0], int(fields[1])


def orphans(session: str) -> list[tuple[int, str, str]]:
    """(pid, command, the test that started it) of each orphan of `session`."""
    out = []
    me = os.getpid()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        pid = int(entry.name)
        env = _environ(pid)
        if env.get(MARK) != session:
            continue
        stat = _stat(pid)
        if stat is None or stat[0] == "Z":
            continue
        if stat[1] == me or _environ(stat[1]).get(MARK) == session:
            continue  # its parent is pytest (whose /proc environ predates the mark) or ours
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()[:120]
        except OSError:
            cmd = "?"
        out.append((pid, cmd, env.get("PYTEST_CURRENT_TEST", "?")))
    return out


def settle(session: str, limit_s: float = 10.0) -> list[tuple[int, str, str]]:
    """The orphans still there once a just-killed process had `limit_s` to go."""
    deadline = time.monotonic() + limit_s
    while True:
        left = orphans(session)
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)
