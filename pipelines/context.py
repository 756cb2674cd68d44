"""One stream's rolling context window, kept as token ids so the engine's prefix cache holds.

vLLM caches KV per full block, each block's hash chained from the first token of the
prompt. A prompt that only grows at its end reuses every block it had; a prompt whose
oldest tokens are removed reuses nothing after the point of removal and is prefilled
again in full (at 120K tokens that is seconds on an H200, minutes on an Orin). So the
window is:

    head (instructions, fault catalogue, summaries of dropped history)   -- stable
    transcript lines, oldest first, only ever appended                   -- grows
    a short request                                                      -- the tail

and when the transcript no longer fits, the oldest lines leave in one large step (a
quarter of the budget by default), so that the full re-prefill this costs happens once
per quarter-window of speech instead of on every analysis.

Lines are tokenized one by one and their ids concatenated: a line's ids never change once
appended, whatever comes after it (tokenizing the whole text again could merge tokens
across a line boundary and break the cached prefix).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

__all__ = ["ContextError", "ContextLine", "ContextWindow", "Drop"]


class ContextError(ValueError):
    """The window cannot be built as configured (a head that leaves no room, ...)."""


@dataclass(frozen=True)
class ContextLine:
    """One transcript line as the model sees it."""

    seq: int
    start: float
    end: float
    text: str  # the transcript text (without the line's "[#seq]" prefix)
    ids: tuple[int, ...]  # the rendered line, prefix and newline included
    faults: tuple[str, ...] = ()  # fault codes the keyword tier matched in it


@dataclass(frozen=True)
class Drop:
    """What one drop step removed from the window."""

    lines: tuple[ContextLine, ...]
    tokens: int


class ContextWindow:
    """Head + append-only transcript within `budget` tokens; drops oldest in large steps.

    `budget` bounds the whole prompt: head, transcript and a tail of at most
    `tail_reserve` tokens. `head_reserve` is room kept for the head to grow into (summaries
    of dropped history join it at a drop): a longer head then does not force a second drop.
    `drop_fraction` of the budget leaves at each drop (0 drops only what must go, line by
    line: the naive policy, kept for the benchmark's comparison).
    """

    def __init__(
        self,
        budget: int,
        *,
        tail_reserve: int,
        drop_fraction: float = 0.25,
        head: Sequence[int] = (),
        head_reserve: int = 0,
    ) -> None:
        if not 0.0 <= drop_fraction <= 0.5:
            raise ContextError(f"drop_fraction must be within [0, 0.5], got {drop_fraction}")
        if tail_reserve < 0 or budget <= tail_reserve:
            raise ContextError(f"budget {budget} must exceed the tail reserve {tail_reserve}")
        self.budget = budget
        self.tail_reserve = tail_reserve
        self.head_reserve = head_reserve
        self.drop_fraction = drop_fraction
        self._head: tuple[int, ...] = ()
        self._lines: deque[ContextLine] = deque()
        self._transcript_tokens = 0
        self.drops = 0
        self.dropped_lines = 0
        self.dropped_tokens = 0
        self.set_head(head)

    # -- reading ---------------------------------------------------------------------------
    @property
    def head(self) -> tuple[int, ...]:
        return self._head

    @property
    def lines(self) -> Sequence[ContextLine]:
        return tuple(self._lines)

    @property
    def transcript_tokens(self) -> int:
        return self._transcript_tokens

    @property
    def tokens(self) -> int:
        """Tokens held: head + transcript (the tail is added per prompt)."""
        return len(self._head) + self._transcript_tokens

    @property
    def capacity(self) -> int:
        """Transcript tokens the window can hold (the head counted at its reserve)."""
        return self.budget - self.tail_reserve - max(len(self._head), self.head_reserve)

    @property
    def max_line_tokens(self) -> int:
        """Longest line accepted whole: a quarter of the transcript capacity, so one long
        segment can never push everything else out at once."""
        return max(1, self.capacity // 4)

    def prompt(self, tail: Sequence[int]) -> list[int]:
        """head + transcript + `tail`, within the budget."""
        if len(tail) > self.tail_reserve:
            raise ContextError(f"tail of {len(tail)} tokens > reserve {self.tail_reserve}")
        ids = list(self._head)
        for line in self._lines:
            ids.extend(line.ids)
        ids.extend(tail)
        return ids

    # -- changing ----------------------------------------------------------------------------
    def set_head(self, head: Sequence[int]) -> bool:
        """Replace the head (a new summary, a new catalogue); True if it changed.

        A changed head invalidates the whole cached prefix: do it at a drop, when the
        transcript is re-prefilled anyway. A longer head may push old lines out (one step).
        """
        head = tuple(head)
        room = self.budget - self.tail_reserve - max(len(head), self.head_reserve)
        if room < self.budget // 4:
            raise ContextError(
                f"head of {max(len(head), self.head_reserve)} tokens (reserve included) leaves "
                f"less than a quarter of the {self.budget}-token budget for the transcript"
            )
        changed = head != self._head
        self._head = head
        if self._transcript_tokens > self.capacity:
            self.drop_oldest(len(self.planned_drop()))
        return changed

    def resize(self, budget: int) -> Drop | None:
        """A new budget (the watchdog's context rung, or its climb back). A smaller one drops
        the oldest lines that no longer fit, in one step; the head must still fit.

        Raises:
            ContextError: the head and tail would leave under a quarter of `budget`.
        """
        if budget <= self.tail_reserve:
            raise ContextError(f"budget {budget} must exceed the tail reserve {self.tail_reserve}")
        room = budget - self.tail_reserve - max(len(self._head), self.head_reserve)
        if room < budget // 4:
            raise ContextError(
                f"a {budget}-token budget leaves {room} tokens for the transcript after the "
                "head and the request"
            )
        self.budget = budget
        if self._transcript_tokens <= self.capacity:
            return None
        return self.drop_oldest(len(self.planned_drop()))

    def planned_drop(self, incoming: Sequence[ContextLine] = ()) -> tuple[ContextLine, ...]:
        """The lines that appending `incoming` would drop (oldest first; none if it fits).

        At least enough to make room, and at least `drop_fraction` of the budget in
        tokens, so the next drop is far away. Ask before appending: the caller may want
        the engine to summarize these while their prefix is still cached.
        """
        need = self._transcript_tokens + sum(len(x.ids) for x in incoming) - self.capacity
        if need <= 0:
            return ()
        step = max(need, int(self.budget * self.drop_fraction))
        freed = 0
        gone: list[ContextLine] = []
        for line in (*self._lines, *incoming):
            if freed >= step:
                break
            freed += len(line.ids)
            gone.append(line)
        return tuple(gone)

    def drop_oldest(self, count: int) -> Drop:
        gone = tuple(self._lines.popleft() for _ in range(min(count, len(self._lines))))
        tokens = sum(len(line.ids) for line in gone)
        self._transcript_tokens -= tokens
        if gone:
            self.drops += 1
            self.dropped_lines += len(gone)
            self.dropped_tokens += tokens
        return Drop(gone, tokens)

    def append(self, lines: Iterable[ContextLine]) -> Drop | None:
        """Append lines, dropping the oldest in one step when they would not fit (a
        backlog longer than the window loses its own oldest lines too).

        Raises:
            ContextError: a line longer than max_line_tokens (split it first).
        """
        new = list(lines)
        for line in new:
            if len(line.ids) > self.max_line_tokens:
                raise ContextError(
                    f"line #{line.seq} has {len(line.ids)} tokens > {self.max_line_tokens}"
                )
        count = len(self.planned_drop(new))
        self._lines.extend(new)
        self._transcript_tokens += sum(len(line.ids) for line in new)
        return self.drop_oldest(count) if count else None
