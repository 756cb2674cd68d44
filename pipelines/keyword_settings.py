"""The keyword tier's settings (`keywords:` in the agent file): fuzziness, windows, cues,
and the word classes that catalogue terms refer to as @name."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["DEFAULT_CLASSES", "KeywordSettings", "ReaderSettings"]

_EN_NEGATIONS = [
    "no",
    "not",
    "never",
    "without",
    "none",
    "nothing",
    "isn't",
    "aren't",
    "wasn't",
    "weren't",
    "don't",
    "doesn't",
    "didn't",
    "hasn't",
    "haven't",
    "zero",
]
_ZH_NEGATIONS = ["没有", "没", "无", "不", "未", "非", "别", "并非"]
# "bearing noise is gone", "轴承异响已消除", "皮带打滑 已经处理好了": said to be over.
_EN_CLEARED = [
    "normal",
    "fine",
    "ok",
    "okay",
    "resolved",
    "cleared",
    "fixed",
    "gone",
    "solved",
    "repaired",
    "sorted",
]
_ZH_CLEARED = ["正常", "消失", "消除", "排除", "解除", "恢复",
               "处理好", "修好", "解决", "好了", "没了"]  # fmt: skip
# Before a match in its clause, these make it no report of a fault now: a condition, a
# question, a procedure ("if you find an oil leak", "has anyone seen an air leak",
# "how to look for", 如果, 是不是). Multi-word cues are matched as consecutive words.
_EN_UNREAL = [
    "if",
    "whenever",
    "in case",
    "what if",
    "how to",
    "how you",
    "look for",
    "looking for",
    "check for",
    "checking for",
    "watch for",
    "has anyone",
    "have you",
    "did anyone",
    "did you",
    "was it",
    "is there",
    "are there",
    "any sign of",
    # Denied by comparison: "nothing even close to over temperature", "nowhere near".
    "nothing like",
    "nothing close to",
    "nothing even close to",
    "not even close to",
    "nowhere near",
    "no sign of",
    "no signs of",
    "no trace of",
    # Negative polarity: "any" before a fault is asked about or denied ("none of them showing
    # any bearing noise", "is there any leak"), never a report of one; "whether" asks.
    "any",
    "whether",
]
# 任何: negative polarity (没有任何异响); 哪: which (哪台设备报的电机过载).
_ZH_UNREAL = ["如果", "万一", "要是", "假如", "是不是", "是否", "有没有", "会不会",
              "如何", "怎么判断", "任何", "哪"]  # fmt: skip
# Right before a match: it is the topic, not an event ("a video about bearing noise", 讲).
_EN_TOPIC = ["about", "regarding", "on how", "recognising", "recognizing", "identifying",
             "spotting", "preventing", "avoiding"]  # fmt: skip
# 防止 / 预防: what a measure prevents (防止轴承异响的润滑脂); not a bare 防, which starts
# 防爆电机 (explosion-proof motors), 防护罩, 消防泵.
_ZH_TOPIC = ["讲", "关于", "讲的是", "防止", "预防", "避免"]
# Anywhere in a match's clause: a drill, a test, training ("emergency stop drill",
# 急停演练). A real fault said during a drill is in another clause.
_EN_DRILL = [
    "drill",
    "exercise",
    "rehearsal",
    "simulation",
    "simulated",
    "training",
    "test",
    "testing",
    "quiz",
    "video",
    "lesson",
]
_ZH_DRILL = ["演练", "演习", "培训", "练习", "模拟", "测试", "视频", "课程", "考试", "不是真"]
# Anywhere earlier in the segment: it announces a drill, so what follows is the drill ("this
# is a scheduled drill, when the horn sounds, press your emergency stop"), unless the match's
# clause says it is real (_EN_REAL). Only words that name a drill: "test" or "training"
# earlier in a segment says nothing of a later clause.
_EN_ANNOUNCE = ["drill", "exercise", "rehearsal", "simulation", "simulated"]
_ZH_ANNOUNCE = ["演练", "演习", "模拟"]
_EN_REAL = ["real", "really", "actual", "actually", "not a drill", "no drill", "genuine"]
_ZH_REAL = ["真的", "不是演练", "不是演习", "真实", "确实"]
# Later in the same segment: the fault was repaired ("the motor overload from Tuesday, they
# found a seized gearbox and replaced it"; 轴承异响换完轴承以后已经消除了), unless a
# negation comes right before the cue (还没排除, haven't fixed it) or "again" after it.
_EN_REPAIRED = ["replaced it", "fixed it", "repaired it", "sorted it", "changed it",
                "swapped it", "fixed that", "sorted that", "cleared it", "reset it"]  # fmt: skip
_ZH_REPAIRED = ["消除", "排除", "解除", "修好", "处理好", "解决了", "换完", "换好", "更换了",
                "修复"]  # fmt: skip

# Right after a match: it names a part or a document, not an event ("the emergency stop
# buttons are all pulled out", 急停按钮). An event on the part is a concept (button + hit).
_EN_DEVICE = ["button", "buttons", "circuit", "circuits", "switch", "switches", "cord",
              "procedure", "procedures", "sign", "signs", "manual", "checklist", "sensor",
              "sensors", "kit", "kits", "tray", "trays", "rating"]  # fmt: skip
# Not "protection", 保护, "symbol", "icon": "overload protection tripped", 过载保护跳了 and
# "the over temperature symbol is on" are the events themselves.
_ZH_DEVICE = ["按钮", "开关", "回路", "拉绳", "程序", "规程", "标识", "传感器", "手册", "托盘"]

# Before a match in its clause (condition window): it is printed or depicted, not heard
# happening ("on this poster you can see the signs of a hydraulic leak", 标签上写着...).
# A label or sticker only as what is written on it: "label printer" is a machine.
# Not "slide" (a press slide is a part), "diagram" (the HMI's), 写着 (屏幕上写着温度过高
# reads an alarm out), 说明书上 or 铭牌上 (说明书上说的那个位置在漏油 is a place).
_EN_REFERENCE = ["poster", "posters", "handbook", "brochure", "textbook", "chapter",
                 "datasheet", "label says", "label reads", "sticker says"]  # fmt: skip
_ZH_REFERENCE = ["海报上", "标签上写", "教材", "课件", "叫做", "名叫", "标语"]  # fmt: skip
# (A year, "in 1998", counts too: pipelines.cues.) Anywhere in a match's clause: an earlier
# day's fault ("the belt slipping you saw on tuesday", 星期二那个振动过大的问题), unless
# the clause says it is back or ongoing (again, still, since, is, 又, 还在, 了 right after);
# the words that make it a description of the part ("the pump we replaced last week is
# leaking") or a comparison ("slipping like last time") are the ongoing words of
# pipelines.cues; Chinese only in the forms that point back at one event (上周那次, 星期二
# 那次): 去年换的轴承有异响 and 星期二那台电机 describe the part.
_EN_PAST = ["last week", "last month", "last year", "last shift", "the other day",
            "on monday", "on tuesday", "on wednesday", "on thursday", "on friday",
            "on saturday", "on sunday", "from monday", "from tuesday", "from wednesday",
            "from thursday", "from friday", "years ago", "earlier in the week",
            "earlier this week"]  # fmt: skip
_ZH_PAST = ["上周那次", "上星期那次", "上个月那次", "去年那次", "前几天那次", "上次那次",
            "星期一那次", "星期二那次", "星期三那次", "星期四那次", "星期五那次", "周一那次",
            "周二那次", "周三那次", "周四那次", "周五那次", "有一年", "当年"]  # fmt: skip
# Anywhere in a match's clause: a broadcast or a song ("the dj says next up ... emergency
# stop by ...", 天气预报南方地区温度过高). A real shout beside the radio is another clause.
# Phrases, not bare nouns: the radio on a plant floor is the two-way radio ("over the radio
# they said the belt is slipping"), film is packaging film, hot weather overheats motors.
_EN_MEDIA = ["radio station", "on the radio they're playing", "the dj", "dj says", "lyrics",
             "singer", "album", "playlist", "weather forecast", "podcast", "sitcom", "cartoon",
             "tv show", "tv series", "movie"]  # fmt: skip
_ZH_MEDIA = ["收音机里", "歌词", "唱歌", "放歌", "这首歌", "主持人", "乐队", "天气预报", "下一首",
             "电视剧", "播客", "男主角", "女主角", "电影", "剧里"]  # fmt: skip

DEFAULT_CLASSES: dict[str, dict[str, list[str]]] = {
    "intense": {
        "en": [
            "severe",
            "excessive",
            "strong",
            "heavy",
            "violent",
            "violently",
            "abnormal",
            "unusual",
            "extreme",
            "massive",
            "serious",
            "badly",
            "terrible",
            "crazy",
        ],
        "zh": ["剧烈", "异常", "过大", "太大", "很大", "厉害", "严重", "超标", "特别大"],
    },
}


def _cue_lists(en: list[str], zh: list[str]) -> dict[str, list[str]]:
    return {"en": list(en), "zh": list(zh)}


def _cue_field(en: list[str], zh: list[str], title: str, description: str) -> Any:
    """A cue list setting: per-language lists, these defaults, a title and a description."""
    return Field(default_factory=lambda: _cue_lists(en, zh), title=title, description=description)


class ReaderSettings(BaseModel):
    """The instant tier's reader (pipelines.reading): which model, and its threshold."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    enabled: bool = Field(True, title="Enabled", description="Read matches that passed the cues.")
    model: str = Field(
        "instant-reader",
        min_length=1,
        title="Model",
        description="A folder holding reader.json: a name in the models search path "
        "($EDGE_AGENT_MODELS_DIR, the tree's models/, /usr/share/edge-agent/models) or a path.",
    )
    threshold: float | None = Field(
        None,
        gt=0,
        lt=1,
        title="Threshold",
        description="P(report) below which a match raises nothing; unset: the model's own "
        "(models/instant-reader/MODEL_CARD.md says how it was chosen).",
    )


