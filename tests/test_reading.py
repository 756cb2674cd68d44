"""pipelines.reading (the instant tier's reader) and agent.reader (where its model lives)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.config.loader import ConfigError, load_config
from agent.reader import keyword_detector, load_reader, reader_path
from pipelines.detect import KeywordDetector
from pipelines.keyword_settings import KeywordSettings, ReaderSettings
from pipelines.normalize import units
from pipelines.reading import MASK, READER_FORMAT, Reader, ReaderError, features

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "configs/agent.yaml"


def _model(tmp_path: Path, **fields: object) -> Path:
    data = {"format": READER_FORMAT, "threshold": 0.5, "bias": 0.0, "weights": {}} | fields
    folder = tmp_path / "reader-model"
    folder.mkdir(exist_ok=True)
    (folder / "reader.json").write_text(json.dumps(data), encoding="utf-8")
    return folder / "reader.json"


def test_features_mask_the_fault_words_and_tag_their_neighbours() -> None:
    seq = units("yesterday the bearing noise on pump two was fixed")
    start = [u.text for u in seq].index("bearing")
    feats = features(seq, start, start + 2, ".")
    assert "bearing" not in feats and "noise" not in feats  # the words the matcher found
    assert MASK in feats and f"{MASK} on" in feats
    assert {"L:yesterday", "L:the", "R:on", "R:was"} <= set(feats) and "R:fixed" not in feats
    assert "C:fixed" in feats and "end:." in feats


def test_features_of_chinese_are_character_grams() -> None:
    seq = units("昨天轴承异响已经修好了")
    start = [u.text for u in seq].index("轴")
    feats = set(features(seq, start, start + 4))
    assert {"修", "修 好", "已经修", "L:昨", "R:已"} <= feats


def test_probability_is_the_logistic_of_the_weights(tmp_path: Path) -> None:
    reader = Reader.from_file(_model(tmp_path, bias=-1.0, weights={"fixed": -2.0, "now": 3.0}))
    assert reader.probability([]) == pytest.approx(0.2689, abs=1e-4)
    assert reader.probability(["now", "now"]) == pytest.approx(0.8808, abs=1e-4)  # once each
    assert reader.probability(["fixed", "unknown"]) < 0.05
    assert reader.name == "reader-model"


@pytest.mark.parametrize(
    ("content", "says"),
    [
        (None, "No such file"),
        ("{not json", "Expecting property name"),
        (json.dumps({"format": "other/1"}), "not a edge-agent-reader/1 file"),
        (json.dumps({"format": READER_FORMAT, "threshold": 0.5, "bias": 0, "weights": {"a": "x"}}),
         "'weights' must map features to numbers"),
        (json.dumps({"format": READER_FORMAT, "threshold": "high", "bias": 0, "weights": {}}),
         "'bias' and 'threshold' must be numbers"),
        (json.dumps({"format": READER_FORMAT, "threshold": 1.5, "bias": 0, "weights": {}}),
         "threshold 1.5 is not between 0 and 1"),
    ],
)  # fmt: skip
def test_an_unusable_model_file_is_a_clear_error(
    tmp_path: Path, content: str | None, says: str
) -> None:
    path = tmp_path / "reader.json"
    if content is not None:
        path.write_text(content, encoding="utf-8")
    with pytest.raises(ReaderError, match=r".*") as err:
        Reader.from_file(path)
    assert str(path) in str(err.value) and says in str(err.value)


def _detector(reader: Reader | None) -> KeywordDetector:
    cfg = load_config(CONFIG, overrides=["llm.enabled=false"]).config
    return KeywordDetector(cfg.faults, cfg.keywords, reader)


def test_a_match_the_reader_rejects_raises_nothing_and_says_why(tmp_path: Path) -> None:
    doubting = Reader.from_file(_model(tmp_path, bias=-5.0))  # reads everything as no report
    text = "the hydraulic pack on press four has an oil leak"
    assert [m.code for m in _detector(None).detect(text)] == ["leak"]
    result = _detector(doubting).explain(text)
    assert result.raised == []
    leaks = [c for c in result.candidates if c.match.code == "leak"]
    assert leaks and all(c.reading == pytest.approx(0.0067, abs=1e-4) for c in leaks)
    assert {c.dropped for c in leaks} == {"read as no report: P(report) 0.007 < 0.5"}


def test_a_short_shout_is_never_read_away(tmp_path: Path) -> None:
    doubting = _detector(Reader.from_file(_model(tmp_path, bias=-5.0)))
    assert [m.code for m in doubting.detect("Emergency stop!")] == ["emergency_stop"]
    assert [m.code for m in doubting.detect("急停！")] == ["emergency_stop"]
    # the previous segment's words, without punctuation, do not make the shout long
    said = doubting.detect("emergency stop!", context="ignore that and tell everyone on line")
    assert [m.code for m in said] == ["emergency_stop"]
    # a long sentence ending in "!" is read like any other
    assert doubting.detect("we ran the emergency stop drill on line four this morning!") == []


def test_the_shipped_reader_is_found_and_loaded() -> None:
    path = reader_path("instant-reader")
    assert path == REPO / "models/instant-reader/reader.json"
    reader = load_reader(ReaderSettings())
    assert reader is not None and 0 < reader.threshold < 1 and len(reader.weights) > 1000
    assert load_reader(ReaderSettings(threshold=0.9)).threshold == 0.9  # type: ignore[union-attr]
    assert load_reader(ReaderSettings(enabled=False)) is None
    cfg = load_config(CONFIG, overrides=["llm.enabled=false"]).config
    assert keyword_detector(cfg.faults, cfg.keywords).detect("Emergency stop!")


def test_a_missing_reader_model_is_a_located_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG, overrides=[f"keywords.reader.model={tmp_path}/nothing-here"])
    [issue] = err.value.issues
    assert issue.path == "keywords.reader.model"
    assert issue.source.startswith("--set keywords.reader.model=")
    assert f"no reader.json for reader model '{tmp_path}/nothing-here'" in issue.reason


def test_a_damaged_reader_model_is_a_located_config_error(tmp_path: Path) -> None:
    bad = _model(tmp_path, threshold=7)
    with pytest.raises(ConfigError) as err:
        load_config(CONFIG, overrides=[f"keywords.reader.model={bad.parent}"])
    assert "threshold 7.0 is not between 0 and 1" in err.value.issues[0].reason
    # switched off, the same path is not read at all
    off = load_config(
        CONFIG,
        overrides=[f"keywords.reader.model={bad.parent}", "keywords.reader.enabled=false"],
    )
    assert off.config.keywords.reader.enabled is False


def test_reader_settings_are_bounded() -> None:
    with pytest.raises(ValueError, match="less than 1"):
        KeywordSettings.model_validate({"reader": {"threshold": 1.0}})
    with pytest.raises(ValueError, match="Extra inputs are not permitted"):
        KeywordSettings.model_validate({"reader": {"path": "x"}})


def test_a_relative_reader_path_is_the_config_files_not_the_working_directorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    site.mkdir()
    _model(site, threshold=0.4)  # site/reader-model/reader.json
    config = site / "agent.yaml"
    agent = CONFIG.read_text(encoding="utf-8")
    config.write_text(agent + "\n", encoding="utf-8")
    (site / "profiles").symlink_to(REPO / "configs/profiles")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    loaded = load_config(config, overrides=["keywords.reader.model=./reader-model"])
    assert loaded.config.keywords.reader.model == str(site / "reader-model")
    reader = load_reader(loaded.config.keywords.reader)
    assert reader is not None and reader.threshold == 0.4
