"""The control socket and agentctl against the running service (`edge-agent run` as a
subprocess, real mosquitto): status in both forms, alerts and --follow, config, engine
restart without an engine, and a stranger refused, both by the socket's mode and by the
peer-credential check."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from agent.control import PeerCredentials, peer_allowed
from agent.devbroker import DevBroker
from tests.helpers import MqttWatcher, publish_all

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
AGENTCTL = [sys.executable, "-m", "agent.cli.agentctl"]
# A stranger's client: the system interpreter (readable by `nobody`), stdlib only.
STRANGER_CLIENT = """
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
try:
    s.connect(sys.argv[1])
except OSError as exc:
    print(json.dumps({"connect_error": exc.errno})); sys.exit(0)
try:
    s.sendall(b'{"cmd": "status"}\\n')
except OSError:
    pass  # refused: the service answered and closed before reading the request
print(s.makefile().readline().strip())
"""


@pytest.fixture
def sock_path() -> Iterator[Path]:
    """A short path: AF_UNIX paths are limited to 107 bytes, pytest's tmp paths are long."""
    path = Path("/tmp") / f"ea-{uuid.uuid4().hex[:10]}.sock"
    yield path
    path.unlink(missing_ok=True)


def agentctl(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*AGENTCTL, *args], capture_output=True, text=True, timeout=60, cwd=REPO, check=False
    )


def wait_for_socket(path: Path, limit: float = 30.0) -> None:
    deadline = time.monotonic() + limit
    while not path.exists():
        assert time.monotonic() < deadline, f"no control socket at {path}"
        time.sleep(0.05)


def test_peer_allowed_is_root_the_service_user_or_its_group() -> None:
    me = PeerCredentials(os.getpid(), 4242, 4242)
    assert me.groups() >= {4242, *os.getgroups()}
    assert peer_allowed(PeerCredentials(1, 0, 0), uid=1000, gid=1000)  # root
    assert peer_allowed(PeerCredentials(1, 1000, 5), uid=1000, gid=1000)  # the service user
    assert not peer_allowed(PeerCredentials(os.getpid() + 10**6, 2000, 2000), uid=1000, gid=1000)
    assert peer_allowed(PeerCredentials(os.getpid() + 10**6, 2000, 1000), uid=1000, gid=1000)


async def test_agentctl_status_alerts_and_config_against_the_running_service(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker, sock_path: Path
) -> None:
    agent_factory(f"control.socket_path={sock_path}").start()
    await asyncio.to_thread(wait_for_socket, sock_path)
    mode = (await asyncio.to_thread(sock_path.stat)).st_mode
    assert mode & 0o777 == 0o660
    now = time.time()
    segment = {
        "stream_id": "mic1",
        "seq": 1,
        "start": now - 5,
        "end": now,
        "text": "temperature over limit on the oven",
        "lang": "en",
    }
    follower = await asyncio.create_subprocess_exec(
        *AGENTCTL, "alerts", "--follow", "--socket", str(sock_path),
        stdout=asyncio.subprocess.PIPE, cwd=REPO,
    )  # fmt: skip

    def following(w: MqttWatcher) -> bool:  # the follower's request reached the service
        st = w.on("status")
        return bool(st) and st[-1].json().get("control", {}).get("requests", 0) >= 1

    try:
        await watcher.wait_for(following, timeout=30, what="the follower connected")
        await publish_all(
            broker.port, [(f"{prefix}/streams/mic1/transcript", json.dumps(segment).encode())]
        )
        assert follower.stdout is not None
        line = await asyncio.wait_for(follower.stdout.readline(), 30)
        event = json.loads(line)  # no alert was active when it connected: the event itself
        assert event["type"] == "new" and event["alert"]["fault"] == "temperature_over_limit"
    finally:
        follower.kill()
        await follower.wait()

    human = await asyncio.to_thread(agentctl, "status", "--socket", str(sock_path))
    assert human.returncode == 0, human.stderr
    for text in ("line3-edge-01", "running", "cpu-dev", "connected", "mic1", "1 active",
                 "keyword p50", "(n=1)", "http://127.0.0.1:",
                 "confirmed 0, unreviewed 0"):  # fmt: skip
        assert text in human.stdout, (text, human.stdout)
    as_json = await asyncio.to_thread(agentctl, "status", "--socket", str(sock_path), "--json")
    assert as_json.returncode == 0
    status = json.loads(as_json.stdout)
    assert status["state"] == "running" and status["mqtt"]["connected"] is True
    assert status["streams"]["mic1"]["active_alerts"] == 1
    assert status["alerts_last_hour"] == 1
    assert status["watchdog"]["level"] in ("ok", "warn", "critical")

    active = await asyncio.to_thread(agentctl, "alerts", "--socket", str(sock_path))
    assert [json.loads(x)["fault"] for x in active.stdout.splitlines()] == [
        "temperature_over_limit"
    ]
    # the LLM tier is off here: the active alert shows it has no verdict
    assert [json.loads(x)["verdict"] for x in active.stdout.splitlines()] == ["unreviewed"]
    shown = await asyncio.to_thread(
        agentctl, "config", "show", "--running", "--json", "--socket", str(sock_path)
    )
    config = json.loads(shown.stdout)
    assert config["device_id"] == "line3-edge-01" and config["mqtt"]["topic_prefix"] == prefix
    restart = await asyncio.to_thread(agentctl, "engine", "restart", "--socket", str(sock_path))
    assert restart.returncode == 2 and "no engine here" in restart.stderr


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root")
def test_a_stranger_is_refused_by_mode_and_by_credentials(
    agent_factory: Any, sock_path: Path
) -> None:
    agent = agent_factory(f"control.socket_path={sock_path}").start()
    wait_for_socket(sock_path)
    as_nobody = [
        "setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups",
        "/usr/bin/python3", "-c", STRANGER_CLIENT, str(sock_path),
    ]  # fmt: skip
    blocked = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30, check=False)
    assert blocked.returncode == 0, blocked.stderr
    assert json.loads(blocked.stdout) == {"connect_error": 13}  # EACCES: mode 0660
    sock_path.chmod(0o666)  # a mistake an operator could make: the credential check holds
    refused = subprocess.run(as_nobody, capture_output=True, text=True, timeout=30, check=False)
    assert refused.returncode == 0, refused.stderr
    assert json.loads(refused.stdout) == {"ok": False, "error": "permission denied"}
    deadline = time.monotonic() + 10
    while not agent.events("control.refused"):
        assert time.monotonic() < deadline, "control.refused not logged"
        time.sleep(0.05)
    [event] = agent.events("control.refused")
    assert event["uid"] == 65534
    status = json.loads(agentctl("status", "--socket", str(sock_path), "--json").stdout)
    assert status["control"]["refused"] == 1


def test_unreachable_service_exits_3(sock_path: Path) -> None:
    result = agentctl("status", "--socket", str(sock_path))
    assert result.returncode == 3 and "unreachable" in result.stderr
