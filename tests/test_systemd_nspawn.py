"""The unit under a real systemd: a minimal Debian root booted with systemd-nspawn (one boot
for the module), the project installed into it, the shipped unit with all its hardening plus
a drop-in that only points ExecStart at the test's venv and shortens the watchdog.

Checked: `systemctl start` returns after READY=1 and the unit is active with the daemon's
STATUS; the installed service turns a transcript on the host's broker into an alert; agentctl
answers inside; a hung event loop gets the service killed by systemd's watchdog and restarted
(ready again); `systemctl stop` ends it cleanly (STOPPING=1, exit 0, no SIGKILL).

Root only; the first run debootstraps the root (tests/nspawn.py, about a minute, cached).
"""

from __future__ import annotations

import json
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agent.devbroker import DevBroker
from tests.helpers import MqttWatcher, publish_all
from tests.nspawn import VENV_MOUNT, Container, ensure_root, ensure_venv, missing_prerequisites

REPO = Path(__file__).resolve().parents[1]
UNIT = REPO / "systemd" / "edge-agent.service"
WATCHDOG_S = 4
SOCKET = "/run/edge-agent/control.sock"  # RuntimeDirectory=edge-agent
CONFIG = "/etc/edge-agent/agent.yaml"
AGENTCTL = f"{VENV_MOUNT}/bin/agentctl"
STREAM = "line3-mic1"

_why_not = missing_prerequisites()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.broker,
    pytest.mark.skipif(_why_not is not None, reason=f"real systemd in nspawn: {_why_not}"),
]

# Only what a test cannot do with the shipped values: run from the test's venv, notice a
# hang in seconds rather than 30 s, restart at once.
DROP_IN = f"""\
[Service]
ExecStart=
ExecStart={VENV_MOUNT}/bin/edge-agent run --config {CONFIG}
WatchdogSec={WATCHDOG_S}
RestartSec=1
"""


@pytest.fixture(scope="module")
def prefix() -> str:
    return f"test/{uuid.uuid4().hex[:10]}"


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevBroker]:
    """mosquitto on the host's loopback: the container shares the host's network."""
    if shutil.which("mosquitto") is None:
        pytest.fail("mosquitto is not installed: `make setup` (or apt-get install mosquitto)")
    with DevBroker(workdir=tmp_path_factory.mktemp("broker")) as b:
        yield b


def _etc(dest: Path, broker: DevBroker, prefix: str) -> Path:
    """/etc/edge-agent as the package and an operator would leave it: the shipped config
    (pointed at the test's broker), its profiles, and the credential LoadCredential= reads."""
    dest.mkdir()
    data = yaml.safe_load((REPO / "configs" / "agent.yaml").read_text(encoding="utf-8"))
    data["mqtt"].update(
        port=broker.port,
        topic_prefix=prefix,
        client_id=f"agent-{prefix.rsplit('/', 1)[1]}",
        # The password comes from $CREDENTIALS_DIRECTORY (LoadCredential=); the broker lets
        # anyone in, but the service refuses to start when the named credential is missing.
        username="edge-agent",
        password_credential="mqtt-password",
        reconnect_max_s=1,
    )
    data["llm"]["enabled"] = False  # no engine in the container: the keyword tier only
    # fault.block_loop: the watchdog test's hang, on request
    data.setdefault("control", {})["fault_injection"] = True
    if "metrics" in data:  # the host's network is shared: no fixed port another run may hold
        data["metrics"]["port"] = 0
    assert data["outbox"]["path"] == "/var/lib/edge-agent/outbox.sqlite"  # StateDirectory=
    (dest / "agent.yaml").write_text(yaml.safe_dump(data, allow_unicode=True), encoding="utf-8")
    shutil.copytree(REPO / "configs" / "profiles", dest / "profiles")
    password = dest / "mqtt-password"
    password.write_text("not-a-secret\n")
    password.chmod(0o600)
    for path in (dest, dest / "profiles"):
        path.chmod(0o755)
    return dest


