"""A publish the broker refuses is not a delivery (real mosquitto with an ACL, MQTT 5).

mosquitto answers a PUBLISH to a topic its ACL does not let us write with PUBACK 0x87 (Not
authorized). The outbox row must stay, be counted by reason and reported on
`<prefix>/errors`, and go out once the ACL lets it."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import aiomqtt
import pytest

from agent.config.models import MqttSettings
from agent.devbroker import DevBroker
from agent.errors_report import ErrorReporter
from agent.mqtt import Ack, MqttLink, Topics
from agent.outbox import Outbox, PendingEvent
from agent.publish import Publisher
from agent.stats import Stats
from pipelines.compat import TaskGroup
from tests.helpers import MqttWatcher, until

pytestmark = [
    pytest.mark.broker,
    pytest.mark.skipif(shutil.which("mosquitto") is None, reason="needs mosquitto"),
]
PREFIX = "acl/line3"
# Anonymous clients (ours and the watcher) may read everything under the prefix and write
# the availability and the errors, not the alerts; ALLOWED adds them.
DENIED = f"topic read {PREFIX}/#\ntopic write {PREFIX}/available\ntopic write {PREFIX}/errors\n"
ALLOWED = DENIED + f"topic write {PREFIX}/alerts\n"


async def test_a_refused_alert_stays_in_the_outbox_until_the_broker_takes_it(
    tmp_path: Path,
) -> None:
    (tmp_path / "broker").mkdir()
    broker = DevBroker(workdir=tmp_path / "broker", acl=DENIED).start()
    try:
        topics, stats = Topics(PREFIX), Stats()
        outbox = Outbox(tmp_path / "outbox.sqlite", 10)
        await outbox.open()

        def on_message(_m: aiomqtt.Message, ack: Ack) -> None:
            ack()

        link = MqttLink(
            MqttSettings(port=broker.port, topic_prefix=PREFIX, client_id="acl-test", protocol="5"),
            None, topics, on_message, stats,
        )  # fmt: skip
        errors = ErrorReporter(topics.errors, 60, stats)
        publisher = Publisher(link, topics, outbox, stats, status=lambda _s: b"{}",
                              status_interval_s=lambda: 60.0, errors=errors)  # fmt: skip
        body = json.dumps({"type": "new", "seq": 1, "alert": {"id": "a1"}}).encode()
        await outbox.append([PendingEvent(topics.alerts, body, "new")])
        watcher = MqttWatcher(broker.port, PREFIX)
        await watcher.start()
        async with TaskGroup() as tg:
            tasks = [tg.create_task(link.run()), tg.create_task(publisher.run_outbox()),
                     tg.create_task(errors.run(link))]  # fmt: skip
            await until(lambda: sum(stats.publish_refused.values()) >= 2, "two refusals", 20)
            assert set(stats.publish_refused) == {"Not authorized"}
            assert outbox.depth == 1 and stats.published == 0  # kept, not counted delivered
            assert "0x87" in (stats.last_publish_refusal or "")
            await watcher.wait_for(lambda w: bool(w.on("errors")), what="the error event")
            event = watcher.on("errors")[0].json()
            assert (event["reason"], event["topic"]) == ("publish_refused", topics.alerts)
            broker.set_acl(ALLOWED)
            await watcher.wait_for(lambda w: bool(w.alerts()), what="the alert, once allowed")
            await until(lambda: outbox.depth == 0, "the row acknowledged", 20)
            assert stats.published == 1
            for task in tasks:
                task.cancel()
        await watcher.stop()
        await outbox.close()
    finally:
        broker.stop()
