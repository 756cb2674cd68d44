"""systemd's notify protocol: READY=1, STATUS=..., WATCHDOG=1, STOPPING=1.

Through systemd-python (`systemd.daemon.notify`) where it is installed (the `systemd`
extra, needs libsystemd); otherwise the protocol's few lines are sent here directly, so a
device without libsystemd headers still reports to systemd. Without `NOTIFY_SOCKET` (not
under systemd, or `Type=simple`) every call is a no-op.

The watchdog interval comes from `WATCHDOG_USEC` (set by `WatchdogSec=`), honoured only
when `WATCHDOG_PID` is unset or ours; `notify_loop` (a task of the daemon) pings at half of
it, and only while the pipeline makes progress, so a hung event loop or a stuck pipeline
gets the service killed and restarted by systemd.
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from typing import Any, Protocol

import structlog

__all__ = ["Progress", "Readiness", "SystemdNotifier", "notify_loop"]

log = structlog.get_logger(__name__)

_READY_POLL_S = 0.1


def _systemd_notify() -> Any:
    try:
        from systemd import daemon  # type: ignore[import-not-found, attr-defined, unused-ignore]
    except ImportError:
        return None
    return daemon.notify


class SystemdNotifier:
    def __init__(self) -> None:
        self.address = os.environ.get("NOTIFY_SOCKET") or None
        self._notify = _systemd_notify() if self.address else None
        usec = os.environ.get("WATCHDOG_USEC")
        pid = os.environ.get("WATCHDOG_PID")
        mine = pid is None or pid == str(os.getpid())
        self.watchdog_s = int(usec) / 1e6 if usec and usec.isdigit() and mine else None
        self.sent = 0

    @property
    def enabled(self) -> bool:
        return self.address is not None

    @property
    def ping_interval_s(self) -> float | None:
        """Half the watchdog timeout, as sd_watchdog_enabled(3) advises; None: no watchdog."""
        return self.watchdog_s / 2 if self.watchdog_s else None

    def send(self, message: str) -> bool:
        if self.address is None:
            return False
        try:
            if self._notify is not None:
                ok = bool(self._notify(message))
            else:
                ok = self._send_direct(message)
        except OSError as exc:  # systemd gone (shutdown): nothing to tell
            log.debug("notify.failed", error=str(exc))
            return False
        self.sent += ok
        return ok

    def _send_direct(self, message: str) -> bool:
        assert self.address is not None
        address = self.address
        if address.startswith("@"):  # abstract namespace
            address = "\0" + address[1:]
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC) as sock:
            sock.sendto(message.encode(), address)
        return True

    def ready(self, status: str) -> bool:
        return self.send(f"READY=1\nSTATUS={status}")

    def status(self, status: str) -> bool:
        return self.send(f"STATUS={status}")

    def watchdog(self) -> bool:
        return self.send("WATCHDOG=1")

    def stopping(self) -> bool:
        return self.send("STOPPING=1\nSTATUS=stopping")


class Readiness(Protocol):
    """What systemd is told (agent.snapshot.StatusBuilder fits)."""

    def serving(self) -> bool: ...
    def line(self) -> str: ...


class Progress(Protocol):
    """Whether the pipeline keeps up (agent.intake.Intake fits)."""

    @property
    def processed(self) -> int: ...
    def waiting(self) -> int: ...


async def notify_loop(n: SystemdNotifier, status: Readiness, progress: Progress) -> None:
    """READY once serving, STATUS when it changes, WATCHDOG at half of WatchdogSec while
    the loop runs (this task is on it) and the pipeline drains what is queued."""
    period = min(n.ping_interval_s or 5.0, 5.0)
    ready = False
    last = None
    seen = progress.processed
    next_ping = time.monotonic()
    while True:
        line = status.line()
        if not ready and status.serving():
            ready = True
            n.ready(line)
            log.info("agent.ready", status=line, systemd=n.enabled)
        elif ready and line != last:
            n.status(line)
        last = line
        if n.ping_interval_s is not None and time.monotonic() >= next_ping:
            next_ping = time.monotonic() + period
            waiting = progress.waiting()
            if waiting > 0 and progress.processed == seen:
                # Work waiting and none done for a whole period: let systemd decide.
                log.error("agent.stalled", waiting=waiting, period_s=period)
            else:
                n.watchdog()
            seen = progress.processed
        # Until READY, look often: `systemctl start` waits on it (no lag after connect).
        await asyncio.sleep(period if ready else min(period, _READY_POLL_S))
