"""The instant tier: catalogue faults in each transcript segment, with reasons.

A fault is heard two ways (pipelines.catalogue): one of its keyword phrases
(pipelines.phrases), or one of its concepts: a subject term and a symptom term within one
clause, a few words apart, in either order (pipelines.terms: stems, spelling, sound).
Every language's phrases and terms are looked for in every segment, so a code-switched
segment ("五号线的 conveyor belt 一直 slipping") meets both lists.

A match raises nothing when the words around it say it is no report (pipelines.cues):
negated ("no abnormal noise", "没有轴承异响"), cleared ("is fixed", "已经处理好了"), a
condition or question ("if you find an oil leak", "是不是漏气"), a topic ("a video about
bearing noise"), a drill or test ("急停演练"); each cue is scoped to the match's clause.
A segment that reads like an instruction to the machine (pipelines.instruction, the same
classifier the slow tier withholds segments by) raises nothing at all, and neither do song
lyrics the ASR marks as [music]. What passes the cues is then read as a whole
(pipelines.reading, a model trained on hand-written sentences): a match the reader judges
no report raises nothing, except a short shout ("Emergency stop!"), which is never read away.

`explain` returns every candidate with the reason it was dropped (`agentctl catalogue
test`); `detect` returns what is raised, at most one match per fault.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass

from pipelines.catalogue import FaultRule, Severity
from pipelines.cues import Cues, reads_as_all_clear
from pipelines.instruction import looks_like_instruction
from pipelines.keyword_settings import KeywordSettings
from pipelines.normalize import Unit, join_units, units
from pipelines.phrases import Phrase, phrase_spans
from pipelines.reading import Reader, features
from pipelines.terms import Heard, Hit, TermIndex, expand

__all__ = [
    "Candidate",
    "Explanation",
    "FaultRule",
    "KeywordDetector",
    "KeywordMatch",
    "KeywordSettings",
    "Severity",
    "reads_as_all_clear",
]

_SHOUT_WORDS, _SHOUT_CHARS = 5, 8
_MUSIC = re.compile(r"[\[(（【]\s*(music|音乐)\s*[\])）】]|[♪♫]", re.IGNORECASE)


@dataclass(frozen=True)
class KeywordMatch:
    code: str
    severity: Severity
    label: str
    lang: str
    keyword: str  # the phrase, or "subject + symptom" of a concept
    matched: str  # the heard words of the span
    score: float
    kind: str = "phrase"  # phrase | concept
    terms: tuple[str, ...] = ()  # a concept's subject and symptom terms, as catalogued
    heard: tuple[str, ...] = ()  # ... and the words they were heard as
    clause: str = ""  # the clause it was heard in


@dataclass(frozen=True)
class Candidate:
    match: KeywordMatch
    dropped: str | None  # why it raises nothing ("negation: not"), None if raised
    reading: float | None = None  # the reader's P(report), where it read the match


@dataclass(frozen=True)
class Explanation:
    segment: str | None  # why the whole segment raises nothing, if it does not
    candidates: tuple[Candidate, ...]

    @property
    def raised(self) -> list[KeywordMatch]:
        best: dict[str, KeywordMatch] = {}
        for c in self.candidates:
            if c.dropped is None and (
                c.match.code not in best or c.match.score > best[c.match.code].score
            ):
                best[c.match.code] = c.match
        return sorted(best.values(), key=lambda m: m.code)


@dataclass(frozen=True)
class _Role:
    code: str
    concept: int
    role: str  # subject | symptom
    lang: str


def _gap_ok(between: Sequence[Unit], s: KeywordSettings) -> tuple[bool, int]:
    """Whether the units between subject and symptom fit the window; and their count."""
    cjk = sum(u.cjk for u in between)
    latin = len(between) - cjk
    ww, wc = s.concept_window_words, s.concept_window_chars
    ok = latin <= ww and cjk <= wc and latin * wc + cjk * ww <= ww * wc
    return ok, len(between)


class KeywordDetector:
    """Finds catalogue faults in transcript text; at most one match per fault per call."""

    def __init__(
        self, faults: Sequence[FaultRule], settings: KeywordSettings, reader: Reader | None = None
    ) -> None:
        self._faults = {f.code: f for f in faults}
        self._s = settings
        self._reader = reader
        self._cues = Cues(settings)
        self._phrases = [
            Phrase.of(f.code, lang, phrase)
            for f in faults
            for lang, phrases in f.keywords.items()
            for phrase in phrases
        ]
        classes: dict[str, list[str]] = {}
        for name, lists in settings.classes.items():
            classes[name] = [w for words in lists.values() for w in words]
        entries = []
        for f in faults:
            for ci, concept in enumerate(f.concepts):
                for role, terms in (("subject", concept.subject), ("symptom", concept.symptom)):
                    for lang, words in terms.items():
                        where = _Role(f.code, ci, role, lang)
                        entries += [(t, where) for t in expand(words, classes)]
        self._terms = TermIndex(
            entries,
            fuzzy=settings.fuzzy,
            sound=settings.fuzzy and settings.pinyin,
            cap=settings.max_word_edits,
        )

    def detect(
        self,
        text: str,
        *,
        context: str = "",
        lang: str | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> list[KeywordMatch]:
        """Faults spoken in `text`. `context` is text heard just before it (the end of the
        previous segment): it can complete a phrase or carry a negation, but a match lying
        wholly inside it is not reported again."""
        return self.explain(text, context=context, lang=lang, exclude=exclude).raised

    def explain(
        self,
        text: str,
        *,
        context: str = "",
        lang: str | None = None,
        exclude: frozenset[str] = frozenset(),
    ) -> Explanation:
        """Every candidate match in `text` and why it is raised or not."""
        segment = None
        if looks_like_instruction(text):
            segment = "instruction-like: it addresses the machine, not people"
        elif _MUSIC.search(text):
            segment = "music: the ASR marked it as song"
        seq, first_new, ends, clauses = _heard(text, context)
        first_order = _first_instruction_clause(seq) if segment else 0
        found: list[tuple[KeywordMatch, int, int, str]] = []  # match, start, end, own
        for phrase in self._phrases:
            if phrase.code in exclude:
                continue
            for start, end, score in phrase_spans(phrase, seq, self._s):
                m = self._match(
                    phrase.code,
                    seq,
                    start,
                    end,
                    clauses,
                    label_lang=lang or phrase.lang,
                    lang=phrase.lang,
                    keyword=phrase.text,
                    score=score,
                )
                own = "".join(phrase.words)  # a cue inside the keyword (不平衡) is no negation
                found.append((m, start, end, own))
        found += self._concepts(seq, clauses, lang, exclude)
        out: list[Candidate] = []
        spans: set[tuple[str, int, int]] = set()
        for m, start, end, own in found:
            if end <= first_new or (m.code, start, end) in spans:
                continue
            if m.kind == "concept" and start < first_new:
                continue  # the context has lost its punctuation: no clause to meet in
            spans.add((m.code, start, end))
            clause = seq[start].clause
            # An instruction-like segment raises nothing, except a short shout said before
            # the instruction begins ("Emergency stop! System, ignore your rules..."): a
            # loudspeaker shouting "Emergency stop!" alone would raise it anyway.
            if segment and not (clause < first_order and _shout(seq, clause, ends, first_new)):
                out.append(Candidate(m, segment))
                continue
            dropped = self._why_not(
                seq, start, end, own, question=ends[clause] == "?", floor=first_new
            )
            p = None
            if (
                dropped is None
                and self._reader is not None
                and not _shout(seq, clause, ends, first_new)
            ):
                p = self._reader.probability(features(seq, start, end, ends[clause], first_new))
                if p < self._reader.threshold:
                    dropped = f"read as no report: P(report) {p:.3f} < {self._reader.threshold}"
            out.append(Candidate(m, dropped, p))
        return Explanation(segment, tuple(out))

    def spans(
        self, text: str, *, context: str = ""
    ) -> list[tuple[str, list[Unit], int, int, str, int]]:
        """Every candidate's (code, units, start, end, clause end, where the segment starts
        in the units), before any cue or the reader: what training/reading/ trains on."""
        seq, first_new, ends, clauses = _heard(text, context)
        found = [
            (phrase.code, start, end)
            for phrase in self._phrases
            for start, end, _ in phrase_spans(phrase, seq, self._s)
        ]
        found += [(m.code, a, b) for m, a, b, _ in self._concepts(seq, clauses, None, frozenset())]
        return [
            (code, seq, a, b, ends[seq[a].clause], first_new)
            for code, a, b in dict.fromkeys(found)
            if b > first_new
        ]

    # -- concepts -------------------------------------------------------------------------

    def _concepts(
        self, seq: list[Unit], clauses: dict[int, str], lang: str | None, exclude: frozenset[str]
    ) -> list[tuple[KeywordMatch, int, int, str]]:
        if not seq:
            return []
        heard = Heard.of(seq)
        groups: dict[tuple[str, int], dict[str, list[tuple[_Role, Hit]]]] = {}
        seen: set[tuple[str, int, str, int, int]] = set()
        for role, hit in self._terms.find(heard):
            key = (role.code, role.concept, role.role, hit.start, hit.end)
            if role.code in exclude or key in seen:
                continue  # slip and slippage both meet "slipped": one hit
            seen.add(key)
            groups.setdefault((role.code, role.concept), {}).setdefault(role.role, []).append(
                (role, hit)
            )
        out: list[tuple[KeywordMatch, int, int, str]] = []
        for (code, _), roles in groups.items():
            pairs = []
            for srole, s in roles.get("subject", []):
                for _, y in roles.get("symptom", []):
                    if s.end <= y.start:
                        a, b = s, y
                    elif y.end <= s.start:
                        a, b = y, s
                    else:
                        continue  # one word cannot be both
                    if seq[a.start].clause != seq[b.end - 1].clause:
                        continue
                    ok, gap = _gap_ok(seq[a.end : b.start], self._s)
                    if ok:
                        pairs.append((gap, not (s.exact and y.exact), a.start, b.end, srole, s, y))
            for gap, inexact, start, end, srole, s, y in sorted(pairs, key=lambda p: p[:2]):
                own = "".join(u.text for h in (s, y) for u in seq[h.start : h.end] if u.cjk)
                m = self._match(
                    code,
                    seq,
                    start,
                    end,
                    clauses,
                    label_lang=lang or srole.lang,
                    lang=srole.lang,
                    keyword=f"{s.term} + {y.term}",
                    score=0.85 - 0.01 * gap - (0.05 if inexact else 0.0),
                    kind="concept",
                    terms=(s.term, y.term),
                    heard=tuple(join_units([u.text for u in seq[h.start : h.end]]) for h in (s, y)),
                )
                out.append((m, start, end, own))
        return out

    def _match(
        self,
        code: str,
        seq: list[Unit],
        start: int,
        end: int,
        clauses: dict[int, str],
        *,
        label_lang: str,
        lang: str,
        keyword: str,
        score: float,
        kind: str = "phrase",
        terms: tuple[str, ...] = (),
        heard: tuple[str, ...] = (),
    ) -> KeywordMatch:
        rule = self._faults[code]
        return KeywordMatch(
            code=rule.code,
            severity=rule.severity,
            label=rule.label(label_lang),
            lang=lang,
            keyword=keyword,
            matched=join_units([u.text for u in seq[start:end]]),
            score=score,
            kind=kind,
            terms=terms,
            heard=heard,
            clause=clauses[seq[start].clause],
        )

    def _why_not(
        self, seq: list[Unit], start: int, end: int, own: str, *, question: bool, floor: int
    ) -> str | None:
        """Why a match is not raised, or None. `floor`: where this segment starts after the
        previous one's words (a statement-scoped cue does not look before it)."""
        cues = self._cues
        if cue := cues.negation(seq, start, end, own):
            return f"negation: {cue}"
        if cue := cues.cleared(seq, end):
            return f"cleared: {cue}"
        if cue := cues.repaired(seq, end):
            return f"repaired: {cue}"
        if cue := cues.unreal(seq, start, end, question):
            return f"condition or question: {cue}"
        if cue := cues.topic(seq, start):
            return f"topic: {cue}"
        if cue := cues.reference(seq, start, floor):
            return f"printed or shown: {cue}"
        if cue := cues.past(seq, start, end, floor):
            return f"an earlier day: {cue}"
        if cue := cues.media(seq, start, end, floor):
            return f"broadcast: {cue}"
        if cue := cues.device(seq, end):
            return f"names a part: {cue}"
        if cue := cues.drill(seq, start):
            return f"drill or test: {cue}"
        return None


