"""What around a match says it is no fault report: negation, "cleared", a condition or a
question, a topic, a drill. Most cues are scoped to the match's clause (a clause ends at
, . ; : ! ? and their CJK forms), so "no smoke, but bearing noise" still alerts. Two look
further, within the segment: a drill announced earlier in it ("this is a drill, ... press
your emergency stop"), and a repair said later in it ("..., they replaced it").

A cue is a word or words (matched as consecutive words) or, when it is written in CJK
characters, a character string looked for in the clause's characters; which language list
holds it does not matter.
"""

from __future__ import annotations

import datetime
import itertools
import re
from collections.abc import Iterator, Mapping, Sequence

from pipelines.keyword_settings import KeywordSettings
from pipelines.normalize import Unit, is_cjk, units

__all__ = ["Cues", "reads_as_all_clear"]

# Ordinary words that contain a negation character but negate nothing (持续不断的轴承异响,
# 特别刺耳), and potential complements that say a machine cannot do something, which is
# the symptom itself, not a denial of it (带不动, 停不住, 受不了, 停不下来, 手放不上去).
_ZH_NOT_NEGATIONS = [
    "不断",
    "不停",
    "不止",
    "不好",
    "不妙",
    "不对",
    "不少",
    "无论",
    "非常",
    "无法",
    "不动",
    "不住",
    "不了",
    "不下",
    "不上去",
    "不走",
    "特别",
    "别人",
    "别的",
    "分别",
    "区别",
]
_EN_LINKS = {"is", "was", "are", "were", "seems", "now", "back", "to", "has", "been", "all"}
# A yes/no question: an auxiliary before its subject, at the clause's start or after a
# conjunction ("and is the temperature too high warning still set at 950").
_EN_AUX = {"is", "are", "was", "were", "does", "did", "do", "has", "have", "can", "could",
           "should", "will", "would"}  # fmt: skip
_EN_SUBJECT_START = {"the", "a", "an", "that", "this", "there", "it", "our", "your", "its",
                     "any", "my", "their"}  # fmt: skip
_EN_CONJUNCTIONS = {"and", "but", "so", "or", "then", "also"}
# Inside a concept's span, "whether" (判断皮带有没有打滑): no report. 是不是 and 会不会 there
# are a suspicion said aloud (皮带是不是又在轮子上溜了), which is how a fault is reported.
_ZH_WHETHER = ("有没有", "是否")
# Right before a repaired cue: it is not repaired ("haven't fixed it", 还没排除).
_EN_NOT = {"not", "never", "haven't", "hasn't", "didn't", "isn't", "wasn't", "weren't",
           "aren't", "don't", "doesn't", "can't", "couldn't", "won't", "no", "yet"}  # fmt: skip
_ZH_NOT = ("没", "未", "不", "无")
_EN_REAL_WORDS = {"real", "really", "actual", "actually", "genuine"}  # "not real" is none
# "Not real" (不是真实故障) is no real-event cue: these are taken out before looking for one.
_ZH_DENIED_REAL = ("不是真", "并非真", "不真", "非真", "没有真", "并不真")
# After a repaired cue: it came back ("fixed it on Monday and it's back again", 又响了).
_EN_AGAIN = {"again", "back", "returned", "still"}
_ZH_AGAIN = ("又", "再次", "还是", "仍然", "依然")
_ZH_LINKS = ["已经", "已", "都", "也", "现在", "现已"]
# Right after a match: a Chinese negation that follows what it denies (一点轴承噪音都没有,
# 漏油也没有), where it ends the clause or says it was not seen (没有了, 没有出现); not
# where it negates what follows (电机过热都没有报警, 皮带打滑也没人管, 异响并没有好转).
_ZH_POST_NEGATIONS = ("都没有", "也没有", "都没", "也没", "并没有", "根本没有")
# What may follow it, to the clause's end: nothing, or "was seen / happened" (没有出现过了).
_ZH_POST_NEGATION_REST = re.compile(r"(出现|发现|听到|看到)?过?了?(问题)?")
# In a clause with an earlier-day cue, what makes it a report: "again" (as after a repair),
# a present, perfect or recent verb, or the verb of a clause that describes the part ("the
# pump we replaced last week is leaking", "the motor we rebuilt last month overheated this
# morning"); "than" and "like" compare with today.
_EN_ONGOING = _EN_AGAIN | {"since", "now", "started", "today", "than", "like", "is", "are",
                           "am", "keeps", "keep", "has", "have", "just", "ago", "tonight",
                           "morning", "replaced", "fitted", "rebuilt", "serviced",
                           "installed", "swapped", "new"}  # fmt: skip
