"""Merge overlapping transcript segments by their timestamps, so no text counts twice.

Microphone pipelines often transcribe a sliding window (30 s of audio every 5 s): each
segment repeats most of the previous one. Per stream we remember which time ranges were
already accepted and the last words accepted. A new segment is then:
- a duplicate (same seq again, as QoS 1 redelivery does, or a time range already covered);
- new from its start (no overlap: a fresh segment, or a late one filling a gap);
- overlapping at its head: its first words repeat the end of what we hold. We cut where
  the words line up (difflib over words / CJK characters), and fall back to cutting in
  proportion to the overlapping time when they do not (ASR rewrites words at the edges).
"""

from __future__ import annotations

import unicodedata
from collections import deque
from dataclasses import dataclass
from difflib import SequenceMatcher

from pipelines.ingest import Segment
from pipelines.normalize import Unit, join_units, units

__all__ = ["MergeResult", "StreamTimeline"]

_EPS = 0.05  # seconds: timestamps of re-transcribed windows jitter a little
_CONTEXT_UNITS = 8  # words kept before the new text so a phrase across the cut still matches


@dataclass(frozen=True)
class MergeResult:
    duplicate: bool
    reason: str  # "new", "trimmed", "seq_repeat", "covered", "empty"
    text: str  # the part of the segment's text not heard before (readable, NFKC)
    context: str  # the words accepted just before it
    start: float  # start time of `text` (estimated when trimmed)


class StreamTimeline:
    """What one stream has already said, bounded in memory."""

    def __init__(self, *, history: int = 256, tail_units: int = 256) -> None:
        self._seqs: deque[int] = deque(maxlen=history)
        self._intervals: deque[tuple[float, float]] = deque(maxlen=history)
        self._tail: deque[str] = deque(maxlen=tail_units)

    def accept(self, seg: Segment) -> MergeResult:
        if seg.seq in self._seqs:
            return MergeResult(True, "seq_repeat", "", "", seg.start)
        seg_units = units(seg.text)
        overlap_end = self._overlap_end(seg.start, seg.end)
        if overlap_end is not None and seg.end <= overlap_end + _EPS:
            self._seqs.append(seg.seq)
            return MergeResult(True, "covered", "", "", seg.start)
        cut = 0
        reason = "new"
        if overlap_end is not None and seg_units:
            cut = self._cut(seg_units, (overlap_end - seg.start) / max(seg.end - seg.start, 1e-6))
            reason = "trimmed"
        context = join_units(list(self._tail)[-_CONTEXT_UNITS:])
        novel = seg_units[cut:]
        text = _readable(seg.text, novel)
        start = seg.start if cut == 0 else max(seg.start, overlap_end or seg.start)
        self._seqs.append(seg.seq)
        self._intervals.append((seg.start, seg.end))
        self._tail.extend(u.text for u in novel)
        if not novel:
            return MergeResult(True, "empty", "", context, start)
        return MergeResult(False, reason, text, context, start)

    def _overlap_end(self, start: float, end: float) -> float | None:
        """End of the accepted time that overlaps the head of [start, end], if any."""
        ends = [e for s, e in self._intervals if s <= start + _EPS and e > start + _EPS]
        return max(ends) if ends else None

    def _cut(self, seg_units: list[Unit], fraction: float) -> int:
        """Number of leading units of the segment already heard."""
        fraction = min(max(fraction, 0.0), 1.0)
        expected = round(len(seg_units) * fraction)
        tail = list(self._tail)[-(2 * expected + 8) :]
        if not tail or expected == 0:
            return expected
        head = [u.text for u in seg_units[: 2 * expected + 8]]
        # Best case: the segment starts with exactly the words we ended on. Take the
        # longest such run, so a fault named again later in the segment is not mistaken
        # for the repeat.
        for k in range(min(len(tail), len(head)), max(1, expected // 2) - 1, -1):
            if tail[-k:] == head[:k]:
                return k
        matcher = SequenceMatcher(None, tail, head, autojunk=False)
        best = None
        matched = 0
        for block in matcher.get_matching_blocks():
            if block.size == 0:
                continue
            matched += block.size
            # The repeated words must run up to (nearly) the end of what we hold.
            if block.a + block.size >= len(tail) - 2:
                best = block.b + block.size
        if best is not None and matched >= max(1, expected // 2):
            return best
        return expected


def _readable(original: str, novel: list[Unit]) -> str:
    """The original text from the first new unit on (case and punctuation kept)."""
    if not novel:
        return ""
    nfkc = unicodedata.normalize("NFKC", original)
    return nfkc[novel[0].start :].strip()
