"""The device's own services: `outbox:`, `control:`, `metrics:` and `logging:`."""

from __future__ import annotations

from enum import Enum
from pathlib import Path

from pydantic import Field, field_validator

from agent.config.base import SectionModel

__all__ = ["ControlSettings", "LogFormat", "LoggingSettings", "MetricsSettings", "OutboxSettings"]


class OutboxSettings(SectionModel):
    path: Path = Field(
        Path("/var/lib/edge-agent/outbox.sqlite"),
        title="Outbox path",
        description="SQLite database (WAL) holding alert events until the broker acknowledged "
        "them. Relative paths are resolved against the config file's directory.",
    )
    max_events: int = Field(
        100_000,
        ge=10,
        title="Outbox bound",
        description="Most events kept while the broker is away; beyond it the oldest updates "
        "are shed first (new/end events last) and counted.",
    )


class ControlSettings(SectionModel):
    enabled: bool = Field(
        True, title="Control socket", description="Serve `agentctl` on a Unix socket."
    )
    socket_path: Path | None = Field(
        None,
        title="Socket path",
        description="Unix socket for agentctl (mode 0660, the service's group). None: "
        "control.sock in $RUNTIME_DIRECTORY (systemd's RuntimeDirectory=), else beside the "
        "outbox. Not remotely settable.",
    )
    fault_injection: bool = Field(
        False,
        title="Fault injection",
        description="Accept the fault-injection commands on the control socket "
        "(`fault.block_loop`: blocks the event loop for the given seconds, so a test can "
        "prove systemd's watchdog restarts a hung service; `fault.pause_detect`: input is "
        "queued but not processed or acknowledged for the given seconds;"
        " `fault.pause_fleet_apply`). Off in production. Not remotely settable.",
    )


class MetricsSettings(SectionModel):
    enabled: bool = Field(
        True, title="Metrics", description="Serve Prometheus `/metrics` (agent.metrics)."
    )
    host: str = Field(
        "127.0.0.1",
        title="Listen address",
        description="Loopback by default: the endpoint has no authentication and names "
        "streams and faults. Scrape with the device's own agent or through a tunnel.",
    )
    port: int = Field(
        9464, ge=0, le=65535, title="Port", description="TCP port; 0 picks a free one."
    )


class LogFormat(str, Enum):
    json = "json"
    console = "console"


class LoggingSettings(SectionModel):
    level: str = Field("info", title="Level", description="debug, info, warning or error.")
    format: LogFormat = Field(
        LogFormat.json,
        title="Format",
        description="json lines on stdout (journal fields under systemd) or console for humans.",
    )

    @field_validator("level")
    @classmethod
    def _known_level(cls, v: str) -> str:
        v = v.lower()
        if v not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return v
