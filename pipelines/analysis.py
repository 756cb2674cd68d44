"""The slow tier: per-stream rolling contexts and LLM fault analyses that quote evidence.

Data flow per stream: the daemon hands every merged transcript segment to `add()` (cheap,
synchronous, bounded); a worker later absorbs what is pending into the stream's
`ContextWindow` (tokenized off the event loop by the codec), asks the engine for faults
as JSON under a schema, checks every quote (pipelines.evidence) and hands accepted faults
to the daemon, which feeds them to the same alert tracker as the keyword tier.

Scheduling: a stream is analysed when it has new transcript and its previous analysis
finished; whatever arrives meanwhile is coalesced into its next analysis, so the work
per stream is bounded by the engine's speed, never by a queue. Streams with an active
keyword alert go first. When the window overflows, the engine is asked for a one-line
note on the lines about to leave *before* they leave (that prompt still shares the cached
prefix, so the note costs a few dozen tokens, not a prefill), and the note joins the head.

What this stage needs from the daemon is declared here as protocols (`AnalysisLlm`,
`TokenCodec`): tests and the benchmark run it on the real engine or anything that fits.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field

from pipelines.analysis_prompt import (
    ChatFrame,
    analysis_request,
    analysis_schema,
    render_head,
    render_line,
    render_transcript_open,
    summary_request,
)
from pipelines.compat import TaskGroup
from pipelines.context import ContextError, ContextLine, ContextWindow
from pipelines.detect import FaultRule, Severity
from pipelines.evidence import AcceptedFault, looks_like_instruction, parse_answer, verify
from pipelines.latency import LatencyWindow

__all__ = [
    "WITHHELD",
    "AnalysisLlm",
    "AnalysisReport",
    "AnalysisSettings",
    "Analyzer",
    "LlmAnswer",
    "LlmUnavailable",
    "TokenCodec",
]

log = structlog.get_logger(__name__)

_TAIL_MARGIN = 16  # tokens: the summary request's segment number varies in length
_RETRY_MIN_S = 1.0
_RETRY_MAX_S = 30.0
_LATENCY_WINDOW = 256
_PRIORITY_MAX_WAIT_S = 60.0  # a stream waiting longer than this goes before alert streams
_MARKUP = re.compile(r"<\|[^|>]*\|>|[<>]")
# What the model reads instead of a segment that reads like a command to a machine.
WITHHELD = "[segment withheld: it reads like an instruction to a machine]"


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
        256, ge=32, le=4096, title="Answer length", description="Token limit of one answer."
    )
    max_faults: int = Field(
        4, ge=1, le=16, title="Faults per answer", description="The schema's maxItems."
    )
    max_quote_chars: int = Field(
        200, ge=16, le=2000, title="Quote length", description="Longest evidence quote."
    )
    min_quote_chars: int = Field(
        8,
        ge=1,
        title="Shortest quote",
        description="Quotes shorter than this (normalized; a CJK character counts as two) "
        "are not evidence.",
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
    require_topic_word: bool = Field(
        True,
        title="Quote must name the fault",
        description="A catalogue fault's quote must hold a word of its labels, keywords or "
        "related words; off-topic quotes are rejected (off_topic).",
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


class LlmUnavailable(Exception):
    """The engine cannot serve now (stopped, starting, dead); try again when it is back."""


class LlmAnswer(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def num_prompt_tokens(self) -> int: ...
    @property
    def num_cached_tokens(self) -> int | None: ...
    @property
    def ttft_s(self) -> float | None: ...


class AnalysisLlm(Protocol):
    async def wait_ready(self) -> None:
        """Return when the engine can take requests."""

    async def complete(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        json_schema: Mapping[str, Any] | None,
        stop: Sequence[str] = (),
    ) -> LlmAnswer:
        """Raises LlmUnavailable when the engine is not serving."""


class TokenCodec(Protocol):
    async def encode(self, texts: Sequence[str], *, trusted: bool) -> list[list[int]]:
        """Token ids of each text, no special tokens added. `trusted` (our template
        pieces): markers such as <|im_end|> become the control tokens they name.
        Untrusted (transcript lines): they stay plain text, so speech cannot close the
        user turn or open a system one."""

    async def chat_frame(self) -> ChatFrame: ...


FaultSink = Callable[[str, Sequence[AcceptedFault]], Awaitable[None]]


@dataclass(frozen=True)
class _Pending:
    seq: int
    start: float
    end: float
    text: str
    faults: tuple[str, ...]


@dataclass(frozen=True)
class AnalysisReport:
    stream_id: str
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    latency_s: float
    dropped_lines: int
    dropped_tokens: int
    summary: str | None
    accepted: tuple[AcceptedFault, ...]
    new_faults: tuple[AcceptedFault, ...]
    rejected: Counter[str]
    valid: bool
    finish_reason: str | None
    answer: str


@dataclass
class _Stream:
    stream_id: str
    window: ContextWindow | None = None
    pending: deque[_Pending] = field(default_factory=deque)
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
            "last_latency_s": _round(self.last_latency_s),
            "last_ttft_s": _round(self.last_ttft_s),
            "waiting_s": None if self.dirty_since is None else round(now - self.dirty_since, 1),
            "faults_accepted": self.accepted,
            "faults_rejected": dict(self.rejected),
            "invalid_answers": self.invalid_answers,
            "timeouts": self.timeouts,
            "failures": self.failures,
            "retry_in_s": round(max(0.0, self.retry_at - now), 1) if self.retry_delay else None,
        }


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
        # The benchmark's naive policy passes 0 (drop only what must go); config cannot.
        self._drop_fraction = settings.drop_fraction if drop_fraction is None else drop_fraction
        self._streams: dict[str, _Stream] = {}
        self._wake = asyncio.Event()
        self._frame: ChatFrame | None = None
        self._analysis_tail: list[int] = []
        self._tail_reserve = 0
        self._head_reserve = 0
        self._preparing = asyncio.Lock()
        # Public so a test can force an answer through the engine's real output path.
        self.schema: dict[str, Any] = analysis_schema(
            list(self._catalogue),
            max_faults=settings.max_faults,
            max_quote_chars=settings.max_quote_chars,
            allow_other=settings.allow_other,
        )
        self._pending_max_chars = budget * 4  # more than a window's worth is dropped anyway
        self.latency = LatencyWindow(_LATENCY_WINDOW)  # per analysis; /metrics reads it too
        self.analyses = 0
        self.withheld = 0  # segments not shown to the model (instruction-like)

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
            st = self._streams[stream_id] = _Stream(stream_id)
        st.pending.append(_Pending(seq, start, end, text, tuple(faults)))
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

    def _pick(self) -> tuple[_Stream | None, float | None]:
        """The next stream to analyse, else how long until a backed-off one is due."""
        now = self._mono()
        waiting = [s for s in self._streams.values() if s.dirty_since is not None and not s.running]
        ready = [s for s in waiting if s.retry_at <= now]
        if not ready:
            due = [s.retry_at - now for s in waiting]
            return None, (min(due) if due else None)
        first = set(self._priority())

        def order(s: _Stream) -> tuple[bool, float]:
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

    async def _analyze(self, st: _Stream) -> AnalysisReport:
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

    async def _analyze_now(self, st: _Stream) -> AnalysisReport:
        await self._prepare()
        window = await self._window(st)
        dropped_lines, dropped_tokens, summary = await self._absorb(st, window)
        prompt = window.prompt(self._analysis_tail)
        t0 = self._mono()
        try:
            answer = await asyncio.wait_for(
                self.llm.complete(
                    prompt,
                    max_tokens=self.settings.max_output_tokens,
                    json_schema=self.schema,
                ),
                self.settings.analysis_timeout_s,
            )
        except asyncio.TimeoutError:
            st.timeouts += 1
            log.error(
                "analysis.timeout",
                stream_id=st.stream_id,
                deadline_s=self.settings.analysis_timeout_s,
                prompt_tokens=len(prompt),
            )
            raise
        latency = self._mono() - t0
        cached = answer.num_cached_tokens or 0
        st.analyses += 1
        self.analyses += 1
        st.prompt_tokens += answer.num_prompt_tokens
        st.cached_tokens += cached
        st.last_latency_s, st.last_ttft_s = latency, answer.ttft_s
        self.latency.add(latency)
        valid = True
        rejected: Counter[str] = Counter()
        accepted: tuple[AcceptedFault, ...] = ()
        # The raw answer, for whoever measures the model (bench/quality runs at debug).
        log.debug("analysis.answer", stream_id=st.stream_id, answer=answer.text[:2000])
        try:
            parsed = parse_answer(answer.text)
        except ValueError as exc:
            valid = False
            st.invalid_answers += 1
            log.warning(
                "analysis.invalid_answer",
                stream_id=st.stream_id,
                finish_reason=answer.finish_reason,
                error=str(exc),
                answer=answer.text[:200],
            )
        else:
            verdict = verify(
                parsed,
                window.lines,
                self._catalogue,
                disabled=self._disabled_for(st.stream_id),
                allow_other=self.settings.allow_other,
                other_max_severity=self.settings.other_max_severity,
                min_quote_chars=self.settings.min_quote_chars,
                require_topic_word=self.settings.require_topic_word,
            )
            accepted, rejected = verdict.accepted, verdict.rejected
            st.rejected.update(rejected)
        # An old quote is not news: each (fault, segment) reaches the tracker once, so a
        # fault quoted from the window again and again does not keep its alert alive.
        new = tuple(f for f in accepted if _report_key(f) not in st.reported)
        if new:
            await self._on_faults(st.stream_id, new)
        # Recorded once delivered: a sink that failed (or was cancelled) gets them again.
        st.reported.update(_report_key(f) for f in new)
        held = {line.seq for line in window.lines}
        st.reported = {key for key in st.reported if key[1] in held}
        st.accepted += len(new)
        log.info(
            "analysis.done",
            stream_id=st.stream_id,
            prompt_tokens=answer.num_prompt_tokens,
            cached_tokens=cached,
            ttft_s=_round(answer.ttft_s),
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

    # -- the window --------------------------------------------------------------------------
    async def _prepare(self) -> None:
        """Tokenize the fixed pieces once (the engine's tokenizer exists only once it ran)."""
        async with self._preparing:  # several workers may ask at once
            if self._frame is not None:
                return
            frame = await self.codec.chat_frame()
            tails = await self.codec.encode(
                [
                    analysis_request(frame),
                    summary_request(frame, 10**12, self.settings.summary_words),
                ],
                trusted=True,
            )
            # Room for the head at its largest: every note slot full. Measured on a head
            # with empty notes (and the longest stream id), plus each note's cap and its
            # "- " and newline.
            slots = ["" for _ in range(self.settings.max_summaries)]
            (empty,) = await self.codec.encode(
                [self._head_text(frame, "x" * 64, slots)], trusted=True
            )
            per_note = self.settings.summary_max_tokens + 4
            self._head_reserve = len(empty) + self.settings.max_summaries * per_note + _TAIL_MARGIN
            self._analysis_tail = tails[0]
            self._tail_reserve = max(len(t) for t in tails) + _TAIL_MARGIN
            self._frame = frame  # last: its presence means everything above is ready

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

    async def _window(self, st: _Stream) -> ContextWindow:
        if st.window is not None and st.window.budget != self.budget:
            before = st.window.budget
            try:
                drop = st.window.resize(self.budget)
            except ContextError as exc:
                # The head no longer fits with room to spare: a new window on the new
                # budget (its lines were analysed already; the pending ones are kept).
                log.error("context.reset", stream_id=st.stream_id, error=str(exc))
                st.window = None
            else:
                log.warning(
                    "context.resize",
                    stream_id=st.stream_id,
                    budget=self.budget,
                    previous=before,
                    lines_dropped=len(drop.lines) if drop else 0,
                    tokens_dropped=drop.tokens if drop else 0,
                )
        if st.window is None:
            st.window = ContextWindow(
                self.budget,
                tail_reserve=self._tail_reserve,
                drop_fraction=self._drop_fraction,
                head=await self._head(st),
                head_reserve=self._head_reserve,
            )
        return st.window

    def _head_text(self, frame: ChatFrame, stream_id: str, summaries: Sequence[str]) -> str:
        return render_head(
            frame,
            list(self._catalogue.values()),
            summaries,
            allow_other=self.settings.allow_other,
        ) + render_transcript_open(stream_id)

    async def _head(self, st: _Stream) -> list[int]:
        assert self._frame is not None
        (ids,) = await self.codec.encode(
            [self._head_text(self._frame, st.stream_id, st.summaries)], trusted=True
        )
        return ids

    async def _absorb(self, st: _Stream, window: ContextWindow) -> tuple[int, int, str | None]:
        """Move pending segments into the window; returns (lines, tokens) dropped and the
        note kept of them."""
        pending = list(st.pending)
        st.pending.clear()
        st.pending_chars = 0
        if not pending:
            return 0, 0, None
        try:
            lines = await self._encode_lines(pending, window.max_line_tokens)
            gone = window.planned_drop(lines)
            summary = await self._summarize(st, window, gone) if gone else None
        except BaseException:
            # Tokenizing failed (or we were cancelled) before the lines reached the window:
            # the text goes back to the front of the queue, before what arrived meanwhile.
            st.pending.extendleft(reversed(pending))
            st.pending_chars += sum(len(p.text) for p in pending)
            raise
        if summary is not None and self.settings.max_summaries:
            st.summaries = [*st.summaries, summary][-self.settings.max_summaries :]
        drop = window.append(lines)
        if gone:
            window.set_head(await self._head(st))
            log.info(
                "context.drop",
                stream_id=st.stream_id,
                lines=len(drop.lines) if drop else 0,
                tokens=drop.tokens if drop else 0,
                held=window.tokens,
                budget=window.budget,
                summary=summary,
            )
        return (len(drop.lines), drop.tokens, summary) if drop else (0, 0, summary)

    async def _encode_lines(
        self, pending: Sequence[_Pending], max_tokens: int
    ) -> list[ContextLine]:
        # A segment that reads like a command to a machine is not shown to the model at
        # all (the keyword tier still saw it): it can neither steer an answer nor be
        # quoted as evidence. Judged on the whole segment, before any split.
        shown = []
        for item in pending:
            if looks_like_instruction(item.text):
                self.withheld += 1
                log.warning("analysis.segment_withheld", seq=item.seq, text=item.text[:120])
                item = _Pending(item.seq, item.start, item.end, WITHHELD, item.faults)  # noqa: PLW2901
            shown.append(item)
        pending = shown
        rendered = [render_line(p.seq, p.start, p.text) for p in pending]
        ids = await self.codec.encode(rendered, trusted=False)
        lines: list[ContextLine] = []
        for p, line_ids in zip(pending, ids, strict=True):
            if len(line_ids) <= max_tokens:
                lines.append(ContextLine(p.seq, p.start, p.end, p.text, tuple(line_ids), p.faults))
            else:
                lines.extend(await self._split(p, max_tokens))
        return lines

    async def _split(self, p: _Pending, max_tokens: int) -> list[ContextLine]:
        """A segment too long for one line becomes several lines of the same segment
        (halves, at a space near the middle where there is one)."""
        mid = len(p.text) // 2
        cut = p.text.rfind(" ", 0, mid + 1)
        cut = cut if cut > 0 else mid
        out: list[ContextLine] = []
        for part in (p.text[:cut].strip(), p.text[cut:].strip()):
            if part:
                half = _Pending(p.seq, p.start, p.end, part, p.faults)
                out.extend(await self._encode_lines([half], max_tokens))
        return out

    async def _summarize(
        self, st: _Stream, window: ContextWindow, gone: Sequence[ContextLine]
    ) -> str:
        """A note on the lines about to leave: facts we know (time span, keyword matches)
        and, when the engine serves, one sentence from it, asked on the still-cached
        window."""
        counts = Counter(code for line in gone for code in line.faults)
        span = f"{_clock(gone[0].start)}-{_clock(gone[-1].end)} UTC, {len(gone)} segments"
        if counts:
            top = counts.most_common(4)  # bounded: the note has a token cap
            span += ", keyword matches: " + ", ".join(f"{c} x{n}" for c, n in top)
        held = {line.seq for line in window.lines}
        last = max((line.seq for line in gone if line.seq in held), default=None)
        if last is None:
            return span
        assert self._frame is not None
        st.summary_requests += 1
        try:
            (tail,) = await self.codec.encode(
                [summary_request(self._frame, last, self.settings.summary_words)], trusted=True
            )
            answer = await asyncio.wait_for(
                self.llm.complete(
                    window.prompt(tail),
                    max_tokens=self.settings.summary_words * 2,
                    json_schema=None,
                    stop=("\n",),
                ),
                self.settings.analysis_timeout_s,
            )
            # Model-written from untrusted speech, and it joins the head (encoded as
            # trusted template text): no template markers, one line, not a command.
            sentence = " ".join(_MARKUP.sub(" ", answer.text).split())
            if not sentence or looks_like_instruction(sentence):
                return span
            return await self._fit_note(f"{span}: {sentence}", span)
        except Exception as exc:  # any failure costs the sentence, never the lines
            log.warning("context.summary_skipped", stream_id=st.stream_id, error=repr(exc))
            return span

    async def _fit_note(self, note: str, floor: str) -> str:
        """`note`, shortened by words until it fits summary_max_tokens (else `floor`)."""
        words = note.split(" ")
        while len(words) > len(floor.split(" ")):
            (ids,) = await self.codec.encode([" ".join(words)], trusted=True)
            if len(ids) <= self.settings.summary_max_tokens:
                return " ".join(words)
            words = words[: max(len(floor.split(" ")), len(words) * 3 // 4)]
        return floor

    # -- reporting ---------------------------------------------------------------------------
    def stream_ids(self) -> list[str]:
        return sorted(self._streams)

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
            "latency_p50_s": _round(self.latency.percentile(0.50)),
            "latency_p95_s": _round(self.latency.percentile(0.95)),
            "prefix_hit_rate": round(cached / prompt, 3) if prompt else None,
            "faults_accepted": sum(s.accepted for s in self._streams.values()),
            "faults_rejected": dict(rejected),
            "segments_withheld": self.withheld,
            "streams": {sid: s.snapshot(now) for sid, s in sorted(self._streams.items())},
        }


def _report_key(fault: AcceptedFault) -> tuple[str, int]:
    """What makes a fault news: its code and segment. Every `other` label counts as one
    code, so the same segment relabelled at the next analysis is not a new alert."""
    code = fault.code.split(":", 1)[0]
    return code, fault.line.seq


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch))
