"""The instant tier: fault keywords on each transcript segment.

Matching is unit by unit (a Latin word or one CJK character, see `normalize`), so it is
independent of spacing and punctuation, and tolerant of what ASR gets wrong:
- English: each keyword word may be off by a small edit distance (noice ~ noise; short
  words must match exactly, or "under" would pass for "over"), one filler word may sit
  inside the phrase, and a compound may be split or joined (over heat ~ overheat).
- Chinese: characters match when they are the same or sound the same (pypinyin, tones
  ignored), so the homophone 轴成异响 still matches 轴承异响.
A match preceded closely by a negation cue ("no abnormal noise", "没有轴承异响") is dropped.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pypinyin import lazy_pinyin
from rapidfuzz.distance import Levenshtein
from typing_extensions import Self

from pipelines.normalize import Unit, is_cjk, join_units, units

__all__ = ["FaultRule", "KeywordDetector", "KeywordMatch", "KeywordSettings", "Severity"]


class Severity(str, Enum):
    info = "info"
    warning = "warning"
    critical = "critical"


class FaultRule(BaseModel):
    """One entry of the fault catalogue."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str = Field(
        pattern=r"^[a-z][a-z0-9_]*$",
        title="Code",
        description="Stable identifier, part of every alert id (bearing_noise).",
    )
    severity: Severity = Field(
        Severity.warning, title="Severity", description="info, warning or critical."
    )
    labels: dict[str, str] = Field(
        title="Labels",
        description="Human label per language code; `en` is required and is the default.",
    )
    keywords: dict[str, list[str]] = Field(
        title="Keywords",
        description="Phrases per language code that raise this fault when spoken.",
    )
    related: dict[str, list[str]] = Field(
        default_factory=dict,
        title="Related words",
        description="Words per language that describe this fault in other words (running "
        "hot, grinding). They raise nothing by themselves; an LLM fault must quote a "
        "segment holding a word of its labels, keywords or these (llm.require_topic_word).",
    )

    @field_validator("labels")
    @classmethod
    def _english_label(cls, v: dict[str, str]) -> dict[str, str]:
        if "en" not in v:
            raise ValueError("an `en` label is required")
        return v

    @model_validator(mode="after")
    def _has_keywords(self) -> Self:
        phrases = [p for ps in self.keywords.values() for p in ps]
        if not phrases:
            raise ValueError("at least one keyword is required")
        empty = [p for p in phrases if not units(p)]
        if empty:
            raise ValueError(f"keywords without any word: {empty!r}")
        return self

    def label(self, lang: str | None) -> str:
        return self.labels.get(lang or "en", self.labels["en"])


_EN_NEGATIONS = [
    "no",
    "not",
    "never",
    "without",
    "none",
    "nothing",
    "isn't",
    "aren't",
    "wasn't",
    "weren't",
    "don't",
    "doesn't",
    "didn't",
    "hasn't",
    "haven't",
    "zero",
]
_ZH_NEGATIONS = ["没有", "没", "无", "不", "未", "非", "别", "并非"]
# Ordinary words that contain a negation character but negate nothing (持续不断的轴承异响,
# 特别刺耳),
# and potential complements that say a machine cannot do something, which is the symptom
# itself, not a denial of it (带不动, 停不住, 受不了, 停不下来, 手放不上去).
_ZH_NOT_NEGATIONS = [
    "不断",
    "不停",
    "不止",
    "不好",
    "不妙",
    "不对",
    "不少",
    "无论",
    "非常",
    "无法",
    "不动",
    "不住",
    "不了",
    "不下",
    "不上去",
    "不走",
    "特别",
    "别人",
    "别的",
    "分别",
    "区别",
]
# "bearing noise is gone", "轴承异响已消除": the fault is mentioned to say it is over.
_EN_CLEARED = ["normal", "fine", "ok", "okay", "resolved", "cleared", "fixed", "gone"]
_ZH_CLEARED = ["正常", "消失", "消除", "排除", "解除", "恢复"]
_EN_LINKS = {"is", "was", "are", "were", "seems", "now", "back", "to", "has", "been", "all"}
_ZH_LINKS = ["已经", "已", "都", "也", "现在", "现已"]


