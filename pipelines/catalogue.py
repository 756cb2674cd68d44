"""The fault catalogue's entries: what the keyword tier listens for.

A fault is described two ways, side by side:
- `keywords`: phrases, matched word by word in order (one filler word, ASR near-misses);
- `concepts`: a subject (bearing, roller, 轴承) and a symptom (grinding, knocking, 异响)
  that must meet within one clause, in either order, a few words apart (the window is in
  keyword settings). A term is a word or a short phrase, matched by its stem (slipped,
  slipping ~ slip), by spelling (berring ~ bearing) and, in Chinese, by sound (轴成 ~ 轴承);
  `@name` stands for a class of words defined once (keywords.classes: @intense is severe,
  excessive, violent, 剧烈...).
Every language's terms are matched in every segment, so a code-switched sentence meets
both lists. `labels`, `severity` and the first six English `related` words are what the
slow tier's prompt shows (pipelines.analysis_prompt.render_head): the tuned model was
trained on that text.
"""

from __future__ import annotations

import re
from enum import Enum

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import Self

from pipelines.normalize import units

__all__ = ["CLASS_REF", "Concept", "FaultRule", "Severity", "class_refs"]

CLASS_REF = re.compile(r"^@[a-z][a-z0-9_]*$")


class Severity(str, Enum):
    info = "info"
    warning = "warning"
    critical = "critical"


def _check_terms(terms: dict[str, list[str]], what: str) -> dict[str, list[str]]:
    if not any(terms.values()):
        raise ValueError(f"at least one {what} term is required")
    for lang, words in terms.items():
        for term in words:
            if term.startswith("@"):
                if not CLASS_REF.match(term):
                    raise ValueError(f"{lang}: class reference {term!r} must read @name")
            elif not units(term):
                raise ValueError(f"{lang}: term without any word: {term!r}")
            elif len(units(term)) > 4:
                raise ValueError(f"{lang}: term {term!r} is a phrase; at most 4 words")
    return terms


class Concept(BaseModel):
    """A subject and a symptom that, met within one clause, name the fault."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subject: dict[str, list[str]] = Field(
        title="Subject terms",
        description="Per language: what has the fault (bearing, roller, 轴承), or @class.",
    )
    symptom: dict[str, list[str]] = Field(
        title="Symptom terms",
        description="Per language: what it does (grinding, knocking, 异响), or @class.",
    )

    @field_validator("subject")
    @classmethod
    def _subject(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        return _check_terms(v, "subject")

    @field_validator("symptom")
    @classmethod
    def _symptom(cls, v: dict[str, list[str]]) -> dict[str, list[str]]:
        return _check_terms(v, "symptom")


class FaultRule(BaseModel):
    """One entry of the fault catalogue."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    code: str = Field(
        pattern=r"^[a-z][a-z0-9_]*$",
        title="Code",
        description="Stable identifier, part of every alert id (bearing_noise).",
    )
    severity: Severity = Field(
        Severity.warning, title="Severity", description="info, warning or critical."
    )
    labels: dict[str, str] = Field(
        title="Labels",
        description="Human label per language code; `en` is required and is the default.",
    )
    keywords: dict[str, list[str]] = Field(
        title="Keywords",
        description="Phrases per language code that raise this fault when spoken.",
    )
    concepts: list[Concept] = Field(
        default_factory=list,
        max_length=16,
        title="Concepts",
        description="Subject and symptom terms that raise this fault when they meet within "
        "one clause (keywords.concept_window), beside the phrases.",
    )
    related: dict[str, list[str]] = Field(
        default_factory=dict,
        title="Related words",
        description="Words per language that describe this fault in other words (running "
        "hot, grinding). They raise nothing by themselves; with llm.require_topic_word an "
        "LLM fault's line must hold a word of its labels, keywords or these.",
    )

    @field_validator("labels")
    @classmethod
    def _english_label(cls, v: dict[str, str]) -> dict[str, str]:
        if "en" not in v:
            raise ValueError("an `en` label is required")
        return v

    @model_validator(mode="after")
    def _has_keywords(self) -> Self:
        phrases = [p for ps in self.keywords.values() for p in ps]
        if not phrases:
            raise ValueError("at least one keyword is required")
        empty = [p for p in phrases if not units(p)]
        if empty:
            raise ValueError(f"keywords without any word: {empty!r}")
        return self

    def label(self, lang: str | None) -> str:
        return self.labels.get(lang or "en", self.labels["en"])


def class_refs(rule: FaultRule) -> list[tuple[tuple[str | int, ...], str]]:
    """Every @class reference of a rule, with its location under the rule."""
    out: list[tuple[tuple[str | int, ...], str]] = []
    for i, concept in enumerate(rule.concepts):
        for role, terms in (("subject", concept.subject), ("symptom", concept.symptom)):
            for lang, words in terms.items():
                out += [
                    (("concepts", i, role, lang, k), w)
                    for k, w in enumerate(words)
                    if w.startswith("@")
                ]
    return out
