"""`status.ingest` and `status.queue`: transcript payloads taken in, and the bounded queue
between intake and the detector (agent.stats, agent.daemon)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["IngestStatus", "QueueStatus", "SpoolStatus"]


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


class SpoolStatus(StatusModel):
    """The ingest spool on disk (agent/spool.py): accepted segments past the queue."""

    depth: int = Field(title="Depth", description="Segments spooled and not yet detected.")
    max: int = Field(title="Capacity", description="`ingest.spool_max_segments`.")
    written: int = Field(title="Written", description="Segments spooled since start.")
    taken: int = Field(title="Taken", description="Spooled segments through the detector.")
    shed: int = Field(title="Shed", description="Segments shed because the spool was full.")
    write_errors: int = Field(
        title="Write errors", description="Spool writes that failed and were retried."
    )
    damaged: str | None = Field(
        None, title="Damaged file", description="A damaged spool file found at start, and "
        "where it went; null when it was sound.",
    )  # fmt: skip


class QueueStatus(StatusModel):
    depth: int = Field(title="Depth", description="Segments waiting for the detector.")
    max: int = Field(title="Capacity", description="The queue's bound (`ingest.queue_size`).")
    shed: int = Field(title="Shed", description="Segments shed from the full queue.")
    spool: SpoolStatus | None = Field(
        None, title="Spool", description="The on-disk spool behind the queue; null when "
        "`ingest.spool_max_segments` is 0.",
    )  # fmt: skip