_ZH_ONGOING = (*_ZH_AGAIN, "还在", "仍", "一直", "开始", "从", "今天", "现在", "比", "正在", "在",
               "跟上次一样", "得很")  # fmt: skip
# Where the condition window stops, walking back from a match: a clause joined by and / but
# is another statement ("no sign of the fitter and the hydraulic leak is getting worse").
_EN_WINDOW_STOPS = {"and", "but", "then"}
_ZH_WINDOW_STOPS = ("但是", "可是", "还有", "而且", "结果", "然后", "现在")

# The slow tier's all-clear test (pipelines.evidence) keeps the word lists it was measured
# with; the keyword tier's configurable cues grew beyond them.
_ALL_CLEAR_EN = frozenset(
    ["no", "not", "never", "without", "none", "nothing", "isn't", "aren't", "wasn't",
     "weren't", "don't", "doesn't", "didn't", "hasn't", "haven't", "zero",
     "normal", "fine", "ok", "okay", "resolved", "cleared", "fixed", "gone"]
)  # fmt: skip
_ALL_CLEAR_ZH = ("没有", "没", "无", "不", "未", "非", "别", "并非",
                 "正常", "消失", "消除", "排除", "解除", "恢复")  # fmt: skip


# Question forms (是不是, is it or not): the keyword tier reads them as questions (its
# condition cues), not as negations; the slow tier's all-clear test keeps them as it was.
_ZH_QUESTION_FORMS = ["是不是", "会不会", "有没有", "是否"]


def _strip_not_negations(chars: str, *, questions: bool = False) -> str:
    for word in (*_ZH_NOT_NEGATIONS, *(_ZH_QUESTION_FORMS if questions else ())):
        chars = chars.replace(word, "")
    return chars


class _CueList:
    """One cue list, split into word cues and character-string cues."""

    def __init__(self, lists: Mapping[str, Sequence[str]]) -> None:
        words: set[tuple[str, ...]] = set()
        chars: set[str] = set()
        for cues in lists.values():
            for cue in cues:
                us = units(cue)
                if us and all(u.cjk for u in us):
                    chars.add("".join(u.text for u in us))
                elif us:
                    words.add(tuple(u.text for u in us))
        self.words = sorted(words)
        self.chars = sorted(chars, key=len, reverse=True)
        self._single = {c[0] for c in words if len(c) == 1}
        self._multi: dict[str, list[tuple[str, ...]]] = {}
        for c in self.words:
            if len(c) > 1:
                self._multi.setdefault(c[0], []).append(c)

    def word_hits(self, latin: Sequence[str]) -> Iterator[tuple[int, tuple[str, ...]]]:
        """Every word cue in `latin`, in order: (where it starts, its words)."""
        for i, word in enumerate(latin):
            if word in self._single:
                yield i, (word,)
            for cue in self._multi.get(word, ()):
                if tuple(latin[i : i + len(cue)]) == cue:
                    yield i, cue

    def in_words(self, latin: Sequence[str]) -> str | None:
        return next((" ".join(cue) for _, cue in self.word_hits(latin)), None)

    def char_hits(self, chars: str) -> Iterator[tuple[int, str]]:
        """Every character-string cue in `chars`, each wherever it occurs."""
        for cue in self.chars:
            at = chars.find(cue)
            while at >= 0:
                yield at, cue
                at = chars.find(cue, at + 1)

    def in_chars(self, chars: str, own: str = "") -> str | None:
        return next((c for c in self.chars if c in chars and c not in own), None)

    def find(self, us: Sequence[Unit], own: str = "", *, questions: bool = False) -> str | None:
        chars = _strip_not_negations("".join(u.text for u in us if u.cjk), questions=questions)
        return self.in_words([u.text for u in us if not u.cjk]) or self.in_chars(chars, own)