class KeywordSettings(BaseModel):
    """How strictly keywords match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fuzzy: bool = Field(True, title="Fuzzy", description="Tolerate ASR spelling errors.")
    max_word_edits: int = Field(
        2,
        ge=0,
        le=3,
        title="Edits per word",
        description="Most character edits per keyword word (1 for words of 5-7 letters, this "
        "many from 8 letters, none up to 4 letters).",
    )
    max_fillers: int = Field(
        1, ge=0, le=3, title="Filler words", description="Extra words allowed inside a phrase."
    )
    pinyin: bool = Field(
        True, title="Pinyin", description="Chinese characters also match by sound (homophones)."
    )
    negation_window: int = Field(
        3,
        ge=0,
        le=10,
        title="Negation window",
        description="Units (words, or CJK characters) before a match searched for negation cues.",
    )
    negation_cues: dict[str, list[str]] = Field(
        default_factory=lambda: {"en": list(_EN_NEGATIONS), "zh": list(_ZH_NEGATIONS)},
        title="Negation cues",
        description="Words (en) or character strings (zh) that cancel a following match.",
    )
    cleared_cues: dict[str, list[str]] = Field(
        default_factory=lambda: {"en": list(_EN_CLEARED), "zh": list(_ZH_CLEARED)},
        title="Cleared cues",
        description="Words right after a match (after is/was/已...) saying the fault is over.",
    )


@dataclass(frozen=True)
class KeywordMatch:
    code: str
    severity: Severity
    label: str
    lang: str
    keyword: str
    matched: str
    score: float


@dataclass(frozen=True)
class _Phrase:
    code: str
    lang: str
    text: str
    words: tuple[str, ...]
    cjk: bool


@lru_cache(maxsize=65536)
def _pinyin(ch: str) -> str:
    return lazy_pinyin(ch)[0]


def _allowed_edits(word: str, cap: int) -> int:
    if len(word) <= 4:
        return 0
    return min(cap, 1 if len(word) <= 7 else 2)


def _near(heard: str, keyword: str, cap: int) -> int | None:
    """Edits between a heard word and a keyword word, if close enough to count.

    ASR misspells inside a word (noice, bearings) but rarely loses its first letter, and a
    word of another length is usually another word (stop is not estop, overhead is not
    overheated): so the first letter must agree and the lengths differ by one at most.
    """
    if heard == keyword:
        return 0
    if not heard or heard[0] != keyword[0] or abs(len(heard) - len(keyword)) > 1:
        return None
    d = Levenshtein.distance(heard, keyword)
    return d if d <= _allowed_edits(keyword, cap) else None


class KeywordDetector:
    """Finds catalogue faults in transcript text; at most one match per fault per call."""

    def __init__(self, faults: Sequence[FaultRule], settings: KeywordSettings) -> None:
        self._faults = {f.code: f for f in faults}
        self._settings = settings
        self._phrases = [
            _Phrase(
                code=f.code,
                lang=lang,
                text=phrase,
                words=tuple(u.text for u in units(phrase)),
                cjk=all(u.cjk for u in units(phrase)),
            )
            for f in faults
            for lang, phrases in f.keywords.items()
            for phrase in phrases
        ]
        self._en_cues = {c.casefold() for c in settings.negation_cues.get("en", [])}
        self._zh_cues = [c for c in settings.negation_cues.get("zh", []) if c]
        self._en_cleared = {c.casefold() for c in settings.cleared_cues.get("en", [])}
        self._zh_cleared = tuple(c for c in settings.cleared_cues.get("zh", []) if c)
        self._other_cues = {
            c.casefold()
            for lang, cues in settings.negation_cues.items()
            if lang not in {"en", "zh"}
            for c in cues
        }

    def detect(
        self,
        text: str,
        *,
        context: str = "",
        lang: str | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> list[KeywordMatch]:
        """Faults spoken in `text`. `context` is text heard just before it (the end of the
        previous segment): it can complete a phrase or carry a negation, but a match lying
        wholly inside it is not reported again."""
        first_new = len(units(context))
        # A segment boundary is no clause break: "there is no" + "bearing noise" is negated.
        seq = units(f"{context} {text}") if context else units(text)
        best: dict[str, KeywordMatch] = {}
        for phrase in self._phrases:
            if phrase.code in exclude:
                continue
            for start, end, score in self._spans(phrase, seq):
                if end <= first_new or self._negated(seq, start, end, phrase):
                    continue
                current = best.get(phrase.code)
                if current is None or score > current.score:
                    rule = self._faults[phrase.code]
                    best[phrase.code] = KeywordMatch(
                        code=rule.code,
                        severity=rule.severity,
                        label=rule.label(lang or phrase.lang),
                        lang=phrase.lang,
                        keyword=phrase.text,
                        matched=join_units([u.text for u in seq[start:end]]),
                        score=score,
                    )
        return sorted(best.values(), key=lambda m: m.code)

    # -- matching -------------------------------------------------------------------------

    def _spans(self, phrase: _Phrase, seq: list[Unit]) -> list[tuple[int, int, float]]:
        n = len(phrase.words)
        found: list[tuple[int, int, float]] = []
        if phrase.cjk:
            # A phrase too short to allow a wrong syllable must start on its first sound.
            head = _pinyin(phrase.words[0]) if (n - 1) // 4 == 0 else None
            for i in range(len(seq) - n + 1):
                if head is not None and (not seq[i].cjk or _pinyin(seq[i].text) != head):
                    continue
                score = self._cjk_score(phrase.words, seq[i : i + n])
                if score is not None:
                    found.append((i, i + n, score))
            return found
        fuzzy = self._settings.fuzzy
        # Longer windows hold filler words, or a compound split in two (over heating).
        extra = max(self._settings.max_fillers if n > 1 else 0, 1) if fuzzy else 0
        first = phrase.words[0][0]
        for i in range(len(seq)):
            if seq[i].text[0] != first:  # every match starts on the keyword's first letter
                continue
            for length in range(max(1, n - 1) if fuzzy else n, n + extra + 1):
                window = seq[i : i + length]
                if len(window) < length:
                    break
                score = self._latin_score(phrase.words, [u.text for u in window])
                if score is not None:
                    found.append((i, i + length, score))
                    break
        return found

    def _cjk_score(self, words: tuple[str, ...], window: list[Unit]) -> float | None:
        if not all(u.cjk for u in window):
            return None
        chars = [u.text for u in window]
        if list(words) == chars:
            return 1.0
        if not (self._settings.fuzzy and self._settings.pinyin):
            return None
        # Same sound is a match; a longer phrase may also have one syllable wrong
        # (温度超过上限 heard as 温度超过纯线).
        misses = sum(_pinyin(a) != _pinyin(b) for a, b in zip(words, chars, strict=True))
        if misses > (len(words) - 1) // 4:
            return None
        return 0.95 - 0.1 * misses

    def _latin_score(self, words: tuple[str, ...], window: list[str]) -> float | None:
        if list(words) == window:
            return 1.0
        if not self._settings.fuzzy:
            return None
        if any(is_cjk(w[0]) for w in window):
            return None
        cap = self._settings.max_word_edits
        # Compound split or joined: compare without spaces.
        compound = len(window) != len(words) or len(words) == 1
        if compound and _near("".join(window), "".join(words), cap) is not None:
            return 0.9
        if len(window) < len(words):
            return None
        # In order, each keyword word near a window word; extra words are fillers, but the
        # window must start and end on keyword words (so a span is never padded).
        edits = 0
        j = 0
        for k, word in enumerate(words):
            while j < len(window):
                d = _near(window[j], word, cap)
                if d is not None:
                    edits += d
                    break
                if k == 0:
                    return None
                j += 1
            else:
                return None
            j += 1
        if j != len(window):
            return None
        fillers = len(window) - len(words)
        return max(0.5, 0.95 - 0.05 * edits - 0.1 * fillers)

    def _negated(self, seq: list[Unit], start: int, end: int, phrase: _Phrase) -> bool:
        window = self._settings.negation_window
        # A negation governs its own clause: "no smoke, but bearing noise" still alerts.
        clause = seq[start].clause
        before = [u for u in seq[max(0, start - window) : start] if u.clause == clause]
        span = seq[start:end]
        for u in (*before, *span):
            if not u.cjk and (u.text in self._en_cues or u.text in self._other_cues):
                return True
        # Chinese cues are character strings: look in the characters just before the match
        # and inside it (温度没有超限 never matches 温度超限, but 没有轴承异响 must be dropped).
        cjk_before = "".join(u.text for u in before if u.cjk)
        for word in _ZH_NOT_NEGATIONS:
            cjk_before = cjk_before.replace(word, "")
        cjk_span = "".join(u.text for u in span if u.cjk)
        own = "".join(phrase.words)  # a cue that is part of the keyword (不平衡) is no negation
        if any(c in cjk_before or (c in cjk_span and c not in own) for c in self._zh_cues):
            return True
        return self._cleared_after(seq[end:])

    def _cleared_after(self, after: list[Unit]) -> bool:
        latin = [u.text for u in after[:6] if not u.cjk]
        while latin and latin[0] in _EN_LINKS:
            latin.pop(0)
        if latin and after and not after[0].cjk and latin[0] in self._en_cleared:
            return True
        chars = ""
        for u in after[:8]:
            if not u.cjk:
                break
            chars += u.text
        for link in _ZH_LINKS:
            chars = chars.removeprefix(link)
        return chars.startswith(self._zh_cleared) if self._zh_cleared else False


def reads_as_all_clear(text: str) -> bool:
    """Whether `text` holds a negation or an all-clear word ("no", "not", "normal", "fine",
    没有, 正常...). The LLM tier rejects such quotes as evidence: "temperature is normal"
    is not evidence of temperature over limit, whatever a small model files it under."""
    us = units(text)
    latin = {u.text for u in us if not is_cjk(u.text)}
    if latin & (set(_EN_NEGATIONS) | set(_EN_CLEARED)):
        return True
    cjk = "".join(u.text for u in us if is_cjk(u.text))
    for word in _ZH_NOT_NEGATIONS:
        cjk = cjk.replace(word, "")
    return any(c in cjk for c in (*_ZH_NEGATIONS, *_ZH_CLEARED))
