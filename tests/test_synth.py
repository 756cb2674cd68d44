"""The synthetic shift for the rolling-context benchmark (bench/context/synth.py)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.context.synth import BEARING, BELT, TEMPERATURE, generate_shift
from pipelines.ingest import Segment

REPO = Path(__file__).resolve().parents[1]


def test_same_seed_same_stream() -> None:
    assert generate_shift(1, seed=5) == generate_shift(1, seed=5)
    assert generate_shift(1, seed=5) != generate_shift(1, seed=6)


@pytest.mark.parametrize(("hours", "seg_s"), [(4, 5.0), (0.5, 10.0), (1, 2.5)])
def test_count_seq_and_contiguous_times(hours: float, seg_s: float) -> None:
    segments = generate_shift(hours, seg_s=seg_s, start_epoch=1_700_000_000.0)
    assert len(segments) == hours * 3600 / seg_s
    assert [s.seq for s in segments] == list(range(len(segments)))
    assert segments[0].start == 1_700_000_000.0
    for before, after in itertools.pairwise(segments):
        assert after.start == before.end
        assert before.end - before.start == pytest.approx(seg_s)


def test_payloads_validate_as_transcript_segments() -> None:
    for s in generate_shift(2, stream_id="line3-mic2"):
        payload = s.payload()
        assert "faults" not in payload
        seg = Segment.model_validate(payload)
        assert (seg.stream_id, seg.seq, seg.text, seg.lang) == ("line3-mic2", s.seq, s.text, "en")
        assert seg.text.strip()


def test_faults_develop_over_the_shift() -> None:
    segments = generate_shift(4)
    quarter = len(segments) // 4
    first = sum(1 for s in segments[:quarter] if s.faults)
    last = sum(1 for s in segments[-quarter:] if s.faults)
    assert first < last
    assert first * 3 < last
    assert last > 0.08 * quarter  # the rate ends near 15% of segments
    codes = {c for s in segments for c in s.faults}
    assert codes == {BEARING, TEMPERATURE, BELT}
    assert sum(1 for s in segments if BELT in s.faults) == 1
    # The first bearing hint comes after ~15% of the shift; the literal over-limit phrase once.
    first_bearing = next(s.seq for s in segments if BEARING in s.faults)
    assert first_bearing >= 0.15 * len(segments)
    assert sum("temperature over limit" in s.text for s in segments) == 1


def test_cli_writes_payload_lines_and_a_summary(tmp_path: Path) -> None:
    out = tmp_path / "shift.jsonl"
    done = subprocess.run(
        [sys.executable, "-m", "bench.context.synth", "--hours", "0.5", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = out.read_text(encoding="utf-8").splitlines()
    assert len(lines) == 360
    assert [json.loads(line) for line in lines] == [s.payload() for s in generate_shift(0.5)]
    assert done.stderr.startswith("segments=360 ")
    assert len(done.stderr.strip().splitlines()) == 1
