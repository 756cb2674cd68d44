"""A fault's confidence from the engine's tokens (pipelines.analysis.confidence): pure."""

from __future__ import annotations

import math

import pytest

from pipelines.analysis import TokenLogprob
from pipelines.analysis.confidence import fault_confidences


def toks(*pieces: tuple[str, float]) -> list[TokenLogprob]:
    return [TokenLogprob(text, math.log(p)) for text, p in pieces]


def test_smollm2_style_tokens_multiply_the_opening_and_the_code() -> None:
    """SmolLM2 writes `{"` apart from `[`: the item's `{"` (0.6, the choice against `]`)
    and the code's pieces (0.5 x 0.9) make the fault; `"code":"` and the number do not."""
    tokens = toks(('{"', 1.0), ("fault", 1.0), ("s", 1.0), ('":', 1.0), ("[", 1.0),
                  ('{"', 0.6), ("code", 1.0), ('":"', 1.0), ("le", 0.5), ("ak", 0.9),
                  ('","', 1.0), ("seg", 1.0), ('":', 1.0), ("1", 0.3), ("2", 0.4),
                  ("}", 1.0), ("]}", 1.0))  # fmt: skip
    [conf] = fault_confidences(tokens, 1) or []
    assert conf == pytest.approx(0.6 * 0.5 * 0.9)


def test_gemma_style_merged_tokens_and_a_second_item() -> None:
    """Gemma merges `":[{"`: that token is the decision and counts once; the second item
    opens with `},{"` (0.2) and its code."""
    tokens = toks(('{"', 1.0), ("fault", 1.0), ("s", 1.0), ('":[{"', 0.8), ("code", 1.0),
                  ('":"', 1.0), ("leak", 0.7), ('","', 1.0), ("seg", 1.0), ('":', 1.0),
                  ("3", 0.5), ('},{"', 0.2), ("code", 1.0), ('":"', 1.0), ("belt", 0.9),
                  ("_slip", 1.0), ('","', 1.0), ("seg", 1.0), ('":', 1.0), ("4", 1.0),
                  ("}]}", 1.0))  # fmt: skip
    first, second = fault_confidences(tokens, 2) or []
    assert first == pytest.approx(0.8 * 0.7)
    assert second == pytest.approx(0.2 * 0.9)


def test_no_tokens_or_a_count_that_does_not_match_gives_none() -> None:
    assert fault_confidences(None, 1) is None
    assert fault_confidences(toks(('{"faults":[]}', 0.9)), 0) == []
    assert fault_confidences(toks(('{"faults":[]}', 0.9)), 1) is None


def test_the_closing_quote_counts_so_a_code_that_prefixes_another_is_scored_whole() -> None:
    """`leak` against `leak_oil`: the token after `leak` (the closing quote, 0.4 here) is
    the choice between them and belongs to the fault."""
    tokens = toks(('{"', 1.0), ("fault", 1.0), ("s", 1.0), ('":[{"', 1.0), ("code", 1.0),
                  ('":"', 1.0), ("leak", 0.5), ('","', 0.4), ("seg", 1.0), ('":', 1.0),
                  ("3", 1.0), ("}]}", 1.0))  # fmt: skip
    [conf] = fault_confidences(tokens, 1) or []
    assert conf == pytest.approx(0.5 * 0.4)


def test_a_minus_infinite_logprob_is_zero_and_a_nan_is_unknown() -> None:
    base = [('{"', 1.0), ("fault", 1.0), ("s", 1.0), ('":[{"', 1.0), ("code", 1.0), ('":"', 1.0)]
    tail = [('","', 1.0), ("seg", 1.0), ('":', 1.0), ("3", 1.0), ("}]}", 1.0)]
    inf = [*toks(*base), TokenLogprob("leak", -math.inf), *toks(*tail)]
    nan = [*toks(*base), TokenLogprob("leak", math.nan), *toks(*tail)]
    assert fault_confidences(inf, 1) == [0.0]
    assert fault_confidences(nan, 1) == [None]
