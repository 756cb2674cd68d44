"""Input the broker was told we received is not lost by a SIGKILL.

The real service, a real mosquitto with its store on disk. `fault.pause_detect` holds
queued input unprocessed, which makes the window reproducible: segments (and a spoken clip)
are received and queued, the service is SIGKILLed before it processed them, and a new
service on the same persistent session gets them again from the broker and alerts on each.
Before, paho acknowledged a message as soon as it was queued in memory and these were lost.
A match that was only counted (its update debounced) survives the same kill."""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.control import request
from agent.devbroker import DevBroker
from tests.helpers import MqttWatcher, publish_all
from tests.speech import missing_tools, speak

pytestmark = [pytest.mark.broker, pytest.mark.slow]


T0 = time.time() - 600


def _segment(prefix: str, stream: str, seq: int, text: str) -> tuple[str, bytes]:
    """Segment `seq` of a stream covers its own 10 s (no overlap with its neighbours)."""
    start = T0 + 10 * seq
    body = {"stream_id": stream, "seq": seq, "start": start, "end": start + 4, "text": text,
            "lang": "en"}  # fmt: skip
    return f"{prefix}/streams/{stream}/transcript", json.dumps(body).encode()


def _new(w: MqttWatcher) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for e in w.alerts():
        if e["type"] == "new":
            out.setdefault(e["alert"]["stream_id"], []).append(e)
    return out


def _status(w: MqttWatcher) -> dict[str, Any]:
    return w.on("status")[-1].json() if w.on("status") else {}


def _options(sock: Path, *more: str) -> list[str]:
    return ["control.fault_injection=true", f"control.socket_path={sock}", *more]


async def test_queued_segments_and_a_clip_survive_a_sigkill(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    problem = missing_tools()
    if problem:
        pytest.skip(problem)
    sock = Path(f"/tmp/ea-{uuid.uuid4().hex[:10]}.sock")
    first = agent_factory(*_options(sock, "streams.defaults.alerts.debounce_s=0")).start()
    await watcher.wait_for(
        lambda w: (_status(w).get("asr") or {}).get("state") == "ready", 120, "ASR ready"
    )
    assert (await request(sock, {"cmd": "fault.pause_detect", "seconds": 120}))["ok"]

    streams = [f"kill-{i}" for i in range(5)]
    segments = [_segment(prefix, s, 1, f"bearing abnormal noise on roller {i}")
                for i, s in enumerate(streams)]  # fmt: skip
    await publish_all(broker.port, segments)
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [("seq", "1")]
    async with aiomqtt.Client(
        "127.0.0.1", broker.port, protocol=aiomqtt.ProtocolVersion.V5
    ) as client:  # returns once the broker acknowledged it
        await client.publish(
            f"{prefix}/streams/kill-audio/audio",
            speak("attention, the motor is overloaded, motor overload alarm"),
            qos=1,
            properties=props,
        )

    def all_queued(w: MqttWatcher) -> bool:  # received, transcribed, waiting in the queue
        s = _status(w)
        return (
            s.get("ingest", {}).get("accepted", 0) >= 6 and s.get("queue", {}).get("depth", 0) >= 5
        )

    await watcher.wait_for(all_queued, 120, "segments and the clip's segment queued")
    status = _status(watcher)
    assert status["mqtt"]["acked"] == 0, status["mqtt"]  # nothing acknowledged yet
    assert _new(watcher) == {}
    first.kill()  # SIGKILL: the queue dies with the process

    agent_factory(*_options(sock, "streams.defaults.alerts.debounce_s=0")).start()
    wanted = {*streams, "kill-audio"}
    await watcher.wait_for(lambda w: wanted <= set(_new(w)), 180, "every input alerted")
    alerts = _new(watcher)
    assert {s: len(v) for s, v in alerts.items() if s in wanted} == dict.fromkeys(wanted, 1)
    assert alerts["kill-audio"][0]["alert"]["fault"] == "motor_overload"
    await watcher.wait_for(lambda w: _status(w).get("mqtt", {}).get("acked", 0) >= 6, 30, "acks")


async def test_a_debounced_match_survives_a_sigkill(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    """The second match of an alert is only counted while its update is debounced; the
    service is killed before the update went out; the next one emits it."""
    sock = Path(f"/tmp/ea-{uuid.uuid4().hex[:10]}.sock")
    first = agent_factory(
        *_options(sock, "streams.defaults.alerts.debounce_s=600", "asr.enabled=false")
    ).start()
    await watcher.wait_for(lambda w: bool(_status(w)), 60, "status")
    first_match = _segment(prefix, "deb", 1, "bearing abnormal noise on roller 2")
    await publish_all(broker.port, [first_match])
    await watcher.wait_for(lambda w: "deb" in _new(w), 30, "the new alert")
    second_match = _segment(prefix, "deb", 2, "the bearing noise is louder now")
    await publish_all(broker.port, [second_match])

    def counted(w: MqttWatcher) -> bool:  # processed, and acknowledged to the broker
        s = _status(w)
        return s.get("streams", {}).get("deb", {}).get("segments") == 2 and (
            s.get("mqtt", {}).get("acked", 0) >= 2
        )

    await watcher.wait_for(counted, 30, "the second match counted and acknowledged")
    assert [e["type"] for e in watcher.alerts()] == ["new"]  # the update is being debounced
    first.kill()
    agent_factory(
        *_options(sock, "streams.defaults.alerts.debounce_s=1", "asr.enabled=false")
    ).start()

    def updated(w: MqttWatcher) -> bool:
        return any(e["type"] == "update" for e in w.alerts())

    await watcher.wait_for(updated, 60, "the update after the restart")
    update = next(e for e in watcher.alerts() if e["type"] == "update")
    assert update["alert"]["count"] == 2 and update["seq"] == 2
    assert [ev["seq"] for ev in update["alert"]["evidence"]] == [1, 2]