class Cues:
    def __init__(self, s: KeywordSettings) -> None:
        self._s = s
        self._negation = _CueList(s.negation_cues)
        self._cleared = _CueList(s.cleared_cues)
        self._unreal = _CueList(s.unreal_cues)
        self._topic = _CueList(s.topic_cues)
        self._drill = _CueList(s.drill_cues)
        self._announce = _CueList(s.announce_cues)
        self._real = _CueList(s.real_cues)
        self._repaired = _CueList(s.repaired_cues)
        self._device = _CueList(s.device_cues)
        self._reference = _CueList(s.reference_cues)
        self._past = _CueList(s.past_cues)
        self._media = _CueList(s.media_cues)

    @staticmethod
    def _clause(seq: Sequence[Unit], i: int) -> list[Unit]:
        c = seq[i].clause
        return [u for u in seq if u.clause == c]

    def _before(self, seq: Sequence[Unit], start: int, window: int) -> list[Unit]:
        clause = seq[start].clause
        return [u for u in seq[max(0, start - window) : start] if u.clause == clause]

    def _before_mixed(self, seq: Sequence[Unit], start: int, floor: int = 0) -> list[Unit]:
        """The units before `start` in its clause within the condition window: up to
        `unreal_window` words and `unreal_window_chars` CJK characters, whichever comes
        first (a CJK character says less than a word)."""
        clause = seq[start].clause
        words, chars = self._s.unreal_window, self._s.unreal_window_chars
        used = 0.0
        i = start
        while i > floor and seq[i - 1].clause == clause:
            u = seq[i - 1]
            limit = chars if u.cjk else words
            if limit == 0 or (not u.cjk and u.text in _EN_WINDOW_STOPS) or _boundary(seq, i):
                break
            if used + 1 / limit > 1 + 1e-9:
                break
            used += 1 / limit
            i -= 1
        return list(seq[i:start])

    def negation(self, seq: Sequence[Unit], start: int, end: int, own: str) -> str | None:
        """A negation cue shortly before the match or inside it ("bearing is not noisy");
        a cue that is part of the matched terms (不平衡) is no negation."""
        before = self._before(seq, start, self._s.negation_window)
        span = seq[start:end]
        if cue := self._negation.find([*before, *span], own, questions=True):
            return cue
        return _postposed_negation(seq, end)

    def cleared(self, seq: Sequence[Unit], end: int) -> str | None:
        """A cleared cue right after the match, after linking words (is now, 已经)."""
        if end >= len(seq):
            return None
        clause = seq[end - 1].clause
        after = [u for u in seq[end : end + 8] if u.clause == clause]
        latin: list[str] = []
        for u in after:
            if u.cjk:
                break
            latin.append(u.text)
        while latin and latin[0] in _EN_LINKS:
            latin.pop(0)
        for cue in self._cleared.words if latin else ():
            if tuple(latin[: len(cue)]) == cue:
                return " ".join(cue)
        chars = ""
        for u in after:
            if not u.cjk:
                break
            chars += u.text
        for link in _ZH_LINKS:
            chars = chars.removeprefix(link)
        return next((c for c in self._cleared.chars if chars.startswith(c)), None)

    def unreal(self, seq: Sequence[Unit], start: int, end: int, question: bool) -> str | None:
        """A condition or question cue before the match in its clause, "whether" inside it
        (皮带有没有打滑), a yes/no question (an auxiliary before the subject), or a clause
        that ends with a question mark or 吗."""
        if question:
            return "?"
        clause = self._clause(seq, start)
        if clause and clause[-1].text == "吗":
            return "吗"
        if cue := self._unreal.find(self._before_mixed(seq, start)):
            return cue
        inside = "".join(u.text for u in seq[start:end] if u.cjk)
        if cue := next((q for q in _ZH_WHETHER if q in inside), None):
            return cue
        return _inverted(clause, seq[start])

    def topic(self, seq: Sequence[Unit], start: int) -> str | None:
        return self._topic.find(self._before(seq, start, self._s.negation_window))

    @staticmethod
    def _statement(seq: Sequence[Unit], start: int, end: int, floor: int = 0) -> list[Unit]:
        """The match's statement: its clause cut at and / but / then / 但是 / 还有 / 现在 and,
        between CJK characters, at a space (an ASR pause): "the dj is loud and the belt is
        slipping" holds two, 收音机里在放歌 皮带打滑了 too. Nothing before `floor` (where the
        segment starts after the previous one's last words: they end no sentence in English)."""
        clause = seq[start].clause
        i, j = start, end
        while i > floor and seq[i - 1].clause == clause and not _boundary(seq, i):
            i -= 1
        while j < len(seq) and seq[j].clause == clause and not _boundary(seq, j):
            j += 1
        return list(seq[i:j])

    def reference(self, seq: Sequence[Unit], start: int, floor: int = 0) -> str | None:
        """Printed or shown before the match in its statement (a poster, 海报上)."""
        return self._reference.find(self._before_mixed(seq, start, floor))

    def past(self, seq: Sequence[Unit], start: int, end: int, floor: int = 0) -> str | None:
        """An earlier day in the match's clause (last week, on tuesday, 上周), unless the
        clause says it is back or ongoing (again, still, since, 又, 还在, 从...开始)."""
        said = self._statement(seq, start, end, floor)
        cue = self._past.find(said) or _a_past_year([u.text for u in said if not u.cjk])
        if cue is None:
            return None
        clause = self._clause(seq, start)  # "..., and now it's back": the whole clause
        words = {u.text for u in clause if not u.cjk}
        chars = "".join(u.text for u in clause if u.cjk)
        if words & _EN_ONGOING or any(o in chars for o in _ZH_ONGOING):
            return None
        if end < len(seq) and seq[end].clause == seq[start].clause and seq[end].text == "了":
            return None  # 前天装的泵漏油了: it leaks now
        return cue

    def media(self, seq: Sequence[Unit], start: int, end: int, floor: int = 0) -> str | None:
        """A broadcast or a song in the match's statement (the dj says, 天气预报)."""
        return self._media.find(self._statement(seq, start, end, floor))

    def device(self, seq: Sequence[Unit], end: int) -> str | None:
        """The word right after the match (its clause) names a part: "emergency stop
        button"; for Chinese, the characters right after it start with one (急停按钮)."""
        if end >= len(seq) or seq[end].clause != seq[end - 1].clause:
            return None
        nxt = seq[end]
        if not nxt.cjk:
            part = nxt.text if (nxt.text,) in self._device.words else None
        else:
            chars = "".join(u.text for u in seq[end : end + 4] if u.cjk)
            part = next((c for c in self._device.chars if chars.startswith(c)), None)
        if part is not None and _part_event(seq, end):
            return None  # "the emergency stop cord got pulled", 急停拉绳被拉了: the event
        return part

    def drill(self, seq: Sequence[Unit], start: int) -> str | None:
        """A drill or test in the match's clause, or a drill announced earlier in the
        segment (or the words before it); neither where the clause says it is real."""
        clause = self._clause(seq, start)
        if self._is_real(clause):
            return None
        if cue := self._drill.find(clause):
            return cue
        before = seq[:start]
        cue = self._announce.find(before)
        return None if cue is None or self._is_real(before) else cue

    def _is_real(self, clause: Sequence[Unit]) -> bool:
        """A real-event cue that is not itself denied ("not real", 不是真实故障)."""
        words = [u.text for u in clause if not u.cjk]
        kept = [
            w
            for i, w in enumerate(words)
            if not (w in _EN_REAL_WORDS and i and words[i - 1] in _EN_NOT)
        ]
        chars = "".join(u.text for u in clause if u.cjk)
        for denied in _ZH_DENIED_REAL:
            chars = chars.replace(denied, "")
        return bool(self._real.in_words(kept) or self._real.in_chars(chars))

    def repaired(self, seq: Sequence[Unit], end: int) -> str | None:
        """A repair said after the match in the segment ("..., they replaced it", 换完轴承
        以后已经消除了): not right after a negation, not followed by "again"."""
        after = seq[end:]
        words = [u.text for u in after if not u.cjk]
        for i, cue in self._repaired.word_hits(words):
            negated = i > 0 and words[i - 1] in _EN_NOT
            if not negated and not _EN_AGAIN & set(words[i + len(cue) :]):
                return " ".join(cue)
        chars = "".join(u.text for u in after if u.cjk)
        for at, said in self._repaired.char_hits(chars):
            negated = any(n in chars[max(0, at - 2) : at] for n in _ZH_NOT)
            if not negated and not any(a in chars[at + len(said) :] for a in _ZH_AGAIN):
                return said
        return None


