"""bench_slow's results as markdown tables: per part, candidate, rule set and language; per
code; the confusion between codes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from bench._common import md_table, percentile
from bench.quality.slow_score import Answered, Rules, StreamResult, confusion, score
from pipelines.catalogue import FaultRule

__all__ = ["load_results", "render", "rule_sets", "summary"]


def load_results(rows: Sequence[Mapping[str, Any]]) -> list[StreamResult]:
    out = []
    for r in rows:
        fields = dict(r)
        fields["answered"] = tuple(Answered(**a) for a in r["answered"])
        fields["faults"] = tuple(r["faults"])
        fields["evidence"] = tuple(r["evidence"])
        out.append(StreamResult(**fields))
    return out


def rule_sets(data: Mapping[str, Any], label: str) -> dict[str, Rules]:
    """The rule sets a table shows: none, the shipped rules, the calibrated thresholds, and
    each optional evidence rule on top of them (what each one adds, by numbers)."""
    shipped = data["shipped_rules"]
    sets = {
        "none": Rules(),
        "shipped": Rules(
            shipped["min_confidence"],
            shipped["by_code"],
            shipped["reject_all_clear"],
            shipped["require_topic_word"],
        ),
    }
    if label in data.get("calibrated", {}):
        fitted = data["calibrated"][label]
        sets["calibrated"] = Rules(0.0, fitted)
        sets["calibrated+all_clear"] = Rules(0.0, fitted, reject_all_clear=True)
        sets["calibrated+topic_word"] = Rules(0.0, fitted, require_topic_word=True)
    return sets


def _row(results: Sequence[StreamResult], rules: Rules, cat: Mapping[str, FaultRule]) -> list[Any]:
    s = score(results, rules, cat)
    lat = [r.latency_s for r in results if r.latency_s is not None]
    ttft = [r.ttft_s for r in results if r.ttft_s is not None]
    valid = sum(r.valid for r in results) / len(results) if results else None
    return [
        f"{s['found_paraphrase']}/{s['paraphrase']}" if s["paraphrase"] else "",
        f"{s['found_keyword']}/{s['keyword']}" if s["keyword"] else "",
        s["pointed"],
        s["wrong_code"],
        f"{s['negatives_alarmed']}/{s['negatives']}",
        f"{s['injections_alarmed']}/{s['injections']}",
        valid,
        percentile(lat, 0.5),
        percentile(lat, 0.95),
        percentile(ttft, 0.5),
    ]


def summary(data: Mapping[str, Any], catalogue: Mapping[str, FaultRule], part: str) -> str:
    """One row per candidate on one part (or "all"), under its calibrated rules where it has
    them (else the shipped ones): what the README and the model card quote."""
    rows = []
    for label, run in data["runs"].items():
        results = [r for r in load_results(run["results"]) if part in ("all", r.part)]
        sets = rule_sets(data, label)
        rules = sets.get("calibrated", sets["shipped"])
        by = {lang: score([r for r in results if r.lang == lang], rules, catalogue)
              for lang in ("en", "zh")}  # fmt: skip
        s = score(results, rules, catalogue)
        kept = sum(1 for r in results for a in r.answered if rules.accepts(a, catalogue))
        lat = [r.latency_s for r in results if r.latency_s is not None]
        rows.append([
            label,
            " / ".join(f"{by[g]['found_paraphrase']}/{by[g]['paraphrase']}" for g in by),
            " / ".join(f"{by[g]['found_keyword']}/{by[g]['keyword']}" for g in by),
            f"{s['wrong_code']} of {kept}",
            f"{s['negatives_alarmed']}/{s['negatives']}",
            f"{s['injections_alarmed']}/{s['injections']}",
            percentile(lat, 0.5),
            percentile(lat, 0.95),
        ])  # fmt: skip
    headers = ["candidate", "paraphrased found, en / zh", "keyword-named found, en / zh",
               "wrong code of accepted", "negatives alarmed", "injections alarmed",
               "analysis p50 s", "p95 s"]  # fmt: skip
    return md_table(headers, rows)


def render(data: Mapping[str, Any], catalogue: Mapping[str, FaultRule]) -> str:
    lines = [
        "# bench/quality: the slow tier alone (bench_slow.py)",
        "",
        f"Revision {data['revision']}; machine: {data['machine']}; parts: "
        f"{', '.join(data['parts'])}.",
        "",
        f"Command: `{data['command']}`",
        "",
    ]
    headers = ["part", "candidate", "rules", "lang", "paraphrased found", "keyword-named found",
               "pointed at evidence", "wrong code", "negatives alarmed", "injections alarmed",
               "JSON valid", "analysis p50 s", "p95 s", "TTFT p50 s"]  # fmt: skip
    rows: list[list[Any]] = []
    per_code: list[list[Any]] = []
    for label, run in data["runs"].items():
        results = load_results(run["results"])
        sets = rule_sets(data, label)
        for part in [*data["parts"], "all"]:
            chosen = [r for r in results if part in ("all", r.part)]
            for name, rules in sets.items():
                for lang in ("en", "zh", None):
                    sub = [r for r in chosen if lang is None or r.lang == lang]
                    if sub:
                        rows.append(
                            [part, label, name, lang or "all", *_row(sub, rules, catalogue)]
                        )
        best = sets.get("calibrated", sets["shipped"])
        for code in catalogue:
            for lang in ("en", "zh"):
                sub = [r for r in results if r.lang == lang]
                have = [r for r in sub if code in r.faults]
                got = sum(
                    code in {a.code for a in r.answered if best.accepts(a, catalogue)} for r in have
                )
                wrong = sum(
                    code
                    in {a.code for a in r.answered if best.accepts(a, catalogue)} - set(r.faults)
                    for r in sub
                )
                per_code.append([label, code, lang, f"{got}/{len(have)}", wrong])
    for part in [*data["parts"], "all"]:
        lines.append(f"## Summary, {part} (calibrated thresholds where fitted)\n")
        lines.append(summary(data, catalogue, part) + "\n")
    lines.append("## Detection (a fault is found when its stream gets its code)\n")
    lines.append(md_table(headers, rows))
    lines.append("\n## Per code, all parts (calibrated rules where fitted, else shipped)\n")
    lines.append(md_table(["candidate", "code", "lang", "found", "raised wrongly"], per_code))
    for label, run in data["runs"].items():
        results = load_results(run["results"])
        best = rule_sets(data, label).get("calibrated", rule_sets(data, label)["shipped"])
        matrix = confusion(results, best, catalogue)
        cols = [*catalogue, "missed"]
        lines.append(f"\n## Confusion, {label} (rows: labelled; columns: answered)\n")
        lines.append(
            md_table(
                ["labelled", *cols],
                [[k, *[matrix[k].get(c, 0) or "" for c in cols]] for k in sorted(matrix)],
            )
        )
    meta_rows = []
    for label, run in data["runs"].items():
        fitted = data.get("calibrated", {}).get(label, {})
        meta = run["meta"]
        meta_rows.append(
            [label, meta["model"], meta["engine_start_s"], meta["wall_s"],
             ", ".join(f"{k} {v}" for k, v in fitted.items())]
        )  # fmt: skip
    lines.append("\n## Candidates\n")
    lines.append(
        md_table(["candidate", "served", "engine start s", "wall s", "thresholds"], meta_rows)
    )
    return "\n".join(lines) + "\n"
