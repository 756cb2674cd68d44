"""systemd's side: the unit file verifies clean, and the notify protocol against a real
datagram socket set as NOTIFY_SOCKET (READY after the broker connects, STATUS, WATCHDOG
pings, STOPPING), with no pings while the pipeline or the event loop is stuck."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog.testing

from agent.config.loader import load_config
from agent.daemon import Daemon
from agent.devbroker import DevBroker
from pipelines.compat import timeout
from tests.helpers import publish_all

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "systemd" / "edge-agent.service"


class NotifySocket:
    """What systemd listens on: a datagram socket; every message kept with its time."""

    def __init__(self) -> None:
        self.path = Path("/tmp") / f"ea-notify-{uuid.uuid4().hex[:10]}"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(self.path))
        self.sock.setblocking(False)
        self.messages: list[tuple[float, str]] = []

    def drain(self) -> list[tuple[float, str]]:
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                return self.messages
            self.messages.append((time.monotonic(), data.decode()))

    def has(self, text: str) -> bool:
        return any(text in m for _, m in self.drain())

    def pings(self) -> list[float]:
        return [t for t, m in self.drain() if m == "WATCHDOG=1"]

    def close(self) -> None:
        self.sock.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def notify(monkeypatch: pytest.MonkeyPatch) -> Iterator[NotifySocket]:
    sock = NotifySocket()
    monkeypatch.setenv("NOTIFY_SOCKET", str(sock.path))
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    yield sock
    sock.close()


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
def test_the_unit_verifies_without_a_warning(tmp_path: Path) -> None:
    """systemd-analyze verify only warns on bad values (exit 0): stderr must be empty. The
    ExecStart binary must exist for the check, so it points at this checkout's."""
    binary = shutil.which("edge-agent") or str(REPO / ".venv" / "bin" / "edge-agent")
    unit = tmp_path / "edge-agent.service"
    unit.write_text(UNIT.read_text().replace("/usr/bin/edge-agent", binary))
    result = subprocess.run(
        ["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0 and result.stderr == "", result.stderr
    text = UNIT.read_text()
    for line in ("Type=notify", "WatchdogSec=", "OOMPolicy=continue", "ProtectSystem=strict"):
        assert line in text
    assert "PrivateDevices=yes" not in text  # it would hide the GPU


@pytest.mark.broker
@pytest.mark.slow
def test_ready_status_watchdog_and_stopping_from_the_service(
    agent_factory: Any, notify: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "1000000")  # pings every 0.5 s
    agent = agent_factory().start()
    deadline = time.monotonic() + 30
    while not notify.has("READY=1"):
        assert time.monotonic() < deadline, notify.messages
        time.sleep(0.05)
    ready = next(m for _, m in notify.messages if "READY=1" in m)
    assert "STATUS=0 streams, engine off, 0 alerts today" in ready
    while len(notify.pings()) < 3:  # the pings themselves, however slow the machine
        assert time.monotonic() < deadline + 30, notify.messages
        time.sleep(0.05)
    assert agent.terminate() == 0
    assert notify.has("STOPPING=1")
    [event] = agent.events("agent.ready")
    assert event["systemd"] is True


@pytest.mark.broker
async def test_no_pings_while_the_pipeline_or_the_loop_is_stuck(
    broker: DevBroker, prefix: str, tmp_path: Path, notify: NotifySocket,
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # pings every 0.2 s
    loaded = load_config(
        REPO / "configs" / "agent.yaml",
        overrides=[
            f"mqtt.port={broker.port}",
            f"mqtt.topic_prefix={prefix}",
            f"outbox.path={tmp_path / 'outbox.sqlite'}",
            "llm.enabled=false",
            "control.enabled=false",
            "metrics.enabled=false",
        ],
    )
    daemon = Daemon(loaded)
    stop = asyncio.Event()
    run = asyncio.create_task(daemon.run(stop))
    try:
        async with timeout(30):
            while not notify.has("READY=1"):
                await asyncio.sleep(0.05)
            while len(notify.pings()) < 2:
                await asyncio.sleep(0.05)
        # A stuck pipeline: the detector cannot take the lock, a segment waits in the queue.
        # Each ping period ends in a ping or an `agent.stalled` line: two stalls in a row
        # with no ping between them is the daemon withholding, not the machine being slow.
        with structlog.testing.capture_logs() as logs:

            def stalls() -> int:
                return sum(e["event"] == "agent.stalled" for e in logs)

            async with daemon.keywords.lock:
                now = time.time()
                body = {"stream_id": "m", "seq": 1, "start": now - 1, "end": now, "text": "hi"}
                await publish_all(
                    broker.port, [(f"{prefix}/streams/m/transcript", json.dumps(body).encode())]
                )
                async with timeout(30):
                    while stalls() < 1:  # the segment is queued and a period went by
                        await asyncio.sleep(0.05)
                    before = len(notify.pings())
                    while stalls() < 3:
                        await asyncio.sleep(0.05)
                assert len(notify.pings()) == before  # work waiting, none done: no ping
        async with timeout(30):
            while len(notify.pings()) <= before:  # drained: pings again
                await asyncio.sleep(0.05)
        # A blocked event loop: no ping can be sent while it is blocked.
        mark = time.monotonic()
        time.sleep(1.5)  # noqa: ASYNC251 (the stall under test)
        async with timeout(30):
            while not any(t > mark + 1.5 for t in notify.pings()):
                await asyncio.sleep(0.05)
        pings = notify.pings()
        during = [t for t in pings if mark + 0.05 < t < mark + 1.5]
        assert during == []
    finally:
        stop.set()
        await asyncio.wait_for(run, 30)
    assert notify.has("STOPPING=1")
