"""The keyword tier against the real fault catalogue (configs/agent.yaml)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.config import AgentConfig, load_config
from agent.config.loader import PROFILES_ENV
from pipelines.detect import FaultRule, KeywordDetector, KeywordSettings, Severity

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def real_config(tmp_path_factory: pytest.TempPathFactory) -> AgentConfig:
    """configs/agent.yaml with its catalogue and keyword settings, over a neutral profile.

    A device profile may not set `faults`, so the catalogue is the file's own; the neutral
    profile keeps these tests independent of engine tuning in configs/profiles/.
    """
    profiles = tmp_path_factory.mktemp("profiles")
    (profiles / "cpu-dev.yaml").write_text("description: neutral\n", encoding="utf-8")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(PROFILES_ENV, str(profiles))
        return load_config(REPO / "configs" / "agent.yaml", overrides=["llm.enabled=false"]).config


@pytest.fixture(scope="module")
def catalogue(real_config: AgentConfig) -> list[FaultRule]:
    return list(real_config.faults)


@pytest.fixture(scope="module")
def detector(real_config: AgentConfig) -> KeywordDetector:
    return KeywordDetector(real_config.faults, real_config.keywords)


def codes(
    detector: KeywordDetector,
    text: str,
    *,
    context: str = "",
    exclude: frozenset[str] = frozenset(),
) -> list[str]:
    return [m.code for m in detector.detect(text, context=context, exclude=exclude)]


# -- exact matches ------------------------------------------------------------------------


def test_english_exact_phrase_raises_its_fault(detector: KeywordDetector) -> None:
    """An exact English keyword inside a sentence raises that fault with its severity."""
    [match] = detector.detect("operator reports bearing abnormal noise on line three")
    assert match.code == "bearing_noise"
    assert match.severity is Severity.warning
    assert match.matched == "bearing abnormal noise"
    assert match.label == "bearing abnormal noise"


def test_chinese_exact_phrase_raises_its_fault(detector: KeywordDetector) -> None:
    """An exact Chinese keyword inside a sentence raises that fault, labelled in Chinese."""
    [match] = detector.detect("三号线轴承异响，请检查", lang="zh")
    assert match.code == "bearing_noise"
    assert match.matched == "轴承异响"
    assert match.label == "轴承异响"


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("bearing grinding", "bearing_noise"),
        ("轴承有异响", "bearing_noise"),
        ("temperature too high", "temperature_over_limit"),
        ("温度超限了", "temperature_over_limit"),
        ("the belt is slipping", "belt_slip"),
        ("输送带打滑", "belt_slip"),
        ("excessive vibration", "abnormal_vibration"),
        ("振动过大", "abnormal_vibration"),
        ("hydraulic leak under the press", "leak"),
        ("漏油", "leak"),
        ("motor overcurrent", "motor_overload"),
        ("电机过载", "motor_overload"),
        ("emergency stop button pressed", "emergency_stop"),
        ("紧急停机", "emergency_stop"),
    ],
)
def test_every_catalogue_fault_is_heard_in_english_and_chinese(
    detector: KeywordDetector, text: str, code: str
) -> None:
    """Each fault of the shipped catalogue is raised by an English and a Chinese phrase."""
    assert codes(detector, text) == [code]


def test_critical_faults_carry_critical_severity(detector: KeywordDetector) -> None:
    """Severity comes from the catalogue: emergency stop is critical, belt slip a warning."""
    by_code = {m.code: m.severity for m in detector.detect("e-stop! belt slip!")}
    assert by_code == {"emergency_stop": Severity.critical, "belt_slip": Severity.warning}


@pytest.mark.parametrize(
    "text",
    ["BEARING NOISE!", "ＢＥＡＲＩＮＧ　ＮＯＩＳＥ", "bearing... noise", "Bearing-Noise"],
)
def test_case_width_and_punctuation_do_not_matter(detector: KeywordDetector, text: str) -> None:
    """Upper case, full-width letters and punctuation inside a phrase still match."""
    assert codes(detector, text) == ["bearing_noise"]


def test_spaces_between_chinese_characters_do_not_matter(detector: KeywordDetector) -> None:
    """ASR that spaces out CJK characters (轴承 异响, 温度 超 限) still matches."""
    assert codes(detector, "轴承 异响") == ["bearing_noise"]
    assert codes(detector, "温度 超 限") == ["temperature_over_limit"]


def test_several_faults_in_one_segment_each_reported_once(detector: KeywordDetector) -> None:
    """Two faults in one text give one match each (sorted by code), repeats do not multiply."""
    assert codes(detector, "bearing noise and belt slip, bearing noise again") == [
        "bearing_noise",
        "belt_slip",
    ]


def test_mixed_language_segment_finds_both(detector: KeywordDetector) -> None:
    """Code-switched speech (English and Chinese in one segment) finds faults in both."""
    assert codes(detector, "belt slip and 轴承异响") == ["bearing_noise", "belt_slip"]


# -- ASR near-misses ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "code"),
    [
        ("there is a bearing noice on line three", "bearing_noise"),
        ("bearing abnormal noice", "bearing_noise"),
        ("bearings noise", "bearing_noise"),
        ("the motor is over heating", "temperature_over_limit"),
        ("motor over-heating again", "temperature_over_limit"),
        ("hit the e-stop now", "emergency_stop"),
        ("E-Stop pressed", "emergency_stop"),
        ("estop", "emergency_stop"),
    ],
)
def test_english_asr_near_misses_still_match(
    detector: KeywordDetector, text: str, code: str
) -> None:
    """Misspelt words, a plural, a compound split in two and e-stop spellings still match."""
    assert codes(detector, text) == [code]


def test_near_miss_scores_below_an_exact_match(detector: KeywordDetector) -> None:
    """A near miss is reported with a lower confidence score than the exact phrase."""
    [exact] = detector.detect("bearing noise")
    [near] = detector.detect("bearing noice")
    assert exact.score == 1.0
    assert near.score < exact.score


def test_chinese_homophone_matches_by_pinyin(detector: KeywordDetector) -> None:
    """轴成异响 (承 heard as the homophone 成) still raises 轴承异响."""
    [match] = detector.detect("轴成异响", lang="zh")
    assert match.code == "bearing_noise"
    assert match.keyword == "轴承异响"
    assert match.matched == "轴成异响"


def test_one_wrong_syllable_in_long_chinese_phrase_matches(detector: KeywordDetector) -> None:
    """温度超过纯线 (one syllable wrong in 温度超过上限) still raises temperature over limit."""
    [match] = detector.detect("温度超过纯线")
    assert match.code == "temperature_over_limit"
    assert match.keyword == "温度超过上限"


def test_two_wrong_syllables_do_not_match(detector: KeywordDetector) -> None:
    """Pinyin tolerance stops at one wrong syllable: 温度超出纯线 raises nothing."""
    assert codes(detector, "温度超出纯线") == []


def test_fuzzy_off_requires_exact_words(catalogue: list[FaultRule]) -> None:
    """With fuzzy matching off, near misses and homophones no longer match; exact ones do."""
    strict = KeywordDetector(catalogue, KeywordSettings(fuzzy=False))
    assert codes(strict, "bearing noice") == []
    assert codes(strict, "轴成异响") == []
    assert codes(strict, "bearing noise") == ["bearing_noise"]


def test_pinyin_off_keeps_english_fuzziness(catalogue: list[FaultRule]) -> None:
    """With pinyin off, a Chinese homophone no longer matches but English near misses do."""
    no_pinyin = KeywordDetector(catalogue, KeywordSettings(pinyin=False))
    assert codes(no_pinyin, "轴成异响") == []
    assert codes(no_pinyin, "轴承异响") == ["bearing_noise"]
    assert codes(no_pinyin, "bearing noice") == ["bearing_noise"]


# -- negations and cleared cues -----------------------------------------------------------


@pytest.mark.parametrize(
    ("negated", "affirmed", "code"),
    [
        ("no bearing abnormal noise", "bearing abnormal noise", "bearing_noise"),
        ("bearing: no abnormal noise", "bearing: abnormal noise", "bearing_noise"),
        ("temperature not over the limit", "temperature over the limit", "temperature_over_limit"),
        (
            "the temperature is not over the limit",
            "the temperature is over the limit",
            "temperature_over_limit",
        ),
        ("皮带没有打滑", "皮带打滑", "belt_slip"),
        ("没有轴承异响", "轴承异响", "bearing_noise"),
    ],
)
def test_negated_mention_does_not_alert(
    detector: KeywordDetector, negated: str, affirmed: str, code: str
) -> None:
    """A negated mention raises nothing, while the same words without the negation do."""
    assert codes(detector, negated) == []
    assert codes(detector, affirmed) == [code]


def test_normal_status_reports_raise_nothing(detector: KeywordDetector) -> None:
    """Routine all-clear reports (温度正常, no abnormal noise) raise no alert."""
    assert codes(detector, "温度正常") == []
    assert codes(detector, "三号线温度正常，皮带没有打滑") == []
    assert codes(detector, "no abnormal noise") == []


@pytest.mark.parametrize(
    "text",
    [
        "bearing noise is gone",
        "bearing noise is now gone",
        "轴承异响已消除",
        "皮带打滑已经恢复正常",
        "bearing noise is back to normal",
    ],
)
def test_cleared_mentions_do_not_alert(detector: KeywordDetector, text: str) -> None:
    """Saying a fault is over (is gone, 已消除, 恢复正常) does not raise it again."""
    assert codes(detector, text) == []


@pytest.mark.parametrize(
    "text",
    ["bearing noise is not gone", "bearing noise is back", "bearing noise. The belt is fine"],
)
def test_not_cleared_mentions_still_alert(detector: KeywordDetector, text: str) -> None:
    """Not gone, back again, or a cleared cue about something else: the fault is raised."""
    assert codes(detector, text) == ["bearing_noise"]


@pytest.mark.parametrize(
    "text",
    [
        "temperature under limit",
        "temperature is under the limit",
        "temperature below limit",
        "温度过低",
        "the bearing was replaced",
        "pizza over the limit",
    ],
)
def test_similar_but_different_statements_do_not_match(
    detector: KeywordDetector, text: str
) -> None:
    """Antonyms and partial mentions (under the limit, just 'bearing') raise nothing."""
    assert codes(detector, text) == []


# -- context across a segment cut ---------------------------------------------------------


def test_context_completes_phrase_split_across_segments(detector: KeywordDetector) -> None:
    """'the bearing' at the end of one segment plus 'abnormal noise' in the next matches."""
    [match] = detector.detect("abnormal noise", context="the bearing")
    assert match.code == "bearing_noise"
    assert match.matched == "bearing abnormal noise"


def test_context_completes_chinese_phrase_split_across_segments(
    detector: KeywordDetector,
) -> None:
    """轴承 at the end of the previous segment plus 异响 in the new one matches."""
    assert codes(detector, "异响", context="三号线轴承") == ["bearing_noise"]


def test_match_wholly_in_context_is_not_reported_again(detector: KeywordDetector) -> None:
    """A fault already heard in the context (previous segment) is not raised again."""
    assert codes(detector, "and the line keeps running", context="bearing abnormal noise") == []
    assert codes(detector, "on line three", context="轴承异响") == []


def test_negation_in_context_applies_to_new_text(detector: KeywordDetector) -> None:
    """A negation heard just before the cut still cancels the match after it."""
    assert codes(detector, "abnormal noise", context="no bearing") == []
    assert codes(detector, "bearing noise", context="there is no") == []


# -- disabled faults and labels -----------------------------------------------------------


def test_excluded_fault_is_not_reported_others_are(detector: KeywordDetector) -> None:
    """A fault disabled for the stream (exclude) is skipped; other faults still match."""
    text = "belt slip and bearing noise"
    assert codes(detector, text, exclude=frozenset({"bearing_noise"})) == ["belt_slip"]
    assert codes(detector, text, exclude=frozenset({"bearing_noise", "belt_slip"})) == []


def test_label_follows_segment_language(detector: KeywordDetector) -> None:
    """The label is in the segment's language; unknown languages fall back to English."""
    assert detector.detect("bearing noise", lang="zh")[0].label == "轴承异响"
    assert detector.detect("轴承异响", lang="en")[0].label == "bearing abnormal noise"
    assert detector.detect("轴承异响", lang="de")[0].label == "bearing abnormal noise"
    assert detector.detect("轴承异响")[0].label == "轴承异响"


