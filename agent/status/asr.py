"""`status.asr`: audio in, transcripts out (pipelines.asr.stage.AsrStage.snapshot, plus the
daemon's republishing counters; docs/asr.md). Without `asr.enabled` just
`{"state": "off"}` (AsrOff)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["AsrOff", "AsrQueue", "AsrStatus"]


class AsrQueue(StatusModel):
    inbox: int = Field(title="Inbox", description="Undecoded payloads waiting.")
    inbox_max: int = Field(title="Inbox capacity", description="`asr.inbox_payloads`.")
    inbox_shed: int = Field(title="Inbox shed", description="Payloads shed from the full inbox.")
    seconds: float = Field(title="Seconds", description="Seconds of audio waiting.")
    per_stream_s: dict[str, float] = Field(
        title="Per stream (s)", description="Seconds of audio waiting, by stream."
    )
    max_per_stream_s: float = Field(
        title="Per stream bound (s)", description="`asr.queue_seconds_per_stream`."
    )
    max_total_s: float = Field(title="Bound (s)", description="`asr.queue_seconds_total`.")
    shed_clips: int = Field(title="Shed clips", description="Clips shed from the full queue.")
    shed_s: float = Field(title="Shed (s)", description="Seconds of audio shed.")


class AsrOff(StatusModel):
    state: Literal["off"] = Field(title="State", description="`asr.enabled: false`.")


class AsrStatus(StatusModel):
    state: Literal["loading", "ready", "unavailable"] = Field(
        title="State", description="`unavailable`: the model could not be loaded (`error`)."
    )
    error: str | None = Field(title="Error", description="Why unavailable; else null.")
    model: str = Field(title="Model", description="`asr.model`.")
    device: str = Field(title="Device", description="`asr.device`.")
    compute_type: str = Field(title="Compute type", description="`asr.compute_type`.")
    received: int = Field(title="Received", description="Audio payloads received.")
    rejected: dict[str, int] = Field(
        title="Rejected", description="Audio payloads refused, by reason (docs/mqtt.md)."
    )
    clips: int = Field(title="Clips", description="Clips transcribed (silent ones included).")
    silent_clips: int = Field(title="Silent clips", description="Clips where VAD found no speech.")
    segments: int = Field(title="Segments", description="Transcript segments produced.")
    languages: dict[str, int] = Field(title="Languages", description="Clips by language.")
    audio_s: float = Field(title="Audio (s)", description="Seconds of audio transcribed.")
    rtf: float | None = Field(
        title="Real-time factor",
        description="Recognition time / audio time since start (under 1: keeps up).",
    )
    rtf_p50: float | None = Field(title="RTF p50", description="Recent median per clip.")
    latency_p95_s: float | None = Field(
        title="Latency p95 (s)",
        description="Arrival to transcribed, queueing included (recent).",
    )
    queue: AsrQueue = Field(title="Queue", description="The two bounded queues.")
    published: int = Field(
        title="Published", description="Segments republished (`asr.publish_transcript`)."
    )
    publish_dropped: int = Field(
        title="Publish dropped", description="Segments not republished (not connected, full)."
    )