@pytest.fixture(scope="module")
def container(
    tmp_path_factory: pytest.TempPathFactory, broker: DevBroker, prefix: str
) -> Iterator[Container]:
    """One boot for the module; powered off at the end whatever happened."""
    work = tmp_path_factory.mktemp("nspawn")
    root = ensure_root()
    venv = ensure_venv(work)
    units = work / "units"
    units.mkdir()
    shutil.copy2(UNIT, units / "edge-agent.service")
    (units / "edge-agent.service.d").mkdir()
    (units / "edge-agent.service.d" / "test.conf").write_text(DROP_IN)
    # Read-only binds, as the package would install them (the overlay would take writes too,
    # but binds need no daemon-reload and show exactly what the service was given).
    binds = {
        venv: VENV_MOUNT,
        _etc(work / "etc", broker, prefix): Path("/etc/edge-agent"),
        units / "edge-agent.service": Path("/etc/systemd/system/edge-agent.service"),
        units / "edge-agent.service.d": Path("/etc/systemd/system/edge-agent.service.d"),
        REPO / "models": Path("/usr/share/edge-agent/models"),  # the instant tier's reader
    }
    box = Container(root, binds, work / "console.log")
    try:
        box.boot()
        yield box
    finally:
        box.poweroff()


def journal(box: Container, after: str | None = None) -> str:
    return box.journal("edge-agent", after)


def cursor(box: Container) -> str:
    return box.cursor()


def status_json(box: Container) -> dict[str, Any]:
    raw = box.run([AGENTCTL, "status", "--config", CONFIG, "--socket", SOCKET, "--json"])
    data: dict[str, Any] = json.loads(raw.stdout)
    return data


def wait_show(box: Container, check: dict[str, str], limit_s: float) -> dict[str, str]:
    return box.wait_show("edge-agent", check, limit_s)


def test_start_returns_once_ready_and_shows_the_status(container: Container) -> None:
    started = time.monotonic()
    container.run(["systemctl", "start", "edge-agent"], timeout=120)  # blocks until READY=1
    took = time.monotonic() - started
    props = container.show(
        "edge-agent", "ActiveState", "SubState", "StatusText", "MainPID", "NRestarts", "Result"
    )
    assert props["ActiveState"] == "active" and props["SubState"] == "running", props
    assert props["StatusText"] == "0 streams, engine off, 0 alerts today", props
    assert props["NRestarts"] == "0"
    log = journal(container)
    assert "agent.ready" in log, log
    assert took < 30, f"start took {took:.1f} s"
    # The hardening took effect on the real process: its user, no privileges left.
    proc = container.run(["cat", f"/proc/{props['MainPID']}/status"]).stdout
    fields = dict(line.split(":", 1) for line in proc.splitlines() if ":" in line)
    uid = container.run(["id", "-u", "edge-agent"]).stdout.strip()
    assert fields["Uid"].split()[0] == uid
    assert fields["NoNewPrivs"].strip() == "1"
    assert int(fields["CapEff"], 16) == 0 and int(fields["CapBnd"], 16) == 0
    assert fields["Seccomp"].strip() == "2"  # filtered: address families, architectures, ...
    # ProtectSystem=strict and ProtectHome=yes as the service sees them: its user in its
    # mount namespace writes only its own directories.
    as_service = ["nsenter", "-t", props["MainPID"], "-m", "setpriv", "--reuid=edge-agent",
                  "--regid=edge-agent", "--init-groups", "sh", "-c"]  # fmt: skip
    for denied in ("touch /etc/x", "touch /usr/x", "ls /root", "ls /home"):
        assert container.run([*as_service, denied], check=False).returncode != 0, denied
    container.run([*as_service, "touch /var/lib/edge-agent/.w && rm /var/lib/edge-agent/.w"])


async def test_the_installed_service_alerts(
    container: Container, broker: DevBroker, prefix: str
) -> None:
    """A fault phrase on the host's broker comes back as an alert from the service inside,
    which logged in with the password from the credential systemd handed it."""
    watcher = MqttWatcher(broker.port, prefix)
    await watcher.start()
    try:
        now = time.time()
        segment = {
            "stream_id": STREAM,
            "seq": 1,
            "start": now - 4,
            "end": now,
            "text": "Wait, I hear a bearing abnormal noise on roller four.",
        }
        topic = f"{prefix}/streams/{STREAM}/transcript"
        await publish_all(broker.port, [(topic, json.dumps(segment).encode())])
        await watcher.wait_for(
            lambda w: any(e["type"] == "new" for e in w.alerts()), timeout=20, what="the alert"
        )
    finally:
        await watcher.stop()
    [event] = [e for e in watcher.alerts() if e["type"] == "new"]
    assert (event["alert"]["stream_id"], event["alert"]["fault"]) == (STREAM, "bearing_noise")
    # The credential systemd handed over (without it the service exits 2 before READY).
    container.run(["test", "-s", "/run/credentials/edge-agent.service/mqtt-password"])
    # STATUS follows (the notify loop sends it on change, every 2 s at WatchdogSec=4).
    wait_show(container, {"StatusText": "1 streams, engine off, 1 alerts today"}, 10)


