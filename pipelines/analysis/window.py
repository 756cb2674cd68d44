"""Feeding a stream's window: pending segments in, overflow out with a note kept of it.

Before each analysis the scheduler hands the stream to `WindowFeeder`: the window is
resized to the current budget (or rebuilt), the pending segments are tokenized (untrusted:
speech stays plain text; a segment that reads like a command to a machine is withheld) and
appended. When they would overflow the window, the lines about to leave are summarized
*before* they leave: that prompt still shares the cached prefix, so the note costs a few
dozen tokens, not a prefill; the note joins the head, and the head is encoded again.
"""

from __future__ import annotations

import asyncio
import re
import time
from collections import Counter
from collections.abc import Mapping, Sequence

import structlog

from pipelines.analysis.protocols import AnalysisLlm, TokenCodec
from pipelines.analysis.settings import AnalysisSettings
from pipelines.analysis.state import Pending, StreamState
from pipelines.analysis_prompt import (
    WITHHELD,
    ChatFrame,
    analysis_request,
    render_head,
    render_line,
    render_transcript_open,
    summary_request,
)
from pipelines.context import ContextError, ContextLine, ContextWindow
from pipelines.detect import FaultRule
from pipelines.evidence import looks_like_instruction

__all__ = ["WITHHELD", "WindowFeeder"]

log = structlog.get_logger(__name__)

_TAIL_MARGIN = 16  # tokens: the summary request's segment number varies in length
_MARKUP = re.compile(r"<\|[^|>]*\|>|[<>]")


class WindowFeeder:
    """Builds, resizes and fills the streams' windows; one per analyzer."""

    def __init__(
        self,
        llm: AnalysisLlm,
        codec: TokenCodec,
        settings: AnalysisSettings,
        catalogue: Mapping[str, FaultRule],
        *,
        drop_fraction: float,
    ) -> None:
        self.llm = llm
        self.codec = codec
        self.settings = settings
        self._catalogue = catalogue
        self._drop_fraction = drop_fraction
        self._frame: ChatFrame | None = None
        self.analysis_tail: list[int] = []  # the analysis request, after the transcript
        self._tail_reserve = 0
        self._head_reserve = 0
        self._preparing = asyncio.Lock()
        self.withheld = 0  # segments not shown to the model (instruction-like)

    async def prepare(self) -> None:
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
            self.analysis_tail = tails[0]
            self._tail_reserve = max(len(t) for t in tails) + _TAIL_MARGIN
            self._frame = frame  # last: its presence means everything above is ready

    async def window(self, st: StreamState, budget: int) -> ContextWindow:
        """The stream's window on `budget`: resized when the budget changed (or rebuilt
        when its head no longer fits), created at the stream's first analysis."""
        if st.window is not None and st.window.budget != budget:
            before = st.window.budget
            try:
                drop = st.window.resize(budget)
            except ContextError as exc:
                # The head no longer fits with room to spare: a new window on the new
                # budget (its lines were analysed already; the pending ones are kept).
                log.error("context.reset", stream_id=st.stream_id, error=str(exc))
                st.window = None
            else:
                log.warning(
                    "context.resize",
                    stream_id=st.stream_id,
                    budget=budget,
                    previous=before,
                    lines_dropped=len(drop.lines) if drop else 0,
                    tokens_dropped=drop.tokens if drop else 0,
                )
        if st.window is None:
            st.window = ContextWindow(
                budget,
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

    async def _head(self, st: StreamState) -> list[int]:
        assert self._frame is not None
        (ids,) = await self.codec.encode(
            [self._head_text(self._frame, st.stream_id, st.summaries)], trusted=True
        )
        return ids

    async def absorb(self, st: StreamState, window: ContextWindow) -> tuple[int, int, str | None]:
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

    async def _encode_lines(self, pending: Sequence[Pending], max_tokens: int) -> list[ContextLine]:
        # A segment that reads like a command to a machine is not shown to the model at
        # all (the keyword tier still saw it): it can neither steer an answer nor be
        # pointed at as evidence. Judged on the whole segment, before any split.
        shown = []
        for item in pending:
            if looks_like_instruction(item.text):
                self.withheld += 1
                log.warning("analysis.segment_withheld", seq=item.seq, text=item.text[:120])
                item = Pending(item.seq, item.start, item.end, WITHHELD, item.faults)  # noqa: PLW2901
            shown.append(item)
        pending = shown
        rendered = [render_line(p.seq, p.text) for p in pending]
        ids = await self.codec.encode(rendered, trusted=False)
        lines: list[ContextLine] = []
        for p, line_ids in zip(pending, ids, strict=True):
            if len(line_ids) <= max_tokens:
                lines.append(ContextLine(p.seq, p.start, p.end, p.text, tuple(line_ids), p.faults))
            else:
                lines.extend(await self._split(p, max_tokens))
        return lines

    async def _split(self, p: Pending, max_tokens: int) -> list[ContextLine]:
        """A segment too long for one line becomes several lines of the same segment
        (halves, at a space near the middle where there is one)."""
        mid = len(p.text) // 2
        cut = p.text.rfind(" ", 0, mid + 1)
        cut = cut if cut > 0 else mid
        out: list[ContextLine] = []
        for part in (p.text[:cut].strip(), p.text[cut:].strip()):
            if part:
                half = Pending(p.seq, p.start, p.end, part, p.faults)
                out.extend(await self._encode_lines([half], max_tokens))
        return out

    async def _summarize(
        self, st: StreamState, window: ContextWindow, gone: Sequence[ContextLine]
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


def _clock(epoch: float) -> str:
    return time.strftime("%H:%M:%S", time.gmtime(epoch))
