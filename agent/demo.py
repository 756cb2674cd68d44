"""`edge-agent demo`: the whole path on one machine, alerts printed as they arrive.

Starts a loopback broker (mosquitto, or amqtt where mosquitto is missing: it says which),
runs `edge-agent run` as a child process on the given config with its state in a scratch
folder, replays a JSONL transcript (times relative to the first segment, shifted to now),
prints each alert event, then stops the service with SIGTERM as systemd would.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import aiomqtt

from agent.config import load_config
from agent.devbroker import DevBroker

__all__ = ["load_sample", "run_argv", "run_demo"]

_QUIET_END_S = 6  # short, so the demo also shows alerts ending


def run_argv(config: Path, overrides: Sequence[str] = ()) -> list[str]:
    """The command line of `edge-agent run` in a child process of this interpreter (the
    demo, the benchmarks and the tests all start the service this way)."""
    argv = [sys.executable, "-m", "agent.cli.edge_agent", "run", "--config", str(config)]
    for option in overrides:
        argv += ["--set", option]
    return argv


def load_sample(path: Path, base: float) -> list[dict[str, Any]]:
    """Read a JSONL replay file; `start`/`end` are seconds from the beginning of the shift."""
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line]
    for row in rows:
        row["start"] += base
        row["end"] += base
    return rows


def _fmt(event: dict[str, Any]) -> str:
    alert = event["alert"]
    ev = alert["evidence"][-1] if alert["evidence"] else {"text": ""}
    return (
        f"{event['type'].upper():6} {alert['stream_id']:11} {alert['fault']:22} "
        f"{alert['severity']:8} count={alert['count']:<2} seq={event['seq']:<2} "
        f"\u201c{ev['text'][:70]}\u201d"
    )


async def _replay_and_watch(
    port: int, prefix: str, rows: list[dict[str, Any]], speed: float, child: subprocess.Popen[bytes]
) -> dict[str, int]:
    counts: dict[str, int] = {}
    async with aiomqtt.Client("127.0.0.1", port, identifier="edge-agent-demo-watch") as client:
        await client.subscribe(f"{prefix}/alerts", qos=1)
        await client.subscribe(f"{prefix}/available", qos=1)

        online = asyncio.Event()

        async def watch() -> None:
            async for msg in client.messages:
                payload = bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""
                if msg.topic.value.endswith("/available"):
                    print(f"-- service is {payload.decode()}", flush=True)
                    if payload == b"online":
                        online.set()
                    continue
                event = json.loads(payload)
                counts[event["type"]] = counts.get(event["type"], 0) + 1
                print(_fmt(event), flush=True)

        watcher = asyncio.create_task(watch())
        # Replay only once the service is subscribed: before its first connect the broker
        # has no session for it and would drop what we publish.
        await asyncio.wait_for(online.wait(), 60)
        t0 = rows[0]["end"]
        began = time.monotonic()
        for row in rows:
            due = (row["end"] - t0) / speed
            await asyncio.sleep(max(0.0, due - (time.monotonic() - began)))
            topic = f"{prefix}/streams/{row['stream_id']}/transcript"
            await client.publish(topic, json.dumps(row, ensure_ascii=False).encode(), qos=1)
        await client.publish(f"{prefix}/streams/line3-mic1/transcript", b"{not json", qos=1)
        print("-- replay done; one malformed payload sent (it is reported, then skipped)")
        await asyncio.sleep(_QUIET_END_S + 3)
        child.send_signal(signal.SIGTERM)
        await asyncio.to_thread(child.wait, 30)
        await asyncio.sleep(0.5)
        watcher.cancel()
    return counts


def run_demo(config: Path, sample: Path, speed: float) -> int:
    loaded = load_config(config)  # fail here, with line numbers, before starting anything
    prefix = loaded.config.mqtt.topic_prefix
    work = Path(tempfile.mkdtemp(prefix="edge-agent-demo-"))
    with DevBroker(workdir=work) as broker:
        note = "" if broker.kind == "mosquitto" else " (mosquitto not installed: in-process amqtt)"
        print(f"-- broker: {broker.kind} on 127.0.0.1:{broker.port}{note}")
        log_path = work / "edge-agent.log"
        argv = run_argv(
            config,
            [
                f"mqtt.port={broker.port}",
                f"outbox.path={work / 'outbox.sqlite'}",
                f"streams.defaults.alerts.quiet_end_s={_QUIET_END_S}",
                "streams.defaults.alerts.debounce_s=2",
            ],
        )
        with log_path.open("wb") as log:
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        print(f"-- service: profile {loaded.config.profile}, log {log_path}")
        rows = load_sample(sample, time.time())
        print(f"-- replaying {len(rows)} segments from {sample} at {speed:g}x")
        try:
            counts = asyncio.run(_replay_and_watch(broker.port, prefix, rows, speed, child))
        finally:
            if child.poll() is None:
                child.kill()
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"
    print(f"-- alerts: {summary}; service exit code {child.returncode}")
    return 0 if counts.get("new") and child.returncode == 0 else 1
