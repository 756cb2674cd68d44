"""Streams into training examples, through the service's own analyzer.

Each stream is fed to a real `pipelines.analysis.Analyzer` (the stage the daemon runs),
with the model's own tokenizer as its codec and a stand-in engine that records every
prompt it is sent. So the prompt of an example is, token for token, what the service
would send the engine at that point of the stream: the chat template, the instructions
and catalogue, notes on dropped history, the window after its drops, withheld
instruction-like segments, the request. The stand-in answers with the target (the faults
the window's lines show, each with its latest evidence), and the analyzer checks that
answer with the service's evidence rules; an example whose target would not be accepted
in full is not kept.

Notes on dropped history: the analyzer asks for one before a drop; the stand-in answers
with a plain note, and some of those requests become summary examples too.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.analysis import WITHHELD, AnalysisSettings, Analyzer, TokenLogprob
from pipelines.analysis_prompt import ChatFrame, chat_frame_of, encode_texts
from pipelines.context import ContextLine
from pipelines.detect import FaultRule
from pipelines.evidence import AcceptedFault
from training.streams import Stream

__all__ = ["Example", "Renderer", "target_answer"]

_LAST_SEQ = re.compile(r"segments up to #(\d+) are about to be removed")
SUMMARY_SHARE = 0.3  # of the analyzer's note requests, kept as summary examples


@dataclass(frozen=True)
class Example:
    prompt: list[int]
    target: str  # the answer text; its tokens are the model's to learn
    task: str  # "analysis" | "summary"
    lang: str
    codes: tuple[str, ...]  # the faults the target reports
    lines: int  # transcript lines in the window
    drops: int  # drops the window went through so far


@dataclass
class _Reply:
    text: str
    num_prompt_tokens: int
    finish_reason: str | None = "stop"
    num_cached_tokens: int | None = 0
    ttft_s: float | None = None
    tokens: Sequence[TokenLogprob] | None = None


def target_answer(
    lines: Sequence[ContextLine],
    evidence: Mapping[int, Sequence[str]],
    max_faults: int,
) -> tuple[str, tuple[str, ...]]:
    """The answer for a window: each fault its lines show, pointing at its latest evidence
    segment, in segment order; compact JSON in the schema's key order. `evidence` maps a
    segment number to the codes it shows. Returns (text, codes)."""
    latest: dict[str, int] = {}
    for line in lines:
        if line.text == WITHHELD:
            continue
        for code in evidence.get(line.seq, ()):
            latest[code] = line.seq
    ordered = sorted(latest.items(), key=lambda kv: kv[1])[-max_faults:]
    faults = [{"code": code, "seg": seq} for code, seq in ordered]
    text = json.dumps({"faults": faults}, ensure_ascii=False, separators=(",", ":"))
    return text, tuple(code for code, _ in ordered)


class _Codec:
    """TokenCodec over the tokenizer the service loads (same functions as agent's codec)."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    async def encode(self, texts: Sequence[str], *, trusted: bool) -> list[list[int]]:
        return encode_texts(self.tokenizer, list(texts), trusted=trusted)

    async def chat_frame(self) -> ChatFrame:
        return chat_frame_of(self.tokenizer)


@dataclass
class _Recorder:
    """The stand-in engine for one stream."""

    renderer: Renderer
    stream: Stream
    rng: random.Random
    evidence: dict[int, list[str]]
    analyzer: Analyzer | None = None
    examples: list[Example] = field(default_factory=list)
    expected: tuple[str, ...] = ()

    async def wait_ready(self) -> None:
        return None

    async def complete(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        json_schema: Mapping[str, Any] | None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
    ) -> _Reply:
        assert self.analyzer is not None
        window = self.analyzer.window(self.stream.stream_id)
        assert window is not None
        if json_schema is None:
            note = self._note(prompt, window.lines)
            if self.rng.random() < SUMMARY_SHARE:
                self.examples.append(
                    Example(
                        prompt,
                        note,
                        "summary",
                        self.stream.lang,
                        (),
                        len(window.lines),
                        window.drops,
                    )
                )
            return _Reply(note, len(prompt))
        text, codes = target_answer(window.lines, self.evidence, self.renderer.settings.max_faults)
        self.expected = codes
        self.examples.append(
            Example(
                prompt, text, "analysis", self.stream.lang, codes, len(window.lines), window.drops
            )
        )
        return _Reply(text, len(prompt))

    def _note(self, prompt: list[int], lines: Sequence[ContextLine]) -> str:
        tail = self.renderer.tokenizer.decode(prompt[-48:])
        found = _LAST_SEQ.search(tail)
        last = int(found.group(1)) if found else -1
        seen = [
            (code, line.seq)
            for line in lines
            if line.seq <= last
            for code in self.evidence.get(line.seq, ())
        ]
        if seen:
            code, seq = seen[-1]
            label = self.renderer.catalogue[code].label("en")
            return f"an operator reported {label} at segment #{seq}; other talk was routine"
        bank = self.renderer.banks[self.stream.lang]
        return self.rng.choice(list(bank.notes)) if bank.notes else "routine production talk"


class Renderer:
    """Turns streams into examples with one tokenizer, catalogue and budget."""

    def __init__(
        self,
        tokenizer: Any,
        catalogue: Sequence[FaultRule],
        banks: Mapping[str, Any],
        *,
        budget: int,
        settings: AnalysisSettings | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.rules = list(catalogue)
        self.catalogue = {rule.code: rule for rule in catalogue}
        self.banks = banks
        self.budget = budget
        self.settings = settings or AnalysisSettings()
        self.dropped = 0  # examples whose target the analyzer did not accept in full

    async def render(self, stream: Stream, rng: random.Random) -> list[Example]:
        evidence: dict[int, list[str]] = {}
        for i, said in enumerate(stream.said):
            if said.evidence:
                evidence[stream.first_seq + i] = [code for code, _ in said.evidence]
        recorder = _Recorder(self, stream, rng, evidence)
        analyzer = Analyzer(
            recorder,
            _Codec(self.tokenizer),
            self.settings,
            self.rules,
            budget=self.budget,
            on_faults=_ignore,
        )
        recorder.analyzer = analyzer
        kept: list[Example] = []
        clock = stream.start
        upto = 0
        for after in stream.analyze_after:
            for i in range(upto, after + 1):
                said = stream.said[i]
                analyzer.add(
                    stream.stream_id,
                    seq=stream.first_seq + i,
                    start=clock,
                    end=clock + stream.gaps[i] * 0.8,
                    text=said.text,
                )
                clock += stream.gaps[i]
            upto = after + 1
            before = len(recorder.examples)
            report = await analyzer.analyze(stream.stream_id)
            got = tuple(sorted(f.code for f in report.accepted))
            if report.valid and got == tuple(sorted(recorder.expected)):
                kept.extend(recorder.examples[before:])
            else:
                self.dropped += 1
        return kept


async def _ignore(_stream_id: str, _faults: Sequence[AcceptedFault]) -> None:
    return None
