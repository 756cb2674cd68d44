"""The slow tier's settings: the `llm:` section of the agent config (window, answers, pace)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from pipelines.detect import Severity

__all__ = ["AnalysisSettings"]


class AnalysisSettings(BaseModel):
    """How the slow tier reads and reports (the `llm:` section of the agent config)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    context_tokens: int | None = Field(
        None,
        ge=2048,
        le=1 << 20,
        title="Context window",
        description="Token budget of one stream's prompt (head + transcript + request), "
        "counted with the model's tokenizer. None: the engine's max_model_len minus "
        "max_output_tokens. Usually set by the device profile.",
    )
    drop_fraction: float = Field(
        0.25,
        ge=0.05,
        le=0.5,
        title="Drop step",
        description="Share of the budget dropped at once when the window is full. Every drop "
        "forces one full re-prefill, so drops are rare and large, never token by token.",
    )
    max_output_tokens: int = Field(
        128, ge=32, le=4096, title="Answer length", description="Token limit of one answer."
    )
    max_faults: int = Field(
        4, ge=1, le=16, title="Faults per answer", description="The schema's maxItems."
    )
    allow_other: bool = Field(
        True,
        title="Faults outside the catalogue",
        description="Accept `other` faults with a label of the model's choosing.",
    )
    other_max_severity: Severity = Field(
        Severity.warning,
        title="Severity cap of `other`",
        description="An `other` fault is never raised above this severity.",
    )
    min_confidence: float = Field(
        0.5,
        ge=0.0,
        le=1.0,
        title="Confidence threshold",
        description="A fault the engine answered with a lower probability (of the tokens "
        "that open it and name its code) is rejected as low_confidence. Codes listed in "
        "`confidence` use their own threshold.",
    )
    confidence: dict[str, float] = Field(
        default_factory=dict,
        title="Confidence threshold per code",
        description="Fault code -> threshold, calibrated for the served model on the "
        "development parts of bench/quality (python -m bench.quality.bench_slow --calibrate).",
    )
    require_topic_word: bool = Field(
        False,
        title="Segment must name the fault",
        description="A catalogue fault's segment must hold a word of its labels, keywords "
        "or related words; other segments are rejected (off_topic).",
    )
    reject_all_clear: bool = Field(
        False,
        title="Reject all-clear segments",
        description="A fault whose segment reads as all-clear (a negation, 'normal', "
        "没有) is rejected (all_clear).",
    )
    concurrency: int = Field(
        1,
        ge=1,
        le=16,
        title="Parallel analyses",
        description="Streams analysed at once (at most the engine's max_num_seqs helps).",
    )
    analysis_timeout_s: float = Field(
        120.0,
        gt=0,
        title="Analysis deadline",
        description="An analysis running longer is aborted and counted (the watchdog reads it).",
    )
    max_summaries: int = Field(
        4,
        ge=0,
        le=32,
        title="Summaries kept",
        description="Notes on dropped history kept in the head; the oldest leaves first.",
    )
    summary_words: int = Field(
        25, ge=5, le=100, title="Summary words", description="Asked length of one note."
    )
    summary_max_tokens: int = Field(
        64,
        ge=16,
        le=512,
        title="Summary length",
        description="Hard cap of one note in tokens; the head keeps room for max_summaries of "
        "them, so a new note never forces a second drop.",
    )

    @field_validator("confidence")
    @classmethod
    def _thresholds(cls, v: dict[str, float]) -> dict[str, float]:
        for code, threshold in v.items():
            if not 0.0 <= threshold <= 1.0:
                raise ValueError(f"{code}: a threshold is a probability, 0 to 1 (got {threshold})")
        return v
