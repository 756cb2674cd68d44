"""Merging overlapping transcript segments by timestamps (pipelines/overlap.py)."""

from __future__ import annotations

from pipelines.ingest import Segment
from pipelines.overlap import StreamTimeline

T0 = 1_700_000_000.0


def seg(seq: int, start: float, end: float, text: str) -> Segment:
    return Segment(stream_id="line3-mic1", seq=seq, start=T0 + start, end=T0 + end, text=text)


WORDS = [
    "one",
    "two",
    "three",
    "four",
    "five",
    "six",
    "seven",
    "eight",
    "nine",
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
    "twenty",
]


def words(first: int, last: int) -> str:
    """Words `first`..`last` (1-based, inclusive): one word per second of audio."""
    return " ".join(WORDS[first - 1 : last])


def test_first_segment_is_new_in_full() -> None:
    """The first segment of a stream is returned whole, with no context."""
    r = StreamTimeline().accept(seg(1, 0, 10, "Bearing noise, line three!"))
    assert not r.duplicate
    assert r.reason == "new"
    assert r.text == "Bearing noise, line three!"
    assert r.context == ""
    assert r.start == T0


def test_sliding_window_returns_only_new_words() -> None:
    """A 10 s window every 5 s: each segment yields only the 5 s of words not heard before."""
    t = StreamTimeline()
    first = t.accept(seg(1, 0, 10, words(1, 10)))
    second = t.accept(seg(2, 5, 15, words(6, 15)))
    third = t.accept(seg(3, 10, 20, words(11, 20)))
    assert first.text == words(1, 10)
    assert (second.duplicate, second.reason, second.text) == (False, "trimmed", words(11, 15))
    assert (third.duplicate, third.reason, third.text) == (False, "trimmed", words(16, 20))
    # Every word was delivered exactly once across the three segments.
    delivered = " ".join(r.text for r in (first, second, third)).split()
    assert delivered == WORDS


def test_trimmed_text_starts_where_old_audio_ended() -> None:
    """The start time of trimmed text is the end of the audio already accepted."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    r = t.accept(seg(2, 5, 15, words(6, 15)))
    assert r.start == T0 + 10


def test_trimmed_text_carries_preceding_words_as_context() -> None:
    """The words heard just before the cut come back as context (at most 8)."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    r = t.accept(seg(2, 5, 15, words(6, 15)))
    assert r.context == words(3, 10)


def test_trimmed_text_keeps_original_case_and_punctuation() -> None:
    """The returned text is the segment's own readable text from the first new word on."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, "start the line"))
    r = t.accept(seg(2, 5, 15, "the line is running, Bearing noise!"))
    assert r.text == "is running, Bearing noise!"


def test_chinese_sliding_window_cuts_by_character() -> None:
    """Chinese overlap is cut per character, independent of ASR spacing."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, "三号线 开始 运行"))
    r = t.accept(seg(2, 5, 15, "开始运行 轴承异响"))
    assert not r.duplicate
    assert r.text == "轴承异响"


def test_redelivered_seq_is_a_duplicate() -> None:
    """The same seq again (QoS 1 redelivery) is a duplicate whatever its text."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    r = t.accept(seg(1, 0, 10, "bearing noise"))
    assert r.duplicate
    assert r.reason == "seq_repeat"
    assert r.text == ""


def test_segment_inside_covered_time_is_a_duplicate() -> None:
    """A segment whose time range was fully heard already is a duplicate, not new text."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    t.accept(seg(2, 5, 15, words(6, 15)))
    r = t.accept(seg(3, 7, 14, "bearing noise"))
    assert r.duplicate
    assert r.reason == "covered"
    assert r.text == ""


def test_segment_repeating_only_old_words_is_a_duplicate() -> None:
    """A segment reaching a little past the old audio but with no new words is a duplicate."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    r = t.accept(seg(2, 5, 12, words(6, 10)))
    assert r.duplicate
    assert r.reason == "empty"
    assert r.text == ""


def test_timestamp_jitter_does_not_create_new_text() -> None:
    """A re-transcribed window whose end jitters by a few ms counts as covered."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    r = t.accept(seg(2, 0.01, 10.02, words(1, 10)))
    assert r.duplicate


def test_later_non_overlapping_segment_is_new() -> None:
    """A segment after a gap in time is new from its first word."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    r = t.accept(seg(2, 30, 35, "Bearing noise again"))
    assert (r.duplicate, r.reason, r.text) == (False, "new", "Bearing noise again")
    assert r.start == T0 + 30
    assert r.context == words(3, 10)


def test_late_segment_filling_a_gap_is_new() -> None:
    """A segment arriving late for a gap between accepted segments is accepted whole."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    t.accept(seg(3, 20, 30, "later words"))
    r = t.accept(seg(2, 10, 20, "gap filler words"))
    assert (r.duplicate, r.reason, r.text) == (False, "new", "gap filler words")


def test_cut_falls_back_to_time_proportion_when_words_differ() -> None:
    """When ASR rewrote the overlap, the cut is placed by the share of overlapping time."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, "alpha beta gamma delta epsilon zeta eta theta"))
    # Half of the new window (5 of 10 s) overlaps: half of its 8 words are dropped.
    r = t.accept(seg(2, 5, 15, "uno dos tres cuatro cinco seis siete ocho"))
    assert r.reason == "trimmed"
    assert r.text == "cinco seis siete ocho"
    assert r.start == T0 + 10


def test_proportional_cut_follows_overlap_share() -> None:
    """With 3 s of an 8 s window overlapping, 3 of its 8 unmatched words are dropped."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, "alpha beta gamma"))
    r = t.accept(seg(2, 7, 15, "uno dos tres cuatro cinco seis siete ocho"))
    assert r.text == "cuatro cinco seis siete ocho"


def test_word_alignment_beats_time_proportion() -> None:
    """When the words line up, the cut follows the words even if speech rate was uneven."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, words(1, 10)))
    # Half the window overlaps in time, but only two old words were re-heard.
    r = t.accept(seg(2, 5, 15, "nine ten " + words(11, 18)))
    assert r.text == words(11, 18)


def test_new_mention_of_old_words_after_overlap_is_kept() -> None:
    """Words repeated in the new audio (the fault said again) are not cut with the overlap."""
    t = StreamTimeline()
    t.accept(seg(1, 0, 10, "bearing noise on line three"))
    # "line three" is the re-heard overlap; "bearing noise again ..." is new speech.
    r = t.accept(seg(2, 5, 15, "line three bearing noise again and again and again now"))
    assert r.text == "bearing noise again and again and again now"


def test_streams_are_tracked_independently() -> None:
    """Each stream has its own timeline: the same seq on another timeline is new."""
    a, b = StreamTimeline(), StreamTimeline()
    a.accept(seg(1, 0, 10, words(1, 10)))
    r = b.accept(seg(1, 0, 10, words(1, 10)))
    assert not r.duplicate
    assert r.text == words(1, 10)
