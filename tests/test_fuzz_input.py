"""Fuzzing the input boundary: hypothesis-generated hostile payloads on every subscribed
topic (transcripts, audio with odd MQTT 5 properties, fleet documents) and on the control
socket, against the real service and a real mosquitto. No payload stops it; every one is
counted in the status; afterwards the service still alerts on a plain segment. A bounded
count here; `python -m bench.chaos.bench_chaos --fuzz 10000` is the long run."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.devbroker import DevBroker
from bench.chaos.payloads import Target, counted, payloads, send
from pipelines.compat import timeout
from tests.helpers import AgentProcess

pytestmark = [pytest.mark.broker, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[1]
SENT: Counter[str] = Counter()


class Fuzzed:
    def __init__(self, broker: DevBroker, agent: AgentProcess, prefix: str, sock: Path) -> None:
        self.broker, self.agent, self.prefix = broker, agent, prefix
        self.target = Target(broker.port, prefix, sock)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fuzzed]:
    work = tmp_path_factory.mktemp("fuzz")
    prefix = f"fuzz/{uuid.uuid4().hex[:8]}"
    sock = Path(f"/tmp/ea-{uuid.uuid4().hex[:10]}.sock")
    (work / "broker").mkdir()
    (work / "keys").mkdir()
    with DevBroker(workdir=work / "broker") as broker:
        agent = AgentProcess(
            REPO / "configs" / "agent.yaml",
            [
                f"mqtt.port={broker.port}",
                f"mqtt.topic_prefix={prefix}",
                f"outbox.path={work / 'outbox.sqlite'}",
                f"control.socket_path={sock}",
                "llm.enabled=false",
                "metrics.enabled=false",
                "mqtt.status_interval_s=1",
                "mqtt.errors_per_minute=100000",
                "fleet.enabled=true",
                "fleet.groups=[fz]",
                f"fleet.trusted_keys_dir={work / 'keys'}",
            ],
            work / "agent.log",
        ).start()
        asyncio.run(_wait_online(broker.port, prefix))
        yield Fuzzed(broker, agent, prefix, sock)
        agent.kill()


async def _wait_online(port: int, prefix: str) -> None:
    async with aiomqtt.Client("127.0.0.1", port) as c:
        await c.subscribe(f"{prefix}/available", qos=1)
        async with timeout(60):
            async for msg in c.messages:
                if msg.payload == b"online":
                    return


@settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow,
                           HealthCheck.data_too_large],
)  # fmt: skip
@given(batch=st.lists(payloads(), min_size=1, max_size=12))
def test_hostile_payloads_on_every_input(
    fuzzed: Fuzzed, batch: list[tuple[str, bytes, list[tuple[str, str]]]]
) -> None:
    asyncio.run(send(fuzzed.target, batch, SENT))
    assert fuzzed.agent.alive, "the service stopped"


def test_every_payload_was_counted_and_the_service_still_alerts(fuzzed: Fuzzed) -> None:
    assert sum(SENT.values()) > 0

    async def check() -> dict[str, Any]:
        now = time.time()
        body = {"stream_id": "fz2", "seq": 1, "start": now - 3, "end": now,
                "text": "the motor is overloaded, motor overload alarm"}  # fmt: skip
        async with aiomqtt.Client("127.0.0.1", fuzzed.broker.port) as c:
            await c.subscribe(f"{fuzzed.prefix}/#", qos=1)
            await c.publish(f"{fuzzed.prefix}/streams/fz2/transcript", json.dumps(body), qos=1)
            status: dict[str, Any] = {}
            alerted = False
            deadline = time.monotonic() + 120
            async for msg in c.messages:
                topic = msg.topic.value
                if topic.endswith("/alerts") and b"fz2" in bytes(msg.payload):  # type: ignore[arg-type]
                    alerted = True
                elif topic.endswith("/status"):
                    status = json.loads(bytes(msg.payload))  # type: ignore[arg-type]
                    if alerted and counted(status, SENT, extra_transcripts=1):
                        return status
                if time.monotonic() > deadline:
                    raise AssertionError(f"not all counted or no alert: {SENT}, {status}")
        raise AssertionError("subscription ended")

    status = asyncio.run(check())
    assert fuzzed.agent.alive and status["state"] == "running"
    ingest = status["ingest"]
    assert ingest["accepted"] + sum(ingest["rejected"].values()) == ingest["received"]
    assert "internal_error" not in ingest["rejected"], ingest["rejected"]
