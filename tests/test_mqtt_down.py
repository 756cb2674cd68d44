"""While the broker cannot be reached the link says where it is trying and why (real socket:
a port nothing listens on), and agentctl names an unreachable socket with exit 3."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path

import aiomqtt
import pytest
from structlog.testing import capture_logs

from agent.config.models import MqttSettings
from agent.devbroker import free_port
from agent.mqtt import Ack, MqttLink, Topics
from agent.stats import Stats
from tests.helpers import until

REPO = Path(__file__).resolve().parents[1]


async def test_a_broker_that_is_not_there_is_named_with_the_reason() -> None:
    port = free_port()  # nothing listens on it

    def on_message(_m: aiomqtt.Message, ack: Ack) -> None:
        ack()

    link = MqttLink(MqttSettings(port=port, reconnect_min_s=0.05, reconnect_max_s=0.2), None,
                    Topics("t"), on_message, Stats())  # fmt: skip
    assert link.broker == f"127.0.0.1:{port}"
    with capture_logs() as logs:
        task = asyncio.create_task(link.run())
        try:
            await until(lambda: link.last_error is not None, "the first failed attempt", 10)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    assert "refused" in (link.last_error or "").lower()
    assert (link.disconnected_s() or 0) >= 0
    waits = [e for e in logs if e["event"] == "mqtt.reconnect_wait"]
    assert waits and waits[0]["broker"] == f"127.0.0.1:{port}"


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to another user: needs root")
def test_agentctl_exits_3_on_a_socket_it_may_not_open(tmp_path: Path) -> None:
    """A socket in a folder only root may enter, asked by `nobody`: unreachable, exit 3."""
    folder = tmp_path / "private"
    folder.mkdir(mode=0o700)
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(folder / "control.sock"))
    server.listen()
    tmp_path.chmod(0o755)
    script = (
        "import os, sys; import agent.cli.agentctl as a, agent.control, agent.cli.service; "
        "os.setgid(65534); os.setuid(65534); "
        f"sys.argv = ['agentctl', 'status', '--socket', {str(folder / 'control.sock')!r}]; a.main()"
    )
    try:
        done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                              text=True, timeout=60, check=False)  # fmt: skip
    finally:
        server.close()
    assert done.returncode == 3, done.stderr
    assert "unreachable" in done.stderr and "Permission denied" in done.stderr
