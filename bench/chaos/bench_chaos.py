"""Nothing accepted is lost: the real service under injected faults, counted per segment.

    .venv/bin/python -m bench.chaos.bench_chaos --rounds 10             # every kind, N = 10
    .venv/bin/python -m bench.chaos.bench_chaos --rounds 1 --kinds broker,agent   # CI's round
    .venv/bin/python -m bench.chaos.bench_chaos --soak 30                # 30 min soak, PNG

Parts, all real: mosquitto with its store on disk (DevBroker: persistence on), the service
as `edge-agent run` subprocesses on configs/agent.yaml, a publisher that retries each QoS 1
message until the broker's PUBACK (only then is it "accepted"), a subscriber with a
persistent session that reconnects across broker restarts. Every fault segment goes to a
stream of its own, so "alerted" is exact: a `new` alert event on that stream. Kinds:

- `broker`: the broker stopped (its store saved) and started again during a burst;
- `agent`: the service SIGKILLed during a burst of transcripts and audio clips, started again;
- `engine`: the engine-core process SIGKILLed while an analysis runs (LLM tier on);
- `memory`: a child process takes memory until the watchdog's warn level (LLM tier on).

Per kind: segments accepted by the broker, alerted, lost (accepted, never alerted), duplicate
alerts (a second `new` for one segment) and redelivered events (same id and seq again, which
consumers drop), and the time to recover. `--soak` runs compressed traffic with faults mixed
in and samples the service's RSS, open files and outbox depth, with their slopes and a chart.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import aiomqtt
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.demo import run_argv
from agent.devbroker import DevBroker
from agent.devsubscriber import PersistentSubscriber
from bench._common import md_table, percentile, provenance, stamped, write_result

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "configs" / "agent.yaml"
RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("broker", "agent", "engine", "memory")
BURST = 12  # transcript segments per round
CLIPS = 2  # audio clips per round (agent kind)
# After the last fault: wait while alerts keep coming (a backlog of clips is transcribed one
# by one); a segment is lost only if it has not alerted once nothing came for _STALL_S.
_STALL_S = 60.0
_SETTLE_MAX_S = 900.0
_HEADERS = ["fault", "rounds", "accepted by the broker", "alerted", "lost",
            "duplicate alerts", "redelivered events", "recover p50 s", "recover max s",
            "publisher retries"]  # fmt: skip


# -- the parts ------------------------------------------------------------------------------


class Publisher:
    """Publishes at QoS 1 and retries each message until the broker acknowledged it."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._client: aiomqtt.Client | None = None
        self.retries = 0

    async def _connect(self) -> aiomqtt.Client:
        while True:
            client = aiomqtt.Client(
                "127.0.0.1", self.port, identifier=f"chaos-pub-{uuid.uuid4().hex[:6]}",
                protocol=aiomqtt.ProtocolVersion.V5, timeout=5,
            )  # fmt: skip
            try:
                await client.__aenter__()
                return client
            except aiomqtt.MqttError:
                await asyncio.sleep(0.2)

    async def publish(self, topic: str, payload: bytes, properties: Any = None) -> float:
        """Returns when the broker's PUBACK came (its monotonic time)."""
        while True:
            if self._client is None:
                self._client = await self._connect()
            try:
                await asyncio.wait_for(
                    self._client.publish(topic, payload, qos=1, properties=properties), 5
                )
                return time.monotonic()
            except (aiomqtt.MqttError, asyncio.TimeoutError):
                self.retries += 1
                with contextlib.suppress(Exception):
                    await self._client.__aexit__(None, None, None)
                self._client = None
                await asyncio.sleep(0.2)

    async def close(self) -> None:
        if self._client is not None:
            with contextlib.suppress(Exception):
                await self._client.__aexit__(None, None, None)


@dataclass
class Seen:
    """What the subscriber received, by stream."""

    new: dict[str, list[tuple[str, float]]] = field(default_factory=dict)  # stream -> (id, t)
    events: dict[tuple[str, int], int] = field(default_factory=dict)  # (id, seq) -> times
    status: dict[str, Any] = field(default_factory=dict)
    online: float | None = None


class Subscriber(PersistentSubscriber):
    """What the service published on <prefix>/#, across broker restarts."""

    def __init__(self, port: int, prefix: str) -> None:
        super().__init__(port, prefix, name="chaos-sub")
        self.seen = Seen()

    def take(self, msg: aiomqtt.Message) -> None:
        payload = bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""
        topic = msg.topic.value
        if topic.endswith("/alerts"):
            event = json.loads(payload)
            alert = event["alert"]
            key = (alert["id"], event["seq"])
            self.seen.events[key] = self.seen.events.get(key, 0) + 1
            if event["type"] == "new" and self.seen.events[key] == 1:
                self.seen.new.setdefault(alert["stream_id"], []).append(
                    (alert["id"], time.monotonic())
                )
        elif topic.endswith("/status"):
            self.seen.status = json.loads(payload)
        elif topic.endswith("/available") and payload == b"online":
            self.seen.online = time.monotonic()


