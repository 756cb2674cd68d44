"""The slow tier alone on the hand-written parts: several models side by side, one run.

    .venv/bin/python -m bench.quality.bench_slow --parts dev,holdout \\
        --candidates tuned=smollm2-135m-instruct:smollm2-135m-edge,base=smollm2-135m-instruct

The daemon's own slow-tier path without the broker: the engine supervisor on the cpu-dev
profile (or `--profile`) and the real vLLM engine, the service's codec, `Analyzer` and
evidence rules. For each candidate (`label=BASE[:ADAPTER]`: a bundled base's name or a
model folder, and an adapter's name or folder), every stream of every part is given to
the analyzer whole (segments numbered from 0, 6 s apart, as bench_quality publishes them)
and analysed once, with no threshold and neither optional evidence rule, so that every
answered fault is recorded with its confidence and the segment it names. The scoring
(bench/quality/slow_score.py) then applies rule sets to the same answers: none, the
shipped config's, and with `--calibrate` (fits per-code thresholds on the parts given:
development parts only) or `--thresholds-from DEV_RESULTS` (a development run's fitted
thresholds, for the held-out parts) the calibrated thresholds alone and with each optional
evidence rule. `--rescore RESULTS` renders a results file again without an engine.

Writes `<out>/results.json` (every answer, the machine, the revision, the command) and
`<out>/table.md` (per part, candidate and language; per code; the confusion between codes).
bench_quality runs the whole service for the numbers a release quotes; this is for
comparing models and rules quickly on the same answers.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import shlex
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import structlog

from agent.config import load_config
from bench._common import machine, revision
from bench.quality.bench_quality import Case, load_set
from bench.quality.slow_report import load_results, render
from bench.quality.slow_score import Answered, Rules, StreamResult, calibrate
from pipelines.analysis import Analyzer
from pipelines.catalogue import FaultRule
from pipelines.evidence import AcceptedFault

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "agent.yaml"
GAP_S = 6.0
T0 = 1_790_000_000.0


async def _ignore(_stream: str, _faults: Sequence[AcceptedFault]) -> None:
    return None


async def run_candidate(
    label: str, base: str, adapter: str | None, parts: dict[str, list[Case]], profile: str | None
) -> tuple[list[StreamResult], dict[str, Any]]:
    from agent.analysis_link import EngineCodec, EngineLlm
    from agent.engine.paths import cache_dir
    from agent.supervision import EngineSupervisor, supervised

    overrides = ["llm.enabled=true"] + ([f"profile={profile}"] if profile else [])
    cfg = load_config(CONFIG, overrides=overrides).config
    assert cfg.engine is not None
    model = base if "/" in base else str(cache_dir() / "models" / base)
    engine = cfg.engine.model_copy(update={"model": model, "adapter": adapter})
    settings = cfg.llm.model_copy(
        update={
            "min_confidence": 0.0,
            "confidence": {},
            "reject_all_clear": False,
            "require_topic_word": False,
        }
    )
    sup = EngineSupervisor(engine)
    results: list[StreamResult] = []
    t0 = time.monotonic()
    async with supervised(sup):
        if not await sup.wait_serving():
            raise RuntimeError(f"{label}: engine not serving: {sup.detail}")
        start_s = time.monotonic() - t0
        info = sup.engine.info
        codec = EngineCodec(sup)
        analyzer = Analyzer(
            EngineLlm(sup),
            codec,
            settings,
            cfg.faults,
            budget=settings.context_budget(engine),
            on_faults=_ignore,
        )
        for part, cases in parts.items():
            for case in cases:
                for i, text in enumerate(case.segments):
                    start = T0 + GAP_S * i
                    analyzer.add(case.id, seq=i, start=start, end=start + GAP_S - 1, text=text)
                report = await analyzer.analyze(case.id)
                answered = tuple(
                    Answered(f.code, f.line.seq, f.confidence, f.quote) for f in report.accepted
                )
                results.append(
                    StreamResult(
                        case.id,
                        part,
                        case.lang,
                        case.kind,
                        case.negative,
                        case.faults,
                        case.evidence,
                        answered,
                        report.valid,
                        report.latency_s,
                        report.ttft_s,
                        report.prompt_tokens,
                    )
                )
            print(f"-- {label}: {part} done ({len(cases)} streams)", flush=True)
        codec.close()
    meta = {
        "base": base,
        "adapter": adapter,
        "model": info.model.line() if info else None,
        "engine_start_s": round(start_s, 1),
        "wall_s": round(time.monotonic() - t0, 1),
    }
    return results, meta


def parse_candidate(spec: str) -> tuple[str, str, str | None]:
    label, _, model = spec.partition("=")
    base, _, adapter = model.partition(":")
    if not label or not base:
        raise ValueError(f"candidate {spec!r}: write label=BASE[:ADAPTER]")
    return label, base, adapter or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality.bench_slow", description=__doc__)
    parser.add_argument("--parts", default="dev,holdout")
    parser.add_argument("--candidates", default=None, help="label=BASE[:ADAPTER],...")
    parser.add_argument("--profile", default=None, help="device profile (default: the config's)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--calibrate", action="store_true", help="fit per-code thresholds")
    parser.add_argument(
        "--thresholds-from", type=Path, default=None,
        help="a development run's results.json: score with its fitted thresholds",
    )  # fmt: skip
    parser.add_argument("--limit", type=int, default=0, help="streams per part (a smoke run)")
    parser.add_argument("--rescore", type=Path, default=None, help="re-render a results.json")
    args = parser.parse_args(argv)
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    config = load_config(CONFIG).config
    catalogue = {r.code: r for r in config.faults}
    shipped = config.llm
    # a code the fit never saw answered keeps the config's default threshold
    floor = Rules(min_confidence=shipped.min_confidence)
    command = " ".join(
        shlex.quote(a)
        for a in [sys.executable, "-m", "bench.quality.bench_slow", *(argv or sys.argv[1:])]
    )
    # read before the runs (minutes of engine time), not after them
    fitted: dict[str, dict[str, float]] = {}
    if args.thresholds_from is not None:
        fitted = json.loads(args.thresholds_from.read_text(encoding="utf-8"))["calibrated"]
    if args.rescore is not None:
        data = json.loads(args.rescore.read_text(encoding="utf-8"))
        data["rescored_by"] = command
        if args.thresholds_from is not None:
            data["calibrated"] = {k: fitted[k] for k in data["runs"] if k in fitted}
            data["thresholds_from"] = str(args.thresholds_from)
        if args.calibrate:
            data["calibrated"] = {
                label: calibrate(load_results(run["results"]), catalogue, base=floor)
                for label, run in data["runs"].items()
            }
        return _write(data, catalogue, args.out)
    if args.candidates is None:
        parser.error("--candidates is needed (or --rescore)")
    parts = {part: load_set(part)[: args.limit or None] for part in args.parts.split(",")}
    runs: dict[str, Any] = {}
    for spec in args.candidates.split(","):
        label, base, adapter = parse_candidate(spec)
        results, meta = asyncio.run(run_candidate(label, base, adapter, parts, args.profile))
        runs[label] = {"meta": meta, "results": results}
    shipped_rules = Rules(
        shipped.min_confidence, shipped.confidence, shipped.reject_all_clear,
        shipped.require_topic_word,
    )  # fmt: skip
    calibrated = {label: fitted[label] for label in runs if label in fitted}
    if args.calibrate:
        for label, run in runs.items():
            calibrated[label] = calibrate(run["results"], catalogue, base=floor)
    data = {
        "revision": revision(),
        "command": command,
        "machine": machine(),
        "parts": list(parts),
        "shipped_rules": shipped_rules.__dict__ | {"by_code": dict(shipped_rules.by_code)},
        "calibrated": calibrated,
        "thresholds_from": str(args.thresholds_from) if args.thresholds_from else None,
        "runs": {
            label: {"meta": run["meta"], "results": [_as_dict(r) for r in run["results"]]}
            for label, run in runs.items()
        },
    }
    return _write(data, catalogue, args.out)


def _write(data: dict[str, Any], catalogue: Mapping[str, FaultRule], out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    text = render(data, catalogue)
    (out / "table.md").write_text(text, encoding="utf-8")
    print(text)
    return 0


def _as_dict(r: StreamResult) -> dict[str, Any]:
    out = dict(r.__dict__)
    out["answered"] = [a.__dict__ for a in r.answered]
    return out


if __name__ == "__main__":
    raise SystemExit(main())