# After a part named right after a match: something happened to it, so it is a report.
_EN_PART_EVENTS = {"pulled", "tripped", "lit", "pressed", "hit", "triggered", "activated",
                   "fired", "flashing", "blinking", "alarming", "alarmed"}  # fmt: skip
_EN_PART_EVENT_PAIRS = {("went", "off"), ("goes", "off"), ("is", "on"), ("came", "on")}
_ZH_PART_EVENTS = ("被拉", "拉了", "被按", "按下", "拍下", "断开", "跳了", "跳闸", "动作了", "亮了",
                   "报警", "响了", "触发")  # fmt: skip


def _part_event(seq: Sequence[Unit], end: int) -> bool:
    """An event said of the part within the next few words of the clause."""
    clause = seq[end].clause
    after = [u for u in seq[end : end + 7] if u.clause == clause]
    words = [u.text for u in after if not u.cjk]
    # "the emergency stop buttons are all pulled out": released, the opposite of an event
    events = {w for i, w in enumerate(words) if words[i + 1 : i + 2] != ["out"]}
    if _EN_PART_EVENTS & events or any(
        (a, b) in _EN_PART_EVENT_PAIRS for a, b in itertools.pairwise(words)
    ):
        return True
    chars = "".join(u.text for u in after if u.cjk)
    return any(e in chars for e in _ZH_PART_EVENTS)


