"""Keyword phrases, matched unit by unit (a Latin word or one CJK character).

Independent of spacing and punctuation, and tolerant of what ASR gets wrong:
- English: each keyword word may be off by a small edit distance (noice ~ noise; short
  words must match exactly, or "under" would pass for "over"), one filler word may sit
  inside the phrase, and a compound may be split or joined (over heat ~ overheat).
- Chinese: characters match when they are the same or sound the same (pypinyin, tones
  ignored), so the homophone 轴成异响 still matches 轴承异响; a two-character phrase only
  with the tones the same (级停 is 急停, the 机停 of 装配机停了 is not).
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.keyword_settings import KeywordSettings
from pipelines.normalize import Unit, is_cjk, units
from pipelines.terms import near, pinyin, pinyin_tone

__all__ = ["Phrase", "phrase_spans"]


@dataclass(frozen=True)
class Phrase:
    code: str
    lang: str
    text: str
    words: tuple[str, ...]
    cjk: bool

    @classmethod
    def of(cls, code: str, lang: str, text: str) -> Phrase:
        us = units(text)
        return cls(code, lang, text, tuple(u.text for u in us), all(u.cjk for u in us))


def phrase_spans(
    phrase: Phrase, seq: list[Unit], s: KeywordSettings
) -> list[tuple[int, int, float]]:
    """Where `phrase` is heard in `seq`: (start, end, score) per place."""
    n = len(phrase.words)
    found: list[tuple[int, int, float]] = []
    if phrase.cjk:
        # A phrase too short to allow a wrong syllable must start on its first sound.
        head = pinyin(phrase.words[0]) if (n - 1) // 4 == 0 else None
        for i in range(len(seq) - n + 1):
            if head is not None and (not seq[i].cjk or pinyin(seq[i].text) != head):
                continue
            score = _cjk_score(phrase.words, seq[i : i + n], s)
            if score is not None:
                found.append((i, i + n, score))
        return found
    # Longer windows hold filler words, or a compound split in two (over heating).
    extra = max(s.max_fillers if n > 1 else 0, 1) if s.fuzzy else 0
    first = phrase.words[0][0]
    for i in range(len(seq)):
        if seq[i].text[0] != first:  # every match starts on the keyword's first letter
            continue
        for length in range(max(1, n - 1) if s.fuzzy else n, n + extra + 1):
            window = seq[i : i + length]
            if len(window) < length:
                break
            score = _latin_score(phrase.words, [u.text for u in window], s)
            if score is not None:
                found.append((i, i + length, score))
                break
    return found


def _cjk_score(words: tuple[str, ...], window: list[Unit], s: KeywordSettings) -> float | None:
    if not all(u.cjk for u in window):
        return None
    chars = [u.text for u in window]
    if list(words) == chars:
        return 1.0
    if not (s.fuzzy and s.pinyin):
        return None
    # Same sound is a match; a longer phrase may also have one syllable wrong
    # (温度超过上限 heard as 温度超过纯线).
    misses = sum(pinyin(a) != pinyin(b) for a, b in zip(words, chars, strict=True))
    if misses > (len(words) - 1) // 4:
        return None
    # Two characters say little: the sound must hold with its tone (级停 ~ 急停, not 机停).
    if len(words) <= 2 and any(
        pinyin_tone(a) != pinyin_tone(b) for a, b in zip(words, chars, strict=True)
    ):
        return None
    return 0.95 - 0.1 * misses


def _latin_score(words: tuple[str, ...], window: list[str], s: KeywordSettings) -> float | None:
    if list(words) == window:
        return 1.0
    if not s.fuzzy:
        return None
    if any(is_cjk(w[0]) for w in window):
        return None
    cap = s.max_word_edits
    # Compound split or joined: compare without spaces.
    compound = len(window) != len(words) or len(words) == 1
    if compound and near("".join(window), "".join(words), cap) is not None:
        return 0.9
    if len(window) < len(words):
        return None
    # In order, each keyword word near a window word; extra words are fillers, but the
    # window must start and end on keyword words (so a span is never padded).
    edits = 0
    j = 0
    for k, word in enumerate(words):
        while j < len(window):
            d = near(window[j], word, cap)
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