class Service:
    """`edge-agent run` as systemd runs it, which this bench kills and starts again."""

    def __init__(self, port: int, prefix: str, work: Path, extra: Sequence[str]) -> None:
        self.argv = run_argv(
            CONFIG,
            [
                f"mqtt.port={port}",
                f"mqtt.topic_prefix={prefix}",
                f"mqtt.client_id=chaos-{prefix.rsplit('/', 1)[1]}",
                f"outbox.path={work / 'outbox.sqlite'}",
                f"control.socket_path={work / 'control.sock'}",
                f"watchdog.state_path={work / 'watchdog.json'}",
                "metrics.enabled=false",
                "mqtt.status_interval_s=1",
                "mqtt.reconnect_max_s=1",
                "ingest.max_streams=100000",
                "streams.defaults.alerts.debounce_s=0",
                *extra,
            ],
        )
        self.log = work / "service.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def start(self) -> None:
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT)
        self.starts += 1

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()  # SIGKILL, as the OOM killer or a power cut would
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                self.proc.kill()


# -- one kind ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    kind: str
    rounds: int = 0
    published: int = 0
    accepted: int = 0
    alerted: int = 0
    lost: list[str] = field(default_factory=list)
    duplicate_alerts: int = 0
    redelivered_events: int = 0
    recover_s: list[float] = field(default_factory=list)
    publisher_retries: int = 0

    def row(self) -> list[object]:
        return [self.kind, self.rounds, self.accepted, self.alerted, len(self.lost),
                self.duplicate_alerts, self.redelivered_events,
                percentile(self.recover_s, 0.5), max(self.recover_s, default=None),
                self.publisher_retries]  # fmt: skip


def _segment(prefix: str, stream: str, seq: int, text: str) -> tuple[str, bytes]:
    now = time.time()
    body = {
        "stream_id": stream,
        "seq": seq,
        "start": now - 4,
        "end": now,
        "text": text,
        "lang": "en",
    }
    return f"{prefix}/streams/{stream}/transcript", json.dumps(body).encode()


def _speech(text: str, out: Path) -> bytes:
    subprocess.run(
        ["espeak-ng", "-s", "150", "-w", str(out), text], check=True, capture_output=True
    )
    return out.read_bytes()


