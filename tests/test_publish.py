"""agent.publish's status task against a real broker: a status that fails to build (a bug in
a producer, or a snapshot the status model refuses) is logged and counted, and the next
round publishes; the service is not stopped by it."""

from __future__ import annotations

import json
from pathlib import Path

import aiomqtt
import pytest
from structlog.testing import capture_logs

from agent.config.models import MqttSettings
from agent.devbroker import DevBroker
from agent.mqtt import Ack, MqttLink, Topics
from agent.outbox import Outbox
from agent.publish import Publisher
from agent.stats import Stats
from pipelines.compat import TaskGroup
from tests.helpers import MqttWatcher

pytestmark = [pytest.mark.broker]


async def test_a_status_that_fails_to_build_is_logged_and_the_next_round_publishes(
    broker: DevBroker, prefix: str, watcher: MqttWatcher, tmp_path: Path
) -> None:
    topics, stats = Topics(prefix), Stats()

    def on_message(_message: aiomqtt.Message, ack: Ack) -> None:
        ack()

    link = MqttLink(
        MqttSettings(port=broker.port, topic_prefix=prefix, client_id="pub-test"),
        None,
        topics,
        on_message,  # nothing is published to the prefix's input topics here
        stats,
    )
    rounds = 0

    def status(state: str) -> bytes:
        nonlocal rounds
        rounds += 1
        if rounds == 1 or state == "stopped":
            raise ValueError("a producer's bug")
        return json.dumps({"round": rounds, "state": state}).encode()

    publisher = Publisher(
        link,
        topics,
        Outbox(tmp_path / "outbox.sqlite", max_events=10),
        stats,
        status=status,
        status_interval_s=lambda: 0.05,
    )
    with capture_logs() as logs:
        async with TaskGroup() as tg:
            tasks = [tg.create_task(link.run()), tg.create_task(publisher.run_status())]
            await watcher.wait_for(lambda w: bool(w.on("status")), what="a status after the bug")
            for task in tasks:
                task.cancel()
        # The shutdown's last status (Daemon.run) goes the same way: logged, not raised.
        await publisher.publish_status("stopped")
    assert publisher.status_failures == 2
    first = watcher.on("status")[0].json()
    assert first["round"] >= 2 and first["state"] == "running"
    failed = [e for e in logs if e["event"] == "status.build_failed"]
    assert [(e["state"], e["failures"]) for e in failed] == [("running", 1), ("stopped", 2)]
