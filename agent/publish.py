"""The way out: alert events into the outbox, and from it, the status and our transcripts
onto MQTT.

- `AlertWriter` is the keyword stage's `AlertSink` (pipelines.keyword_stage): each batch of
  alert events becomes outbox rows in one transaction with the active alerts it changed,
  goes to `agentctl alerts --follow` clients, and is counted (per type, new ones per hour
  and per day, segment-to-alert latency once durable).
- `Publisher` delivers the outbox in order with QoS 1 (a row leaves the outbox on its
  PUBACK), publishes the retained status every `mqtt.status_interval_s` and at once when
  kicked (a watchdog or supervisor decision, a fleet answer), and the fleet's retained
  answers.
  Each alert event it delivered goes on to an optional `sink` (the Sparkplug node).
- `Transcripts`: the ASR's segments for other consumers (`asr.publish_transcript`), best
  effort and bounded: the alert path never depends on them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import structlog

from agent.control import ControlServer
from agent.errors_report import ErrorReporter
from agent.mqtt import MqttLink, NotConnectedError, PublishRefused, Topics
from agent.outbox import Outbox, PendingEvent
from agent.stats import Stats
from pipelines.alerts import EventType
from pipelines.keyword_stage import AlertBatch
from pipelines.queues import SheddingQueue

__all__ = ["AlertWriter", "Publisher", "Transcripts"]

log = structlog.get_logger(__name__)

_RETRY_S = 1.0
_REFUSED_MAX_S = 60.0  # a refused row is tried again after 1 s, doubling up to this
_ACK_WAIT_S = 60.0  # an acknowledgement waits this long for the broker, then stays in status


class AlertWriter:
    def __init__(
        self,
        outbox: Outbox,
        topics: Topics,
        stats: Stats,
        device_id: Callable[[], str],
        followers: ControlServer | None,
    ) -> None:
        """`followers`: the control socket whose `alerts --follow` clients see every event
        (one that did not start has none)."""
        self._outbox = outbox
        self._topics = topics
        self._stats = stats
        self._device_id = device_id
        self._followers = followers
        self._new_alerts: deque[float] = deque()  # times of `new` events in the last hour
        self._today: tuple[str, int] = (time.strftime("%Y-%m-%d"), 0)

    async def commit(self, batch: AlertBatch) -> None:
        pending = []
        for event in batch.events:
            body = {**event.payload(), "device_id": self._device_id()}
            pending.append(
                PendingEvent(
                    self._topics.alerts,
                    json.dumps(body, ensure_ascii=False).encode(),
                    event.type.value,
                )
            )
            self._stats.alert_events[event.type.value] += 1
            self._stats.alert_verdict(
                event.alert, reviewed=event.reviewed, ended=event.type is EventType.end
            )
            if event.type is EventType.new:
                self._new_alerts.append(time.monotonic())
                today = time.strftime("%Y-%m-%d")
                day, count = self._today
                self._today = (today, count + 1 if day == today else 1)
            if self._followers is not None:
                self._followers.publish(body)
            log.info(
                "alert.event",
                type=event.type.value,
                alert_id=event.alert_id,
                stream_id=event.alert["stream_id"],
                fault=event.alert["fault"],
                count=event.alert["count"],
                seq=event.seq,
            )
        await self._outbox.append(
            pending,
            batch.upserts,
            batch.deletes,
            batch.standing_upserts,
            batch.standing_deletes,
        )
        for event in batch.events:  # timed once durable: from here the publisher delivers them
            if event.type is EventType.new:
                alert = event.alert
                seq = alert["evidence"][-1]["seq"] if alert["evidence"] else None
                self._stats.alert_raised(alert["stream_id"], seq, alert["fault"], alert["source"])

    def alerts_last_hour(self) -> int:
        cutoff = time.monotonic() - 3600
        while self._new_alerts and self._new_alerts[0] < cutoff:
            self._new_alerts.popleft()
        return len(self._new_alerts)

    def alerts_today(self) -> int:
        day, count = self._today
        return count if day == time.strftime("%Y-%m-%d") else 0


class Transcripts:
    """Our transcripts for other consumers: a bounded queue that drops, and counts, what
    it cannot hold or send."""

    def __init__(self) -> None:
        self._queue: SheddingQueue[tuple[str, bytes]] = SheddingQueue(256)
        self.published = self.dropped = 0

    def put(self, topic: str, body: bytes) -> None:
        if self._queue.put((topic, body)) is not None:
            self.dropped += 1

    async def run(self, link: MqttLink) -> None:
        while True:
            topic, body = await self._queue.get()
            try:
                await link.publish(topic, body, qos=1)
                self.published += 1
            except NotConnectedError:  # best effort: the alert path does not depend on it
                self.dropped += 1


class Publisher:
    def __init__(
        self,
        link: MqttLink,
        topics: Topics,
        outbox: Outbox,
        stats: Stats,
        *,
        status: Callable[[str], bytes],
        status_interval_s: Callable[[], float],
        errors: ErrorReporter | None = None,
    ) -> None:
        """`status`: the retained status payload now, for a state ("running", "stopped");
        `status_interval_s`: the configured interval (asked each round: a fleet apply may
        change it)."""
        self._link = link
        self._topics = topics
        self._outbox = outbox
        self._stats = stats
        self._status = status
        self._interval_s = status_interval_s
        self._errors = errors
        self.kick = asyncio.Event()  # set: publish the status now
        # Told of each alert event once the broker acknowledged it, in outbox order (the
        # Sparkplug node's bounded queue, agent/sparkplug/node.py); must not block.
        self.sink: Callable[[bytes], None] | None = None
        self.sink_failures = 0  # the sink raised (a bug, in the log with its trace)
        self.status_failures = 0  # snapshots that raised (a bug, in the log with its trace)

    async def run_outbox(self) -> None:
        outbox, link = self._outbox, self._link
        refusals = 0  # in a row: the backoff of a broker that keeps refusing
        while True:
            outbox.changed.clear()
            rows = await outbox.peek()
            if not rows:
                await outbox.changed.wait()
                continue
            await link.connected.wait()
            for row in rows:
                try:
                    await link.publish(row.topic, row.payload, qos=1)
                except PublishRefused as exc:
                    refusals += 1
                    await self._refused(row.topic, len(row.payload), exc, refusals)
                    break  # the same row again, in order: nothing behind it overtakes it
                except NotConnectedError as exc:
                    self._stats.publish_failures += 1
                    log.warning("outbox.publish_deferred", error=str(exc), pending=outbox.depth)
                    if link.connected.is_set():
                        # No PUBACK in time on a live link (a slow or stalled broker): try
                        # the same row again shortly; a redelivery is deduplicated by id+seq.
                        await asyncio.sleep(_RETRY_S)
                    else:
                        await link.wait_disconnected()
                    break
                refusals = 0
                await outbox.ack(row.id)
                self._stats.published += 1
                if self.sink is not None and row.topic == self._topics.alerts:
                    self._to_sink(row.payload)

    def _to_sink(self, payload: bytes) -> None:
        """The published event to the sink; a sink that raises never stops delivery."""
        assert self.sink is not None
        try:
            self.sink(payload)
        except Exception:
            self.sink_failures += 1
            log.exception("outbox.sink_failed", failures=self.sink_failures)

    async def _refused(self, topic: str, size: int, exc: PublishRefused, n: int) -> None:
        """A refused alert: counted by reason, said in status, the log and on
        `<prefix>/errors`; the row stays, tried again after a backoff."""
        reason = f"0x{exc.reason_code:02x} {exc.reason}"
        self._stats.publish_refused[exc.reason] += 1
        self._stats.last_publish_refusal = f"{topic}: {reason}"
        delay = min(_REFUSED_MAX_S, _RETRY_S * 2 ** (n - 1))
        log.error("outbox.publish_refused", topic=topic, reason=reason, retry_in_s=delay,
                  pending=self._outbox.depth)  # fmt: skip
        if self._errors is not None:
            self._errors.report(topic, "publish_refused", size, reason)
        self.kick.set()  # the status says so now
        await asyncio.sleep(delay)

    async def drain_outbox(self, limit_s: float) -> None:
        """Until the outbox is empty, the link is down or `limit_s` passed (what remains
        stays on disk for the next start)."""
        deadline = time.monotonic() + limit_s
        while self._outbox.depth and self._link.connected.is_set() and time.monotonic() < deadline:
            await asyncio.sleep(0.02)

    async def publish_status(self, state: str = "running") -> None:
        """The retained status now. A snapshot that fails to build (a bug, or a state file
        the status model refuses) is logged and counted, and the service goes on: the next
        round, or the shutdown, is not stopped by it."""
        try:
            payload = self._status(state)
        except Exception:
            self.status_failures += 1
            log.exception("status.build_failed", state=state, failures=self.status_failures)
            return
        with contextlib.suppress(NotConnectedError):  # the next round publishes again
            await self._link.publish(self._topics.status, payload, retain=True)

    async def run_status(self) -> None:
        while True:
            await self._link.connected.wait()
            self.kick.clear()
            await self.publish_status()
            # Every interval, and at once after a watchdog or supervisor decision.
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self.kick.wait(), self._interval_s())

    async def publish_ack(self, body: dict[str, Any]) -> bool:
        """A fleet answer, retained, so a fleet tool sees each device's last answer
        whenever it looks. False where the broker was not reached within `_ACK_WAIT_S`
        (the answer then stands only in the status's `fleet.last`)."""
        payload = json.dumps(body, ensure_ascii=False).encode()
        try:
            await asyncio.wait_for(self._link.connected.wait(), _ACK_WAIT_S)
            await self._link.publish(self._topics.config_ack, payload, retain=True)
        except (NotConnectedError, asyncio.TimeoutError):
            return False
        finally:
            self.kick.set()
        return True
