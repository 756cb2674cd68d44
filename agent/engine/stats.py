"""Engine statistics: what vLLM reports per step, plus latencies we time ourselves.

vLLM hands each engine step's stats to the stat logger of agent/engine/vllm_api.py, which
reads them by name and passes plain numbers (`StepStats`) to the collector here. The
collector runs on the event loop (the AsyncLLM output handler calls it), but a lock keeps
snapshots consistent if a version ever calls it from another thread.

TTFT and per-token times are measured by `Engine.generate` around the stream the caller
sees, so they include tokenization and queueing, not only engine time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from pipelines.latency import TOKEN_BUCKETS_S, LatencyWindow

__all__ = ["EngineStats", "LatencyWindow", "StatsCollector", "StepStats"]


@dataclass(frozen=True)
class EngineStats:
    """One snapshot; counters cover the current engine run (reset at each start)."""

    state: str
    vllm_version: str | None
    backend: str | None
    model: str | None
    start_seconds: float | None
    uptime_seconds: float | None
    restarts: int
    # requests, as seen by our wrapper
    requests: int
    requests_running: int
    generated_tokens: int
    ttft_last_s: float | None
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    per_token_p50_s: float | None
    per_token_p95_s: float | None
    # engine (vLLM scheduler) side
    engine_steps: int
    prefix_cache_queries: int
    prefix_cache_hits: int
    prefix_cache_hit_rate: float | None
    kv_cache_usage: float
    kv_capacity_tokens: int | None
    num_running_reqs: int
    num_waiting_reqs: int
    preemptions: int
    # speculative decoding
    spec_method: str
    spec_k: int
    spec_target_k: int
    spec_drafts: int
    spec_draft_tokens: int
    spec_accepted_tokens: int
    spec_acceptance_rate: float | None
    spec_mean_accepted_length: float | None  # tokens per verify step: 1 + accepted / drafts
    spec_window_acceptance: float | None
    spec_step_downs: int

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StepStats:
    """What one engine step reported (the scheduler's side), zero where vLLM said nothing."""

    kv_usage: float
    num_running: int
    num_waiting: int
    prefix_queries: int
    prefix_hits: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int


class StatsCollector:
    """Accumulates per-step engine stats; one per engine run. The latency windows may be
    the engine's own, shared by every run, so their histograms survive restarts."""

    def __init__(
        self,
        on_spec: Callable[[int, int], object] | None = None,
        *,
        ttft: LatencyWindow | None = None,
        per_token: LatencyWindow | None = None,
    ) -> None:
        self._lock = threading.Lock()
        self._on_spec = on_spec
        self.steps = 0
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.kv_usage = 0.0
        self.num_running = 0
        self.num_waiting = 0
        self.preemptions = 0
        self.spec_drafts = 0
        self.spec_draft_tokens = 0
        self.spec_accepted = 0
        self.kv_capacity_tokens: int | None = None
        self.ttft = ttft if ttft is not None else LatencyWindow()
        self.per_token = (
            per_token if per_token is not None else LatencyWindow(buckets=TOKEN_BUCKETS_S)
        )

    # -- called by the vLLM stat logger ------------------------------------------------
    def on_kv_capacity(self, tokens: int | None) -> None:
        """The KV cache's size in tokens, once vLLM knows it (None: not yet)."""
        if tokens is not None:
            with self._lock:
                self.kv_capacity_tokens = tokens

    def on_record(self, preempted: int, step: StepStats | None) -> None:
        """One engine step: requests preempted, and the scheduler's stats where it sent them."""
        with self._lock:
            self.preemptions += preempted
            if step is None:
                return
            self.steps += 1
            self.kv_usage = step.kv_usage
            self.num_running = step.num_running
            self.num_waiting = step.num_waiting
            self.prefix_queries += step.prefix_queries
            self.prefix_hits += step.prefix_hits
            self.spec_drafts += step.drafts
            self.spec_draft_tokens += step.draft_tokens
            self.spec_accepted += step.accepted_tokens
        if step.draft_tokens and self._on_spec is not None:
            self._on_spec(step.draft_tokens, step.accepted_tokens)  # outside the lock: it may log

    # -- called by Engine.generate -----------------------------------------------------
    def on_first_token(self, seconds: float) -> None:
        with self._lock:
            self.ttft.add(seconds)

    def on_tokens(self, seconds: float, n_tokens: int) -> None:
        """`n_tokens` arrived `seconds` after the previous chunk (several per chunk when
        speculation accepts drafts): each counts as seconds / n_tokens."""
        if n_tokens <= 0:
            return
        with self._lock:
            per = seconds / n_tokens
            for _ in range(n_tokens):
                self.per_token.add(per)

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            rate = self.prefix_hits / self.prefix_queries if self.prefix_queries else None
            acc = self.spec_accepted / self.spec_draft_tokens if self.spec_draft_tokens else None
            mean_len = 1 + self.spec_accepted / self.spec_drafts if self.spec_drafts else None
            return {
                "engine_steps": self.steps,
                "prefix_cache_queries": self.prefix_queries,
                "prefix_cache_hits": self.prefix_hits,
                "prefix_cache_hit_rate": rate,
                "kv_cache_usage": self.kv_usage,
                "kv_capacity_tokens": self.kv_capacity_tokens,
                "num_running_reqs": self.num_running,
                "num_waiting_reqs": self.num_waiting,
                "preemptions": self.preemptions,
                "spec_drafts": self.spec_drafts,
                "spec_draft_tokens": self.spec_draft_tokens,
                "spec_accepted_tokens": self.spec_accepted,
                "spec_acceptance_rate": acc,
                "spec_mean_accepted_length": mean_len,
                "ttft_last_s": self.ttft.last,
                "ttft_p50_s": self.ttft.percentile(0.50),
                "ttft_p95_s": self.ttft.percentile(0.95),
                "per_token_p50_s": self.per_token.percentile(0.50),
                "per_token_p95_s": self.per_token.percentile(0.95),
            }
