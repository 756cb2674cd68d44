"""Scheduling of the slow tier: coalescing, priority, bounds, engine outages.

The engine is replaced here by a stand-in that can be held, released and failed on
demand, which the real engine cannot do on cue; the same paths run on the real engine in
tests/test_analysis_engine.py and tests/test_llm_daemon.py.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from pipelines.analysis import AnalysisSettings, Analyzer, LlmUnavailable, TokenLogprob
from pipelines.analysis_prompt import ChatFrame
from pipelines.detect import FaultRule
from pipelines.evidence import AcceptedFault
from tests.helpers import until

CATALOGUE = [
    FaultRule(code="bearing_noise", labels={"en": "bearing noise"}, keywords={"en": ["bearing"]})
]


@dataclass
class Answer:
    text: str
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int | None
    ttft_s: float | None
    tokens: Sequence[TokenLogprob] | None = None


class WordCodec:
    async def encode(self, texts: Sequence[str], *, trusted: bool = False) -> list[list[int]]:
        return [
            [int(hashlib.sha1(w.encode()).hexdigest()[:6], 16) for w in t.split()] for t in texts
        ]

    async def chat_frame(self) -> ChatFrame:
        return ChatFrame.plain()


class StandInLlm:
    def __init__(self) -> None:
        self.ready = asyncio.Event()
        self.ready.set()
        self.gate = asyncio.Event()
        self.gate.set()
        self.prompts: list[list[int]] = []
        self.fail = 0
        self.started = asyncio.Event()
        self.parked = 0  # workers waiting for the engine right now

    async def wait_ready(self) -> None:
        if self.ready.is_set():
            return
        self.parked += 1
        try:
            await self.ready.wait()
        finally:
            self.parked -= 1

    async def complete(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        json_schema: Mapping[str, Any] | None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
    ) -> Answer:
        if self.fail:
            self.fail -= 1
            self.ready.clear()
            raise LlmUnavailable("engine core died")
        self.started.set()
        await self.gate.wait()
        self.prompts.append(prompt)
        return Answer('{"faults": []}', "stop", len(prompt), 0, 0.01)


async def ignore(_sid: str, _faults: Sequence[AcceptedFault]) -> None:
    return None


def make(llm: StandInLlm, **kw: Any) -> Analyzer:
    return Analyzer(
        llm, WordCodec(), AnalysisSettings(), CATALOGUE, budget=4096, on_faults=ignore, **kw
    )


def say(a: Analyzer, stream: str, seq: int) -> None:
    a.add(stream, seq=seq, start=1e9 + seq, end=1e9 + seq + 1, text=f"word{seq} line {seq}")


async def test_segments_arriving_during_an_analysis_are_coalesced() -> None:
    """Five segments that arrive while an analysis runs make one more analysis, not five."""
    llm = StandInLlm()
    llm.gate.clear()
    a = make(llm)
    task = asyncio.create_task(a.run())
    say(a, "mic1", 0)
    await until(llm.started.is_set)
    for seq in range(1, 6):
        say(a, "mic1", seq)
    llm.gate.set()
    await until(lambda: a.analyses == 2 and not a.snapshot()["waiting"])
    # Nothing running, waiting or pending: no third analysis can come, however long one waits.
    snap = a.snapshot()
    assert snap["running"] == 0 and snap["streams"]["mic1"]["pending_lines"] == 0
    task.cancel()
    assert a.analyses == 2
    assert len(llm.prompts[1]) > len(llm.prompts[0])  # the second saw all five


async def test_streams_with_a_keyword_alert_go_first() -> None:
    llm = StandInLlm()
    order: list[str] = []
    a = make(llm, priority=lambda: {"mic2"})
    for sid in ("mic1", "mic2", "mic3"):
        say(a, sid, 0)
    original = a._analyze_now

    async def spy(st: Any) -> Any:
        order.append(st.stream_id)
        return await original(st)

    a._analyze_now = spy  # type: ignore[method-assign]
    task = asyncio.create_task(a.run())
    await until(lambda: a.analyses == 3)
    task.cancel()
    assert order[0] == "mic2"
    assert order[1:] == ["mic1", "mic3"]  # then the longest waiting


async def test_pending_text_is_bounded_and_sheds_oldest_counted() -> None:
    """While the engine is away, each stream holds at most a few windows of text."""
    llm = StandInLlm()
    llm.ready.clear()
    a = make(llm)
    for seq in range(20_000):
        say(a, "mic1", seq)
    snap = a.snapshot()["streams"]["mic1"]
    assert snap["shed_lines"] > 0
    assert snap["pending_lines"] + snap["shed_lines"] == 20_000
    assert snap["pending_lines"] * len("word00000 line 00000") <= 4096 * 4 + 40


async def test_engine_outage_loses_no_transcript() -> None:
    """An analysis that finds the engine gone leaves the stream pending; once the engine
    is back, the next analysis sees every line, and nothing ran while it was away."""
    llm = StandInLlm()
    llm.fail = 1
    a = make(llm)
    task = asyncio.create_task(a.run())
    say(a, "mic1", 0)
    await until(lambda: not llm.ready.is_set())
    for seq in range(1, 4):
        say(a, "mic1", seq)
    # Every worker parked on the engine with lines pending: none can analyse until it serves.
    await until(lambda: llm.parked == a.settings.concurrency)
    assert a.analyses == 0
    llm.ready.set()
    await until(lambda: a.analyses == 1, limit=10)
    task.cancel()
    words = set((await WordCodec().encode([f"word{s}" for s in range(4)]))[0])
    assert words <= set(llm.prompts[0])
    assert a.snapshot()["streams"]["mic1"]["failures"] == 0


async def test_a_failing_analysis_backs_off_instead_of_spinning() -> None:
    """A stream whose analysis keeps failing is retried slowly and counted, and the
    other streams still get analysed."""
    llm = StandInLlm()
    now = [0.0]
    a = make(llm, monotonic=lambda: now[0])
    original = a._analyze_now
    calls: list[str] = []

    async def broken(st: Any) -> Any:
        calls.append(st.stream_id)
        if st.stream_id == "bad":
            raise RuntimeError("bug")
        return await original(st)

    a._analyze_now = broken  # type: ignore[method-assign]
    say(a, "bad", 0)
    say(a, "good", 0)
    task = asyncio.create_task(a.run())
    bad = lambda: a.snapshot()["streams"]["bad"]  # noqa: E731
    await until(lambda: "good" in calls and bad()["failures"] == 1)
    # The retry is due a second later on the analyzer's clock, which stands still here: the
    # stream cannot run again until it moves, however long the test machine takes.
    assert bad()["retry_in_s"] == 1.0
    assert calls.count("bad") == 1
    now[0] = 1.0
    await until(lambda: bad()["failures"] == 2, limit=10)
    assert bad()["retry_in_s"] == 2.0  # and the next wait is twice as long
    task.cancel()
    assert calls.count("bad") == 2


async def test_nothing_runs_until_the_engine_serves() -> None:
    llm = StandInLlm()
    llm.ready.clear()
    a = make(llm)
    task = asyncio.create_task(a.run())
    say(a, "mic1", 0)
    await until(lambda: llm.parked == a.settings.concurrency)
    assert a.analyses == 0 and not llm.prompts
    llm.ready.set()
    await until(lambda: a.analyses == 1)
    task.cancel()


async def test_overlapping_segments_enter_the_window_once() -> None:
    """A 30 s window re-transcribed every 10 s reaches the window merged by timestamps:
    every spoken word appears once in the prompt."""
    from pipelines.ingest import Segment
    from pipelines.overlap import StreamTimeline

    words = [f"w{i}" for i in range(120)]  # two words a second, 60 s
    timeline = StreamTimeline()
    llm = StandInLlm()
    a = make(llm)
    for seq, start in enumerate(range(0, 40, 10)):
        text = " ".join(words[2 * start : 2 * (start + 30)])
        seg = Segment(stream_id="mic1", seq=seq, start=1e9 + start, end=1e9 + start + 30, text=text)
        merged = timeline.accept(seg)
        if not merged.duplicate:
            a.add("mic1", seq=seg.seq, start=merged.start, end=seg.end, text=merged.text)
    await a.analyze("mic1")
    (ids,) = await WordCodec().encode([" ".join(words)])
    prompt = llm.prompts[0]
    assert len(ids) == 120
    for token in ids:
        assert prompt.count(token) == 1


async def test_a_tokenizer_failure_puts_the_text_back() -> None:
    """If tokenizing the pending segments fails, they wait for the next analysis in order,
    ahead of what arrived meanwhile."""

    class FlakyCodec(WordCodec):
        fail = True

        async def encode(self, texts: Sequence[str], *, trusted: bool = False) -> list[list[int]]:
            if self.fail and any("word0" in t for t in texts):
                self.fail = False
                raise RuntimeError("tokenizer hiccup")
            return await super().encode(texts)

    llm = StandInLlm()
    a = Analyzer(llm, FlakyCodec(), AnalysisSettings(), CATALOGUE, budget=4096, on_faults=ignore)
    say(a, "mic1", 0)
    with pytest.raises(RuntimeError, match="hiccup"):
        await a.analyze("mic1")
    assert a.snapshot()["streams"]["mic1"]["pending_lines"] == 1
    say(a, "mic1", 1)
    await a.analyze("mic1")
    (first, second) = await WordCodec().encode(["word0", "word1"])
    prompt = llm.prompts[0]
    assert prompt.index(first[0]) < prompt.index(second[0])


async def test_a_failed_note_costs_the_sentence_not_the_lines() -> None:
    """Any failure of the summary request before a drop keeps every line: the note falls
    back to the facts (time span, segment count)."""

    class NoNotes(StandInLlm):
        async def complete(self, prompt: list[int], **kw: Any) -> Answer:
            if kw.get("json_schema") is None:
                raise RuntimeError("bad request")
            return await super().complete(prompt, **kw)

    llm = NoNotes()
    a = Analyzer(llm, WordCodec(), AnalysisSettings(), CATALOGUE, budget=2048, on_faults=ignore)
    for seq in range(400):
        say(a, "mic1", seq)
        if seq % 20 == 19:
            report = await a.analyze("mic1")
    window = a.window("mic1")
    assert window is not None and window.drops > 0
    assert window.lines[-1].seq == 399  # the newest segment made it in
    assert report.summary is None or "segments" in report.summary
    held = [line.seq for line in window.lines]
    assert held == list(range(held[0], 400))  # nothing missing after the drops


async def test_faults_the_sink_failed_to_take_are_offered_again() -> None:
    """A fault is recorded as reported only after the daemon took it."""
    calls: list[int] = []

    async def flaky(_sid: str, faults: Sequence[AcceptedFault]) -> None:
        calls.append(len(faults))
        if len(calls) == 1:
            raise OSError("outbox write failed")

    llm = StandInLlm()
    a = Analyzer(llm, WordCodec(), AnalysisSettings(), CATALOGUE, budget=4096, on_faults=flaky)
    a.add("mic1", seq=0, start=1e9, end=1e9 + 5, text="the bearing is grinding loudly")
    original = llm.complete

    async def quoting(prompt: list[int], **kw: Any) -> Answer:
        ans = await original(prompt, **kw)
        text = '{"faults": [{"code": "bearing_noise", "seg": 0}]}'
        return Answer(text, "stop", ans.num_prompt_tokens, 0, 0.01)

    llm.complete = quoting  # type: ignore[method-assign]
    with pytest.raises(OSError, match="outbox"):
        await a.analyze("mic1")
    a.add("mic1", seq=1, start=1e9 + 5, end=1e9 + 10, text="still grinding")
    report = await a.analyze("mic1")
    assert calls == [1, 1]
    assert [f.line.seq for f in report.new_faults] == [0]


async def test_a_busy_alert_stream_does_not_starve_the_others() -> None:
    """Alert streams go first, but a stream waiting past the cap goes before them."""
    now = [0.0]
    llm = StandInLlm()
    a = make(llm, priority=lambda: {"alerting"}, monotonic=lambda: now[0])
    say(a, "quiet", 0)
    now[0] = 30.0
    say(a, "alerting", 0)
    st, _ = a._pick()
    assert st is not None and st.stream_id == "alerting"
    now[0] = 61.0
    st, _ = a._pick()
    assert st is not None and st.stream_id == "quiet"


async def test_a_new_budget_reaches_each_window_at_its_next_analysis() -> None:
    """The watchdog's context rung: set_budget shrinks every stream's window before its
    next prompt, dropping its oldest lines; the analysis then fits the smaller engine."""
    llm = StandInLlm()
    a = make(llm)
    for seq in range(0, 400, 4):  # about 3,000 of the 4,096 tokens
        a.add(
            "s1",
            seq=seq,
            start=1e9 + seq,
            end=1e9 + seq + 1,
            text=" ".join(f"w{seq}x{i}" for i in range(30)),
        )
    await a.analyze("s1")
    window = a.window("s1")
    assert window is not None and window.transcript_tokens > 2048
    a.set_budget(2048)
    assert window.budget == 4096  # not under a running analysis: at the next one
    say(a, "s1", 500)
    await a.analyze("s1")
    assert window.budget == 2048
    assert len(llm.prompts[-1]) <= 2048
    assert window.lines[-1].seq == 500
