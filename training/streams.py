"""Synthetic microphone streams: segments of shop-floor talk, some of them evidence of a fault.

A stream is a list of `Said` segments in one language (some Chinese ones switch into
English words), with the fault evidence each carries: the catalogue code and the clause
that shows it. Positive streams hold one or two faults, said once (catalogue words, other
words, a reading) or building up over several segments; every stream also carries hard
negatives (the same words used harmlessly, negated, fixed, drilled, asked, instructed,
injected) among ordinary chatter. Each evidence clause is checked (`StreamMaker.accepted`)
before it is kept. One ingredient of the corpus beside the hand-written streams
(training/people.py): it gives long windows, drops and notes that no writer would type.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from pipelines.analysis_prompt import OTHER
from pipelines.detect import FaultRule, reads_as_all_clear
from pipelines.evidence import looks_like_instruction, names_fault, normalize_quote
from training.bank import NEGATIVE_KINDS, Bank, fill
from training.noise import damage

__all__ = ["Said", "Stream", "StreamMaker"]

_CODE_SWITCH_ZH = {
    "belt_slip": ["{n}号线的conveyor belt一直slipping", "那条belt又在slip", "conveyor belt打滑了"],
    "bearing_noise": ["那个bearing有grinding的声音", "{n}号辊bearing noise很大"],
    "motor_overload": ["motor又overload了", "{motorpart}一直trip，current很高"],
    "temperature_over_limit": ["oven的temperature太高了", "{hotpart}的temperature已经{hot_deg}度"],
    "leak": ["hydraulic那边oil leak了", "{leakpart}有air leak"],
    "abnormal_vibration": ["{machine}的vibration很大", "{vibpart}一直shaking"],
    "emergency_stop": ["快按emergency stop", "{machine}按了e stop"],
}
_STREAM_IDS = [
    "line{a}-mic{b}",
    "press{a}",
    "st{a}{b}-mic",
    "cell{a}-{c}",
    "{area}-mic{b}",
    "line{a}.zone{b}",
    "mic-{area}-{a}",
]
_AREAS = ["packing", "welding", "paint", "assembly", "warehouse", "molding", "press", "oven"]


@dataclass(frozen=True)
class Said:
    """One segment: its text and the fault evidence it holds, (code, quote) each."""

    text: str
    evidence: tuple[tuple[str, str], ...] = ()
    kind: str = "chatter"  # chatter | fault:<form> | trend | negative:<class>


@dataclass(frozen=True)
class Stream:
    stream_id: str
    lang: str
    said: tuple[Said, ...]
    first_seq: int
    start: float  # epoch seconds of the first segment
    gaps: tuple[float, ...]  # seconds from one segment's start to the next
    analyze_after: tuple[int, ...]  # indices after which an analysis runs

    def codes(self) -> set[str]:
        return {code for s in self.said for code, _ in s.evidence}


class StreamMaker:
    """Draws streams from the banks; every choice from the `random.Random` it is given."""

    def __init__(self, banks: Mapping[str, Bank], catalogue: Sequence[FaultRule]) -> None:
        self.banks = banks
        self.catalogue = {rule.code: rule for rule in catalogue}
        self.rejected_clauses = 0  # evidence drawn that the rules would not accept, redrawn

    # -- one segment -----------------------------------------------------------------------
    def accepted(self, code: str, text: str, quote: str) -> bool:
        """Whether `quote`, inside segment `text`, is an evidence clause the generator may
        use for `code`: it names the fault (a word of its labels, keywords or related
        words), says nothing is well, and its segment is not instruction-like. These were
        the service's quote rules before answers pointed at lines; here they keep the
        phrase banks honest (a bank clause that fails them is redrawn)."""
        if code == OTHER or code not in self.catalogue:
            return False
        return (
            names_fault(quote, self.catalogue[code])
            and not reads_as_all_clear(normalize_quote(quote))
            and not looks_like_instruction(text)
        )

    def fault(
        self,
        rng: random.Random,
        bank: Bank,
        code: str,
        clause: str | None = None,
        form: str = "trend",
    ) -> Said:
        """A segment that shows `code`: opener + evidence clause + closer or tail; a given
        `clause` (a trend's step, a code-switched one) is the evidence, of that `form`."""
        phrases = bank.faults[code]
        for _ in range(20):
            if clause is not None:
                template = clause
            else:
                form = _pick_form(rng, bool(phrases.reading))
                template = _template_for(rng, bank, code, form)
            quote = fill(template, rng, bank.slots)
            text = self._dress(rng, bank, quote, rng.choice([*phrases.tails, *bank.closers]))
            text = self._embed(rng, bank, text)
            if rng.random() < 0.5 and text[:1].islower():  # a sentence's capital
                if text.startswith(quote):
                    quote = quote[0].upper() + quote[1:]
                text = text[0].upper() + text[1:]
            if rng.random() < (0.6 if bank.lang == "zh" else 0.35):
                text, quote = self._damaged(rng, bank.lang, code, text, quote)
            if self.accepted(code, text, quote):
                return Said(text, ((code, quote),), f"fault:{form}")
            self.rejected_clauses += 1
        raise ValueError(f"no acceptable evidence clause for {code} in {bank.lang}")

    def _damaged(
        self, rng: random.Random, lang: str, code: str, text: str, quote: str
    ) -> tuple[str, str]:
        hurt_text, hurt_quote = damage(text, quote, lang, rng)
        if self.accepted(code, hurt_text, hurt_quote):
            return hurt_text, hurt_quote
        return text, quote

    def negative(self, rng: random.Random, bank: Bank, kind: str) -> Said:
        text = fill(rng.choice(bank.negatives[kind]), rng, bank.slots)
        if rng.random() < 0.3 and kind != "injection":
            text = self._dress(rng, bank, text, "")
        if rng.random() < 0.2:
            text, _ = damage(text, text, bank.lang, rng)
        return Said(text, (), f"negative:{kind}")

    def chatter(self, rng: random.Random, bank: Bank) -> Said:
        count = rng.choice((1, 1, 2, 2, 3))
        parts = [fill(rng.choice(bank.chatter), rng, bank.slots) for _ in range(count)]
        sep = ", " if bank.lang == "en" else "，"
        text = sep.join(parts)
        if rng.random() < 0.2:
            text, _ = damage(text, text, bank.lang, rng)
        return Said(text)

    @staticmethod
    def _embed(rng: random.Random, bank: Bank, text: str) -> str:
        """Talk before and after the evidence in the same segment, as people run on."""
        before = fill(rng.choice(bank.chatter), rng, bank.slots) if rng.random() < 0.35 else ""
        after = fill(rng.choice(bank.chatter), rng, bank.slots) if rng.random() < 0.25 else ""
        if bank.lang == "zh":
            head = f"{before}，" if before else ""
            tail = f"{after}。" if after else ""
            return f"{head}{text}{tail}"
        head = f"{before}, and " if before else ""
        tail = f" {after}" if after else ""
        return f"{head}{text}{tail}"

    @staticmethod
    def _dress(rng: random.Random, bank: Bank, clause: str, after: str) -> str:
        opener = fill(rng.choice(bank.openers), rng, bank.slots)
        if bank.lang == "zh":
            tail = f"，{fill(after, rng, bank.slots)}" if after else ""
            return f"{opener}{clause}{tail}{rng.choice(['。', '', '！'])}"
        tail = f", {fill(after, rng, bank.slots)}" if after else ""
        return f"{opener}{clause}{tail}{rng.choice(['.', '', '!', '.'])}"

    # -- one stream ------------------------------------------------------------------------
    def stream(self, rng: random.Random) -> Stream:
        lang = rng.choice(("en", "zh"))
        bank = self.banks[lang]
        length = _length(rng)
        said: list[Said | None] = [None] * length
        free = list(range(length))
        rng.shuffle(free)

        positive = rng.random() < 0.5
        if positive:
            codes = rng.sample(sorted(bank.faults), 2 if rng.random() < 0.2 else 1)
            for code in codes:
                self._place_fault(rng, bank, code, said, free)
        hard = rng.randint(1, 3) if not positive else rng.randint(0, 2)
        for _ in range(min(hard, len(free))):
            kind = "injection" if rng.random() < 0.25 else rng.choice(NEGATIVE_KINDS)
            said[free.pop()] = self.negative(rng, bank, kind)
        # People go on about a fault after it is said: actions, guesses, who to call.
        for i in range(length - 1):
            current = said[i]
            if (
                current is not None
                and current.evidence
                and said[i + 1] is None
                and bank.followups
                and rng.random() < 0.6
            ):
                text = fill(rng.choice(bank.followups), rng, bank.slots)
                said[i + 1] = Said(text, kind="followup")
        filled = [s if s is not None else self.chatter(rng, bank) for s in said]

        evidence_at = [i for i, s in enumerate(filled) if s.evidence]
        after = {length - 1}
        if length > 2 and rng.random() < 0.6:
            after.add(rng.randrange(0, length - 1))
        if evidence_at and length > 3 and rng.random() < 0.3:
            after.add(max(0, evidence_at[0] - 1))  # just before the fault: nothing yet
        return Stream(
            stream_id=_stream_id(rng),
            lang=lang,
            said=tuple(filled),
            first_seq=rng.randrange(0, 400),
            start=1_767_225_600.0 + rng.randrange(0, 300 * 86_400),
            gaps=tuple(rng.uniform(3.0, 10.0) for _ in range(length)),
            analyze_after=tuple(sorted(after)),
        )

    def _place_fault(
        self, rng: random.Random, bank: Bank, code: str, said: list[Said | None], free: list[int]
    ) -> None:
        phrases = bank.faults[code]
        if phrases.trend and len(free) >= 4 and rng.random() < 0.25:
            steps = rng.choice(phrases.trend)
            slots = sorted(free[: len(steps)])
            del free[: len(steps)]
            # The same part throughout: the trend's slots are drawn once.
            pinned = _pinned_slots(rng, bank)
            for idx, step in zip(slots, steps, strict=True):
                said[idx] = self.fault(rng, bank, code, clause=fill(step, rng, pinned))
            return
        if bank.lang == "zh" and rng.random() < 0.12:
            clause = rng.choice(_CODE_SWITCH_ZH[code])
            said[free.pop()] = self.fault(rng, bank, code, clause=clause, form="code_switch")
            return
        said[free.pop()] = self.fault(rng, bank, code)


def _pick_form(rng: random.Random, has_readings: bool) -> str:
    roll = rng.random()
    if has_readings and roll < 0.2:
        return "reading"
    return "keyword" if roll < 0.45 else "paraphrase"


def _template_for(rng: random.Random, bank: Bank, code: str, form: str) -> str:
    phrases = bank.faults[code]
    pool = {"reading": phrases.reading, "keyword": phrases.keyword}.get(form, phrases.paraphrase)
    return rng.choice(list(pool))


def _pinned_slots(rng: random.Random, bank: Bank) -> dict[str, list[str]]:
    """The bank's slots with every part slot fixed to one value (one machine per trend)."""
    pinned = {k: list(v) for k, v in bank.slots.items()}
    for key in ("rot", "hotpart", "beltpart", "vibpart", "leakpart", "motorpart", "machine", "n"):
        if key in pinned:
            pinned[key] = [fill(rng.choice(bank.slots[key]), rng, bank.slots)]
    return pinned


def _length(rng: random.Random) -> int:
    roll = rng.random()
    if roll < 0.4:
        return rng.randint(2, 8)
    if roll < 0.75:
        return rng.randint(9, 40)
    return rng.randint(41, 170)


def _stream_id(rng: random.Random) -> str:
    pattern = rng.choice(_STREAM_IDS)
    return pattern.format(
        a=rng.randint(1, 12), b=rng.randint(1, 9), c=rng.choice("abcd"), area=rng.choice(_AREAS)
    )
