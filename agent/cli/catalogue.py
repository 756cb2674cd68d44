"""`agentctl catalogue test`: what the keyword tier would raise on a sentence, and why."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import typer

from agent.cli.common import DEFAULT_CONFIG, load_or_exit
from agent.reader import keyword_detector
from pipelines.detect import Candidate, Explanation

catalogue_app = typer.Typer(no_args_is_help=True, help="Try the fault catalogue on sentences.")


def _describe(c: Candidate) -> list[str]:
    m = c.match
    if m.kind == "concept":
        subject, symptom = m.terms
        said = f' (heard "{m.heard[0]}", "{m.heard[1]}")' if m.heard else ""
        how = f"concept: subject {subject!r} + symptom {symptom!r}{said}"
    else:
        how = f'phrase "{m.keyword}" (heard "{m.matched}")'
    lines = [
        f"  {m.code} [{m.severity.value}] {m.label}",
        f"    {how}, score {m.score:.2f}",
        f'    clause: "{m.clause}"',
    ]
    if c.reading is not None and c.dropped is None:
        lines.append(f"    read as a report: P(report) {c.reading:.3f}")
    return lines


def render(text: str, lang: str | None, result: Explanation) -> str:
    lines = [f'"{text}"' + (f" (lang {lang})" if lang else "")]
    raised = result.raised
    if result.segment:
        what = "only the shout before its instruction" if raised else "nothing"
        lines.append(f"the segment raises {what}: {result.segment}")
    chosen = {(m.code, m.matched, m.keyword) for m in raised}
    lines.append("raises:" if raised else "raises nothing")
    for c in result.candidates:
        if (c.match.code, c.match.matched, c.match.keyword) in chosen:
            lines += _describe(c)
    dropped = [c for c in result.candidates if c.dropped is not None]
    if dropped:
        lines.append("heard but not raised:")
        for c in dropped:
            lines += _describe(c)
            lines.append(f"    not raised: {c.dropped}")
    return "\n".join(lines)


def _as_json(result: Explanation) -> dict[str, Any]:
    def match(c: Candidate) -> dict[str, Any]:
        d = asdict(c.match)
        d["severity"] = c.match.severity.value
        return {**d, "dropped": c.dropped, "reading": c.reading}

    return {
        "raised": sorted({m.code for m in result.raised}),
        "segment": result.segment,
        "candidates": [match(c) for c in result.candidates],
    }


@catalogue_app.command("test")
def test(
    sentence: Annotated[str, typer.Argument(help="What a microphone might hear.")],
    *,
    lang: Annotated[
        str | None, typer.Option(help="The segment's language (labels follow it), en or zh.")
    ] = None,
    context: Annotated[
        str, typer.Option(help="Words heard just before it (the previous segment's end).")
    ] = "",
    config: Annotated[Path, typer.Option("--config", "-c", help="Agent config file.")] = (
        DEFAULT_CONFIG
    ),
    set_: Annotated[
        list[str] | None, typer.Option("--set", help="Override a key: --set keywords.fuzzy=false.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="JSON instead of text.")] = False,
) -> None:
    """Which faults SENTENCE would raise and why: the phrase or the subject and symptom
    terms met, the clause, and for what was heard but not raised the cue that stopped it
    (negation, cleared, repaired, condition or question, topic, printed or shown, an earlier
    day, broadcast, part, drill, instruction-like) or the reader's P(report) below its
    threshold (keywords.reader).
    Exit 0 if it raises a fault, 1 if not."""
    cfg = load_or_exit(config, set_ or []).config
    detector = keyword_detector(cfg.faults, cfg.keywords)
    result = detector.explain(sentence, context=context, lang=lang)
    if as_json:
        typer.echo(json.dumps(_as_json(result), indent=2, ensure_ascii=False))
    else:
        typer.echo(render(sentence, lang, result))
    raise typer.Exit(0 if result.raised else 1)
