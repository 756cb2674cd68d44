"""training/reading/train.py: the shipped reader is what one command makes from the tree."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from training.reading.train import CORPUS, DEV_PARTS, SET_DIR, Example, fit

REPO = Path(__file__).resolve().parents[1]
SHIPPED = REPO / "models/instant-reader/reader.json"


def test_fit_is_deterministic_and_learns_the_signal() -> None:
    examples = [
        Example(("now", "<F>"), 1, "t"),
        Example(("again", "<F>"), 1, "t"),
        Example(("fixed", "<F>"), 0, "t"),
        Example(("drill", "<F>"), 0, "t"),
        Example(("now", "fixed", "<F>"), 0, "t"),
    ]
    first = fit(examples, l2=1e-3, steps=300, lr=2.0)
    assert fit(examples, l2=1e-3, steps=300, lr=2.0) == first
    weights, _ = first
    assert weights["now"] > 0 and weights["again"] > 0
    assert weights["fixed"] < 0 and weights["drill"] < 0


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()[:16]


def test_the_shipped_reader_was_trained_on_the_committed_data() -> None:
    trained = json.loads(SHIPPED.read_text(encoding="utf-8"))["trained_on"]
    assert trained["corpus"] == {f.name: _digest(f) for f in sorted(CORPUS.glob("*.yaml"))}
    assert list(trained["parts"]) == list(DEV_PARTS)  # the development parts, never blind3/4
    assert trained["parts"] == {p: _digest(SET_DIR / f"{p}.yaml") for p in DEV_PARTS}


@pytest.mark.slow
def test_one_command_remakes_the_shipped_reader(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "training.reading.train", "--out", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    made = json.loads((tmp_path / "reader.json").read_text(encoding="utf-8"))
    shipped = json.loads(SHIPPED.read_text(encoding="utf-8"))
    assert made["trained_on"] == shipped["trained_on"]
    assert made["threshold"] == shipped["threshold"]
    assert made["bias"] == pytest.approx(shipped["bias"], abs=2e-4)
    # the same features; each weight to its 4th decimal, bar a last-digit rounding
    assert made["weights"].keys() == shipped["weights"].keys()
    worst = max(abs(made["weights"][k] - v) for k, v in shipped["weights"].items())
    assert worst <= 2e-4
