"""`ingest:`: input limits, queues and the durable spool."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from agent.config.base import SectionModel

__all__ = ["IngestSettings"]


class IngestSettings(SectionModel):
    max_payload_bytes: int = Field(
        64 * 1024,
        ge=256,
        title="Max payload",
        description="Transcript payloads larger than this are rejected unread.",
    )
    max_text_chars: int = Field(
        8000, ge=1, title="Max text", description="Longest transcript text accepted per segment."
    )
    allowed_streams: list[str] | None = Field(
        None,
        title="Stream allow-list",
        description="If set, segments from any other stream id are rejected (strict mode).",
    )
    max_streams: int = Field(
        256,
        ge=1,
        title="Max streams",
        description="Distinct stream ids kept in memory; segments of further streams are "
        "rejected (too_many_streams), so no publisher can grow the agent without bound.",
    )
    queue_size: int = Field(
        1024,
        ge=1,
        title="Ingest queue",
        description="Segments waiting for detection in memory; when full, new segments go "
        "to the spool on disk (spool_max_segments), in order.",
    )
    spool_max_segments: int = Field(
        200_000,
        ge=0,
        le=10_000_000,
        title="Ingest spool",
        description="Accepted segments the on-disk spool holds once the queue is full (each "
        "acknowledged to the broker only when written); past it, new segments are shed and "
        "counted. 0: no spool, a full queue sheds its oldest (as before the spool).",
    )
    spool_path: Path | None = Field(
        None,
        title="Spool file",
        description="SQLite file of the spool; default `spool.sqlite` beside the outbox.",
    )
    max_future_skew_s: float = Field(
        300.0,
        ge=0,
        title="Clock skew",
        description="Segments timestamped further than this in the future are rejected.",
    )
