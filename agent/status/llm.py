"""`status.llm`: the slow tier. Without a supervisor (`llm.enabled: false`, or no engine
profile) just `{"enabled": ...}` (LlmOff); with one, the engine supervisor's view
(agent.supervision.snapshot.supervisor_snapshot) and, with the analyzer, `analysis`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agent.status.analysis import AnalysisStatus
from agent.status.base import StatusModel
from agent.status.engine import EngineFigures, ModelStatus

__all__ = ["EngineState", "LastRestart", "LlmOff", "LlmStatus", "RungStatus"]

EngineState = Literal["stopped", "starting", "running", "restarting", "refused", "degraded"]


class RungStatus(StatusModel):
    """The tuning ladder's current rung (docs/watchdog.md)."""

    index: int = Field(title="Index", description="0: the profile as configured.")
    knob: Literal["none", "speculative", "cuda_graphs", "kv_cache", "batched_tokens", "context"] = (
        Field(title="Knob", description="What this rung turns.")
    )
    name: str = Field(title="Name", description="What it changed, e.g. `speculative k=2`.")
    of: int = Field(title="Of", description="The last rung's index.")
    reason: str | None = Field(
        title="Reason", description="Why it was taken (persisted); null on a fresh ladder."
    )
    since: float | None = Field(
        title="Since", description="Epoch seconds of that change; null if never."
    )
    climb_in_s: float | None = Field(
        title="Climb in (s)",
        description="On a lowered rung: seconds of quiet still needed before the climb "
        "back one rung (`watchdog.stable_s`); null on rung 0.",
    )


class LastRestart(StatusModel):
    at: float = Field(title="At", description="Epoch seconds.")
    reason: str = Field(
        title="Reason",
        description="`engine_dead`, `engine_unhealthy`, `oom_error`, `memory_critical`, "
        "`analysis_hang`, `operator`, or `stable` for a climb.",
    )
    detail: str = Field(title="Detail", description="What was seen.")
    from_rung: int = Field(title="From rung", description="The rung it ran on.")
    to_rung: int = Field(title="To rung", description="The rung it restarts on.")
    recovery_s: float | None = Field(
        title="Recovery (s)",
        description="Until the engine served again; null while it has not.",
    )


class LlmOff(StatusModel):
    """No supervisor: `{"enabled": false}` (or true with no engine profile)."""

    enabled: bool = Field(title="Enabled", description="`llm.enabled` in the configuration.")


class LlmStatus(StatusModel):
    """The supervised engine."""

    enabled: bool = Field(title="Enabled", description="`llm.enabled` in the configuration.")
    state: EngineState = Field(
        title="State",
        description="`refused`: the memory planner refused the profile (keyword-only until "
        "the configuration is fixed); `degraded`: held off after too many restarts, tried "
        "again after `watchdog.degraded_retry_s`.",
    )
    detail: str | None = Field(
        title="Detail",
        description="The planner's outcome while running, else why it is not, where known.",
    )
    vllm_version: str | None = Field(
        title="vLLM version", description="Of the running engine; null while none runs."
    )
    backend: str | None = Field(
        title="Backend", description="Of the running engine; null while none runs."
    )
    model: ModelStatus | None = Field(
        title="Model", description="What the last start chose to serve; null before it."
    )
    spec: str | None = Field(
        title="Speculation",
        description="Method and the running k, e.g. `ngram k=2`; null while none runs.",
    )
    spec_reason: str | None = Field(
        title="Speculation reason",
        description="Why that method (MTP found, the trained draft used, or why not).",
    )
    degraded: bool = Field(title="Degraded", description='`state == "degraded"`.')
    retry_in_s: float | None = Field(
        title="Retry in (s)",
        description="While degraded: seconds until supervision tries the engine again "
        "(`agentctl engine restart` tries now); else null.",
    )
    shedding: bool = Field(
        title="Shedding",
        description="Memory is at warn or critical: no new analysis starts (those in "
        "flight finish).",
    )
    rung: RungStatus = Field(title="Rung", description="The tuning ladder's current rung.")
    restarts: int = Field(title="Restarts", description="Engine restarts since the start.")
    restarts_by_reason: dict[str, int] = Field(
        title="Restarts by reason",
        description="The reasons of `last_restart.reason`; only failures count toward the "
        "rate limit.",
    )
    last_restart: LastRestart | None = Field(
        title="Last restart", description="Null before the first."
    )
    requests_in_flight: int = Field(
        title="Requests in flight", description="Engine requests running now."
    )
    engine_pids: list[int] = Field(
        title="Engine pids",
        description="The engine-core process ids (what an OOM kill takes; empty while stopped).",
    )
    engine: EngineFigures = Field(title="Engine", description="The engine's own figures.")
    analysis: AnalysisStatus | None = Field(
        None, title="Analysis", description="The analyzer; absent without it."
    )