async def _until(test: Any, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if test():
            return True
        await asyncio.sleep(0.05)
    return bool(test())


async def run_kind(kind: str, rounds: int, work: Path) -> Outcome:
    out = Outcome(kind)
    work.mkdir(parents=True, exist_ok=True)
    prefix = f"chaos/{uuid.uuid4().hex[:8]}"
    llm = kind in ("engine", "memory")
    extra = ["llm.enabled=true" if llm else "llm.enabled=false"]
    if kind == "engine":
        # Ten deaths in a few minutes would end in degraded mode (the restart budget, tested
        # on its own): here every death is recovered, so that each round injects one.
        extra += ["watchdog.restart_limit=100"]
    if kind != "agent":
        extra.append("asr.enabled=false")
    if kind == "memory":
        # Warn 2 GiB under what is free now; the hog (3.5 GiB) goes 1.5 GiB past it. Leaving
        # warn needs headroom `hysteresis` above the line: 5% here (the default 20% of a
        # machine's free memory would never come back on a shared box).
        avail = _mem_available()
        extra += [
            f"watchdog.host_warn_bytes={avail - (2 << 30)}",
            f"watchdog.host_critical_bytes={max(256 << 20, avail - (7 << 30))}",
            "watchdog.hysteresis=0.05",
        ]
    (work / "broker").mkdir(exist_ok=True)
    with DevBroker(workdir=work / "broker") as broker:
        sub = Subscriber(broker.port, prefix)
        await sub.start()
        service = Service(broker.port, prefix, work, extra)
        service.start()
        try:
            pub = Publisher(broker.port)
            ready = await _until(lambda: sub.seen.status.get("state") == "running", 120)
            if llm:
                ready = await _until(
                    lambda: (sub.seen.status.get("llm") or {}).get("state") == "running", 300
                )
            if not ready:
                raise RuntimeError(f"{kind}: the service did not come up (log {service.log})")
            accepted: dict[str, float] = {}
            clip_wav = (
                _speech("the motor is overloaded, motor overload alarm", work / "clip.wav")
                if kind == "agent"
                else b""
            )
            for r in range(rounds):
                streams = [f"c-{kind}-{r}-{i}" for i in range(BURST)]
                recover = asyncio.create_task(_inject(kind, r, broker, service, sub, work))
                for i, stream in enumerate(streams):
                    said = f"bearing abnormal noise on roller {i}"
                    topic, body = _segment(prefix, stream, 1, said)
                    accepted[stream] = await pub.publish(topic, body)
                    out.published += 1
                    if kind == "agent" and i < CLIPS:
                        props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                        props.UserProperty = [("seq", "1")]
                        clip_stream = f"a-{kind}-{r}-{i}"
                        accepted[clip_stream] = await pub.publish(
                            f"{prefix}/streams/{clip_stream}/audio", clip_wav, props
                        )
                        out.published += 1
                    await asyncio.sleep(0.03)
                out.recover_s.append(await recover)
                out.rounds += 1
            await _settle(sub, set(accepted))
            out.accepted = len(accepted)
            out.alerted = sum(1 for s in accepted if s in sub.seen.new)
            out.lost = sorted(s for s in accepted if s not in sub.seen.new)
            out.duplicate_alerts = sum(len(v) - 1 for s, v in sub.seen.new.items() if s in accepted)
            out.redelivered_events = sum(n - 1 for n in sub.seen.events.values())
            out.publisher_retries = pub.retries
            await pub.close()
        finally:
            service.stop()
            await sub.stop()
    return out


async def _settle(sub: Subscriber, accepted: set[str]) -> None:
    """Until every accepted segment alerted, or nothing new came for _STALL_S."""
    deadline = time.monotonic() + _SETTLE_MAX_S
    last, seen = time.monotonic(), len(sub.seen.new)
    while not accepted <= set(sub.seen.new) and time.monotonic() < deadline:
        if len(sub.seen.new) != seen:
            last, seen = time.monotonic(), len(sub.seen.new)
        elif time.monotonic() - last > _STALL_S:
            return
        await asyncio.sleep(0.2)


async def _inject(
    kind: str, r: int, broker: DevBroker, service: Service, sub: Subscriber, work: Path
) -> float:
    """The fault, a moment into the burst; returns seconds until the service serves again."""
    await asyncio.sleep(0.15)
    if kind == "broker":
        alerts = len(sub.seen.events)
        await asyncio.to_thread(broker.stop)
        await asyncio.sleep(1.0)
        t0 = time.monotonic()
        await asyncio.to_thread(broker.start)
        await _until(lambda: len(sub.seen.events) > alerts, 60)
        return time.monotonic() - t0
    if kind == "agent":
        t0 = time.monotonic()
        await asyncio.to_thread(service.kill)
        alerts = len(sub.seen.events)
        service.start()
        await _until(lambda: len(sub.seen.events) > alerts, 60)
        return time.monotonic() - t0
    if kind == "engine":
        llm = lambda: sub.seen.status.get("llm") or {}  # noqa: E731
        await _until(lambda: llm().get("requests_in_flight", 0) > 0, 30)
        pids = llm().get("engine_pids") or []
        t0 = time.monotonic()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        await _until(
            lambda: llm().get("state") != "running" or llm().get("engine_pids") != pids, 30
        )
        await _until(
            lambda: llm().get("state") == "running" and llm().get("engine_pids") != pids, 300
        )
        return time.monotonic() - t0
    # memory: a child takes memory past the warn level, holds it, lets go
    take = "import time; b = bytearray(7 << 29); b[::4096] = b'x' * (len(b) // 4096); time.sleep(3)"
    hog = await asyncio.create_subprocess_exec(sys.executable, "-c", take)
    llm = lambda: sub.seen.status.get("llm") or {}  # noqa: E731
    await _until(lambda: bool(llm().get("shedding")), 20)
    await hog.wait()
    t0 = time.monotonic()
    await _until(lambda: not llm().get("shedding"), 60)
    return time.monotonic() - t0


def _mem_available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no MemAvailable in /proc/meminfo")


# -- the report ---------------------------------------------------------------------------------


def report(outcomes: Sequence[Outcome]) -> str:
    lines = [
        "# bench/chaos: accepted input under injected faults",
        "",
        "Mosquitto with persistence; configs/agent.yaml.",
        "",
        md_table(_HEADERS, [o.row() for o in outcomes]),
    ]
    for o in outcomes:
        if o.lost:
            lines.append(f"\nlost ({o.kind}): {', '.join(o.lost[:20])}")
    return "\n".join(lines) + "\n"


async def _main(args: argparse.Namespace) -> int:
    work = Path(tempfile.mkdtemp(prefix="edge-agent-chaos-"))
    prov = provenance("bench.chaos.bench_chaos", args.argv)
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d-%H%M")
    if args.soak:
        from bench.chaos.soak import soak

        print(await soak(args.soak, work, RESULTS, prov))
        return 0
    if args.fuzz:
        from bench.chaos.fuzz import fuzz

        text = await fuzz(args.fuzz, work)
        print(stamped(text, prov))
        if not args.no_write:
            write_result(RESULTS, f"fuzz-{stamp}", prov, text=text)
        return 0
    outcomes = []
    for kind in args.kinds.split(","):
        outcome = await run_kind(kind, args.rounds, work / kind)
        print(f"-- {kind}: {outcome.row()}", flush=True)
        outcomes.append(outcome)
    text = report(outcomes)
    print(stamped(text, prov))
    if not args.no_write:
        write_result(RESULTS, f"chaos-{stamp}", prov, text=text)
    return 1 if any(o.lost for o in outcomes) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.bench_chaos")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--kinds", default=",".join(KINDS))
    parser.add_argument("--soak", type=float, default=0.0, help="minutes of soak instead")
    parser.add_argument("--fuzz", type=int, default=0, help="this many hostile payloads instead")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else argv  # for the results' provenance
    return asyncio.run(_main(args))


if __name__ == "__main__":
    raise SystemExit(main())
