"""Prometheus `/metrics`: the histogram arithmetic, and the running service's endpoint parsed
by prometheus_client's text parser, agreeing with the status snapshot it is rendered from."""

from __future__ import annotations

import asyncio
import json
import math
import socket
import time
from typing import Any

import pytest

from agent.devbroker import DevBroker
from pipelines.latency import LatencyWindow
from tests.helpers import MqttWatcher, http_get, publish_all, sample, scrape


def test_histogram_buckets_are_cumulative_and_le_inclusive() -> None:
    w = LatencyWindow(buckets=(0.1, 1.0, 5.0))
    for v in (0.05, 0.1, 0.7, 1.0, 4.0, 30.0):
        w.add(v)
    assert w.cumulative() == [(0.1, 2), (1.0, 4), (5.0, 5), (math.inf, 6)]
    assert w.count == 6 and w.sum == pytest.approx(35.85)
    assert w.percentile(0.5) == pytest.approx(0.85)
    with pytest.raises(ValueError, match="increasing"):
        LatencyWindow(buckets=(1.0, 0.5))


def _status(w: MqttWatcher) -> dict[str, Any] | None:
    st = w.on("status")
    return st[-1].json() if st else None


@pytest.mark.broker
@pytest.mark.slow
async def test_the_running_service_serves_metrics_that_agree_with_its_status(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    agent = agent_factory().start()
    await watcher.wait_for(
        lambda w: bool((_status(w) or {}).get("metrics", {}).get("address")),
        timeout=30,
        what="the metrics address in the status",
    )
    address = (_status(watcher) or {})["metrics"]["address"]
    assert address.startswith("127.0.0.1:")  # loopback by default
    now = time.time()
    topic = f"{prefix}/streams/mic1/transcript"
    good = [
        {"stream_id": "mic1", "seq": i, "start": now + 5 * i, "end": now + 5 * i + 5,
         "text": text, "lang": "en"}
        for i, text in enumerate(["conveyor running normally", "motor overload on line three"])
    ]  # fmt: skip
    await publish_all(
        broker.port, [*((topic, json.dumps(s).encode()) for s in good), (topic, b"{not json")]
    )
    await watcher.wait_for(lambda w: len(w.alerts()) >= 1, timeout=30, what="the alert")

    def settled(w: MqttWatcher) -> bool:
        st = _status(w) or {}
        return st.get("ingest", {}).get("received") == 3 and st.get("outbox", {}).get("depth") == 0

    await watcher.wait_for(settled, timeout=30, what="the status to show all three payloads")

    m = await scrape(address)
    status = _status(watcher) or {}
    assert sample(m, "edge_agent_segments_received_total") == 3
    assert sample(m, "edge_agent_segments_accepted_total") == 2
    assert sample(m, "edge_agent_segments_rejected_total", reason="invalid_json") == 1
    assert sample(m, "edge_agent_alerts_total", fault="motor_overload") == 1
    assert sample(m, "edge_agent_alert_events_total", type="new") == 1
    assert sample(m, "edge_agent_alerts_active") == 1
    assert sample(m, "edge_agent_stream_active_alerts", stream="mic1") == 1
    assert sample(m, "edge_agent_mqtt_connected") == 1
    assert sample(m, "edge_agent_state", state="running") == 1
    assert sample(m, "edge_agent_state", state="degraded") == 0
    assert sample(m, "edge_agent_queue_capacity", queue="ingest") == 1024
    assert sample(m, "edge_agent_outbox_depth") == 0
    assert sample(m, "edge_agent_llm_enabled") == 0
    host = sample(m, "edge_agent_memory_available_bytes", memory="host")
    assert host is not None and host > 0
    # one source: the same counters as the status snapshot (published after the scrape's
    # counters settled)
    assert status["ingest"]["received"] == sample(m, "edge_agent_segments_received_total")
    assert status["alerts"]["by_fault"]["motor_overload"] == 1
    assert sample(m, "edge_agent_alerts_total", fault="leak") == 0  # the catalogue, at 0

    # the segment-to-alert histogram: one observation, buckets cumulative, +Inf == count
    labels = {"source": "keyword"}
    count = sample(m, "edge_agent_segment_to_alert_seconds_count", **labels)
    total = sample(m, "edge_agent_segment_to_alert_seconds_sum", **labels)
    assert count == 1 and total is not None and 0 < total < 10
    buckets = sorted(
        (float(dict(k[1])["le"]), v)
        for k, v in m.items()
        if k[0] == "edge_agent_segment_to_alert_seconds_bucket" and ("source", "keyword") in k[1]
    )
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert buckets[-1] == (math.inf, 1)
    assert status["alerts"]["segment_to_alert"]["keyword"]["count"] == 1
    assert sample(m, "edge_agent_segment_to_alert_seconds_count", source="llm") == 0

    # anything but GET /metrics is refused and counted; the endpoint goes on serving
    assert (await http_get(address, "/nope")).startswith(b"HTTP/1.0 404")
    assert (await http_get(address, raw=b"POST /metrics HTTP/1.0\r\n\r\n")).startswith(
        b"HTTP/1.0 405"
    )
    assert (await http_get(address, raw=b"GET /" + b"x" * 20000)) == b""  # over the limit
    assert agent.alive
    again = await scrape(address)
    assert sample(again, "edge_agent_segments_received_total") == 3


@pytest.mark.broker
@pytest.mark.slow
async def test_a_taken_port_costs_the_metrics_only(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        agent = agent_factory(f"metrics.port={port}").start()
        await watcher.wait_for(lambda w: _status(w) is not None, timeout=30, what="a status")
        now = time.time()
        segment = {"stream_id": "mic1", "seq": 0, "start": now, "end": now + 5,
                   "text": "emergency stop pressed", "lang": "en"}  # fmt: skip
        await publish_all(
            broker.port, [(f"{prefix}/streams/mic1/transcript", json.dumps(segment).encode())]
        )
        await watcher.wait_for(lambda w: len(w.alerts()) >= 1, timeout=30, what="the alert")
        assert "metrics" not in (_status(watcher) or {})
        await asyncio.to_thread(agent.terminate)
    [failed] = agent.events("metrics.unavailable")
    assert failed["port"] == port