def test_agentctl_status_inside(container: Container) -> None:
    human = container.run([AGENTCTL, "status", "--config", CONFIG, "--socket", SOCKET])
    text = human.stdout
    for expected in ("line3-edge-01", "running", "off (llm.enabled: false)", "connected", STREAM):
        assert expected in text, text
    status = status_json(container)
    assert status["state"] == "running"
    assert status["mqtt"]["connected"] is True
    assert status["llm"]["enabled"] is False
    assert status["active_alerts"] == 1
    assert status["streams"][STREAM]["active_alerts"] == 1


def test_agentctl_finds_the_socket_from_the_config_alone(container: Container) -> None:
    """What an operator types on the device: no --socket (the service's socket is in
    /run/edge-agent, which the operator's shell has no $RUNTIME_DIRECTORY for)."""
    result = container.run([AGENTCTL, "status", "--config", CONFIG], check=False)
    assert result.returncode == 0, result.stderr
    assert "running" in result.stdout


def test_a_hung_loop_is_killed_and_restarted_by_the_watchdog(container: Container) -> None:
    """The event loop blocked for longer than WatchdogSec: no WATCHDOG=1 reaches systemd,
    which aborts the process and Restart=on-failure brings it back."""
    before = wait_show(container, {"ActiveState": "active", "NRestarts": "0"}, 5)
    active = status_json(container)["active_alerts"]
    mark = cursor(container)
    # From inside, as an operator's tool would: the control socket, answered before the hang.
    client = (
        "import asyncio, json, sys; from pathlib import Path; from agent.control import request;"
        f" print(json.dumps(asyncio.run(request(Path({SOCKET!r}),"
        " {'cmd': 'fault.block_loop', 'seconds': 60}))))"
    )
    hung = time.monotonic()
    answer = json.loads(container.run([f"{VENV_MOUNT}/bin/python", "-c", client]).stdout)
    assert answer == {"ok": True, "blocked_s": 60.0}
    # Killed about WatchdogSec after the last ping, restarted RestartSec later, READY again.
    after = wait_show(
        container,
        {"ActiveState": "active", "SubState": "running", "NRestarts": "1"},
        limit_s=WATCHDOG_S * 2 + 15,
    )
    took = time.monotonic() - hung
    assert after["MainPID"] != before["MainPID"]
    # STATUS from the new process: its counters start again from zero.
    assert after["StatusText"] == "0 streams, engine off, 0 alerts today", after
    log = journal(container, after=mark)
    assert "control.fault_injection" in log
    assert "Watchdog timeout" in log, log
    assert "Failed with result 'watchdog'" in log, log
    assert log.count("agent.ready") == 1, log  # the new process's READY=1
    assert took < WATCHDOG_S + 12, f"back after {took:.1f} s"
    # The restarted service answers, its active alerts restored from the outbox.
    status = status_json(container)
    assert status["state"] == "running" and status["active_alerts"] == active


def test_stop_is_clean(container: Container) -> None:
    wait_show(container, {"ActiveState": "active"}, 5)
    # systemd logs each notify message at debug level: that is where STOPPING=1 shows.
    container.run(["systemd-analyze", "log-level", "debug"])
    mark = cursor(container)
    try:
        started = time.monotonic()
        container.run(["systemctl", "stop", "edge-agent"], timeout=120)
        took = time.monotonic() - started
    finally:
        container.run(["systemd-analyze", "log-level", "info"])
    # A unit that stopped cleanly is unloaded at once (its Exec* properties with it): the
    # journal is the record. Exited by itself with 0, not by a signal, nothing killed.
    assert container.show("edge-agent", "ActiveState")["ActiveState"] == "inactive"
    log = journal(container, after=mark)
    assert "STOPPING=1" in log, log
    assert "agent.stopped" in log, log
    assert "Main process exited, code=exited, status=0/SUCCESS" in log, log
    assert "Deactivated successfully" in log, log
    assert "SIGKILL" not in log and "Failed with result" not in log, log
    assert took < 15, f"stop took {took:.1f} s"
