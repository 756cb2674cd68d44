"""The whole service as a subprocess against a real mosquitto: what an operator would see."""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest

from agent.devbroker import DevBroker
from tests.helpers import (
    MqttWatcher,
    events_by_alert,
    publish_all,
    retained,
    sample_segments,
    segment_items,
    until,
)

pytestmark = [pytest.mark.broker, pytest.mark.slow]

EXPECTED_NEW = {
    ("line3-mic1", "bearing_noise"),
    ("line3-mic1", "temperature_over_limit"),
    ("line3-mic1", "emergency_stop"),
    ("line3-mic2", "motor_overload"),
    ("line3-mic2", "bearing_noise"),  # spoken as the homophone 轴成异响
    ("line3-mic2", "leak"),
}


def _new_pairs(alerts: list[dict[str, Any]]) -> set[tuple[str, str]]:
    return {(e["alert"]["stream_id"], e["alert"]["fault"]) for e in alerts if e["type"] == "new"}


def _available(w: MqttWatcher) -> list[str]:
    return [m.payload.decode() for m in w.on("available")]


def _outbox_rows(path: Path) -> list[tuple[str, str]]:
    if not path.exists():
        return []
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        return [(kind, payload) for kind, payload in db.execute("SELECT kind, payload FROM outbox")]


def _assert_lifecycles(by_alert: dict[str, list[dict[str, Any]]]) -> None:
    """Per alert: seq 1..n without gaps, in arrival order, new first, end (if any) last."""
    for alert_id, events in by_alert.items():
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(1, len(events) + 1)), (alert_id, seqs)
        types = [e["type"] for e in events]
        assert types[0] == "new", (alert_id, types)
        assert "end" not in types[:-1], (alert_id, types)
        assert all(t == "update" for t in types[1:-1]), (alert_id, types)


