"""No payload stops the service: hostile input on every subscribed topic and on the control
socket is refused with a reason, counted, reported, and the next message is served.

The subprocess test is the one an operator would run: the real service, a real mosquitto,
the payload that used to end it (10 KB of nested brackets raised RecursionError out of the
MQTT task). The in-process test injects the one fault no payload can produce on demand: a
bug in our own message handling."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.config.loader import load_config
from agent.control import request
from agent.daemon import Daemon
from agent.devbroker import DevBroker
from pipelines.compat import timeout
from tests.helpers import MqttWatcher, publish_all

pytestmark = [pytest.mark.broker]

REPO = Path(__file__).resolve().parents[1]
NESTED = b"[" * 5000 + b"]" * 5000  # 10 KB


def _segment(prefix: str, stream: str, seq: int, text: str) -> tuple[str, bytes]:
    now = time.time()
    body = {"stream_id": stream, "seq": seq, "start": now - 3, "end": now, "text": text}
    return f"{prefix}/streams/{stream}/transcript", json.dumps(body).encode()


def _new_faults(w: MqttWatcher) -> list[tuple[str, str]]:
    return [
        (e["alert"]["stream_id"], e["alert"]["fault"]) for e in w.alerts() if e["type"] == "new"
    ]


async def _raw_control(path: Path, data: bytes, *, close: bool = True) -> dict[str, Any]:
    """Send raw bytes on the control socket; the service's one-line answer."""
    reader, writer = await asyncio.open_unix_connection(str(path), limit=1 << 20)
    try:
        writer.write(data)
        await writer.drain()
        if close:
            writer.write_eof()
        line = await asyncio.wait_for(reader.readline(), 30)
        answer = json.loads(line)
        assert isinstance(answer, dict)
        return answer
    finally:
        writer.close()


@pytest.mark.slow
async def test_hostile_payloads_on_every_input_cost_nothing_else(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker, tmp_path: Path
) -> None:
    keys = tmp_path / "trusted"
    keys.mkdir()
    group = f"line-{uuid.uuid4().hex[:8]}"
    socket = Path(f"/tmp/ea-{uuid.uuid4().hex[:10]}.sock")
    agent = agent_factory(
        "fleet.enabled=true",
        f"fleet.groups=[{group}]",
        f"fleet.trusted_keys_dir={keys}",
        f"control.socket_path={socket}",
        "streams.defaults.alerts.debounce_s=0",
    ).start()
    await watcher.wait_for(lambda w: bool(w.on("status")), what="status", timeout=60)
    assert agent.proc is not None
    pid = agent.proc.pid

    hostile = [
        (f"{prefix}/streams/mic1/transcript", NESTED),
        (
            f"{prefix}/streams/mic1/transcript",
            b'{"stream_id": "mic1", "seq": ' + b"9" * 5000 + b"}",
        ),
        (f"{prefix}/streams/mic1/transcript", b'{"text": "\x00\xff"}'),
        (f"{prefix}/streams/mic1/audio", NESTED),
        (f"fleet/{group}/config", NESTED),
    ]
    await publish_all(broker.port, hostile)
    # MQTT 5 user properties that are not numbers on an audio clip
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [("seq", "1e999999"), ("start", "nan")]
    async with aiomqtt.Client(
        "127.0.0.1", broker.port, protocol=aiomqtt.ProtocolVersion.V5
    ) as client:
        await client.publish(f"{prefix}/streams/mic2/audio", b"RIFF", qos=1, properties=props)

    # The control socket: nested brackets, a line over its limit, a client that says nothing.
    await watcher.wait_for(lambda w: socket.exists(), what="control socket")
    deep = await _raw_control(socket, NESTED + b"\n")
    assert deep["ok"] is False and "too_deep" in deep["error"], deep
    long = await _raw_control(socket, b'{"cmd": "' + b"x" * (70 << 10) + b'"}\n')
    assert long["ok"] is False and "over" in long["error"], long
    silent = await _raw_control(socket, b"", close=False)
    assert silent["ok"] is False and "no request within" in silent["error"], silent

    # The service still serves: a fault spoken afterwards alerts, and status counts it all.
    await publish_all(
        broker.port, [_segment(prefix, "mic1", 1, "bearing abnormal noise on roller 4")]
    )
    await watcher.wait_for(
        lambda w: ("mic1", "bearing_noise") in _new_faults(w), what="the alert after the poison"
    )

    def counted(w: MqttWatcher) -> bool:
        s = w.on("status")[-1].json()
        return (
            s["ingest"]["rejected"].get("too_deep") == 1
            and s["control"]["bad_requests"] == 3
            # the brackets (decoded or refused: either way handled), the properties
            and s["asr"]["clips"] + sum(s["asr"]["rejected"].values()) == 2
        )

    await watcher.wait_for(counted, what="rejections in status")
    status = watcher.on("status")[-1].json()
    assert status["state"] == "running"
    rejected = status["ingest"]["rejected"]
    assert rejected.get("invalid_json") == 1, rejected  # the 5,000-digit number
    assert rejected.get("not_utf8") == 1, rejected
    assert "internal_error" not in rejected, rejected
    assert status["asr"]["rejected"].get("invalid_properties") == 1, status["asr"]
    reasons = {json.loads(m.payload)["reason"] for m in watcher.on("errors")}
    assert {"too_deep", "invalid_json", "not_utf8"} <= reasons, reasons
    ack = next(m.json() for m in watcher.on("config/ack"))
    assert ack["status"] == "rejected" and "too_deep" in ack["reason"], ack
    answer = await request(socket, {"cmd": "status"})
    assert answer["ok"] is True
    assert agent.alive and agent.proc.pid == pid
    assert agent.terminate() == 0


