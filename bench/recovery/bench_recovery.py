"""Recovery benchmark: engine core killed (SIGKILL, as the OOM killer does) mid-analysis ->
the supervisor notices -> restarts one rung down -> the first successful analysis after it;
and every keyword alert spoken during the gap.

Two modes:
- `daemon` (default on CPU): the whole service in this process (bench/recovery reads its
  supervisor and analyzer) with a real broker (mosquitto, else amqtt): ordinary talk on one
  stream keeps analyses running, a fault phrase every --fault-every seconds on another must
  alert over MQTT during every gap.
- `engine` (the H200: no broker, a tokenizer-less 4B-class shape with random weights): the
  supervisor and the analyzer (word-hash codec, no schema, as bench/context), and the
  daemon's keyword path (detector, tracker, SQLite outbox) fed in-process; "arrived" then
  means persisted to the outbox, ready to publish.

Each kill is timed from the signal: noticed (the supervisor's restart began), serving again,
first successful analysis. `--prewarm` starts and stops the engine once on each rung the
run will visit, so that restarts meet a warm compile cache as they would on a device that
has been through those rungs before (the cache lives in the state's cache directory).

    python -m bench.recovery.bench_recovery                       # CPU, cpu-dev, 3 kills
    python -m bench.recovery.bench_recovery --mode engine --profile h200-bench --kills 2 --prewarm
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from agent.config.loader import load_config  # noqa: E402
from agent.daemon import Daemon  # noqa: E402
from agent.engine import Engine  # noqa: E402
from agent.logsetup import configure_logging  # noqa: E402
from agent.supervision import EngineSupervisor, supervised  # noqa: E402
from agent.supervision.ladder import build_ladder  # noqa: E402
from agent.watchdog.settings import WatchdogSettings  # noqa: E402
from bench._common import machine, md_table  # noqa: E402
from bench.context.bench_context import (  # noqa: E402
    PlainLlm,
    WordHashCodec,
    prepare_bench_model,
)
from pipelines.analysis import AnalysisSettings, Analyzer  # noqa: E402
from pipelines.evidence import AcceptedFault  # noqa: E402
from pipelines.ingest import IngestLimits, parse_transcript  # noqa: E402

AGENT_YAML = ROOT / "configs" / "agent.yaml"
ORDINARY = [
    "Shift started, conveyor at normal speed.",
    "Operator checking the press, all parts within tolerance.",
    "Forklift coming through aisle four, watch your step.",
    "Quality check on batch twelve passed, moving on.",
    "Label printer on station five replaced the ribbon.",
    "Count is four hundred twelve parts so far this shift.",
    "Pressure on the hydraulic unit reads normal, one hundred twenty bar.",
    "Break at ten thirty, Maria covers station two.",
]
FAULT = "temperature over limit on oven {n}"


@dataclass
class Kill:
    kill: int
    rung_after: int
    rung_name: str
    noticed_s: float  # signal -> the supervisor began the restart
    backoff_s: float  # of the gap: the restart backoff (repeated failures within the window)
    serving_s: float  # signal -> the engine serves again
    engine_start_s: float | None  # the restart's own engine start (vLLM's construction)
    first_analysis_s: float  # signal -> first successful analysis afterwards
    faults_published: int  # fault segments published while the engine was away
    faults_alerted: int  # ... of which an alert (over MQTT, or in the outbox) carried


async def until(predicate: Callable[[], bool], what: str, limit: float) -> float:
    """Wait for `predicate`; the perf_counter when it held."""
    deadline = time.perf_counter() + limit
    while not predicate():
        if time.perf_counter() > deadline:
            raise SystemExit(f"timed out after {limit:.0f} s waiting for {what}")
        await asyncio.sleep(0.005)
    return time.perf_counter()


def segment(stream: str, seq: int, text: str, start: float, length: float) -> bytes:
    """One transcript segment; consecutive ones abut in time (the overlap merge would take
    overlapping ones for repeats of the same speech)."""
    body = {"stream_id": stream, "seq": seq, "start": start, "end": start + length, "text": text}
    return json.dumps({**body, "lang": "en"}).encode()


class Feeder:
    """Ordinary talk on mic1 (keeps analyses going), a fault phrase on mic2 (keyword alerts)."""

    def __init__(self, send: Callable[[str, int, bytes], Any], fault_every: float) -> None:
        self.send = send
        self.fault_every = fault_every
        self.fault_seq = 0
        self.talk_seq = 0

    async def run(self) -> None:
        next_talk = 0.0
        base = time.time() - 5.0
        while True:
            now = time.perf_counter()
            if now >= next_talk:
                seq = self.talk_seq
                text = ORDINARY[seq % len(ORDINARY)]
                await self.send("mic1", seq, segment("mic1", seq, text, base + seq, 1.0))
                self.talk_seq += 1
                next_talk = now + 1.0
            seq, every = self.fault_seq, self.fault_every
            fault = segment("mic2", seq, FAULT.format(n=seq), base + seq * every, every)
            await self.send("mic2", seq, fault)
            self.fault_seq += 1
            await asyncio.sleep(every)


async def measure_kill(
    index: int,
    sup: EngineSupervisor,
    analyses: Callable[[], int],
    feeder: Feeder,
    alerted: Callable[[], set[int]],
) -> Kill:
    await until(lambda: sup.oldest_request_s() is not None, "an analysis in flight", 300)
    pids = sup.engine.core_pids()
    if not pids:
        raise SystemExit("no engine-core pid (vLLM internals changed?)")
    restarts = sup.restarts
    first_fault = feeder.fault_seq
    events_before = sup.events.count
    t0 = time.perf_counter()
    os.kill(pids[0], signal.SIGKILL)
    noticed = await until(lambda: sup.restarts > restarts, "the supervisor noticing", 60)
    serving = await until(sup.ready.is_set, "the engine serving again", 600)
    last_fault = feeder.fault_seq
    done = analyses()
    first = await until(lambda: analyses() > done, "an analysis after the restart", 300)
    await asyncio.sleep(2.0)  # the last gap alerts reach the subscriber / outbox
    gap = set(range(first_fault, last_fault))
    info = sup.engine.info
    recent = sup.events.recent()[-(sup.events.count - events_before) :]
    backoff = sum(e["wait_s"] for e in recent if e["event"] == "engine.restart_backoff")
    return Kill(
        kill=index,
        rung_after=sup.rung.index,
        rung_name=sup.rung.name,
        noticed_s=round(noticed - t0, 3),
        backoff_s=round(backoff, 2),
        serving_s=round(serving - t0, 3),
        engine_start_s=round(info.start_seconds, 2) if info else None,
        first_analysis_s=round(first - t0, 3),
        faults_published=len(gap),
        faults_alerted=len(gap & alerted()),
    )


async def kill_series(
    args: argparse.Namespace,
    sup: EngineSupervisor,
    analyzer: Analyzer,
    send: Callable[[str, int, bytes], Any],
    alerted: Callable[[], set[int]],
) -> list[Kill]:
    """`args.kills` kills, one after the other, while the feeder talks and alarms."""
    feeder = Feeder(send, args.fault_every)
    feeding = asyncio.create_task(feeder.run())
    kills: list[Kill] = []
    try:
        for i in range(1, args.kills + 1):
            kills.append(await measure_kill(i, sup, lambda: analyzer.analyses, feeder, alerted))
            print(f"kill {i}: {asdict(kills[-1])}", flush=True)
    finally:
        feeding.cancel()
    return kills


# -- daemon mode: the whole service, a real broker -----------------------------------------


async def run_daemon_mode(
    args: argparse.Namespace, work: Path
) -> tuple[list[Kill], dict[str, Any]]:
    import aiomqtt

    from agent.devbroker import DevBroker

    prefix = f"bench/{uuid.uuid4().hex[:8]}"
    (work / "broker").mkdir()
    with DevBroker(workdir=work / "broker") as broker:
        loaded = load_config(
            AGENT_YAML,
            profile=args.profile,
            overrides=[
                f"mqtt.port={broker.port}",
                f"mqtt.topic_prefix={prefix}",
                f"outbox.path={work / 'state' / 'outbox.sqlite'}",
                "streams.defaults.alerts.debounce_s=0",
                "llm.enabled=true",
                f"watchdog.restart_limit={args.kills + 1}",
                "watchdog.restart_window_s=3600",
                *args.set,
            ],
        )
        daemon = Daemon(loaded)
        assert daemon.supervisor is not None and daemon.analysis is not None
        sup, analyzer = daemon.supervisor, daemon.analysis
        seen: set[int] = set()

        async def watch() -> None:
            async with aiomqtt.Client("127.0.0.1", broker.port) as client:
                await client.subscribe(f"{prefix}/alerts", qos=1)
                async for msg in client.messages:
                    body = json.loads(bytes(msg.payload))
                    alert = body["alert"]
                    if alert["stream_id"] == "mic2":
                        seen.update(ev["seq"] for ev in alert["evidence"])

        stop = asyncio.Event()
        t0 = time.perf_counter()
        service = asyncio.create_task(daemon.run(stop))
        watcher = asyncio.create_task(watch())
        async with aiomqtt.Client("127.0.0.1", broker.port) as pub:

            async def send(stream: str, _seq: int, payload: bytes) -> None:
                await pub.publish(f"{prefix}/streams/{stream}/transcript", payload, qos=1)

            if not await sup.wait_serving():
                raise SystemExit(f"engine {sup.state}: {sup.detail}")
            first_start = time.perf_counter() - t0
            try:
                kills = await kill_series(args, sup, analyzer, send, lambda: seen)
            finally:
                stop.set()
                await asyncio.wait_for(service, 120)
                watcher.cancel()
        if watcher.done() and not watcher.cancelled() and watcher.exception():
            raise SystemExit(f"alert subscriber failed: {watcher.exception()!r}")
        meta = {
            "mode": "daemon (whole service, real broker: alerts counted over MQTT)",
            "broker": broker.kind,
            "first_start_s": round(first_start, 1),
            "ladder": [r.name for r in sup.ladder],
        }
        return kills, meta


# -- engine mode: supervisor + analyzer, keyword path in-process ----------------------------


async def _noop(_sid: str, _faults: Sequence[AcceptedFault]) -> None:
    return None


async def run_engine_mode(
    args: argparse.Namespace, work: Path
) -> tuple[list[Kill], dict[str, Any]]:
    cfg = load_config(AGENT_YAML, profile=args.profile, overrides=["llm.enabled=false"]).config
    profile = cfg.engine
    if profile is None:
        raise SystemExit("the profile has no engine section")
    model_dir = (
        prepare_bench_model(profile) if profile.load_format == "dummy" else profile.model_path()
    )
    vocab = int(json.loads((model_dir / "config.json").read_text()).get("vocab_size", 150_000))
    ladder = build_ladder(profile, context_tokens=None)
    prewarm: list[dict[str, Any]] = []
    if args.prewarm or args.prewarm_only:
        for rung in ladder[: args.kills + 1]:
            engine = Engine()
            t = time.perf_counter()
            info = await engine.start(rung.profile)
            await engine.shutdown()
            prewarm.append(
                {
                    "rung": rung.index,
                    "name": rung.name,
                    "start_s": round(info.start_seconds, 1),
                    "with_shutdown_s": round(time.perf_counter() - t, 1),
                }
            )
            print(f"prewarm {prewarm[-1]}", flush=True)
    if args.prewarm_only:
        return [], {"mode": "prewarm only", "first_start_s": None, "prewarm": prewarm}
    sup = EngineSupervisor(
        profile,
        WatchdogSettings(
            interval_s=0.5,
            restart_limit=args.kills + 1,
            restart_window_s=3600,
            host_warn_bytes=cfg.watchdog.host_warn_bytes,
            host_critical_bytes=cfg.watchdog.host_critical_bytes,
        ),
    )
    analyzer = Analyzer(
        PlainLlm(sup, max_tokens=32),
        WordHashCodec(high=min(150_000, vocab)),
        AnalysisSettings(context_tokens=args.budget),
        cfg.faults,
        budget=args.budget,
        on_faults=_noop,
    )
    # The daemon's own keyword path (detector, tracker, SQLite outbox), fed directly.
    keywords = Daemon(
        load_config(
            AGENT_YAML,
            profile="cpu-dev",
            overrides=[
                "llm.enabled=false",
                "watchdog.enabled=false",
                f"outbox.path={work / 'state' / 'outbox.sqlite'}",
                "streams.defaults.alerts.debounce_s=0",
            ],
        )
    )
    await keywords.outbox.open()
    limits = IngestLimits()
    alerted: set[int] = set()

    async def send(stream: str, seq: int, payload: bytes) -> None:
        if stream == "mic1":
            seg = parse_transcript("mic1", payload, limits, time.time())
            analyzer.add("mic1", seq=seg.seq, start=seg.start, end=seg.end, text=seg.text)
            return
        before = keywords.stats.keyword_matches
        await keywords.keywords.process(parse_transcript("mic2", payload, limits, time.time()))
        if keywords.stats.keyword_matches > before and keywords.outbox.depth:
            alerted.add(seq)

    t0 = time.perf_counter()
    async with supervised(sup):
        if not await sup.wait_serving():
            raise SystemExit(f"engine {sup.state}: {sup.detail}")
        first_start = time.perf_counter() - t0
        workers = asyncio.create_task(analyzer.run())
        try:
            kills = await kill_series(args, sup, analyzer, send, lambda: alerted)
        finally:
            workers.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await workers
            await keywords.outbox.close()
    meta = {
        "mode": "engine (supervisor + analyzer; keyword path in-process: alerts counted in "
        "the SQLite outbox, no broker)",
        "first_start_s": round(first_start, 1),
        "prewarm": prewarm,
        "budget_tokens": args.budget,
        "ladder": [r.name for r in sup.ladder],
    }
    return kills, meta


# -- output ----------------------------------------------------------------------------------


def render(meta: dict[str, Any], kills: Sequence[Kill]) -> str:
    lines = [
        f"# Engine recovery: {meta['profile']} on {meta['machine']}",
        "",
        f"{meta['mode']}; first start {meta['first_start_s']} s; {meta['date']}.",
        "",
        md_table(
            [
                "kill", "rung after", "noticed (s)", "backoff (s)", "serving again (s)",
                "engine start (s)", "first analysis (s)", "of which the analysis (s)",
                "fault segments in gap", "alerted",
            ],
            [
                [
                    k.kill, f"{k.rung_after}: {k.rung_name}", f"{k.noticed_s:.2f}",
                    f"{k.backoff_s:.2f}", f"{k.serving_s:.2f}", str(k.engine_start_s),
                    f"{k.first_analysis_s:.2f}", f"{k.first_analysis_s - k.serving_s:.2f}",
                    k.faults_published, k.faults_alerted,
                ]
                for k in kills
            ],
        ),
    ]  # fmt: skip
    med = statistics.median
    lines += [
        "",
        f"Median over {len(kills)} kills: kill -> first successful analysis "
        f"{med(k.first_analysis_s for k in kills):.2f} s (noticed "
        f"{med(k.noticed_s for k in kills):.2f} s, serving "
        f"{med(k.serving_s for k in kills):.2f} s); "
        f"keyword alerts during the gaps: {sum(k.faults_alerted for k in kills)} of "
        f"{sum(k.faults_published for k in kills)} fault segments.",
    ]
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> int:
    configure_logging(args.log_level, "console")
    with tempfile.TemporaryDirectory(prefix="bench-recovery-") as tmp:
        work = Path(tmp)
        cache = os.environ.get("EDGE_AGENT_CACHE_DIR")
        mode = args.mode
        if mode == "auto":
            mode = "engine" if args.profile == "h200-bench" else "daemon"
        runner = run_daemon_mode if mode == "daemon" else run_engine_mode
        kills, meta = await runner(args, work)
    meta.update(
        profile=args.profile,
        machine=machine(),
        date=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        kills=args.kills,
        fault_every_s=args.fault_every,
        cache_dir=cache,
    )
    table = render(meta, kills) if kills else json.dumps(meta, indent=1)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps({"meta": meta, "kills": [asdict(k) for k in kills]}, indent=1) + "\n"
    )
    (out / "table.md").write_text(table + "\n")
    print(table, flush=True)
    return 0 if all(k.faults_alerted == k.faults_published for k in kills) else 2


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--profile", default="cpu-dev")
    ap.add_argument("--mode", choices=["auto", "daemon", "engine"], default="auto")
    ap.add_argument("--kills", type=int, default=3, help="engine kills, one rung down each")
    ap.add_argument("--fault-every", type=float, default=0.5, help="seconds between fault phrases")
    ap.add_argument("--budget", type=int, default=8192, help="engine mode: window tokens")
    ap.add_argument("--prewarm", action="store_true", help="start/stop each visited rung first")
    ap.add_argument("--prewarm-only", action="store_true", help="engine mode: only the prewarm")
    ap.add_argument("--set", action="append", default=[], help="daemon mode: KEY=VALUE overrides")
    ap.add_argument("--out", default=str(ROOT / "bench" / "recovery" / "results" / "latest"))
    ap.add_argument("--log-level", default="warning")
    args = ap.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
