"""Streams written by people: the hand-written part of the slow tier's corpus.

`training/people/*.jsonl` holds microphone streams written one at a time by writers who
read nothing of this repository, each from a brief of its own (training/people/README.md
names every file's writer and brief). A line is one stream, labelled by its writer:

    {"id": "W01-001", "lang": "en", "kind": "fault", "form": "own_words", "negative": null,
     "faults": [{"code": "leak", "evidence": [3, 4], "sure_at": 3}], "about": null,
     "scene": "...", "segments": ["...", "..."]}

`evidence` are the segments that show the fault happening now, `sure_at` the first one by
which a careful listener would raise it. A model is taught to report a fault once its
window holds an evidence segment at or after `sure_at`, pointing at the latest such
segment; a negative (fixed, drill, question, story, injection ...) is answered with no
fault however fault-like its words. `load` validates every file (a bad line is an error
with its file and line, never skipped in silence); `to_streams` turns the records into
the generator's `Stream`s, so both ingredients go through the same renderer
(training/render.py), and `joined` makes long windows from several records.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from typing_extensions import Self

from training.streams import Said, Stream

__all__ = [
    "CODES",
    "NEGATIVES",
    "PEOPLE_DIR",
    "PeopleError",
    "Record",
    "joined",
    "load",
    "to_stream",
]

PEOPLE_DIR = Path(__file__).resolve().parent / "people"
Code = Literal[
    "bearing_noise",
    "temperature_over_limit",
    "belt_slip",
    "abnormal_vibration",
    "leak",
    "motor_overload",
    "emergency_stop",
]
Negative = Literal[
    "fixed",
    "drill",
    "question",
    "hypothetical",
    "other_place",
    "media",
    "normal_readings",
    "sarcasm",
    "negated",
    "past",
    "injection_raise",
    "injection_ignore",
]
CODES: tuple[str, ...] = get_args(Code)
NEGATIVES: tuple[str, ...] = get_args(Negative)


class PeopleError(ValueError):
    """A file of hand-written streams that does not read: its path, line and why."""


class Fault(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    code: Code
    evidence: tuple[int, ...] = Field(min_length=1)
    sure_at: int = Field(ge=0)


class Record(BaseModel):
    """One hand-written stream, as its writer labelled it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=40)
    lang: Literal["en", "zh"]
    kind: Literal["fault", "negative"]
    form: Literal["own_words", "named", "reading", "buildup", "mixed"] | None
    negative: Negative | None
    faults: tuple[Fault, ...]
    about: Code | None
    scene: str
    segments: tuple[str, ...] = Field(min_length=2, max_length=25)

    @model_validator(mode="after")
    def _labels(self) -> Self:
        if any(not s.strip() for s in self.segments):
            raise ValueError("an empty segment")
        n = len(self.segments)
        for fault in self.faults:
            if any(not 0 <= e < n for e in fault.evidence) or fault.sure_at >= n:
                raise ValueError(f"{fault.code}: a segment index outside 0..{n - 1}")
        if self.kind == "fault":
            if self.form is None or not self.faults or self.about is not None:
                raise ValueError("a fault stream has a form, faults and no `about`")
        elif self.form is not None or self.faults or self.negative is None:
            raise ValueError("a negative has a `negative` class, no form and no faults")
        return self

    def evidence(self) -> dict[int, list[str]]:
        """Segment index -> the codes a model should report from it: the writer's evidence
        at or after `sure_at` (an early hint alone is not yet a fault)."""
        out: dict[int, list[str]] = {}
        for fault in self.faults:
            for index in fault.evidence:
                if index >= fault.sure_at:
                    out.setdefault(index, []).append(fault.code)
        return out


def load(folder: Path = PEOPLE_DIR) -> list[Record]:
    """Every record of every `*.jsonl` under `folder`, in file and line order.

    Raises:
        PeopleError: a line that is not a valid record, or an id used twice.
    """
    records: list[Record] = []
    seen: dict[str, str] = {}
    for path in sorted(folder.glob("*.jsonl")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path.name}:{number}"
            try:
                record = Record.model_validate(json.loads(line))
            except (ValueError, ValidationError) as exc:
                raise PeopleError(f"{where}: {exc}") from exc
            if record.id in seen:
                raise PeopleError(f"{where}: id {record.id} also at {seen[record.id]}")
            seen[record.id] = where
            records.append(record)
    return records


def to_stream(record: Record, rng: random.Random) -> Stream:
    """A record as a microphone stream: numbered from a random first segment, analysed
    after its last segment, after the segment its first fault becomes sure, just before
    it, and after one more segment at random."""
    return _stream([record], rng, record.id)


def joined(records: Sequence[Record], rng: random.Random) -> Stream:
    """Several records of one language heard by one microphone in turn: a longer window
    whose earlier talk (a fixed fault, a drill, another fault) the model must read past."""
    if len({r.lang for r in records}) != 1:
        raise ValueError("records of one language only")
    return _stream(records, rng, "+".join(r.id for r in records))


def _stream(records: Sequence[Record], rng: random.Random, name: str) -> Stream:
    said: list[Said] = []
    sure: list[int] = []
    for record in records:
        base = len(said)
        evidence = record.evidence()
        for i, text in enumerate(record.segments):
            codes = evidence.get(i, [])
            kind = f"fault:{record.form}" if codes else f"people:{record.negative or 'talk'}"
            said.append(Said(text, tuple((code, text) for code in codes), kind))
        sure.extend(base + f.sure_at for f in record.faults)
    length = len(said)
    after = {length - 1}
    if sure:
        first = min(sure)
        after.add(first)
        if first > 0 and rng.random() < 0.5:
            after.add(first - 1)  # the hint before it is sure: nothing to report yet
    if length > 2 and rng.random() < 0.5:
        after.add(rng.randrange(0, length - 1))
    first_seq = 0 if rng.random() < 0.3 else rng.randrange(1, 5000)
    return Stream(
        stream_id=_stream_id(rng, name),
        lang=records[0].lang,
        said=tuple(said),
        first_seq=first_seq,
        start=1_767_225_600.0 + rng.randrange(0, 300 * 86_400),
        gaps=tuple(rng.uniform(3.0, 10.0) for _ in range(length)),
        analyze_after=tuple(sorted(after)),
    )


def _stream_id(rng: random.Random, name: str) -> str:
    area = rng.choice(["line", "cell", "press", "hall", "bay", "mic", "zone"])
    return f"{area}{rng.randint(1, 12)}-mic{rng.randint(1, 9)}"


def kinds(records: Iterable[Record]) -> dict[str, int]:
    """Counts by kind, form and negative class (the manifest and the README report them)."""
    out: dict[str, int] = {}
    for r in records:
        key = f"fault:{r.form}" if r.kind == "fault" else f"negative:{r.negative}"
        out[key] = out.get(key, 0) + 1
    return dict(sorted(out.items()))
