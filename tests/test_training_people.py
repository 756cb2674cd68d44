"""training/people/: the hand-written streams of the slow tier's corpus (pure, no engine).

Every file loads under its schema; together they hold at least 2,000 streams, about half
Chinese, every catalogue fault and every class of hard negative; every file names its
writer and brief in the README; and no stream shares a sentence or a long run of words
with any part of bench/quality (training.leak), so the bench measures speech the model
never saw."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from training.leak import COINCIDENCES, bench_texts, coincidences, find_leaks
from training.people import (
    CODES,
    NEGATIVES,
    PEOPLE_DIR,
    PeopleError,
    Record,
    joined,
    load,
    to_stream,
)

RECORDS = load()


def test_there_are_enough_streams_in_both_languages() -> None:
    langs = Counter(r.lang for r in RECORDS)
    assert len(RECORDS) >= 2000, len(RECORDS)
    assert 0.4 <= langs["zh"] / len(RECORDS) <= 0.6, langs


def test_every_fault_and_every_negative_class_in_each_language() -> None:
    for lang in ("en", "zh"):
        mine = [r for r in RECORDS if r.lang == lang]
        codes = Counter(f.code for r in mine for f in r.faults)
        negatives = Counter(r.negative for r in mine if r.kind == "negative")
        assert set(codes) == set(CODES) and min(codes.values()) >= 30, (lang, codes)
        assert set(negatives) == set(NEGATIVES) and min(negatives.values()) >= 10, (lang, negatives)


def test_every_file_names_its_writer_and_brief() -> None:
    readme = (PEOPLE_DIR / "README.md").read_text(encoding="utf-8")
    for path in sorted(PEOPLE_DIR.glob("*.jsonl")):
        assert f"`{path.name}`" in readme, path.name
        brief = PEOPLE_DIR / "briefs" / f"{path.stem}.md"
        assert brief.is_file() and brief.stat().st_size > 1000, brief


def test_no_stream_shares_words_with_the_bench() -> None:
    """Only the listed coincidences (stock phrases of a part written after training, by
    writers who read neither side); the list names only runs that are still shared."""
    leaks = set(find_leaks(((r.id, r.segments) for r in RECORDS), bench_texts()))
    known = coincidences(PEOPLE_DIR / COINCIDENCES)
    assert not leaks - known, sorted(leaks - known, key=str)[:10]
    assert known <= leaks, sorted(known - leaks, key=str)


def test_the_leak_check_finds_a_copied_sentence_and_a_long_run() -> None:
    bench = [
        "The drive end of spindle two sounds a bit rough today.",
        "二号工位轴承有异响，声音越来越大，赶紧停机检查一下吧。",
    ]
    found = find_leaks(
        [
            ("a", ["ok so. the drive end of spindle two sounds a bit ROUGH today!"]),
            ("b", ["我说二号工位轴承有异响声音越来越大赶紧停"]),
            ("c", ["the drive end of spindle three is fine"]),
        ],
        bench,
    )
    assert {leak.record for leak in found} == {"a", "b"}


def test_a_fault_is_taught_from_the_segment_it_is_sure_at() -> None:
    """Evidence before `sure_at` (a hint) is not yet a fault; from it on, each evidence
    segment is; a joined window keeps each record's labels at its own offset."""
    record = Record.model_validate(
        {"id": "T-1", "lang": "en", "kind": "fault", "form": "buildup", "negative": None,
         "faults": [{"code": "leak", "evidence": [1, 2, 3], "sure_at": 2}], "about": None,
         "scene": "test", "segments": ["a", "a small drip", "a puddle now", "spraying", "b"]}
    )  # fmt: skip
    assert record.evidence() == {2: ["leak"], 3: ["leak"]}
    negative = Record.model_validate(
        {"id": "T-2", "lang": "en", "kind": "negative", "form": None, "negative": "fixed",
         "faults": [], "about": "leak", "scene": "test", "segments": ["fixed it", "dry now"]}
    )  # fmt: skip
    stream = joined([negative, record], random.Random(0))
    codes = [[c for c, _ in s.evidence] for s in stream.said]
    assert codes == [[], [], [], [], ["leak"], ["leak"], []]
    single = to_stream(record, random.Random(1))
    assert max(single.analyze_after) == len(record.segments) - 1
    assert 2 in single.analyze_after  # analysed where it becomes sure


@pytest.mark.parametrize(
    "bad",
    [
        '{"id": "x", "lang": "en", "kind": "negative", "form": null, "negative": "fixed", '
        '"faults": [{"code": "leak", "evidence": [0], "sure_at": 0}], "about": null, '
        '"scene": "", "segments": ["a", "b"]}',
        '{"id": "x", "lang": "en", "kind": "fault", "form": "named", "negative": null, '
        '"faults": [{"code": "leak", "evidence": [5], "sure_at": 0}], "about": null, '
        '"scene": "", "segments": ["a", "b"]}',
        '{"id": "x", "lang": "fr", "kind": "fault", "form": "named", "negative": null, '
        '"faults": [], "about": null, "scene": "", "segments": ["a", "b"]}',
        '{"id": "x", "lang": "en", "kind": "fault", "form": "named", "negative": null, '
        '"faults": [{"code": "fire", "evidence": [0], "sure_at": 0}], "about": null, '
        '"scene": "", "segments": ["a", "b"]}',
    ],
)
def test_a_bad_line_is_an_error_with_its_place(tmp_path: Path, bad: str) -> None:
    (tmp_path / "w.jsonl").write_text(bad + "\n", encoding="utf-8")
    with pytest.raises(PeopleError, match=r"w\.jsonl:1"):
        load(tmp_path)
