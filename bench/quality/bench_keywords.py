"""The instant (keyword) tier alone on the hand-written set, through the real service, with
no engine: one matcher against another in one run.

    .venv/bin/python -m bench.quality.bench_keywords --part dev
    .venv/bin/python -m bench.quality.bench_keywords --part holdout --baseline /tmp/old

For each tree (`--baseline`, a checkout of another commit, first; then this one): a fresh
broker and `edge-agent run` with `llm.enabled=false` on that tree's own configs/agent.yaml
(its code on PYTHONPATH), every stream of the part published at QoS 1, then the alerts read
back once every segment went through the detector. Printed and written to
bench/quality/results/<part>-keyword-<date>.md/.json: per matcher and language, recall on
keyword-named and on paraphrased faults, precision, wrong codes, false alarms on the
negatives, alarms from injections. No LLM, so a part runs in about a minute.
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench._common import machine, md_table, provenance, stamped
from bench.quality.bench_quality import (
    REPO,
    Case,
    Run,
    Service,
    load_set,
    published,
    score_tier,
    service,
    write_results,
)

_LIMIT_S = 600.0
_HEADERS = ["matcher", "lang", "keyword-named found", "recall", "paraphrased found", "recall",
            "precision", "wrong code", "false alarms", "negatives alarmed",
            "injection alarms"]  # fmt: skip


def _commit(tree: Path) -> str:
    """The tree's commit, for the results (with "+ changes" if it is not clean)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
        dirty = subprocess.run(
            ["git", "-C", str(tree), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True, text=True, check=True,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.CalledProcessError):
        return str(tree)
    return f"{head} + changes" if dirty else head


async def run_tree(label: str, tree: Path, cases: Sequence[Case]) -> Run:
    """The service of `tree` (its code, its configs/agent.yaml) over the set's streams."""
    run = Run(label, model_line=_commit(tree))
    settings = ["llm.enabled=false", "mqtt.status_interval_s=1"]
    async with service(run, tree / "configs" / "agent.yaml", settings, tree=tree) as svc:
        await _settle(run, svc, cases)
    print(f"-- {label}: {tree} in {run.wall_s:.0f} s (log {svc.log})")
    return run


async def _settle(run: Run, svc: Service, cases: Sequence[Case]) -> None:
    """The set published; back once the detector went through it and the alerts are out."""
    statuses: list[dict[str, Any]] = []

    def settled() -> bool:
        """Every segment through the detector and two statuses in a row that agree on
        what was published (debounce 0: each event goes out as it is made)."""
        if len(statuses) < 2:
            return False
        a, b = statuses[-2], statuses[-1]
        done = sum(s["segments"] for s in b["streams"].values()) >= total
        events = sum(b["alerts"]["events"].values())
        return bool(done and a["alerts"]["published"] == b["alerts"]["published"] >= events)

    total = sum(len(c.segments) for c in cases)
    async with published(run, svc, cases, statuses.append):
        deadline = time.monotonic() + _LIMIT_S
        while not settled():
            if svc.child.poll() is not None:
                raise RuntimeError(f"the service exited ({svc.child.returncode})")
            if time.monotonic() > deadline:
                raise TimeoutError("the detector did not get through the set")
            await asyncio.sleep(0.5)
        run.status = statuses[-1]


def report(part: str, cases: Sequence[Case], runs: Sequence[Run]) -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {"part": part, "machine": machine(), "streams": len(cases), "runs": {}}
    rows = []
    for run in runs:
        entry: dict[str, Any] = {"tree": run.model_line, "wall_s": run.wall_s, "tiers": {}}
        for lang in ("en", "zh", None):
            s = score_tier(cases, run, "keyword", lang)
            entry["tiers"][lang or "all"] = s
            rows.append([run.label, lang or "all", s["found_keyword"], s["recall_keyword"],
                         s["found_paraphrase"], s["recall_paraphrase"], s["precision"],
                         s["wrong_code"], s["false_alarms"], s["negatives_alarmed"],
                         s["injection_alarms"]])  # fmt: skip
        data["runs"][run.label] = entry
    lines = [
        f"# bench/quality, keyword tier only, part `{part}`: {len(cases)} hand-written streams",
        "",
        f"Machine: {data['machine']}; the service without the engine (llm.enabled=false); "
        "one run, the matchers one after the other.",
        "",
        md_table(_HEADERS, rows),
        "",
        "Commits: " + "; ".join(f"{r.label} = {r.model_line}" for r in runs),
    ]
    return "\n".join(lines) + "\n", data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality.bench_keywords")
    parser.add_argument(
        "--part",
        choices=["dev", "holdout", "blind", "blind2", "blind3", "blind4", "blind5"],
        default="dev",
    )
    parser.add_argument(
        "--baseline", type=Path, default=None, help="a checkout of another commit, run first"
    )
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    cases = load_set(args.part)
    trees = [("old", args.baseline.resolve())] if args.baseline else []
    trees.append(("new", REPO))
    runs = [asyncio.run(run_tree(label, tree, cases)) for label, tree in trees]
    text, data = report(args.part, cases, runs)
    prov = provenance("bench.quality.bench_keywords", argv)
    print(stamped(text, prov))
    if not args.no_write:
        write_results(f"{args.part}-keyword", text, data, prov)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
