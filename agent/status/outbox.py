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
    damaged: str | None = Field(
        None,
        title="Damaged file",
        description="The damaged (or foreign) file found at start, where it was moved and "
        "how many rows were saved from it; null when the file was sound.",
    )
    salvaged_rows: int = Field(
        0, title="Salvaged rows", description="Rows carried from the damaged file at start."
    )
