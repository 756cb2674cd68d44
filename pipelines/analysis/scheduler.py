"""The slow tier's scheduler: which stream is analysed next, and one analysis in steps.

The daemon hands every merged transcript segment to `Analyzer.add()` (cheap, synchronous,
bounded). A stream is analysed when it has new transcript and its previous analysis
finished; whatever arrives meanwhile is coalesced into its next analysis, so the work per
stream is bounded by the engine's speed, never by a queue. Streams with an active keyword
alert go first, but none waits past a cap. A failed analysis leaves the stream pending and
backs it off (1 s doubling to 30 s), so a persistent failure is a slow retry, not a hot loop.

One analysis (`_analyze_now`) reads top to bottom: feed the window (window.py), ask the
engine, judge the answer and deliver what is news (answer.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from typing import Any

import structlog

from pipelines.analysis.answer import AnalysisReport, ask, judge, news, remember
from pipelines.analysis.protocols import AnalysisLlm, FaultSink, LlmUnavailable, TokenCodec
from pipelines.analysis.settings import AnalysisSettings
from pipelines.analysis.state import Pending, StreamState, rounded
from pipelines.analysis.window import WindowFeeder
from pipelines.analysis_prompt import analysis_schema
from pipelines.compat import TaskGroup
from pipelines.context import ContextWindow
from pipelines.detect import FaultRule
from pipelines.latency import LatencyWindow

__all__ = ["Analyzer"]

log = structlog.get_logger(__name__)

_RETRY_MIN_S = 1.0
_RETRY_MAX_S = 30.0
_LATENCY_WINDOW = 256
_PRIORITY_MAX_WAIT_S = 60.0  # a stream waiting longer than this goes before alert streams


class Analyzer:
    """Owns the streams' windows and runs their analyses. One instance per daemon."""

    def __init__(
        self,
        llm: AnalysisLlm,
        codec: TokenCodec,
        settings: AnalysisSettings,
        catalogue: Sequence[FaultRule],
        *,
        budget: int,
        on_faults: FaultSink,
        priority: Callable[[], Collection[str]] = frozenset,
        disabled_for: Callable[[str], Collection[str]] = lambda _sid: (),
        monotonic: Callable[[], float] = time.monotonic,
        drop_fraction: float | None = None,
    ) -> None:
        self.llm = llm
        self.codec = codec
        self.settings = settings
        self.budget = budget
        self._catalogue = {rule.code: rule for rule in catalogue}
        self._on_faults = on_faults
        self._priority = priority
        self._disabled_for = disabled_for
        self._mono = monotonic
        self._feeder = WindowFeeder(
            llm,
            codec,
            settings,
            self._catalogue,
            # The benchmark's naive policy passes 0 (drop only what must go); config cannot.
            drop_fraction=settings.drop_fraction if drop_fraction is None else drop_fraction,
        )
        self._streams: dict[str, StreamState] = {}
        self._wake = asyncio.Event()
        # Public so a test can force an answer through the engine's real output path.
        self.schema: dict[str, Any] = analysis_schema(
            list(self._catalogue),
            max_faults=settings.max_faults,
            allow_other=settings.allow_other,
        )
        self._pending_max_chars = budget * 4  # more than a window's worth is dropped anyway
        self.latency = LatencyWindow(_LATENCY_WINDOW)  # per analysis; /metrics reads it too
        self.analyses = 0

    # -- input (synchronous, on the loop) --------------------------------------------------
    def add(
        self,
        stream_id: str,
        *,
        seq: int,
        start: float,
        end: float,
        text: str,
        faults: Sequence[str] = (),
    ) -> None:
        """Queue one merged segment for the stream's window; never blocks, never grows
        past a few windows' worth (the oldest pending text is shed and counted)."""
        text = text.strip()
        if not text:
            return
        st = self._streams.get(stream_id)
        if st is None:
            st = self._streams[stream_id] = StreamState(stream_id)
        st.pending.append(Pending(seq, start, end, text, tuple(faults)))
        st.pending_chars += len(text)
        while st.pending_chars > self._pending_max_chars and len(st.pending) > 1:
            gone = st.pending.popleft()
            st.pending_chars -= len(gone.text)
            st.shed_lines += 1
        if st.dirty_since is None:
            st.dirty_since = self._mono()
        self._wake.set()

    # -- workers ---------------------------------------------------------------------------
    async def run(self) -> None:
        """Analyse streams until cancelled, `settings.concurrency` at a time."""
        async with TaskGroup() as tg:
            for i in range(self.settings.concurrency):
                tg.create_task(self._worker(), name=f"analysis.worker{i}")

    async def _worker(self) -> None:
        while True:
            await self.llm.wait_ready()
            self._wake.clear()
            st, wait_s = self._pick()
            if st is None:
                # Nothing due: sleep until new transcript arrives or a retry falls due.
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), wait_s)
                continue
            try:
                await self._analyze(st)
                st.retry_delay = 0.0
                continue
            except LlmUnavailable as exc:
                log.warning("analysis.engine_unavailable", stream_id=st.stream_id, error=str(exc))
            except asyncio.TimeoutError:
                pass  # counted and logged where it happened
            except Exception:  # one stream's bad analysis must not stop the tier
                st.failures += 1
                log.exception("analysis.failed", stream_id=st.stream_id)
            # The stream is pending again; it backs off on its own so that a persistent
            # failure is a slow retry, not a hot loop, and other streams go on meanwhile.
            st.retry_delay = min(max(st.retry_delay * 2, _RETRY_MIN_S), _RETRY_MAX_S)
            st.retry_at = self._mono() + st.retry_delay

    def _pick(self) -> tuple[StreamState | None, float | None]:
        """The next stream to analyse, else how long until a backed-off one is due."""
        now = self._mono()
        waiting = [s for s in self._streams.values() if s.dirty_since is not None and not s.running]
        ready = [s for s in waiting if s.retry_at <= now]
        if not ready:
            due = [s.retry_at - now for s in waiting]
            return None, (min(due) if due else None)
        first = set(self._priority())

        def order(s: StreamState) -> tuple[bool, float]:
            since = s.dirty_since if s.dirty_since is not None else now
            # Alert streams first, but never so long that a busy one starves the others.
            urgent = s.stream_id in first or now - since >= _PRIORITY_MAX_WAIT_S
            return (not urgent, since)

        return min(ready, key=order), None

    async def analyze(self, stream_id: str) -> AnalysisReport:
        """Analyse one stream now (the workers call this; so do tests and the benchmark).

        Raises:
            KeyError: no such stream. LlmUnavailable: the engine is not serving.
        """
        return await self._analyze(self._streams[stream_id])

    async def _analyze(self, st: StreamState) -> AnalysisReport:
        st.running = True
        since, st.dirty_since = st.dirty_since, None
        try:
            return await self._analyze_now(st)
        except BaseException:
            # Nothing is lost: the lines are in the window (or still pending); analyse
            # again once the engine is back.
            if since is not None:
                st.dirty_since = since if st.dirty_since is None else min(since, st.dirty_since)
            raise
        finally:
            st.running = False

    async def _analyze_now(self, st: StreamState) -> AnalysisReport:
        await self._feeder.prepare()
        window = await self._feeder.window(st, self.budget)
        dropped_lines, dropped_tokens, summary = await self._feeder.absorb(st, window)
        prompt = window.prompt(self._feeder.analysis_tail)
        t0 = self._mono()
        answer = await ask(self.llm, st, prompt, self.settings, self.schema)
        latency = self._mono() - t0
        cached = answer.num_cached_tokens or 0
        st.analyses += 1
        self.analyses += 1
        st.prompt_tokens += answer.num_prompt_tokens
        st.cached_tokens += cached
        st.last_latency_s, st.last_ttft_s = latency, answer.ttft_s
        self.latency.add(latency)
        valid, accepted, rejected = judge(
            answer,
            st,
            window.lines,
            self._catalogue,
            self.settings,
            disabled=self._disabled_for(st.stream_id),
        )
        new = news(st, accepted)
        if new:
            await self._on_faults(st.stream_id, new)
        remember(st, new, window.lines)
        log.info(
            "analysis.done",
            stream_id=st.stream_id,
            prompt_tokens=answer.num_prompt_tokens,
            cached_tokens=cached,
            ttft_s=rounded(answer.ttft_s),
            latency_s=round(latency, 3),
            faults=[f.code for f in new],
            rejected=dict(rejected) or None,
            finish_reason=answer.finish_reason,
        )
        return AnalysisReport(
            stream_id=st.stream_id,
            prompt_tokens=answer.num_prompt_tokens,
            cached_tokens=cached,
            ttft_s=answer.ttft_s,
            latency_s=latency,
            dropped_lines=dropped_lines,
            dropped_tokens=dropped_tokens,
            summary=summary,
            accepted=accepted,
            new_faults=new,
            rejected=rejected,
            valid=valid,
            finish_reason=answer.finish_reason,
            answer=answer.text,
        )

    def running_streams(self) -> set[str]:
        """Streams with an analysis in flight."""
        return {sid for sid, st in self._streams.items() if st.running}

    def set_budget(self, budget: int) -> None:
        """A new window size for every stream (the watchdog's context rung, or its climb
        back). Applied to each window at the start of its next analysis, never under one."""
        if budget != self.budget:
            log.warning("context.budget", budget=budget, previous=self.budget)
        self.budget = budget
        self._pending_max_chars = budget * 4

    # -- reporting ---------------------------------------------------------------------------
    def window(self, stream_id: str) -> ContextWindow | None:
        """The stream's window (None before its first analysis); for reading only."""
        st = self._streams.get(stream_id)
        return st.window if st is not None else None

    def snapshot(self) -> dict[str, Any]:
        now = self._mono()
        prompt = sum(s.prompt_tokens for s in self._streams.values())
        cached = sum(s.cached_tokens for s in self._streams.values())
        rejected: Counter[str] = Counter()
        for s in self._streams.values():
            rejected.update(s.rejected)
        return {
            "analyses": self.analyses,
            "running": sum(1 for s in self._streams.values() if s.running),
            "waiting": sum(1 for s in self._streams.values() if s.dirty_since is not None),
            "latency_p50_s": rounded(self.latency.percentile(0.50)),
            "latency_p95_s": rounded(self.latency.percentile(0.95)),
            "prefix_hit_rate": round(cached / prompt, 3) if prompt else None,
            "faults_accepted": sum(s.accepted for s in self._streams.values()),
            "faults_rejected": dict(rejected),
            "segments_withheld": self._feeder.withheld,
            "streams": {sid: s.snapshot(now) for sid, s in sorted(self._streams.items())},
        }