async def test_segments_in_alerts_out(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    """The sample shift yields exactly the spoken faults (negations stay silent, overlapping
    windows count once), with status and availability kept, and SIGTERM ends it cleanly."""
    agent = agent_factory().start()
    await watcher.wait_for(lambda w: "online" in _available(w), what="online")
    rows = sample_segments()
    await publish_all(broker.port, segment_items(prefix, rows))
    await watcher.wait_for(lambda w: _new_pairs(w.alerts()) >= EXPECTED_NEW, what="all alerts")
    await watcher.wait_for(
        lambda w: any(m.json()["ingest"]["accepted"] == len(rows) for m in w.on("status")),
        what="status counting every segment",
    )
    alerts = watcher.alerts()
    assert _new_pairs(alerts) == EXPECTED_NEW
    assert all(e["device_id"] == "line3-edge-01" for e in alerts)

    status = watcher.on("status")[-1].json()
    assert status["ingest"]["duplicates"] == {}
    assert status["streams"]["line3-mic1"]["segments"] == 9
    assert status["state"] == "running"

    assert agent.terminate() == 0
    await watcher.wait_for(lambda w: _available(w)[-1:] == ["stopped"], what="stopped")
    assert [e["event"] for e in agent.events() if e["event"].startswith("agent.stop")] == [
        "agent.stopping",
        "agent.stopped",
    ]
    # A late subscriber learns the state from retained messages.
    late = await retained(broker.port, [f"{prefix}/available", f"{prefix}/status"])
    assert late[f"{prefix}/available"] == b"stopped"
    assert json.loads(late[f"{prefix}/status"])["device_id"] == "line3-edge-01"
    # The bearing on mic1 was mentioned twice in new text ("bearing noice" the second
    # time) and once more only in an overlapping repeat: its count is 2, not 3. The update
    # was still inside its 10 s debounce window: the shutdown flushed it.
    mic1_bearing = [
        e for e in watcher.alerts() if e["alert"]["id"].startswith("line3-mic1:bearing_noise")
    ]
    assert [(e["type"], e["alert"]["count"]) for e in mic1_bearing] == [("new", 1), ("update", 2)]
    evidence = [ev["text"] for ev in mic1_bearing[-1]["alert"]["evidence"]]
    assert evidence == [
        "Wait, I hear a bearing abnormal noise on roller four.",
        "The bearing noice is getting louder.",
    ]


async def test_broker_outage_loses_nothing(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker, tmp_path: Path
) -> None:
    """With the broker stopped for 10 s, the alert events produced meanwhile wait on disk and
    arrive, in order, once it is back; the stream then goes on as before."""
    agent = agent_factory(
        "streams.defaults.alerts.quiet_end_s=4", "streams.defaults.alerts.debounce_s=0"
    ).start()
    await watcher.wait_for(lambda w: "online" in _available(w), what="online")
    rows = sample_segments()
    first = [r for r in rows if r["stream_id"] == "line3-mic1"]
    second = [r for r in rows if r["stream_id"] == "line3-mic2"]
    await publish_all(broker.port, segment_items(prefix, first))
    mic1 = {p for p in EXPECTED_NEW if p[0] == "line3-mic1"}
    await watcher.wait_for(lambda w: _new_pairs(w.alerts()) >= mic1, what="mic1 alerts")

    broker.stop()
    outage_began = time.monotonic()
    ended_before = len([e for e in watcher.alerts() if e["type"] == "end"])
    outbox = tmp_path / "state" / "outbox.sqlite"
    # The mic1 alerts go quiet during the outage: their end events must wait in the outbox.
    while time.monotonic() - outage_began < 10:
        await asyncio.sleep(0.2)
    waiting = _outbox_rows(outbox)
    assert waiting, "nothing waited for the broker: the test proved nothing"
    assert sorted(kind for kind, _ in waiting) == ["end"] * (len(mic1) - ended_before)
    broker.start()

    await watcher.wait_for(
        lambda w: len([e for e in w.alerts() if e["type"] == "end"]) >= len(mic1),
        what="end events after the outage",
    )
    await publish_all(broker.port, segment_items(prefix, second))
    await watcher.wait_for(lambda w: _new_pairs(w.alerts()) >= EXPECTED_NEW, what="mic2 alerts")
    await watcher.wait_for(
        lambda w: len([e for e in w.alerts() if e["type"] == "end"]) >= len(EXPECTED_NEW),
        what="every alert ended",
    )
    alerts = watcher.alerts()
    by_alert = events_by_alert(alerts)
    _assert_lifecycles(by_alert)
    assert {(a[0]["alert"]["stream_id"], a[0]["alert"]["fault"]) for a in by_alert.values()} == (
        EXPECTED_NEW
    )
    # In order across alerts too: every event of the outage precedes the later stream's.
    order = [(e["alert"]["stream_id"], e["type"]) for e in alerts]
    last_mic1 = max(i for i, (s, _) in enumerate(order) if s == "line3-mic1")
    first_mic2 = min(i for i, (s, _) in enumerate(order) if s == "line3-mic2")
    assert last_mic1 < first_mic2
    # The watcher can see the last event before the service has its PUBACK and deletes the
    # row: the outbox empties right after, not necessarily before this line.
    await until(lambda: _outbox_rows(outbox) == [], "the outbox emptied by the PUBACKs", 30)
    assert agent.alive


async def test_sigkill_before_puback_redelivers(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker, tmp_path: Path
) -> None:
    """Events published but never acknowledged (broker frozen) survive a SIGKILL of the
    service and are delivered after it restarts; consumers dedupe by (id, seq)."""
    overrides = ("streams.defaults.alerts.quiet_end_s=4", "streams.defaults.alerts.debounce_s=0")
    agent = agent_factory(*overrides).start()
    await watcher.wait_for(lambda w: "online" in _available(w), what="online")
    rows = [r for r in sample_segments() if r["stream_id"] == "line3-mic2"]
    await publish_all(broker.port, segment_items(prefix, rows))
    mic2 = {p for p in EXPECTED_NEW if p[0] == "line3-mic2"}
    await watcher.wait_for(lambda w: _new_pairs(w.alerts()) >= mic2, what="mic2 alerts")

    broker.freeze()  # connections stay open; no PUBACK will come
    # On a loaded machine an alert may already have ended (and been delivered) before the
    # freeze: every end not delivered by then must be waiting in the outbox.
    ended_before = len([e for e in watcher.alerts() if e["type"] == "end"])
    outbox = tmp_path / "state" / "outbox.sqlite"
    deadline = time.monotonic() + 30
    while len(_outbox_rows(outbox)) + ended_before < len(mic2) and time.monotonic() < deadline:
        await asyncio.sleep(0.1)
    pending = _outbox_rows(outbox)
    assert pending, "no event was left unacknowledged: the test proved nothing"
    assert sorted(kind for kind, _ in pending) == ["end"] * (len(mic2) - ended_before)
    assert any(e["event"] == "alert.event" and e["type"] == "end" for e in agent.events())
    agent.kill()  # SIGKILL: no shutdown code runs
    broker.thaw()

    restarted = agent_factory(*overrides).start()
    await watcher.wait_for(
        lambda w: (
            {e["alert"]["id"] for e in w.alerts() if e["type"] == "end"}
            >= {json.loads(p)["alert"]["id"] for _, p in pending}
        ),
        what="the unacknowledged end events",
    )
    by_alert = events_by_alert(watcher.alerts())
    _assert_lifecycles(by_alert)
    assert all(events[-1]["type"] == "end" for events in by_alert.values())
    # A redelivered event is byte-for-byte the one first sent.
    payloads: dict[tuple[str, int], bytes] = {}
    for m in watcher.on("alerts"):
        e = m.json()
        assert payloads.setdefault((e["alert"]["id"], e["seq"]), m.payload) == m.payload
    await watcher.wait_for(lambda w: not _outbox_rows(outbox), what="outbox emptied")
    assert restarted.terminate() == 0


async def test_malformed_payloads_reported_and_skipped(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    """Every kind of bad input is counted and reported on <prefix>/errors, and the service
    still turns the next good segment into an alert."""
    agent = agent_factory(
        "ingest.max_payload_bytes=1024",
        "ingest.allowed_streams=[line3-mic1, line3-mic2]",
        "ingest.max_streams=1",
        "mqtt.errors_per_minute=1000",
    ).start()
    await watcher.wait_for(lambda w: "online" in _available(w), what="online")
    now = time.time()
    good = {
        "stream_id": "line3-mic1",
        "seq": 1,
        "start": now - 5,
        "end": now,
        "text": "motor overload alarm on the press",
        "lang": "en",
    }
    topic = f"{prefix}/streams/line3-mic1/transcript"
    bad: list[tuple[str, bytes, str]] = [
        (topic, b"{not json", "invalid_json"),
        (topic, json.dumps({**good, "seq": None}).encode(), "invalid_schema"),
        (topic, json.dumps({**good, "extra": 1}).encode(), "invalid_schema"),
        (topic, json.dumps({**good, "end": now - 10}).encode(), "invalid_schema"),
        (topic, json.dumps({**good, "text": "x" * 2000}).encode(), "too_large"),
        (topic, b"\xff\xfe\x00garbage", "not_utf8"),
        (topic, json.dumps({**good, "stream_id": "line3-mic2"}).encode(), "stream_mismatch"),
        (
            f"{prefix}/streams/intruder/transcript",
            json.dumps({**good, "stream_id": "intruder"}).encode(),
            "stream_not_allowed",
        ),
        (
            topic,
            json.dumps({**good, "start": now + 3600, "end": now + 3601}).encode(),
            "from_future",
        ),
        (
            f"{prefix}/streams/line3-mic2/transcript",
            json.dumps({**good, "stream_id": "line3-mic2"}).encode(),
            "too_many_streams",  # line3-mic1 already holds the one stream allowed
        ),
    ]
    quiet = {
        **good,
        "seq": 0,
        "start": now - 10,
        "end": now - 5,
        "text": "line three running normally",
    }
    await publish_all(broker.port, [(topic, json.dumps(quiet).encode())])
    await publish_all(broker.port, [(t, p) for t, p, _ in bad])
    await publish_all(broker.port, [(topic, json.dumps(good).encode())])
    await watcher.wait_for(
        lambda w: any(e["alert"]["fault"] == "motor_overload" for e in w.alerts()),
        what="the alert of the good segment",
    )
    await watcher.wait_for(lambda w: len(w.on("errors")) >= len(bad), what="error reports")
    reasons = [m.json()["reason"] for m in watcher.on("errors")]
    assert sorted(reasons) == sorted(reason for _, _, reason in bad)
    sizes = {m.json()["reason"]: m.json()["size"] for m in watcher.on("errors")}
    assert sizes["too_large"] > 1024
    expected_counts: dict[str, int] = {}
    for _, _, reason in bad:
        expected_counts[reason] = expected_counts.get(reason, 0) + 1
    await watcher.wait_for(
        lambda w: w.on("status")[-1].json()["ingest"]["rejected"] == expected_counts,
        what="status counting every rejection",
    )
    assert agent.alive
    assert len(agent.events("input.rejected")) == len(bad)
    assert agent.terminate() == 0


async def test_slow_puback_is_retried_on_a_live_connection(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    """A broker that stalls past publish_timeout_s but keeps the connection (frozen shorter
    than the keep-alive) does not stop alert delivery: the event is published again."""
    agent = agent_factory(
        "mqtt.publish_timeout_s=1", "streams.defaults.alerts.quiet_end_s=2"
    ).start()
    await watcher.wait_for(lambda w: "online" in _available(w), what="online")
    now = time.time()
    first = {
        "stream_id": "line3-mic1",
        "seq": 1,
        "start": now - 10,
        "end": now - 5,
        "text": "belt slipping on conveyor two",
        "lang": "en",
    }
    topic = f"{prefix}/streams/line3-mic1/transcript"
    await publish_all(broker.port, [(topic, json.dumps(first).encode())])
    await watcher.wait_for(lambda w: _new_pairs(w.alerts()), what="first alert")
    # The alert goes quiet (2 s) while the broker is frozen: its end event is published
    # and no PUBACK comes within the 1 s publish timeout, on a connection that stays up.
    broker.freeze()
    await asyncio.sleep(4.0)  # over 2 publish timeouts, well under the 30 s keep-alive
    broker.thaw()
    second = {
        **first,
        "seq": 2,
        "start": now - 5,
        "end": now,
        "text": "motor overload alarm on press four",
    }
    await publish_all(broker.port, [(topic, json.dumps(second).encode())])
    await watcher.wait_for(
        lambda w: ("line3-mic1", "motor_overload") in _new_pairs(w.alerts()),
        what="an alert after the stall",
    )
    ends = [e for e in watcher.alerts() if e["type"] == "end"]
    assert [e["alert"]["fault"] for e in ends][:1] == ["belt_slip"]
    assert any(e["event"] == "outbox.publish_deferred" for e in agent.events())
    assert agent.alive
    assert agent.terminate() == 0


@pytest.mark.parametrize("protocol", ["5", "3.1.1"])
async def test_input_published_while_the_agent_is_away_is_delivered_on_its_return(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker, protocol: str
) -> None:
    """The persistent session (MQTT 5: clean start off and a session expiry; 3.1.1:
    clean_session off) makes the broker hold QoS 1 input for the service while it restarts."""
    first = agent_factory(f"mqtt.protocol={protocol}").start()
    await watcher.wait_for(lambda w: "online" in _available(w), what="online")
    assert await asyncio.to_thread(first.terminate) == 0
    now = time.time()
    away = {"stream_id": "mic1", "seq": 1, "start": now, "end": now + 4,
            "text": "emergency stop on line three", "lang": "en"}  # fmt: skip
    await publish_all(broker.port, segment_items(prefix, [away]))
    agent_factory(f"mqtt.protocol={protocol}").start()  # same client id: same session
    await watcher.wait_for(lambda w: len(w.alerts()) >= 1, what="the alert for the held input")
    assert watcher.alerts()[0]["alert"]["fault"] == "emergency_stop"
