"""Scoring the slow tier's answers on the hand-written parts, under any evidence rules.

bench_slow.py records, per stream, every fault the model answered with its confidence and
the text of the segment it points at, with no rule applied. This module then asks what an
operator would have seen under a given rule set (confidence thresholds, the all-clear and
topic-word rules) without running the engine again, so rules and thresholds are compared
on the same answers, and calibrates per-code thresholds on development parts.

A stream's fault counts as found when an accepted fault has its code (the bench_quality
rule: alerts are per stream and fault); `pointed` when, in addition, the segment it names
is one the writer labelled as evidence. A negative stream with any accepted fault is
alarmed. Codes answered on a positive stream that it does not hold are wrong codes.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pipelines.catalogue import FaultRule
from pipelines.cues import reads_as_all_clear
from pipelines.evidence import names_fault, normalize_quote

__all__ = ["Answered", "Rules", "StreamResult", "calibrate", "confusion", "score"]


@dataclass(frozen=True)
class Answered:
    """One fault as the model answered it (before any rule)."""

    code: str
    seg: int
    confidence: float | None
    text: str  # the segment it names ("" when it names none in the window)


@dataclass(frozen=True)
class StreamResult:
    id: str
    part: str
    lang: str
    kind: str  # paraphrase | keyword | negative
    negative: str | None
    faults: tuple[str, ...]
    evidence: tuple[int, ...]
    answered: tuple[Answered, ...]
    valid: bool
    latency_s: float | None
    ttft_s: float | None
    prompt_tokens: int


@dataclass(frozen=True)
class Rules:
    min_confidence: float = 0.0
    by_code: Mapping[str, float] = field(default_factory=dict)
    reject_all_clear: bool = False
    require_topic_word: bool = False

    def accepts(self, a: Answered, catalogue: Mapping[str, FaultRule]) -> bool:
        if not a.text or a.code not in catalogue:
            return False
        if a.confidence is not None and a.confidence < self.by_code.get(
            a.code, self.min_confidence
        ):
            return False
        if self.reject_all_clear and reads_as_all_clear(normalize_quote(a.text)):
            return False
        return not (self.require_topic_word and not names_fault(a.text, catalogue[a.code]))


def accepted(r: StreamResult, rules: Rules, catalogue: Mapping[str, FaultRule]) -> set[str]:
    return {a.code for a in r.answered if rules.accepts(a, catalogue)}


def score(
    results: Iterable[StreamResult], rules: Rules, catalogue: Mapping[str, FaultRule]
) -> dict[str, Any]:
    """Counts under `rules`: found / total per kind, pointed, wrong codes, negatives and
    injections alarmed, and the share of wrong codes among accepted faults."""
    found: Counter[str] = Counter()
    total: Counter[str] = Counter()
    pointed = right = wrong = 0
    neg = neg_alarmed = inj = inj_alarmed = 0
    for r in results:
        got = accepted(r, rules, catalogue)
        if r.kind == "negative":
            neg += 1
            neg_alarmed += bool(got)
            if r.negative == "injection":
                inj += 1
                inj_alarmed += bool(got)
            continue
        total[r.kind] += len(r.faults)
        hit = got & set(r.faults)
        found[r.kind] += len(hit)
        right += len(hit)
        wrong += len(got - set(r.faults))
        ok = {a.code for a in r.answered if a.code in hit and a.seg in r.evidence}
        pointed += len(ok & hit)
    answered = right + wrong
    return {
        "found_paraphrase": found["paraphrase"],
        "paraphrase": total["paraphrase"],
        "found_keyword": found["keyword"],
        "keyword": total["keyword"],
        "pointed": pointed,
        "wrong_code": wrong,
        "wrong_share": wrong / answered if answered else None,
        "negatives_alarmed": neg_alarmed,
        "negatives": neg,
        "injections_alarmed": inj_alarmed,
        "injections": inj,
    }


def confusion(
    results: Iterable[StreamResult], rules: Rules, catalogue: Mapping[str, FaultRule]
) -> dict[str, Counter[str]]:
    """Expected code (or `none` for a negative) -> answered codes (or `missed`)."""
    out: dict[str, Counter[str]] = {}
    for r in results:
        got = accepted(r, rules, catalogue)
        for code in r.faults or ("none",):
            row = out.setdefault(code, Counter())
            if code != "none" and code not in got:
                row["missed"] += 1
            if code != "none" and code in got:
                row[code] += 1
        for extra in got - set(r.faults):
            out.setdefault(r.faults[0] if len(r.faults) == 1 else "none", Counter())[extra] += 1
    return out


def calibrate(
    results: Sequence[StreamResult],
    catalogue: Mapping[str, FaultRule],
    *,
    base: Rules,
    false_alarm_cost: float = 2.0,
) -> dict[str, float]:
    """Per-code thresholds from development parts. For each code: the thresholds that
    minimise misses of that code plus `false_alarm_cost` times the streams where it is
    raised wrongly (on a negative, or as a wrong code) form an interval between two
    confidences seen (or 0, or 1); the lowest such interval is taken (recall first) and the
    threshold is its middle, which accepts the same answers here and leaves a margin on
    both sides for speech the fit has not seen. So a code with no false alarm to cut gets
    half its lowest right answer's confidence, not 0; a code never answered keeps
    `base.min_confidence`."""
    out: dict[str, float] = {}
    for code in catalogue:
        seen = sorted(
            {
                a.confidence
                for r in results
                for a in r.answered
                if a.code == code and a.confidence is not None
            }
        )
        if not seen:
            out[code] = base.min_confidence
            continue
        # a threshold t accepts confidence >= t; the last candidate rejects every answer
        candidates = [0.0, *seen, math.nextafter(seen[-1], math.inf)]
        best: tuple[float, float] | None = None
        for t in candidates:
            rules = Rules(t, {}, base.reject_all_clear, base.require_topic_word)
            cost = 0.0
            for r in results:
                got = code in accepted(r, rules, catalogue)
                if code in r.faults:
                    cost += 0.0 if got else 1.0
                elif got:
                    cost += false_alarm_cost
            if best is None or cost < best[0] - 1e-9:
                best = (cost, t)
        assert best is not None
        t = best[1]
        upper = min((c for c in seen if c >= t), default=1.0)
        lower = max((c for c in seen if c < t), default=0.0)
        threshold = (lower + upper) / 2
        out[code] = round(threshold, 4)
    return out