async def test_a_bug_handling_one_message_is_contained(
    broker: DevBroker, prefix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unexpected exception inside the message callback (injected: no payload makes our
    code raise on demand) is counted as internal_error, reported on <prefix>/errors and
    logged; the link stays up and the next message alerts."""
    import agent.intake as intake_module

    real = intake_module.parse_transcript

    def buggy(stream_id: str, payload: bytes, *args: Any, **kwargs: Any) -> Any:
        if b"boom" in payload:
            raise RuntimeError("injected bug")
        return real(stream_id, payload, *args, **kwargs)

    monkeypatch.setattr(intake_module, "parse_transcript", buggy)
    loaded = load_config(
        REPO / "configs" / "agent.yaml",
        overrides=[
            f"mqtt.port={broker.port}",
            f"mqtt.topic_prefix={prefix}",
            f"outbox.path={tmp_path / 'outbox.sqlite'}",
            "llm.enabled=false",
            "asr.enabled=false",
            "control.enabled=false",
            "metrics.enabled=false",
            "streams.defaults.alerts.debounce_s=0",
        ],
    )
    watcher = MqttWatcher(broker.port, prefix)
    await watcher.start()
    daemon = Daemon(loaded)
    stop = asyncio.Event()
    run = asyncio.create_task(daemon.run(stop))
    try:
        await watcher.wait_for(lambda w: bool(w.on("status")), what="status")
        await publish_all(
            broker.port,
            [
                _segment(prefix, "mic1", 1, "boom"),
                _segment(prefix, "mic1", 2, "the motor is overloaded, motor overload alarm"),
            ],
        )
        await watcher.wait_for(
            lambda w: ("mic1", "motor_overload") in _new_faults(w), what="the next message"
        )
        await watcher.wait_for(
            lambda w: any(
                json.loads(m.payload)["reason"] == "internal_error" for m in w.on("errors")
            ),
            what="the internal error reported",
        )
        assert daemon.stats.rejected["internal_error"] == 1
        error = next(json.loads(m.payload) for m in watcher.on("errors"))
        assert "injected bug" in error["detail"]
        assert not run.done()
    finally:
        stop.set()
        async with timeout(30):
            await run
        await watcher.stop()