def _boundary(seq: Sequence[Unit], k: int) -> bool:
    """Whether a statement starts at seq[k] (see Cues._statement)."""
    u, before = seq[k], seq[k - 1]
    if not u.cjk:
        return u.text in _EN_WINDOW_STOPS
    if before.cjk and u.start > before.end:
        return True  # a space between two CJK characters
    ahead = "".join(w.text for w in seq[k : k + 2] if w.cjk)
    return any(ahead.startswith(stop) for stop in _ZH_WINDOW_STOPS)


def _postposed_negation(seq: Sequence[Unit], end: int) -> str | None:
    """都没有 / 也没有 right after the match that ends its clause or says it was not seen."""
    if end >= len(seq) or not seq[end].cjk:
        return None
    clause = seq[end - 1].clause
    after = "".join(u.text for u in seq[end : end + 8] if u.clause == clause and u.cjk)
    for neg in _ZH_POST_NEGATIONS:
        if after.startswith(neg):
            rest = after[len(neg) :]
            if _ZH_POST_NEGATION_REST.fullmatch(rest):
                return neg
    return None


def _a_past_year(words: Sequence[str]) -> str | None:
    """ "in 1998": a year before this one (four digits after "in"; not "of 2000 psi")."""
    this_year = datetime.date.today().year
    for before, word in itertools.pairwise(words):
        is_year = before == "in" and len(word) == 4 and word.isdigit()
        if is_year and 1900 <= int(word) < this_year:
            return f"{before} {word}"
    return None


def _inverted(clause: Sequence[Unit], first: Unit) -> str | None:
    """ "is the ...", "and did the ...": an auxiliary then a subject word, at the clause's
    start or after a conjunction, before the match (`first` is its first unit)."""
    words = []
    for u in clause:
        if u is first:
            break
        if not u.cjk:
            words.append(u.text)
    for i in range(len(words) - 1):
        at_start = i == 0 or words[i - 1] in _EN_CONJUNCTIONS
        if at_start and words[i] in _EN_AUX and words[i + 1] in _EN_SUBJECT_START:
            return f"{words[i]} {words[i + 1]}"
    return None


def reads_as_all_clear(text: str) -> bool:
    """Whether `text` holds a negation or an all-clear word ("no", "not", "normal", "fine",
    没有, 正常...). The LLM tier rejects such quotes as evidence: "temperature is normal"
    is not evidence of temperature over limit, whatever a small model files it under."""
    us = units(text)
    if {u.text for u in us if not is_cjk(u.text)} & _ALL_CLEAR_EN:
        return True
    cjk = _strip_not_negations("".join(u.text for u in us if is_cjk(u.text)))
    return any(c in cjk for c in _ALL_CLEAR_ZH)
