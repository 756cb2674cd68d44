"""Between the daemon and the ASR stage: the stage built from the config, an audio message's
MQTT v5 user properties read, and a transcribed segment turned into the `Segment` that
published transcripts become. The stage itself (pipelines.asr) knows nothing of MQTT."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

from agent.engine.paths import cache_dir
from pipelines.asr.settings import AsrSettings
from pipelines.asr.stage import AsrStage, ErrorSink, Heard, Recognizer, SegmentSink
from pipelines.detect import FaultRule
from pipelines.ingest import InputRejected, RejectReason, Segment

__all__ = ["audio_properties", "build_asr_stage", "heard_segment"]

_LANG = re.compile(r"^[a-z]{2,3}(-[A-Za-z0-9]{2,8})?$")  # what a transcript's `lang` allows


def build_asr_stage(
    settings: AsrSettings,
    faults: Sequence[FaultRule],
    on_segments: SegmentSink,
    on_error: ErrorSink,
) -> AsrStage:
    """The stage with faster-whisper behind it. The model folder is resolved (the bundled
    base model joined on first use) and loaded in the stage's own thread."""

    def recognizer() -> Recognizer:
        from pipelines.asr.models import resolve_model
        from pipelines.asr.stage import WhisperRecognizer

        return WhisperRecognizer(settings, resolve_model(settings.model, cache_dir()), faults)

    return AsrStage(settings, recognizer, on_segments, on_error)


def audio_properties(properties: Any) -> tuple[int | None, float | None]:
    """`seq` and `start` from an MQTT v5 message's user properties (absent: None each).

    Raises:
        InputRejected: a property is present but not a number of the right kind.
    """
    pairs = getattr(properties, "UserProperty", None) or []
    values = {str(k): str(v) for k, v in pairs}
    seq: int | None = None
    start: float | None = None
    try:
        if "seq" in values:
            seq = int(values["seq"])
            if seq < 0:
                raise ValueError("negative")
        if "start" in values:
            start = float(values["start"])
            if not math.isfinite(start):
                raise ValueError("not finite")
    except ValueError as exc:
        raise InputRejected(
            RejectReason.invalid_properties,
            f"user properties seq={values.get('seq')!r} start={values.get('start')!r}: "
            "seq must be an integer >= 0, start epoch seconds",
        ) from exc
    return seq, start


def heard_segment(heard: Heard, max_text_chars: int) -> Segment:
    """A transcribed segment as the transcript path takes it (the same model, validated)."""
    return Segment(
        stream_id=heard.stream_id,
        seq=heard.seq,
        start=heard.start,
        end=heard.end,
        text=heard.text[:max_text_chars],
        lang=heard.lang if heard.lang and _LANG.match(heard.lang) else None,
    )