class KeywordSettings(BaseModel):
    """How strictly keywords match."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    fuzzy: bool = Field(True, title="Fuzzy", description="Tolerate ASR spelling errors.")
    max_word_edits: int = Field(
        2,
        ge=0,
        le=3,
        title="Edits per word",
        description="Most character edits per keyword word (1 for words of 5-7 letters, this "
        "many from 8 letters, none up to 4 letters).",
    )
    max_fillers: int = Field(
        1, ge=0, le=3, title="Filler words", description="Extra words allowed inside a phrase."
    )
    pinyin: bool = Field(
        True, title="Pinyin", description="Chinese characters also match by sound (homophones)."
    )
    concept_window_words: int = Field(
        8,
        ge=0,
        le=20,
        title="Concept window, words",
        description="Most words between a concept's subject and symptom (one clause).",
    )
    concept_window_chars: int = Field(
        12,
        ge=0,
        le=40,
        title="Concept window, characters",
        description="Most CJK characters between them; a mixed gap counts each word as "
        "window_chars / window_words characters.",
    )
    classes: dict[str, dict[str, list[str]]] = Field(
        default_factory=lambda: {k: dict(v) for k, v in DEFAULT_CLASSES.items()},
        title="Word classes",
        description="Named word lists per language that concept terms use as @name "
        "(@intense: severe, excessive, 剧烈...). Setting this key replaces the defaults.",
    )
    negation_window: int = Field(
        3,
        ge=0,
        le=10,
        title="Negation window",
        description="Units (words, or CJK characters) before a match searched for negation cues.",
    )
    negation_cues: dict[str, list[str]] = _cue_field(
        _EN_NEGATIONS,
        _ZH_NEGATIONS,
        "Negation cues",
        "Words (en) or character strings (zh) that cancel a following match.",
    )
    cleared_cues: dict[str, list[str]] = _cue_field(
        _EN_CLEARED,
        _ZH_CLEARED,
        "Cleared cues",
        "Words right after a match (after is/was/已...) saying the fault is over.",
    )
    unreal_window: int = Field(
        8,
        ge=0,
        le=20,
        title="Condition window",
        description="Words before a match (in its statement: not past and / but / then, 但是 / "
        "还有 / 现在 ..., a pause between CJK characters) searched for condition, question "
        "and reference cues; CJK characters have their own window.",
    )
    unreal_window_chars: int = Field(
        16,
        ge=0,
        le=40,
        title="Condition window, characters",
        description="CJK characters before a match searched for condition, question and "
        "reference cues (如果控制屏上显示模具温度过高: 如果 is 9 characters before).",
    )
    unreal_cues: dict[str, list[str]] = _cue_field(
        _EN_UNREAL,
        _ZH_UNREAL,
        "Condition and question cues",
        "Before a match in its clause: it is a condition, a question or a "
        "procedure, not a report (if, has anyone, look for, 如果, 是不是).",
    )
    reference_cues: dict[str, list[str]] = _cue_field(
        _EN_REFERENCE,
        _ZH_REFERENCE,
        "Reference cues",
        "Before a match in its clause (condition window): it is printed or shown, "
        "not happening (a poster, on the label, 说明书上).",
    )
    past_cues: dict[str, list[str]] = _cue_field(
        _EN_PAST,
        _ZH_PAST,
        "Earlier-day cues",
        "In a match's statement (its clause cut at and / but / 但是): a fault of an earlier "
        "day (last week, on tuesday, 上周那次), unless it says it is back, ongoing or present "
        "(again, still, since, is, 又, 还在).",
    )
    media_cues: dict[str, list[str]] = _cue_field(
        _EN_MEDIA,
        _ZH_MEDIA,
        "Broadcast cues",
        "In a match's statement: a song, a show, a forecast (the dj says, 天气预报).",
    )
    topic_cues: dict[str, list[str]] = _cue_field(
        _EN_TOPIC,
        _ZH_TOPIC,
        "Topic cues",
        "Right before a match (negation window): the fault is a topic, not an "
        "event (a video about bearing noise, 讲轴承异响).",
    )
    drill_cues: dict[str, list[str]] = _cue_field(
        _EN_DRILL,
        _ZH_DRILL,
        "Drill cues",
        "Anywhere in a match's clause: a drill, test or training (急停演练).",
    )
    announce_cues: dict[str, list[str]] = _cue_field(
        _EN_ANNOUNCE,
        _ZH_ANNOUNCE,
        "Drill announcement cues",
        "Anywhere earlier in the segment: it announces a drill, so a match after "
        "it is part of the drill unless its clause says it is real (real_cues).",
    )
    real_cues: dict[str, list[str]] = _cue_field(
        _EN_REAL,
        _ZH_REAL,
        "Real-event cues",
        "In a match's clause: it really happens, whatever drill was announced "
        "before it (not a drill, for real, 真的).",
    )
    repaired_cues: dict[str, list[str]] = _cue_field(
        _EN_REPAIRED,
        _ZH_REPAIRED,
        "Repaired cues",
        "Later in the same segment: the fault was repaired (replaced it, 已经"
        "消除了); not after a negation (还没排除, haven't fixed it) or before 'again' (又).",
    )
    device_cues: dict[str, list[str]] = _cue_field(
        _EN_DEVICE,
        _ZH_DEVICE,
        "Device cues",
        "Right after a match: it names a part or a document, not an event "
        "(emergency stop button, 急停按钮).",
    )

    reader: ReaderSettings = Field(
        default_factory=ReaderSettings,
        title="Reader",
        description="The model that reads a segment whose fault words passed the cues, and "
        "drops the match if the segment does not report the fault (pipelines.reading).",
    )

    @field_validator("classes")
    @classmethod
    def _class_names(cls, v: dict[str, dict[str, list[str]]]) -> dict[str, dict[str, list[str]]]:
        for name, lists in v.items():
            if not name or not name.replace("_", "a").isalnum() or not name[0].isalpha():
                raise ValueError(f"class name {name!r}: letters, digits and _ only")
            if not any(lists.values()):
                raise ValueError(f"class {name!r} has no words")
        return v
