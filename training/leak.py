"""No training stream may carry words of a bench/quality part: the check, and what it finds.

The slow tier is measured on hand-written parts it never saw (bench/quality/set/). A
training record that shares a sentence, or a long run of words, with any of them would
let the model score on what it memorised. Both are compared after folding (NFKC, case,
punctuation and spaces): a sentence of at least MIN_SENTENCE_WORDS words (or
MIN_SENTENCE_CJK Chinese characters), and any run of NGRAM_WORDS words (or NGRAM_CJK
characters of Chinese). tests/test_training_people.py runs it in CI over every file of
training/people/; `python -m training.leak` prints what it finds.
"""

from __future__ import annotations

import argparse
import re
import sys
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = ["Leak", "bench_texts", "find_leaks", "fingerprints"]

REPO = Path(__file__).resolve().parents[1]
SET = REPO / "bench" / "quality" / "set"
NGRAM_WORDS = 8
NGRAM_CJK = 12
COINCIDENCES = "coincidences.txt"  # in the people folder
MIN_SENTENCE_WORDS = 5
MIN_SENTENCE_CJK = 8
_SPLIT = re.compile(r"[.!?;。！？；…\n]+")
_WORD = re.compile(r"[^\W\d_]+|\d+", re.UNICODE)
_CJK = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]")


@dataclass(frozen=True)
class Leak:
    record: str  # the training record's id
    kind: str  # "sentence" | "ngram"
    text: str  # what is shared, folded


def _fold(text: str) -> str:
    return unicodedata.normalize("NFKC", text).casefold()


def _latin_words(text: str) -> list[str]:
    return [w for w in _WORD.findall(_CJK.sub(" ", _fold(text)))]


def _cjk(text: str) -> str:
    return "".join(_CJK.findall(_fold(text)))


def fingerprints(text: str) -> set[tuple[str, str]]:
    """("sentence" | "ngram", folded text) of one segment."""
    out: set[tuple[str, str]] = set()
    for sentence in _SPLIT.split(text):
        words, han = _latin_words(sentence), _cjk(sentence)
        if len(words) >= MIN_SENTENCE_WORDS or len(han) >= MIN_SENTENCE_CJK:
            out.add(("sentence", " ".join(words) + "|" + han))
    words, han = _latin_words(text), _cjk(text)
    for i in range(len(words) - NGRAM_WORDS + 1):
        out.add(("ngram", " ".join(words[i : i + NGRAM_WORDS])))
    for i in range(len(han) - NGRAM_CJK + 1):
        out.add(("ngram", han[i : i + NGRAM_CJK]))
    return out


def bench_texts(folder: Path = SET) -> list[str]:
    """Every segment of every part of the quality set."""
    texts: list[str] = []
    for path in sorted(folder.glob("*.yaml")):
        for row in yaml.safe_load(path.read_text(encoding="utf-8")) or []:
            texts.extend(str(s) for s in row.get("segments", []))
    return texts


def find_leaks(records: Iterable[tuple[str, Iterable[str]]], against: Iterable[str]) -> list[Leak]:
    """The shared sentences and runs of `records` ((id, segments) each) with `against`."""
    held: set[tuple[str, str]] = set()
    for text in against:
        held |= fingerprints(text)
    leaks: list[Leak] = []
    for rid, segments in records:
        for text in segments:
            for kind, folded in sorted(fingerprints(text) & held):
                leaks.append(Leak(rid, kind, folded))
    return leaks


def coincidences(path: Path) -> set[Leak]:
    """The shared runs a file lists as coincidences (`record: kind: text` lines; `#`
    comments): written on both sides by writers who never read the other's."""
    known: set[Leak] = set()
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            record, kind, text = (part.strip() for part in line.split(":", 2))
            known.add(Leak(record, kind, text))
    return known


def main(argv: list[str] | None = None) -> int:
    from training.people import PEOPLE_DIR, load

    parser = argparse.ArgumentParser(prog="python -m training.leak", description=__doc__)
    parser.add_argument("--people", type=Path, default=PEOPLE_DIR)
    args = parser.parse_args(argv)
    records = [(r.id, r.segments) for r in load(args.people)]
    leaks = find_leaks(records, bench_texts())
    known = coincidences(args.people / COINCIDENCES)
    for leak in leaks:
        note = "  (coincidence)" if leak in known else ""
        print(f"{leak.record}: {leak.kind}: {leak.text}{note}")
    new = [leak for leak in leaks if leak not in known]
    print(
        f"{len(records)} records, {len(new)} shared with bench/quality "
        f"(and {len(leaks) - len(new)} listed coincidences, {COINCIDENCES})",
        file=sys.stderr,
    )
    return 1 if new else 0


if __name__ == "__main__":
    raise SystemExit(main())
