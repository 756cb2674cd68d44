"""Validation of the catalogue's concept form, each error at its line in the file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_config import cfg_dir, issues_of, write  # noqa: F401  (the fixture)

_HEAD = """\
device_id: t1
keywords:
  classes:
    loud: {en: [loud, deafening]}
faults:
  - code: fan_noise
    labels: {en: fan noise}
    keywords: {en: [fan noise]}
    concepts:
"""


@pytest.mark.parametrize(
    ("concept", "line", "path", "reason"),
    [
        (
            "      - subject: {en: [fan]}\n        symptom: {en: [noise, '@quiet']}\n",
            11,
            "faults.0.concepts.0.symptom.en.1",
            "unknown word class '@quiet' (keywords.classes has ['loud'])",
        ),
        (
            "      - subject: {en: []}\n        symptom: {en: ['@loud']}\n",
            10,
            "faults.0.concepts.0.subject",
            "at least one subject term is required",
        ),
        (
            "      - subject: {en: [fan]}\n        symptom: {en: ['@Loud!']}\n",
            11,
            "faults.0.concepts.0.symptom",
            "en: class reference '@Loud!' must read @name",
        ),
        (
            "      - subject: {en: [fan]}\n        symptom: {en: [it makes a very loud noise]}\n",
            11,
            "faults.0.concepts.0.symptom",
            "en: term 'it makes a very loud noise' is a phrase; at most 4 words",
        ),
        (
            "      - subject: {en: [fan]}\n        symptom: {en: [noise]}\n        window: 3\n",
            12,
            "faults.0.concepts.0.window",
            "Extra inputs are not permitted",
        ),
        (
            "      - subject: {zh: ['?!']}\n        symptom: {en: [noise]}\n",
            10,
            "faults.0.concepts.0.subject",
            "zh: term without any word: '?!'",
        ),
    ],
)
def test_concept_errors_are_located(
    cfg_dir: Path,  # noqa: F811
    concept: str,
    line: int,
    path: str,
    reason: str,
) -> None:
    """A wrong concept is reported with the file, the line and the key it is about."""
    file = write(cfg_dir, _HEAD + concept)
    [issue] = issues_of(file)
    assert (issue.source, issue.line, issue.path) == (str(file), line, path)
    assert issue.reason == reason


def test_an_empty_word_class_is_refused(cfg_dir: Path) -> None:  # noqa: F811
    file = write(cfg_dir, _HEAD.replace("{en: [loud, deafening]}", "{en: []}") + "      []\n")
    [issue] = issues_of(file)
    assert (issue.line, issue.path) == (3, "keywords.classes")
    assert issue.reason == "class 'loud' has no words"


def test_a_valid_concept_loads(cfg_dir: Path) -> None:  # noqa: F811
    from agent.config import load_config

    file = write(
        cfg_dir, _HEAD + "      - subject: {en: [fan]}\n        symptom: {en: ['@loud', hum]}\n"
    )
    [rule] = load_config(file).config.faults
    assert rule.concepts[0].symptom == {"en": ["@loud", "hum"]}
