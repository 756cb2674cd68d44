"""Operators' alarm commands on the running service, through the real broker: acknowledge,
shelve and unshelve over MQTT and with agentctl, a restart that keeps every state, and
commands that are forged, malformed or aimed at nothing (docs/alarms.md)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiomqtt

from agent.devbroker import DevBroker
from tests.helpers import MqttWatcher, publish_all, segment_items

BEARING = "Wait, I hear a bearing abnormal noise on roller four."
BELT = "the belt is slipping on conveyor two, it keeps slipping"
BASE = time.time() - 300  # audio times in the past, two seconds per segment
OPTIONS = (
    "alarms.operators=[alice]",
    "streams.defaults.alerts.quiet_end_s=3",
    "streams.defaults.alerts.debounce_s=0",
)


def again(n: int) -> str:
    return f"roller {n} again, I hear a bearing abnormal noise there."


def seg(seq: int, text: str, stream: str = "mic1") -> dict[str, Any]:
    """One segment; each seq its own 1.5 s of audio, none overlapping (overlap is merged)."""
    start = BASE + 2 * seq
    return {"stream_id": stream, "seq": seq, "start": start, "end": start + 1.5, "text": text}


async def command(port: int, prefix: str, alert_id: str, action: str, body: Any) -> None:
    payload = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiomqtt.Client("127.0.0.1", port, identifier=f"op-{time.monotonic_ns()}") as c:
        await c.publish(f"{prefix}/alerts/{alert_id}/{action}", payload, qos=1)


def events_of(w: MqttWatcher, alert_id: str) -> list[dict[str, Any]]:
    return [e for e in w.alerts() if e["alert"]["id"] == alert_id]


def kinds(w: MqttWatcher, alert_id: str) -> list[str]:
    return [e["type"] for e in events_of(w, alert_id)]


def new_alert(w: MqttWatcher, fault: str) -> str | None:
    ids = [
        e["alert"]["id"] for e in w.alerts() if e["type"] == "new" and e["alert"]["fault"] == fault
    ]
    return ids[-1] if ids else None


def errors(w: MqttWatcher) -> list[dict[str, Any]]:
    return [m.json() for m in w.on("errors")]


def status(w: MqttWatcher) -> dict[str, Any]:
    doc: dict[str, Any] = w.on("status")[-1].json()
    return doc


def agentctl(socket: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "agent.cli.agentctl", *args, "--socket", socket],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def socket_of(agent: Any) -> str:
    return next(a.split("=", 1)[1] for a in agent.argv if a.startswith("control.socket_path="))


async def test_acknowledged_cleared_and_an_unacknowledged_one_stands_across_a_kill(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker, tmp_path: Path
) -> None:
    agent = agent_factory(*OPTIONS).start()
    await watcher.wait_for(lambda w: bool(w.on("status")), timeout=60, what="the service")
    await publish_all(broker.port, segment_items(prefix, [seg(1, BEARING)]))
    await watcher.wait_for(lambda w: new_alert(w, "bearing_noise") is not None, what="bearing")
    bearing = new_alert(watcher, "bearing_noise")
    assert bearing is not None
    assert events_of(watcher, bearing)[0]["alert"]["alarm"]["state"] == "unack_active"

    # Acknowledged over MQTT while active; then the line goes quiet and it is gone.
    await command(broker.port, prefix, bearing, "ack", {"by": "alice", "note": "on it"})
    await watcher.wait_for(lambda w: "ack" in kinds(w, bearing), what="the ack event")
    ack = events_of(watcher, bearing)[-1]
    assert ack["alert"]["alarm"]["state"] == "ack_active"
    assert ack["operator"]["by"] == "alice" and ack["operator"]["note"] == "on it"
    await watcher.wait_for(lambda w: "end" in kinds(w, bearing), timeout=30, what="its end")
    end = events_of(watcher, bearing)[-1]
    assert end["alert"]["alarm"]["state"] == "normal" and end["reason"] == "cleared"

    # A second fault clears before anyone acknowledged it: it stands.
    await publish_all(broker.port, segment_items(prefix, [seg(2, BELT)]))
    await watcher.wait_for(lambda w: new_alert(w, "belt_slip") is not None, what="belt")
    belt = new_alert(watcher, "belt_slip")
    assert belt is not None
    await watcher.wait_for(lambda w: "end" in kinds(w, belt), timeout=30, what="belt's end")
    assert events_of(watcher, belt)[-1]["alert"]["alarm"]["state"] == "unack_cleared"
    await watcher.wait_for(
        lambda w: status(w)["alarms"]["by_state"]["unack_cleared"] == 1, what="status counts it"
    )

    # Forged, malformed and aimed at nothing: each refused, counted, reported; none applied.
    await command(broker.port, prefix, belt, "ack", {"by": "mallory"})
    await command(broker.port, prefix, belt, "ack", b"{not json")
    await command(broker.port, prefix, belt, "ack", {"by": "alice", "extra": 1})
    await command(broker.port, prefix, "mic1:leak:1", "ack", {"by": "alice"})
    await command(broker.port, prefix, belt, "shelve", {"by": "alice", "for_s": 60})
    await watcher.wait_for(lambda w: len(errors(w)) >= 5, what="five error events")
    reasons = sorted(e["reason"] for e in errors(watcher))
    assert reasons == [
        "alarm_forbidden", "alarm_invalid", "alarm_invalid", "alarm_not_allowed",
        "alarm_unknown_alert",
    ]  # fmt: skip
    await watcher.wait_for(
        lambda w: sum(status(w)["alarms"]["refused"].values()) == 5, what="refusals counted"
    )
    assert kinds(watcher, belt) == ["new", "end"]  # nothing changed it

    # SIGKILL: the standing alarm is still there after the restart.
    before = status(watcher)["uptime_s"]
    agent.kill()
    restarted = agent_factory(*OPTIONS).start()
    sock = socket_of(restarted)
    await watcher.wait_for(
        lambda w: status(w)["uptime_s"] < before and status(w)["alarms"]["standing"] == 1,
        timeout=60,
        what="the restarted service's status",
    )
    listed = [json.loads(line) for line in agentctl(sock, "alerts").stdout.splitlines()]
    assert [(a["id"], a["alarm"]["state"]) for a in listed] == [(belt, "unack_cleared")]
    done = agentctl(sock, "alerts", "ack", belt, "--note", "checked the belt")
    assert done.returncode == 0, done.stderr
    (event,) = [json.loads(line) for line in done.stdout.splitlines()]
    assert event["type"] == "ack" and event["alert"]["alarm"]["state"] == "normal"
    assert event["operator"]["by"].startswith("local:")
    await watcher.wait_for(lambda w: kinds(w, belt) == ["new", "end", "ack"], what="published")
    again = agentctl(sock, "alerts", "ack", belt)
    assert again.returncode == 2 and "no alarm" in again.stderr
    assert agentctl(sock, "alerts").stdout == ""
    assert restarted.terminate() == 0


async def test_a_shelved_alert_stays_quiet_for_its_time_and_comes_back(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    agent = agent_factory(*OPTIONS, "alarms.max_shelve_s=600").start()
    await watcher.wait_for(lambda w: bool(w.on("status")), timeout=60, what="the service")
    await publish_all(broker.port, segment_items(prefix, [seg(1, BEARING)]))
    await watcher.wait_for(lambda w: new_alert(w, "bearing_noise") is not None, what="bearing")
    bearing = new_alert(watcher, "bearing_noise")
    assert bearing is not None
    await command(broker.port, prefix, bearing, "shelve", {"by": "alice", "for_s": 3600})
    await watcher.wait_for(lambda w: bool(errors(w)), what="a shelf past the limit refused")
    assert errors(watcher)[0]["reason"] == "alarm_shelve_too_long"
    await command(
        broker.port, prefix, bearing, "shelve", {"by": "alice", "for_s": 8, "note": "fitter on it"}
    )
    await watcher.wait_for(lambda w: "shelve" in kinds(w, bearing), what="the shelve event")
    shelf = events_of(watcher, bearing)[-1]["alert"]["alarm"]
    assert shelf["state"] == "shelved" and shelf["shelve_reason"] == "fitter on it"
    # Heard again and again on the shelf: nothing is published of it, no new alert.
    for n in range(2, 6):
        await publish_all(broker.port, segment_items(prefix, [seg(n, again(n))]))
    await watcher.wait_for(
        lambda w: status(w)["ingest"]["accepted"] == 5 and status(w)["queue"]["depth"] == 0,
        what="the repeats processed",
    )
    assert kinds(watcher, bearing) == ["new", "shelve"]
    assert [e for e in watcher.alerts() if e["type"] == "new"] == events_of(watcher, bearing)[:1]
    # The shelf runs out while the fault is heard: back, unacknowledged, with what it heard.
    n = 6
    while "unshelve" not in kinds(watcher, bearing) and n < 40:
        await publish_all(broker.port, segment_items(prefix, [seg(n, again(n))]))
        n += 1
        await asyncio.sleep(1)  # heard once a second (quiet_end_s is 3) until it is back
    assert "unshelve" in kinds(watcher, bearing), "the shelf never ran out"
    back = next(e for e in events_of(watcher, bearing) if e["type"] == "unshelve")
    assert back["alert"]["alarm"]["state"] == "unack_active"
    assert back["operator"]["action"] == "expired"
    assert back["alert"]["count"] >= 5
    assert agent.terminate() == 0
