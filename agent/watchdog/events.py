"""Every decision of the watchdog and the supervisor, in one place: the log line, the recent
history in the status (MQTT and `agentctl status`), and a nudge to publish the status now
rather than at the next interval."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from typing import Any, Literal

import structlog

__all__ = ["EventLog", "Severity"]

log = structlog.get_logger("agent.watchdog")

Severity = Literal["info", "warning", "error"]


class EventLog:
    def __init__(self, keep: int = 20, on_event: Callable[[], None] | None = None) -> None:
        self._recent: deque[dict[str, Any]] = deque(maxlen=keep)
        self._listeners: list[Callable[[], None]] = [on_event] if on_event else []
        self.count = 0

    def record(self, event: str, severity: Severity = "warning", **fields: Any) -> None:
        self.count += 1
        getattr(log, severity)(event, **fields)
        self._recent.append({"event": event, "at": round(time.time(), 3), **fields})
        for listener in self._listeners:
            listener()

    def recent(self) -> list[dict[str, Any]]:
        return list(self._recent)