# -- catalogue validation -----------------------------------------------------------------


def test_fault_rule_requires_english_label() -> None:
    """A catalogue entry without an `en` label is rejected."""
    with pytest.raises(ValidationError, match="`en` label is required"):
        FaultRule(code="x", labels={"zh": "坏"}, keywords={"zh": ["坏了"]})


def test_fault_rule_requires_a_keyword_with_words() -> None:
    """A catalogue entry with no keywords, or only punctuation, is rejected."""
    with pytest.raises(ValidationError, match="at least one keyword"):
        FaultRule(code="x", labels={"en": "x"}, keywords={"en": []})
    with pytest.raises(ValidationError, match="without any word"):
        FaultRule(code="x", labels={"en": "x"}, keywords={"en": ["?!"]})


# -- known false alarms and missed alarms (see report) --------------------------------------


@pytest.mark.parametrize(
    ("text", "wrong_code"),
    [
        ("please stop the conveyor for lunch", "emergency_stop"),
        ("the overhead crane is moving", "temperature_over_limit"),
    ],
)
def test_common_words_do_not_raise_critical_faults(
    detector: KeywordDetector, text: str, wrong_code: str
) -> None:
    """Everyday words ('stop', 'overhead') are not near misses of e-stop or overheated."""
    assert wrong_code not in codes(detector, text)


@pytest.mark.parametrize("text", ["持续不断的轴承异响", "不好了，轴承异响"])
def test_chinese_words_containing_bu_are_not_negations(
    detector: KeywordDetector, text: str
) -> None:
    """不断 (continuous) and 不好了 (oh no) do not negate the fault that follows."""
    assert codes(detector, text) == ["bearing_noise"]


@pytest.mark.parametrize(
    "text", ["no smoke, but bearing noise", "Is the line fine? No. Bearing noise on line three."]
)
def test_negation_does_not_cross_a_clause_boundary(detector: KeywordDetector, text: str) -> None:
    """A 'no' that ends an earlier clause does not cancel the fault reported after it."""
    assert codes(detector, text) == ["bearing_noise"]
