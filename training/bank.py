"""The shapes of the generator's phrase banks, and how a template becomes text.

A bank holds, per language, what people on a line say: evidence clauses per fault (in
catalogue words, in other words, as readings, as a trend over several segments), hard
negatives by class, ordinary chatter, openers and closers around a clause, and slot
vocabularies. Templates name slots in braces (`{part}`); a slot's value may name slots of
its own. Everything here is data written for the generator; the hand-written evaluation
set (bench/quality/set/) is kept apart from it and never read by it.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["NEGATIVE_KINDS", "Bank", "FaultPhrases", "fill"]

# Classes of harmless talk that uses fault words (each must yield {"faults": []}).
NEGATIVE_KINDS = (
    "harmless",
    "negation",
    "fixed",
    "drill",
    "question",
    "instruction",
    "injection",
    "noise",
    "normal_reading",
    "hypothetical",
)

_SLOT = re.compile(r"\{([a-z_0-9]+)\}")
_MAX_DEPTH = 6


@dataclass(frozen=True)
class FaultPhrases:
    """Evidence clauses for one catalogue fault. Each clause is what the answer quotes."""

    keyword: Sequence[str]  # with a catalogue keyword phrase in it
    paraphrase: Sequence[str]  # in other words (no catalogue keyword phrase)
    reading: Sequence[str] = ()  # numbers and readings that are out of range
    trend: Sequence[Sequence[str]] = ()  # one fault getting worse, segment by segment
    # Said after the clause in the same segment; may hold negations ("it never goes past
    # 70"), which is why the quote stops before them.
    tails: Sequence[str] = ()


@dataclass(frozen=True)
class Bank:
    lang: str
    joiner: str  # between the pieces of a segment: " " (English) or "" (Chinese)
    slots: Mapping[str, Sequence[str]]
    faults: Mapping[str, FaultPhrases]
    negatives: Mapping[str, Sequence[str]]
    chatter: Sequence[str]
    openers: Sequence[str]  # before a clause: "hey," / "注意，"
    closers: Sequence[str]  # after a clause: "can someone check." / "快来看看。"
    notes: Sequence[str] = field(default=())  # engine notes on dropped history
    # Said after a fault by the people dealing with it (actions, guesses, who to call):
    # about the fault but not evidence of it, so the answer quotes the symptom, not these.
    followups: Sequence[str] = field(default=())


def fill(template: str, rng: random.Random, slots: Mapping[str, Sequence[str]]) -> str:
    """Replace every `{slot}` with a random value of it, recursively.

    Raises:
        KeyError: a template names a slot the bank does not have.
    """
    text = template
    for _ in range(_MAX_DEPTH):
        if "{" not in text:
            return text
        text = _SLOT.sub(lambda m: rng.choice(slots[m.group(1)]), text)
    if _SLOT.search(text):
        raise ValueError(f"slots nested too deep in {template!r}")
    return text
