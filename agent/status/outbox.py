"""`status.outbox`: alert events on disk until the broker acknowledges them (agent.outbox)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["OutboxStatus"]


class OutboxStatus(StatusModel):
    depth: int = Field(
        title="Depth", description="Alert events not yet acknowledged by the broker."
    )
    shed: int = Field(title="Shed", description="Alert events dropped from a full outbox.")
    write_errors: int = Field(
        title="Write errors",
        description="Outbox commits that failed and were retried (the input waits unacknowledged).",
    )
    max: int = Field(title="Capacity", description="The outbox's bound (`outbox.max_events`).")
