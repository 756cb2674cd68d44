"""What the slow tier's corpus is made of, stream by stream: the ingredients and the split.

Three ingredients (docs/training.md reports what each adds):
- `generator`: synthetic streams from the phrase banks (training/streams.py): long windows
  past the budget, drops and the engine's notes on dropped history, every code and every
  class of hard negative in catalogue words;
- `people`: the hand-written records (training/people.py), each rendered `people_passes`
  times with other segment numbers and analysis points;
- `joined`: windows of two to five hand-written records of one language in turn, so the
  model reads past earlier talk (a fixed fault, a drill, another fault) to what is now.
Every VAL_EVERY-th generator stream and hand-written record is validation (rendered once,
never joined).
"""

from __future__ import annotations

import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from training.people import Record, joined, to_stream
from training.streams import Stream, StreamMaker

__all__ = ["INGREDIENTS", "VAL_EVERY", "Mix", "Tagged"]

VAL_EVERY = 20
INGREDIENTS = ("generator", "people", "joined")


@dataclass(frozen=True)
class Tagged:
    """Where an example came from."""

    source: str  # one of INGREDIENTS
    val: bool


@dataclass(frozen=True)
class Mix:
    generator_streams: int
    people: Sequence[Record] = ()
    people_passes: int = 1
    joined: int = 0

    def streams(self, seed: int, maker: StreamMaker) -> Iterator[tuple[Tagged, Stream]]:
        """Every stream of the mix with its tag; deterministic for a seed."""
        for index in range(self.generator_streams):
            rng = random.Random(f"{seed}:{index}")
            yield Tagged("generator", index % VAL_EVERY == 0), maker.stream(rng)
        train: dict[str, list[Record]] = {"en": [], "zh": []}
        for k, record in enumerate(self.people):
            val = k % VAL_EVERY == 0
            if not val:
                train[record.lang].append(record)
            for p in range(1 if val else self.people_passes):
                rng = random.Random(f"{seed}:p{p}:{record.id}")
                yield Tagged("people", val), to_stream(record, rng)
        for j in range(self.joined):
            rng = random.Random(f"{seed}:j{j}")
            pool = train[rng.choice(("en", "zh"))]
            if len(pool) >= 2:
                chosen = rng.sample(pool, rng.randint(2, min(5, len(pool))))
                yield Tagged("joined", False), joined(chosen, rng)
