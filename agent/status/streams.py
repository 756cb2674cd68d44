"""`status.streams.<id>`: one stream's counters (agent.stats), its active alerts, its audio
waiting (with ASR) and its rolling window (with the LLM). A stream appears once it has a
segment, an active alert, audio waiting or a window; each part is absent until then."""

from __future__ import annotations

from pydantic import Field

from agent.status.analysis import ContextStatus
from agent.status.base import StatusModel

__all__ = ["StreamStatus"]


class StreamStatus(StatusModel):
    segments: int | None = Field(
        None, title="Segments", description="Segments processed; absent before one is accepted."
    )
    duplicates: int | None = Field(
        None, title="Duplicates", description="Segments merged away; absent with `segments`."
    )
    last_segment_age_s: float | None = Field(
        None,
        title="Last segment age (s)",
        description="Seconds since its last segment; null before one, absent with `segments`.",
    )
    active_alerts: int | None = Field(
        None, title="Active alerts", description="Its active alerts; absent when none."
    )
    asr_queue_s: float | None = Field(
        None, title="ASR queue (s)", description="Its audio waiting; absent when none."
    )
    context: ContextStatus | None = Field(
        None, title="Context", description="Its rolling window; absent without the LLM."
    )
