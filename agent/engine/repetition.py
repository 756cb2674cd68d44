"""Stop a generation that loops.

Small models (the 135M default above all) fall into loops: the same JSON item, the same
phrase, until the token limit. Prompt-lookup speculation then accelerates the loop, which
looks like a speed-up and is not. vLLM 0.32 can stop a request itself
(`SamplingParams.repetition_detection`); where the installed vLLM lacks it, the engine
wrapper runs the same tail check on the streamed tokens and aborts the request.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["RepetitionGuard", "tail_repeats"]


@dataclass(frozen=True)
class RepetitionGuard:
    """Stop when the output ends with a pattern of min_pattern..max_pattern tokens
    repeated min_count times in a row.

    min_pattern 4 leaves short legitimate repeats alone ("----", "000", JSON's `", "`).
    """

    min_pattern: int = 4
    max_pattern: int = 64
    min_count: int = 3

    def __post_init__(self) -> None:
        if not 1 <= self.min_pattern <= self.max_pattern or self.min_count < 2:
            raise ValueError("need 1 <= min_pattern <= max_pattern and min_count >= 2")


def tail_repeats(tokens: Sequence[int], guard: RepetitionGuard) -> bool:
    """True if `tokens` ends with one pattern repeated guard.min_count times."""
    n = len(tokens)
    for size in range(guard.min_pattern, guard.max_pattern + 1):
        if size * guard.min_count > n:
            return False
        tail = tokens[n - size :]
        if all(
            tokens[n - size * (m + 1) : n - size * m] == tail for m in range(1, guard.min_count)
        ):
            return True
    return False
