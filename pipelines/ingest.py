"""Transcript segments in: parse, validate and reject with a reason a person can act on."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from typing_extensions import Self

from pipelines.bounded_json import JsonRejected, parse_json

__all__ = [
    "IngestLimits",
    "InputRejected",
    "RejectReason",
    "Segment",
    "check_stream_allowed",
    "parse_transcript",
]

STREAM_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class Segment(BaseModel):
    """One transcript segment as published on `<prefix>/streams/<stream_id>/transcript`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    stream_id: str = Field(pattern=STREAM_ID_PATTERN, description="Stream (microphone) id.")
    seq: int = Field(ge=0, description="Sequence number, increasing per stream.")
    start: float = Field(description="Start of the audio it covers, epoch seconds.")
    end: float = Field(description="End of the audio it covers, epoch seconds.")
    text: str = Field(description="Transcript text.")
    lang: str | None = Field(
        None, pattern=r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})?$", description="Language code."
    )

    @model_validator(mode="after")
    def _times(self) -> Self:
        if not (math.isfinite(self.start) and math.isfinite(self.end)):
            raise ValueError("start and end must be finite numbers")
        if self.end < self.start:
            raise ValueError("end must not be before start")
        return self


class RejectReason(str, Enum):
    too_large = "too_large"
    not_utf8 = "not_utf8"
    invalid_json = "invalid_json"
    too_deep = "too_deep"  # JSON nested past pipelines.bounded_json.MAX_DEPTH
    invalid_schema = "invalid_schema"
    stream_mismatch = "stream_mismatch"
    stream_not_allowed = "stream_not_allowed"
    text_too_long = "text_too_long"
    from_future = "from_future"
    too_many_streams = "too_many_streams"
    invalid_properties = "invalid_properties"  # an audio message's MQTT v5 user properties
    internal_error = "internal_error"  # our bug while handling it: logged with the traceback


class InputRejected(Exception):
    """A payload was refused; `reason` is the counter key, `detail` the human explanation."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason.value}: {detail}")


@dataclass(frozen=True)
class IngestLimits:
    max_payload_bytes: int = 64 * 1024
    max_text_chars: int = 8000
    allowed_streams: frozenset[str] | None = None
    max_future_skew_s: float = 300.0


def check_stream_allowed(stream_id: str, limits: IngestLimits) -> None:
    """Raises InputRejected(stream_not_allowed) when ingest.allowed_streams leaves it out
    (transcripts and audio alike)."""
    if limits.allowed_streams is not None and stream_id not in limits.allowed_streams:
        raise InputRejected(RejectReason.stream_not_allowed, f"stream {stream_id!r}")


def parse_transcript(
    topic_stream: str, payload: bytes, limits: IngestLimits, now: float
) -> Segment:
    """Decode one payload received on the transcript topic of `topic_stream`.

    Raises:
        InputRejected: the payload is refused; nothing else happened.
    """
    if len(payload) > limits.max_payload_bytes:
        raise InputRejected(
            RejectReason.too_large, f"{len(payload)} bytes > limit {limits.max_payload_bytes}"
        )
    check_stream_allowed(topic_stream, limits)
    try:  # bounded: size, UTF-8 and nesting are checked before the parser runs
        raw = parse_json(payload, max_bytes=limits.max_payload_bytes)
    except JsonRejected as exc:
        raise InputRejected(RejectReason(exc.reason), exc.detail) from exc
    try:
        segment = Segment.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(p) for p in first["loc"]) or "(payload)"
        more = f" (+{exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
        raise InputRejected(RejectReason.invalid_schema, f"{where}: {first['msg']}{more}") from exc
    if segment.stream_id != topic_stream:
        raise InputRejected(
            RejectReason.stream_mismatch,
            f"payload stream_id {segment.stream_id!r} on topic of {topic_stream!r}",
        )
    if len(segment.text) > limits.max_text_chars:
        raise InputRejected(
            RejectReason.text_too_long, f"{len(segment.text)} chars > {limits.max_text_chars}"
        )
    if segment.start > now + limits.max_future_skew_s:
        raise InputRejected(
            RejectReason.from_future, f"starts {segment.start - now:.0f} s in the future"
        )
    return segment
