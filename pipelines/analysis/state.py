"""Per-stream state of the slow tier: pending segments, the window, counters, its snapshot.

One `StreamState` per stream id, owned by the scheduler (pipelines/analysis/scheduler.py);
the window feeder and the scheduler update it, the status snapshot reads it.
"""

from __future__ import annotations

from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any

from pipelines.context import ContextWindow

__all__ = ["Pending", "StreamState", "rounded"]


@dataclass(frozen=True)
class Pending:
    """One merged segment waiting to join its stream's window."""

    seq: int
    start: float
    end: float
    text: str
    faults: tuple[str, ...]


@dataclass
class StreamState:
    stream_id: str
    window: ContextWindow | None = None
    pending: deque[Pending] = field(default_factory=deque)
    pending_chars: int = 0
    summaries: list[str] = field(default_factory=list)
    reported: set[tuple[str, int]] = field(default_factory=set)
    dirty_since: float | None = None
    running: bool = False
    retry_at: float = 0.0  # monotonic; a failed analysis waits until then
    retry_delay: float = 0.0
    analyses: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    last_latency_s: float | None = None
    last_ttft_s: float | None = None
    accepted: int = 0
    rejected: Counter[str] = field(default_factory=Counter)
    invalid_answers: int = 0
    unscored_answers: int = 0  # faults answered without token probabilities
    timeouts: int = 0
    failures: int = 0
    shed_lines: int = 0
    summary_requests: int = 0

    def snapshot(self, now: float) -> dict[str, Any]:
        w = self.window
        return {
            "tokens": w.tokens if w else 0,
            "budget": w.budget if w else None,
            "lines": len(w.lines) if w else 0,
            "drops": w.drops if w else 0,
            "dropped_tokens": w.dropped_tokens if w else 0,
            "summaries": len(self.summaries),
            "pending_lines": len(self.pending),
            "shed_lines": self.shed_lines,
            "analyses": self.analyses,
            "prefix_hit_rate": round(self.cached_tokens / self.prompt_tokens, 3)
            if self.prompt_tokens
            else None,
            "last_latency_s": rounded(self.last_latency_s),
            "last_ttft_s": rounded(self.last_ttft_s),
            "waiting_s": None if self.dirty_since is None else round(now - self.dirty_since, 1),
            "faults_accepted": self.accepted,
            "faults_rejected": dict(self.rejected),
            "invalid_answers": self.invalid_answers,
            "unscored_answers": self.unscored_answers,
            "timeouts": self.timeouts,
            "failures": self.failures,
            "retry_in_s": round(max(0.0, self.retry_at - now), 1) if self.retry_delay else None,
        }


def rounded(value: float | None) -> float | None:
    """Seconds as the snapshot and the logs show them (milliseconds)."""
    return None if value is None else round(value, 3)
