"""How sure the engine was of each fault it answered: probabilities from its own tokens.

An answer is `{"faults":[{"code":"leak","seg":12},...]}` under the schema, which the engine
enforces by masking every token the grammar forbids before it samples: the log-probability
it reports for a token is over the tokens the schema allows there. A fault's confidence is
the product of the probabilities of the tokens that open its item and spell its code, from
its `{` to the quote that closes the code: that is the engine's probability of answering
*this* fault at that point rather than closing the list (`]`) or naming another code (the
closing quote counts, or a code that is a prefix of another, `leak` of `leak_oil`, would be
scored without the token that chose between them). The tokens that only the grammar
decides (`"code":"`) have probability 1 and change nothing. A token reported at -inf makes
its fault's confidence 0; a NaN makes it unknown (None). Token boundaries differ between
tokenizers (SmolLM2 writes `{"` apart from `[`, Gemma merges `":[{"`), so tokens are found
by the characters they cover, not by position.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence

from pipelines.analysis.protocols import TokenLogprob

__all__ = ["fault_confidences"]

# An item opens with `{` and its first key is the code (the schema's key order).
_ITEM = re.compile(r'\{\s*"code"\s*:\s*"([^"]*)"')


def fault_confidences(
    tokens: Sequence[TokenLogprob] | None, n_faults: int
) -> list[float | None] | None:
    """Each fault's confidence in answer order, or None when the tokens do not show
    `n_faults` items (no tokens reported, a decoding the scan cannot read)."""
    if tokens is None:
        return None
    if n_faults == 0:
        return []
    starts: list[int] = []
    pos = 0
    for token in tokens:
        starts.append(pos)
        pos += len(token.text)
    text = "".join(token.text for token in tokens)
    items = list(_ITEM.finditer(text))
    if len(items) != n_faults:
        return None
    out: list[float | None] = []
    for item in items:
        lo, hi = item.start(), item.end()
        total = 0.0
        for start, token in zip(starts, tokens, strict=True):
            end = start + len(token.text)
            if start < hi and end > lo:
                total += token.logprob
        out.append(None if math.isnan(total) else min(1.0, math.exp(total)))
    return out
