"""`status.control` and `status.metrics`: the two local servers, agentctl's socket
(agent.control) and Prometheus' `/metrics` (agent.metrics)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["ControlStatus", "MetricsStatus"]


class ControlStatus(StatusModel):
    socket: str = Field(title="Socket", description="The control socket's path.")
    requests: int = Field(title="Requests", description="Control socket requests.")
    refused: int = Field(
        title="Refused", description="Connections refused by the peer check (docs/control.md)."
    )
    bad_requests: int = Field(
        title="Bad requests",
        description="Requests refused as malformed (not JSON, too deep or long, too slow).",
    )
    follow_shed: int = Field(
        title="Follow shed",
        description="Alert events dropped for `alerts --follow` clients that stopped reading.",
    )


class MetricsStatus(StatusModel):
    address: str | None = Field(
        title="Address", description="host:port once listening; null before that."
    )
    scrapes: int = Field(title="Scrapes", description="`GET /metrics` answered.")
    bad_requests: int = Field(
        title="Bad requests",
        description="Anything else: refused (404, 405) or the connection closed.",
    )