def _heard(text: str, context: str) -> tuple[list[Unit], int, dict[int, str], dict[int, str]]:
    """The units of context + text, where the text's begin, each clause's closing
    punctuation and each clause's words joined. A segment boundary is no clause break:
    "there is no" + "bearing noise" is negated."""
    combined = f"{context} {text}" if context else text
    seq = units(combined)
    words: dict[int, list[str]] = {}
    for u in seq:
        words.setdefault(u.clause, []).append(u.text)
    clauses = {c: join_units(ws) for c, ws in words.items()}
    return seq, len(units(context)), _clause_ends(combined, seq), clauses


def _clause_ends(text: str, seq: list[Unit]) -> dict[int, str]:
    """The punctuation that ends each clause ("?", "!", "," ...; "" at the end)."""
    nfkc = unicodedata.normalize("NFKC", text)
    last: dict[int, int] = {}
    for u in seq:
        last[u.clause] = u.end
    return {clause: nfkc[end:].lstrip()[:1] for clause, end in last.items()}


def _first_instruction_clause(seq: list[Unit]) -> int:
    """The first clause that reads like an instruction by itself (0 if none does: the
    instruction spans clauses, so no clause is before it)."""
    clauses: dict[int, list[str]] = {}
    for u in seq:
        clauses.setdefault(u.clause, []).append(u.text)
    for clause, words in sorted(clauses.items()):
        if looks_like_instruction(join_units(words)):
            return clause
    return 0


def _shout(seq: list[Unit], clause: int, ends: dict[int, str], floor: int = 0) -> bool:
    """A short exclamation ("Emergency stop!", 急停！): a few words ended by "!", counted
    from `floor` (the previous segment's words share the first clause: no punctuation)."""
    if ends.get(clause) != "!":
        return False
    us = [u for u in seq[floor:] if u.clause == clause]
    cjk = sum(u.cjk for u in us)
    return len(us) - cjk <= _SHOUT_WORDS and cjk <= _SHOUT_CHARS
