"""Test helpers: the daemon as a real subprocess, and an MQTT watcher/publisher."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
import pytest

from agent.demo import run_argv
from agent.devsubscriber import PersistentSubscriber
from pipelines.compat import timeout as async_timeout

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "configs" / "samples" / "line3-shift.jsonl"


def unit_stop_timeout_s() -> float:
    """How long systemd waits for the service to stop (the unit's TimeoutStopSec)."""
    for line in (REPO / "systemd" / "edge-agent.service").read_text().splitlines():
        if line.startswith("TimeoutStopSec="):
            return float(line.split("=", 1)[1])
    raise AssertionError("systemd/edge-agent.service names no TimeoutStopSec")


class AgentProcess:
    """`edge-agent run` in a child process, as systemd would run it."""

    def __init__(self, config: Path, overrides: list[str], log_path: Path) -> None:
        self.argv = run_argv(config, overrides)
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> AgentProcess:
        # A session of its own, so that `kill` takes what the service started with it (its
        # engine core), as systemd's cgroup does: a SIGKILL alone would orphan the core.
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        return self

    def terminate(self, timeout: float = 30) -> int:
        """SIGTERM, then the exit status; a stop past `timeout` fails with the end of the
        service's log (a stop past 45 s has written its threads' stacks there)."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            tail = self.log_path.read_text(errors="replace")[-6000:]
            raise AssertionError(
                f"the service did not stop within {timeout:g} s of SIGTERM; its log ends:\n{tail}"
            ) from None

    def kill(self) -> None:
        """SIGKILL the service and everything of its session (its engine core)."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def events(self, name: str | None = None) -> list[dict[str, Any]]:
        """The structured log events the daemon wrote (JSON lines)."""
        out = []
        for line in self.log_path.read_text(encoding="utf-8", errors="replace").splitlines():
            with contextlib.suppress(json.JSONDecodeError):
                event = json.loads(line)
                if isinstance(event, dict) and (name is None or event.get("event") == name):
                    out.append(event)
        return out


@dataclass
class Received:
    topic: str
    payload: bytes
    retain: bool
    at: float

    def json(self) -> Any:
        return json.loads(self.payload)


class MqttWatcher(PersistentSubscriber):
    """Every message on `<prefix>/#`, kept across broker restarts (a persistent session
    that reconnects by itself: agent.devsubscriber)."""

    def __init__(self, port: int, prefix: str) -> None:
        super().__init__(port, prefix, name="watch")
        self.messages: list[Received] = []

    def take(self, msg: aiomqtt.Message) -> None:
        payload = msg.payload if isinstance(msg.payload, bytes) else b""
        self.messages.append(
            Received(msg.topic.value, bytes(payload), bool(msg.retain), time.time())
        )

    def on(self, suffix: str) -> list[Received]:
        topic = f"{self.prefix}/{suffix}"
        return [m for m in self.messages if m.topic == topic]

    def alerts(self) -> list[dict[str, Any]]:
        return [m.json() for m in self.on("alerts")]

    async def wait_for(
        self, check: Callable[[MqttWatcher], bool], timeout: float = 30, what: str = "condition"
    ) -> None:
        """Wait (bounded) until `check` holds; fail with what was received otherwise."""
        deadline = time.monotonic() + timeout
        while not check(self):
            if time.monotonic() > deadline:
                got = [(m.topic, m.payload[:120]) for m in self.messages[-15:]]
                raise AssertionError(f"timed out waiting for {what}; last messages: {got}")
            await asyncio.sleep(0.05)


def sample_segments(base: float | None = None) -> list[dict[str, Any]]:
    """The shipped sample shift, shifted so that it ends now."""
    rows = [json.loads(line) for line in SAMPLE.read_text(encoding="utf-8").splitlines() if line]
    last = max(r["end"] for r in rows)
    base = (time.time() - last) if base is None else base
    for row in rows:
        row["start"] += base
        row["end"] += base
    return rows


async def publish_all(port: int, items: list[tuple[str, bytes]]) -> None:
    """Publish (topic, payload) pairs at QoS 1, in order, from a throwaway client."""
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"pub-{uuid.uuid4().hex[:8]}") as c:
        for topic, payload in items:
            await c.publish(topic, payload, qos=1)


def segment_items(prefix: str, rows: list[dict[str, Any]]) -> list[tuple[str, bytes]]:
    return [
        (
            f"{prefix}/streams/{r['stream_id']}/transcript",
            json.dumps(r, ensure_ascii=False).encode(),
        )
        for r in rows
    ]


def events_by_alert(alerts: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    """Alert events grouped by alert id, redeliveries (same id and seq) dropped, as the
    MQTT contract tells consumers to do."""
    seen: set[tuple[str, int]] = set()
    out: dict[str, list[dict[str, Any]]] = {}
    for event in alerts:
        key = (event["alert"]["id"], event["seq"])
        if key in seen:
            continue
        seen.add(key)
        out.setdefault(event["alert"]["id"], []).append(event)
    return out


async def retained(port: int, topics: list[str], wait_s: float = 2.0) -> dict[str, bytes]:
    """What a new subscriber receives as retained messages on `topics`."""
    out: dict[str, bytes] = {}
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"late-{uuid.uuid4().hex[:8]}") as c:
        for topic in topics:
            await c.subscribe(topic, qos=1)
        with contextlib.suppress(TimeoutError):
            async with async_timeout(wait_s):
                async for msg in c.messages:
                    if msg.retain and isinstance(msg.payload, bytes):
                        out[msg.topic.value] = msg.payload
                    if len(out) == len(topics):
                        break
    return out


async def until(
    predicate: Callable[[], bool], what: str = "the condition", limit: float = 5.0
) -> None:
    """Wait on the event loop until `predicate()` holds; fail the test after `limit` s."""
    try:
        async with async_timeout(limit):
            while not predicate():
                await asyncio.sleep(0.01)
    except TimeoutError:
        pytest.fail(f"timed out after {limit:g} s waiting for {what}")


Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


async def http_get(address: str, path: str = "/metrics", raw: bytes | None = None) -> bytes:
    """One HTTP/1.0 exchange with host:port; the whole response, status line included."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port))
    writer.write(raw if raw is not None else f"GET {path} HTTP/1.0\r\n\r\n".encode())
    await writer.drain()
    try:
        return await asyncio.wait_for(reader.read(), 10)
    finally:
        writer.close()


async def scrape(address: str) -> Samples:
    """GET /metrics, parsed by prometheus_client's own text parser (a malformed exposition
    raises): {(sample name, labels): value}."""
    from prometheus_client.parser import text_string_to_metric_families

    response = await http_get(address)
    head, _, body = response.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.0 200"), head
    out: Samples = {}
    for family in text_string_to_metric_families(body.decode()):
        for s in family.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"sample {key} twice"
            out[key] = s.value
    return out


def sample(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, frozenset(labels.items())))
