"""`agentctl plan`: the memory planner from the command line, with its exit codes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.shapes import SMOLLM2

REPO = Path(__file__).resolve().parents[1]


def _plan(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.agentctl", "plan", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _model(tmp_path: Path) -> Path:
    folder = tmp_path / "smollm2"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(SMOLLM2))
    return folder


def test_plan_that_fits_exits_0(tmp_path: Path) -> None:
    """SmolLM2 on cpu-dev: the KV arithmetic is printed and the outcome is a fit."""
    done = _plan("--model", str(_model(tmp_path)), "--profile", "cpu-dev")
    assert done.returncode == 0, done.stderr
    assert (
        "KV / token       23.0 KB bf16 (30 full-attention layers x 2 x 3 KV heads x 64 x 2 B)"
        in done.stdout
    )
    assert "outcome          fits 8K with bf16 KV" in done.stdout


def test_plan_of_the_agent_config_with_overrides_exits_1(tmp_path: Path) -> None:
    """--config plans what the service would start (file + profile + --set): asking for more
    context than the model has is a 'does not fit', exit 1."""
    done = _plan(
        "--model",
        str(_model(tmp_path)),
        "--config",
        "configs/agent.yaml",
        "--set",
        "engine.max_model_len=65536",
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "does not fit: max_model_len 65,536 exceeds the model's 8,192 positions" in done.stdout


def test_unknown_profile_exits_2() -> None:
    """A profile that does not exist is an input error (exit 2) that names what was searched."""
    done = _plan("--profile", "no-such-device")
    assert done.returncode == 2
    assert "no-such-device" in done.stderr
