"""structlog configuration: JSON lines on stdout, or the journal's own fields under systemd.

Under systemd, stdout already goes to the journal, but as one opaque MESSAGE. When
JOURNAL_STREAM is set (systemd sets it for units whose stdout is the journal) and
systemd-python is installed, each event goes through `journal.send` instead, with its
keys as journal fields (STREAM_ID, ALERT_ID, RUNG, ...), so `journalctl -u edge-agent
STREAM_ID=line3-mic1` works.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

import structlog

__all__ = ["configure_logging", "journal_fields"]

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}
_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2}


def journal_fields(event_dict: MutableMapping[str, Any]) -> dict[str, str]:
    """Map a structlog event to journal fields: upper-case keys, JSON for non-strings."""
    fields: dict[str, str] = {}
    for key, value in event_dict.items():
        if key in {"event", "level", "timestamp"}:
            continue
        name = "".join(c if c.isalnum() else "_" for c in key).upper().lstrip("_") or "FIELD"
        fields[name] = value if isinstance(value, str) else json.dumps(value, default=str)
    fields["MESSAGE"] = str(event_dict.get("event", ""))
    fields["PRIORITY"] = str(_PRIORITY.get(str(event_dict.get("level", "info")), 6))
    fields["SYSLOG_IDENTIFIER"] = "edge-agent"
    return fields


class _JournalRenderer:
    def __init__(self, send: Any) -> None:
        self._send = send

    def __call__(self, _: Any, __: str, event_dict: MutableMapping[str, Any]) -> str:
        fields = journal_fields(event_dict)
        self._send(fields.pop("MESSAGE"), **fields)
        raise structlog.DropEvent


def configure_logging(level: str = "info", fmt: str = "json") -> str:
    """Configure structlog once; returns the sink in use ("journal", "json" or "console")."""
    processors: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
    ]
    sink = fmt
    renderer: Any
    journal_send = None
    if os.environ.get("JOURNAL_STREAM"):
        try:
            from systemd import journal  # type: ignore[attr-defined,unused-ignore]

            journal_send = journal.send
        except ImportError:
            journal_send = None
    if journal_send is not None:
        renderer, sink = _JournalRenderer(journal_send), "journal"
    elif fmt == "console":
        renderer = structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    else:
        renderer = structlog.processors.JSONRenderer(ensure_ascii=False)
    structlog.configure(
        processors=[*processors, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(_LEVELS[level]),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stdout),
        cache_logger_on_first_use=False,
    )
    return sink
