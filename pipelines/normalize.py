"""Text normalization shared by the keyword tier and the overlap merge.

ASR output and operator speech differ in width (ＡＢＣ vs ABC), case, punctuation and in
whether CJK characters are separated by spaces. Everything downstream compares units:
a Latin word or a single CJK character, so 轴承 异响 and 轴承异响 compare equal.
"""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["Unit", "is_cjk", "join_units", "normalize", "units"]

# CJK Unified Ideographs (+ extension A) and the compatibility block: one unit per character.
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")
# NFKC has already turned full-width CJK punctuation (，！？；：) into these.
_CLAUSE_BREAK = re.compile(r"[,.;:!?、。\n]")
_CJK_RANGES = "\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_WORD = re.compile(rf"[{_CJK_RANGES}]|[^\W_{_CJK_RANGES}]+(?:['’][^\W_{_CJK_RANGES}]+)*")


@lru_cache(maxsize=65536)
def is_cjk(ch: str) -> bool:
    return bool(_CJK.fullmatch(ch))


def normalize(text: str) -> str:
    """NFKC, casefold, punctuation to spaces, spaces collapsed, no spaces between CJK."""
    return join_units([u.text for u in units(text)])


def join_units(parts: list[str]) -> str:
    """Join units with a space, except between two CJK characters."""
    out: list[str] = []
    for part in parts:
        if out and not (is_cjk(out[-1][-1]) and is_cjk(part[0])):
            out.append(" ")
        out.append(part)
    return "".join(out)


@dataclass(frozen=True)
class Unit:
    """One comparable unit (casefolded) and where it sits in the NFKC form of the input,
    so a caller can cut the input's readable text (case and punctuation kept) at a unit."""

    text: str
    start: int
    end: int
    clause: int = 0  # increments after clause punctuation (, . ; : ! ? and CJK forms)
    cjk: bool = False  # a CJK character (set by `units`)


def units(text: str) -> list[Unit]:
    """Split text into words and single CJK characters (punctuation and spaces dropped)."""
    nfkc = unicodedata.normalize("NFKC", text)
    out: list[Unit] = []
    clause = 0
    last_end = 0
    for m in _WORD.finditer(nfkc):
        if _CLAUSE_BREAK.search(nfkc, last_end, m.start()):
            clause += 1
        text = m.group(0).casefold().replace("’", "'")
        out.append(Unit(text, m.start(), m.end(), clause, is_cjk(text)))
        last_end = m.end()
    return out
