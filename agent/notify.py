"""systemd's notify protocol: READY=1, STATUS=..., WATCHDOG=1, STOPPING=1.

Through systemd-python (`systemd.daemon.notify`) where it is installed (the `systemd`
extra, needs libsystemd); otherwise the protocol's few lines are sent here directly, so a
device without libsystemd headers still reports to systemd. Without `NOTIFY_SOCKET` (not
under systemd, or `Type=simple`) every call is a no-op.

The watchdog interval comes from `WATCHDOG_USEC` (set by `WatchdogSec=`), honoured only
when `WATCHDOG_PID` is unset or ours; the daemon pings at half of it, and only while it
makes progress (agent.daemon), so a hung event loop or a stuck pipeline gets the service
killed and restarted by systemd.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import structlog

__all__ = ["SystemdNotifier"]

log = structlog.get_logger(__name__)


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
