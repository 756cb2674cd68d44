"""`status.ingest` and `status.queue`: transcript payloads taken in, and the bounded queue
between intake and the detector (agent.stats, agent.daemon)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["IngestStatus", "QueueStatus"]


class IngestStatus(StatusModel):
    received: int = Field(title="Received", description="Transcript payloads received.")
    accepted: int = Field(title="Accepted", description="Transcript segments accepted.")
    rejected: dict[str, int] = Field(
        title="Rejected", description="Payloads rejected, by reason (docs/mqtt.md)."
    )
    duplicates: dict[str, int] = Field(
        title="Duplicates",
        description="Segments merged away as overlap or redelivery, by reason "
        "(`covered`, `seq_repeat`, ...).",
    )
    shed: int = Field(title="Shed", description="Segments shed from the full ingest queue.")


class QueueStatus(StatusModel):
    depth: int = Field(title="Depth", description="Segments waiting for the detector.")
    max: int = Field(title="Capacity", description="The queue's bound (`ingest.queue_size`).")
    shed: int = Field(title="Shed", description="Segments shed from the full queue.")
