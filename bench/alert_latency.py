"""Segment-in to alert-out latency of the keyword tier, on loopback, with the real parts.

A real mosquitto, `edge-agent run` as a subprocess on configs/agent.yaml (cpu-dev, with
`llm.enabled=false`: the keyword tier alone), and one
client that publishes transcript segments and subscribes to the alerts. Every segment names
a fault, and debounce is 0, so each one yields exactly one alert event (new, then updates);
the event's evidence carries the segment's stream and seq, which pairs it with its publish
time. Latency = alert received - segment published, both on this machine's clock; it
includes the outbox's fsync (synchronous=FULL) and the PUBACK wait.

Two phases: paced (one segment every `--interval` s: the latency a line sees) and burst
(all segments at once: how queueing adds up). Prints a table; writes JSON with --json.

    .venv/bin/python bench/alert_latency.py [--segments 300] [--streams 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiomqtt

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from agent.demo import run_argv  # noqa: E402
from agent.devbroker import DevBroker  # noqa: E402
from bench._common import machine, percentile  # noqa: E402

PHRASES = [
    "bearing abnormal noise on roller {n}",
    "temperature over limit at zone {n}",
    "motor overload alarm on press {n}",
    "轴承异响，{n}号工位",
    "belt slipping on conveyor {n}",
]


async def run_phase(
    port: int, prefix: str, count: int, streams: int, *, interval: float, seq0: int
) -> list[float]:
    sent: dict[tuple[str, int], float] = {}
    latencies: list[float] = []
    done = asyncio.Event()
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"bench-{seq0}") as client:
        await client.subscribe(f"{prefix}/alerts", qos=1)

        async def receive() -> None:
            async for msg in client.messages:
                now = time.time()
                event = json.loads(bytes(msg.payload))  # type: ignore[arg-type]
                ev = event["alert"]["evidence"][-1]
                key = (event["alert"]["stream_id"], ev["seq"])
                if event["type"] != "end" and key in sent:
                    latencies.append(now - sent.pop(key))
                    if len(latencies) == count:
                        done.set()

        receiver = asyncio.create_task(receive())
        t_audio = time.time() - 3600
        for i in range(count):
            stream = f"bench-{i % streams:02d}"
            seq = seq0 + i
            text = PHRASES[i % len(PHRASES)].format(n=i)
            seg = {
                "stream_id": stream,
                "seq": seq,
                "start": t_audio + seq * 5,
                "end": t_audio + seq * 5 + 5,
                "text": text,
            }
            sent[(stream, seq)] = time.time()
            await client.publish(
                f"{prefix}/streams/{stream}/transcript",
                json.dumps(seg, ensure_ascii=False).encode(),
                qos=1,
            )
            if interval:
                await asyncio.sleep(interval)
        try:
            await asyncio.wait_for(done.wait(), 120)
        finally:
            receiver.cancel()
    if len(latencies) != count:
        raise SystemExit(f"only {len(latencies)} of {count} alerts arrived")
    return latencies


async def wait_online(port: int, prefix: str) -> None:
    async with aiomqtt.Client("127.0.0.1", port, identifier="bench-wait") as client:
        await client.subscribe(f"{prefix}/available", qos=1)
        async with asyncio.timeout(60):
            async for msg in client.messages:
                if msg.payload == b"online":
                    return


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--segments", type=int, default=300)
    ap.add_argument("--streams", type=int, default=10)
    ap.add_argument("--interval", type=float, default=0.05, help="seconds between paced segments")
    ap.add_argument("--json", type=Path, help="write the results here too")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="edge-agent-bench-"))
    prefix = "bench/line"
    results: dict[str, Any] = {
        "machine": machine(),
        "python": platform.python_version(),
        "phases": {},
    }
    with DevBroker(workdir=work) as broker:
        argv = run_argv(
            REPO / "configs/agent.yaml",
            [
                f"mqtt.port={broker.port}",
                f"mqtt.topic_prefix={prefix}",
                f"outbox.path={work / 'outbox.sqlite'}",
                "streams.defaults.alerts.debounce_s=0",
                "logging.level=warning",
                # The keyword tier alone, as the README's table: with the engine on, its
                # analyses share the two cores (keyword latency under LLM load is not
                # measured yet).
                "llm.enabled=false",
            ],
        )
        with (work / "agent.log").open("wb") as log:
            agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            asyncio.run(wait_online(broker.port, prefix))
            phases = [("paced", args.interval), ("burst", 0.0)]
            seq0 = 0
            for name, interval in phases:
                lat = asyncio.run(
                    run_phase(
                        broker.port,
                        prefix,
                        args.segments,
                        args.streams,
                        interval=interval,
                        seq0=seq0,
                    )
                )
                seq0 += args.segments
                ms = [x * 1000 for x in lat]
                results["phases"][name] = {
                    "segments": len(ms),
                    "interval_s": interval,
                    "p50_ms": statistics.median(ms),
                    "p95_ms": percentile(ms, 0.95),
                    "p99_ms": percentile(ms, 0.99),
                    "max_ms": max(ms),
                }
        finally:
            agent.send_signal(signal.SIGTERM)
            agent.wait(30)
    print(
        f"segment-in -> alert-out on loopback ({results['machine']}, Python "
        f"{results['python']}, mosquitto, SQLite synchronous=FULL)"
    )
    print(f"{'phase':8} {'segments':>8} {'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'max ms':>8}")
    for name, r in results["phases"].items():
        print(
            f"{name:8} {r['segments']:8d} {r['p50_ms']:8.1f} {r['p95_ms']:8.1f} "
            f"{r['p99_ms']:8.1f} {r['max_ms']:8.1f}"
        )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
