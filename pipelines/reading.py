"""The instant tier's reader: does a segment report the fault it names, or only use its words?

The keyword tier finds a fault's words (pipelines.detect) and its cue lists drop the plain
cases ("no bearing noise", "if the belt slips"). What the lists cannot carry from one way of
speaking to another ("we swapped that pump out on Monday, it's been dry since", "the trainer
fakes an overload so the new starters can practise") the reader judges: a logistic model over
the words of the segment with the fault's own words masked, trained on sentences written by
hand for it (training/reading/, its model card in models/instant-reader/).

Features, for a match at units [start, end) of the segment: the match becomes one token
`<F>`; then word unigrams and bigrams, CJK character unigrams, bigrams and trigrams over the
segment; the same tagged `L:` / `R:` for the four units on each side of the match, `C:` for
the match's clause, the punctuation that ends that clause, and `P:` unigrams for the end of
the previous segment the detector reads with it (a match may start there). Only strings:
a model file is a map from feature to weight, readable and diffable, and the reader needs
no numerical library (the service's path stays pure Python).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipelines.normalize import Unit

__all__ = ["MASK", "READER_FORMAT", "Reader", "ReaderError", "features"]

MASK = "<F>"
READER_FORMAT = "edge-agent-reader/1"
_SIDE = 4


class ReaderError(Exception):
    """A reader model file that cannot be used (missing, not JSON, wrong format)."""


@dataclass(frozen=True)
class Reader:
    """A trained reader: P(report) = sigmoid(bias + the sum of the features' weights)."""

    weights: Mapping[str, float]
    bias: float
    threshold: float  # below it a match is read as no report
    name: str = "reader"

    @classmethod
    def from_file(cls, path: Path, threshold: float | None = None) -> Reader:
        """Load a model file written by training/reading/train.py.

        Raises:
            ReaderError: unreadable, not JSON, or not this format.
        """
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ReaderError(f"reader model {path}: {exc}") from exc
        if not isinstance(data, dict) or data.get("format") != READER_FORMAT:
            raise ReaderError(f"reader model {path}: not a {READER_FORMAT} file")
        weights, bias, own = data.get("weights"), data.get("bias"), data.get("threshold")
        if not isinstance(weights, dict) or not all(
            isinstance(k, str) and isinstance(v, int | float) for k, v in weights.items()
        ):
            raise ReaderError(f"reader model {path}: 'weights' must map features to numbers")
        if not isinstance(bias, int | float) or not isinstance(own, int | float):
            raise ReaderError(f"reader model {path}: 'bias' and 'threshold' must be numbers")
        cut = float(own) if threshold is None else threshold
        if not 0.0 < cut < 1.0:
            raise ReaderError(f"reader model {path}: threshold {cut} is not between 0 and 1")
        return cls({k: float(v) for k, v in weights.items()}, float(bias), cut, path.parent.name)

    def probability(self, feats: Iterable[str]) -> float:
        """P(the match is a report of the fault now)."""
        w = self.weights
        z = self.bias + sum(w.get(f, 0.0) for f in set(feats))
        return 1.0 / (1.0 + math.exp(-max(-30.0, min(30.0, z))))


def features(
    seq: Sequence[Unit], start: int, end: int, clause_end: str = "", floor: int = 0
) -> list[str]:
    """The reader's features of a match at units [start, end) of `seq` (see the module);
    `seq[:floor]` is the previous segment's end, which gives only `P:` unigrams."""
    floor = min(floor, start)
    out = [f"P:{u.text}" for u in seq[:floor]]
    seq = seq[floor:]
    start, end = start - floor, end - floor
    toks = [u.text for u in seq[:start]] + [MASK] + [u.text for u in seq[end:]]
    cjk = [u.cjk for u in seq[:start]] + [False] + [u.cjk for u in seq[end:]]
    at = start  # the mask's index in toks
    clause = seq[start].clause if start < len(seq) else 0
    in_clause = [u.clause == clause for u in seq[:start]] + [True]
    in_clause += [u.clause == clause for u in seq[end:]]
    out += _grams(toks, cjk, "")
    left = slice(max(0, at - _SIDE), at)
    right = slice(at + 1, at + 1 + _SIDE)
    out += [f"L:{t}" for t in toks[left]] + [f"R:{t}" for t in toks[right]]
    out += _grams([t for t, c in zip(toks, in_clause, strict=True) if c],
                  [k for k, c in zip(cjk, in_clause, strict=True) if c], "C:")  # fmt: skip
    out.append(f"end:{clause_end or '.'}")
    return out


def _grams(toks: list[str], cjk: list[bool], tag: str) -> list[str]:
    out = [f"{tag}{t}" for t in toks]
    for i in range(len(toks) - 1):
        out.append(f"{tag}{toks[i]} {toks[i + 1]}")
        if i + 2 < len(toks) and cjk[i] and cjk[i + 1] and cjk[i + 2]:
            out.append(f"{tag}{toks[i]}{toks[i + 1]}{toks[i + 2]}")
    return out
