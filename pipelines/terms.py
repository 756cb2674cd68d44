"""How a heard word meets a catalogue word: inflection, spelling, sound.

- English: words meet when their Snowball (Porter2) stems agree (slipped, slipping ~ slip;
  overloaded ~ overload), or, with fuzzy matching on, when one is a small edit away from
  the other (squeels ~ squeal, berring ~ bearing); short words must agree exactly, and the
  first letter always (ASR rarely loses it, and "under" must not pass for "over").
- Chinese: a character meets another when it is the same or, in a term of two or more
  characters, sounds the same (pypinyin, tones ignored: 轴成 ~ 轴承, 温都 ~ 温度).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Generic, TypeVar

import snowballstemmer
from pypinyin import Style, lazy_pinyin
from rapidfuzz.distance import Levenshtein

from pipelines.normalize import Unit, is_cjk, units

__all__ = [
    "Heard",
    "Hit",
    "Term",
    "TermIndex",
    "allowed_edits",
    "expand",
    "near",
    "pinyin",
    "pinyin_tone",
    "stem",
]

T = TypeVar("T")
_CACHE = 1 << 16  # heard words whose candidate terms are remembered
_local = threading.local()  # a Snowball stemmer keeps state: one per thread


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    stemmer = getattr(_local, "stemmer", None)
    if stemmer is None:
        stemmer = _local.stemmer = snowballstemmer.stemmer("english")
    return str(stemmer.stemWord(word))


@lru_cache(maxsize=65536)
def pinyin(ch: str) -> str:
    return lazy_pinyin(ch)[0]


@lru_cache(maxsize=65536)
def pinyin_tone(ch: str) -> str:
    """The sound with its tone (ji2): a two-character phrase is matched by sound only with
    the tone kept, so 级停 is 急停 (ji2) but the 机停 of 装配机停了 (ji1) and 自己停 (ji3)
    are not."""
    return lazy_pinyin(ch, style=Style.TONE3, neutral_tone_with_five=True)[0]


def allowed_edits(word: str, cap: int) -> int:
    if len(word) <= 4:
        return 0
    return min(cap, 1 if len(word) <= 7 else 2)


@lru_cache(maxsize=1 << 17)
def near(heard: str, keyword: str, cap: int) -> int | None:
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
    return d if d <= allowed_edits(keyword, cap) else None


@dataclass(frozen=True)
class Heard:
    """A unit sequence with what matching needs of each unit, computed once."""

    seq: list[Unit]
    stems: list[str]
    sounds: list[str]

    @classmethod
    def of(cls, seq: list[Unit]) -> Heard:
        return cls(
            seq,
            ["" if u.cjk else stem(u.text) for u in seq],
            [pinyin(u.text) if u.cjk else "" for u in seq],
        )


@dataclass(frozen=True)
class Hit:
    start: int  # unit index of the first unit
    end: int  # one past the last
    term: str  # the catalogue's term (with its class, "severe (@intense)")
    exact: bool


@dataclass(frozen=True)
class Term:
    """One catalogue term, ready to be looked for."""

    text: str
    shown: str
    words: tuple[str, ...]
    stems: tuple[str, ...]
    sounds: tuple[str, ...]

    @classmethod
    def of(cls, text: str, shown: str | None = None) -> Term:
        words = tuple(u.text for u in units(text))
        return cls(
            text,
            shown or text,
            words,
            tuple("" if is_cjk(w) else stem(w) for w in words),
            tuple(pinyin(w) if is_cjk(w) else "" for w in words),
        )

    def at(self, heard: Heard, i: int, *, fuzzy: bool, sound: bool, cap: int) -> Hit | None:
        """This term heard from unit i on, or None."""
        n = len(self.words)
        if i + n > len(heard.seq):
            return None
        exact = True
        for k in range(n):
            got = self._unit(heard, i + k, k, fuzzy=fuzzy, sound=sound and n > 1, cap=cap)
            if got is None:
                return None
            exact = exact and got
        return Hit(i, i + n, self.shown, exact)

    def _unit(
        self, heard: Heard, i: int, k: int, *, fuzzy: bool, sound: bool, cap: int
    ) -> bool | None:
        """None if unit i does not meet word k; True if exactly, False if nearly."""
        unit, word = heard.seq[i], self.words[k]
        if unit.text == word:
            return True
        if is_cjk(word):
            return False if unit.cjk and sound and heard.sounds[i] == self.sounds[k] else None
        if unit.cjk:
            return None
        if heard.stems[i] == self.stems[k]:
            return True
        if not fuzzy:
            return None
        if near(unit.text, word, cap) is not None:
            return False
        return False if near(heard.stems[i], self.stems[k], cap) is not None else None


def expand(terms: Sequence[str], classes: dict[str, list[str]]) -> list[Term]:
    """Terms with each @class replaced by its words (shown as "word (@class)")."""
    out: list[Term] = []
    for t in terms:
        if t.startswith("@"):
            out += [Term.of(w, f"{w} ({t})") for w in classes.get(t[1:], [])]
        else:
            out.append(Term.of(t))
    return out


class TermIndex(Generic[T]):
    """Terms, each with a payload, indexed by their first word: a heard unit is compared
    only with the terms that could start on it (same word, stem, sound or first letter)."""

    def __init__(self, entries: Sequence[tuple[Term, T]], *, fuzzy: bool, sound: bool, cap: int):
        self._fuzzy, self._sound, self._cap = fuzzy, sound, cap
        self._by: dict[str, list[tuple[Term, T]]] = {}
        self._cache: dict[str, tuple[tuple[Term, T], ...]] = {}
        for term, payload in entries:
            w = term.words[0]
            keys = {f"w:{w}"}
            if is_cjk(w):
                if len(term.words) > 1:
                    keys.add(f"s:{term.sounds[0]}")
            else:
                # near() needs the first letter and a length within one, of the words or
                # of their stems: index by both lengths.
                st = term.stems[0]
                keys |= {f"t:{st}", f"lw:{w[0]}:{len(w)}", f"ls:{st[0]}:{len(st)}"}
            entry = (term, payload)
            for key in keys:
                self._by.setdefault(key, []).append(entry)

    def _candidates(self, unit: Unit, st: str, sound: str) -> tuple[tuple[Term, T], ...]:
        """The entries a heard unit could start, once per distinct word (then cached: a
        stream's vocabulary repeats)."""
        got = self._cache.get(unit.text)
        if got is not None:
            return got
        w = unit.text
        if unit.cjk:
            keys = [f"w:{w}", f"s:{sound}"]
        elif self._fuzzy:
            keys = [f"w:{w}", f"t:{st}"]
            keys += [f"lw:{w[0]}:{n}" for n in range(len(w) - 1, len(w) + 2)]
            keys += [f"ls:{st[0]}:{n}" for n in range(len(st) - 1, len(st) + 2)] if st else []
        else:
            keys = [f"w:{w}", f"t:{st}"]
        entries: dict[int, tuple[Term, T]] = {}
        for key in keys:
            for entry in self._by.get(key, ()):
                entries.setdefault(id(entry), entry)
        if len(self._cache) >= _CACHE:
            self._cache.clear()
        got = self._cache[w] = tuple(entries.values())
        return got

    def find(self, heard: Heard) -> list[tuple[T, Hit]]:
        out: list[tuple[T, Hit]] = []
        fuzzy, sound, cap = self._fuzzy, self._sound, self._cap
        for i, unit in enumerate(heard.seq):
            for term, payload in self._candidates(unit, heard.stems[i], heard.sounds[i]):
                hit = term.at(heard, i, fuzzy=fuzzy, sound=sound, cap=cap)
                if hit is not None:
                    out.append((payload, hit))
        return out
