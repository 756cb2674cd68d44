"""The slow tier's settings for answers that point (pure): confidence thresholds validated
where they are written, retired quote settings accepted with a located deprecation."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.config import ConfigError, load_config

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs" / "agent.yaml"


@pytest.mark.parametrize(
    ("option", "reason"),
    [
        ("llm.confidence={leak: -0.1}", "a threshold is a probability"),
        ("llm.confidence={leak: 1.5}", "a threshold is a probability"),
        ("llm.min_confidence=-0.2", "greater than or equal to 0"),
        ("llm.min_confidence=2", "less than or equal to 1"),
    ],
)
def test_a_threshold_outside_0_to_1_is_refused_where_it_is_set(option: str, reason: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(CONFIG, overrides=[option])
    [issue] = caught.value.issues
    assert issue.path.startswith("llm.") and reason in issue.reason
    assert issue.source == f"--set {option}"


def test_per_code_thresholds_load() -> None:
    cfg = load_config(CONFIG, overrides=["llm.confidence={leak: 0.7}"]).config
    assert cfg.llm.confidence["leak"] == 0.7


def test_the_retired_quote_settings_load_with_a_deprecation(tmp_path: Path) -> None:
    """A file (or fleet document) of the release before answers pointed still loads: the
    quote settings are dropped and each is reported where it was written."""
    text = CONFIG.read_text(encoding="utf-8").replace(
        "llm:\n", "llm:\n  min_quote_chars: 8\n  max_quote_chars: 200\n", 1
    )
    path = tmp_path / "agent.yaml"
    path.write_text(text, encoding="utf-8")
    (tmp_path / "profiles").symlink_to(REPO / "configs" / "profiles")
    loaded = load_config(path)
    found = {issue.path: issue for issue in loaded.deprecations}
    assert set(found) == {"llm.min_quote_chars", "llm.max_quote_chars"}
    assert found["llm.min_quote_chars"].line is not None  # located in the file
    assert "deprecated" in found["llm.min_quote_chars"].reason
