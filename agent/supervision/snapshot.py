"""The supervisor's status snapshot: the `llm` part of the service's status (MQTT status,
`/metrics`, `agentctl status`). The keys are read by name downstream (agent.metrics,
agent.cli.service): renaming one is a change to docs/mqtt.md and docs/metrics.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from agent.engine.protocol import EngineProtocol
from agent.engine.stats import EngineStats
from agent.supervision.ladder import Rung
from agent.supervision.store import RungRecord

__all__ = ["engine_figures", "supervisor_snapshot", "until"]


def supervisor_snapshot(
    *,
    state: str,
    detail: str | None,
    engine: EngineProtocol,
    degraded: bool,
    retry_in_s: float | None,
    shedding: bool,
    rung: Rung,
    top_rung: int,
    record: RungRecord,
    climb_in_s: float | None,
    restarts: int,
    restarts_by_reason: Mapping[str, int],
    last_restart: dict[str, Any] | None,
    requests_in_flight: int,
) -> dict[str, Any]:
    info = engine.info
    return {
        "state": state,
        "detail": detail,
        "vllm_version": info.vllm_version if info else None,
        "backend": info.backend if info else None,
        "model": engine.model.as_dict() if engine.model else None,
        "spec": f"{info.spec_method} k={info.spec_k}" if info else None,
        "spec_reason": info.spec_reason if info else None,
        "degraded": degraded,
        "retry_in_s": retry_in_s,
        "shedding": shedding,
        "rung": {
            **rung.as_dict(),
            "of": top_rung,
            "reason": record.reason,
            "since": record.at,
            "climb_in_s": climb_in_s,
        },
        "restarts": restarts,
        "restarts_by_reason": dict(restarts_by_reason),
        "last_restart": last_restart,
        "requests_in_flight": requests_in_flight,
        "engine_pids": engine.core_pids(),
        "engine": engine_figures(engine.stats()),
    }


def engine_figures(stats: EngineStats) -> dict[str, Any]:
    """What an operator reads of the engine's own statistics (this run's counters; the
    latencies span every run)."""
    return {
        "requests": stats.requests,
        "generated_tokens": stats.generated_tokens,
        "num_waiting_reqs": stats.num_waiting_reqs,
        "kv_cache_usage": round(stats.kv_cache_usage, 3),
        "prefix_cache_hit_rate": _round(stats.prefix_cache_hit_rate),
        "spec_method": stats.spec_method,
        "spec_k": stats.spec_k,
        "spec_acceptance_rate": _round(stats.spec_acceptance_rate),
        "spec_mean_accepted_length": _round(stats.spec_mean_accepted_length),
        "preemptions": stats.preemptions,
        "ttft_p50_s": _round(stats.ttft_p50_s),
        "ttft_p95_s": _round(stats.ttft_p95_s),
        "per_token_p50_s": _round(stats.per_token_p50_s, 4),
        "per_token_p95_s": _round(stats.per_token_p95_s, 4),
    }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def until(at: float | None, now: float) -> float | None:
    """Seconds from `now` until `at` (0 when past), rounded; None when nothing is due."""
    return None if at is None else round(max(0.0, at - now), 1)
