"""`status.llm.analysis` and `status.streams.<id>.context`: the slow tier's scheduler and
each stream's rolling window (pipelines.analysis; the fields are explained in
docs/context.md)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["AnalysisStatus", "ContextStatus"]


class AnalysisStatus(StatusModel):
    analyses: int = Field(title="Analyses", description="LLM analyses completed.")
    running: int = Field(title="Running", description="Analyses in flight.")
    waiting: int = Field(title="Waiting", description="Streams with unanalysed text.")
    latency_p50_s: float | None = Field(
        title="Latency p50 (s)", description="One analysis, request to answer (recent)."
    )
    latency_p95_s: float | None = Field(
        title="Latency p95 (s)", description="One analysis, request to answer (recent)."
    )
    prefix_hit_rate: float | None = Field(
        title="Prefix hit rate",
        description="Prompt tokens served from the prefix cache; null before an analysis.",
    )
    faults_accepted: int = Field(
        title="Faults accepted", description="Faults reported that passed the checks."
    )
    faults_rejected: dict[str, int] = Field(
        title="Faults rejected", description="Faults the checks refused, by reason."
    )
    segments_withheld: int = Field(
        title="Segments withheld",
        description="Segments not shown to the model (they read like instructions).",
    )


class ContextStatus(StatusModel):
    """One stream's rolling window."""

    tokens: int = Field(title="Tokens", description="Tokens held in the window.")
    budget: int | None = Field(
        title="Budget", description="The window's token budget; null before its first analysis."
    )
    lines: int = Field(title="Lines", description="Transcript lines in the window.")
    drops: int = Field(title="Drops", description="Times old lines were dropped to fit.")
    dropped_tokens: int = Field(title="Dropped tokens", description="Tokens dropped to fit.")
    summaries: int = Field(title="Summaries", description="Notes standing for dropped spans.")
    pending_lines: int = Field(title="Pending lines", description="Lines not yet in the window.")
    shed_lines: int = Field(
        title="Shed lines", description="Pending lines shed (more than a few windows' worth)."
    )
    analyses: int = Field(title="Analyses", description="Analyses of this stream.")
    prefix_hit_rate: float | None = Field(
        title="Prefix hit rate", description="This stream's prompt tokens from the cache."
    )
    last_latency_s: float | None = Field(
        title="Last latency (s)", description="The last analysis, request to answer."
    )
    last_ttft_s: float | None = Field(
        title="Last TTFT (s)", description="The last analysis' time to first token."
    )
    waiting_s: float | None = Field(
        title="Waiting (s)", description="How long unanalysed text has waited; null if none."
    )
    faults_accepted: int = Field(title="Faults accepted", description="Faults accepted.")
    faults_rejected: dict[str, int] = Field(
        title="Faults rejected", description="Faults refused, by reason."
    )
    invalid_answers: int = Field(
        title="Invalid answers",
        description="Answers that did not parse (a truncated or looping answer: the "
        "repetition guard stops it).",
    )
    unscored_answers: int = Field(
        title="Unscored answers",
        description="Answers with faults but no token probabilities from the engine: their "
        "faults were judged without the confidence threshold.",
    )
    timeouts: int = Field(title="Timeouts", description="Analyses over the time limit.")
    failures: int = Field(title="Failures", description="Analyses that failed otherwise.")
    retry_in_s: float | None = Field(
        title="Retry in (s)",
        description="After a failure: seconds until the stream is tried again; else null.",
    )
