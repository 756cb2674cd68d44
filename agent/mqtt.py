"""The broker connection: connect, announce, subscribe, receive; reconnect with jitter.

One `MqttLink` owns the aiomqtt client. It keeps a persistent session (fixed client id;
MQTT 5: clean start off and a session expiry, 3.1.1: clean_session off) so the broker
holds our QoS 1 input while we are away, sets
`<prefix>/available` to `online` on every connect with `offline` as the last will, and
`stopped` on a clean close. Publishing waits for the broker's PUBACK (aiomqtt 2.x resolves
a QoS 1 publish on it), which is what lets the outbox delete a row; a PUBACK with a failure
reason code is a refusal (agent/mqtt_client.py), not a delivery.

Reconnects use tenacity's full-jitter exponential backoff: after a broker restart a fleet
of devices spreads its reconnects instead of arriving at once.

Input is acknowledged by us, not by paho: paho's manual acknowledgement is on, and every
message reaches `on_message` with an `Ack` that the daemon settles once the message's
effect is durable (its alert events committed to the outbox, a clip transcribed and its
segments processed) or the message is refused. Until then the broker keeps it and
redelivers it to the next session: a SIGKILL loses nothing the broker was told we received.
An `Ack` of a session that has ended does nothing (the broker redelivers that message).
MQTT 5's Receive Maximum (the ingest queue's size) bounds how many the broker sends unacked.
"""

from __future__ import annotations

import asyncio
import socket
import ssl
import time
from collections.abc import Callable, Sequence
from typing import Any

import aiomqtt
import structlog
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from agent.config.models import MqttSettings
from agent.mqtt_client import BrokerRefused, Client
from agent.stats import Stats
from pipelines.compat import timeout

__all__ = ["Ack", "MqttLink", "NotConnectedError", "PublishRefused", "Topics"]

log = structlog.get_logger(__name__)


class NotConnectedError(Exception):
    """No broker connection right now; the caller keeps its data and retries later."""


class PublishRefused(NotConnectedError):
    """The broker answered the publish with a failure reason code (MQTT 5): not delivered.
    A NotConnectedError too, so a best-effort publisher treats it as a failed send; the
    outbox tells it apart (it keeps the row and backs off)."""

    def __init__(self, topic: str, reason_code: int, reason: str) -> None:
        self.topic = topic
        self.reason_code = reason_code
        self.reason = reason
        super().__init__(f"publish to {topic} refused: 0x{reason_code:02x} {reason}")


class Topics:
    """Every topic of the contract (docs/mqtt.md), from one prefix."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.transcript_filter = f"{prefix}/streams/+/transcript"
        self.audio_filter = f"{prefix}/streams/+/audio"
        self.alerts = f"{prefix}/alerts"
        self.available = f"{prefix}/available"
        self.status = f"{prefix}/status"
        self.errors = f"{prefix}/errors"
        self.config_ack = f"{prefix}/config/ack"

    def transcript_stream(self, topic: str) -> str | None:
        """The stream id of a transcript topic, or None for any other topic."""
        return self._stream_of(topic, "/transcript")

    def audio_stream(self, topic: str) -> str | None:
        """The stream id of an audio topic, or None for any other topic."""
        return self._stream_of(topic, "/audio")

    def asr_transcript(self, stream_id: str) -> str:
        """Where our own transcripts of a stream's audio go (not matched by the transcript
        filter: `+` is one level, so we never read back what we publish)."""
        return f"{self.prefix}/streams/{stream_id}/transcript/asr"

    def _stream_of(self, topic: str, suffix: str) -> str | None:
        head = f"{self.prefix}/streams/"
        if not (topic.startswith(head) and topic.endswith(suffix)):
            return None
        stream = topic[len(head) : -len(suffix)]
        return stream if stream and "/" not in stream else None


class Ack:
    """Acknowledges one received message to the broker, once, on the session it came on."""

    __slots__ = ("_client", "_link", "_mid", "_qos", "_session", "settled")

    def __init__(self, link: MqttLink, client: Any, mid: int, qos: int, session: int) -> None:
        self._link, self._client = link, client
        self._mid, self._qos, self._session = mid, qos, session
        self.settled = False

    def __call__(self) -> None:
        if self.settled:
            return
        self.settled = True
        if self._qos == 0:
            return
        if self._session != self._link.session or not self._link.connected.is_set():
            self._link.stale_acks += 1  # the broker redelivers it to the session we have now
            return
        self._client.ack(self._mid, self._qos)
        self._link.acked += 1


class _SessionLost(Exception):
    """A connection that had been up for a while dropped: start the backoff afresh."""


_HEALTHY_SESSION_S = 30.0


class MqttLink:
    def __init__(
        self,
        settings: MqttSettings,
        password: str | None,
        topics: Topics,
        on_message: Callable[[aiomqtt.Message, Ack], None],
        stats: Stats,
        *,
        audio: bool = False,
        extra_filters: Sequence[str] = (),
        on_error: Callable[[aiomqtt.Message, Exception], None] | None = None,
        receive_maximum: int = 1024,
    ) -> None:
        """`audio`: subscribe to the streams' audio topics too (asr.enabled);
        `extra_filters`: more subscriptions (the fleet's document topics);
        `on_error`: told of an exception `on_message` raised (a bug: a payload we refuse
        is the callback's business). The link logs and counts it either way, settles the
        message's `Ack` and serves the next message: one message must never end the
        connection or the service. `on_message` must settle every `Ack` it is given,
        now or later. `receive_maximum`: MQTT 5's bound on unacknowledged input."""
        self._settings = settings
        self._password = password
        self._topics = topics
        self._on_message = on_message
        self._on_error = on_error
        self._stats = stats
        self._filters = [
            topics.transcript_filter,
            *([topics.audio_filter] if audio else []),
            *extra_filters,
        ]
        self._client: aiomqtt.Client | None = None
        self._receive_maximum = max(1, min(receive_maximum, 65535))
        self.session = 0  # numbers the connections; an Ack belongs to one
        self.acked = 0
        self.stale_acks = 0
        self.broker = f"{settings.host}:{settings.port}"
        self.last_error: str | None = None  # why the link is down, for status
        self._down_since: float | None = time.monotonic()
        self.connected = asyncio.Event()
        self._disconnected = asyncio.Event()
        self._disconnected.set()

    # -- connection ---------------------------------------------------------------------

    def _make_client(self) -> Client:
        s = self._settings
        tls_params = None
        if s.tls.enabled:
            tls_params = aiomqtt.TLSParameters(
                ca_certs=str(s.tls.ca_file) if s.tls.ca_file else None,
                certfile=str(s.tls.cert_file) if s.tls.cert_file else None,
                keyfile=str(s.tls.key_file) if s.tls.key_file else None,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        session: dict[str, Any]
        if s.protocol == "5":
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = s.session_expiry_s
            props.ReceiveMaximum = self._receive_maximum
            session = {
                "protocol": aiomqtt.ProtocolVersion.V5,
                "clean_start": False,
                "properties": props,
            }
        else:
            session = {"protocol": aiomqtt.ProtocolVersion.V311, "clean_session": False}
        client = Client(
            s.host,
            s.port,
            identifier=s.client_id,
            username=s.username,
            password=self._password,
            keepalive=s.keepalive_s,
            **session,
            will=aiomqtt.Will(self._topics.available, b"offline", qos=1, retain=True),
            tls_params=tls_params,
            tls_insecure=s.tls.insecure if s.tls.enabled else None,
            timeout=s.publish_timeout_s,
            # Small packets both ways (PUBACK, then an alert): with Nagle on, the alert
            # waits for the ACK of the PUBACK, which delayed ACK holds for 40 ms.
            socket_options=((socket.IPPROTO_TCP, socket.TCP_NODELAY, 1),),
        )
        # We acknowledge input ourselves, once it is durable (the module docstring). aiomqtt
        # 2.x does not expose paho's option; its paho client is `_client`.
        client._client.manual_ack_set(True)
        return client

    async def run(self) -> None:
        """Stay connected until cancelled; never returns otherwise."""
        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(aiomqtt.MqttError),
                wait=wait_random_exponential(
                    multiplier=self._settings.reconnect_min_s, max=self._settings.reconnect_max_s
                ),
                before_sleep=self._reconnect_wait,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await self._session()
            except _SessionLost:
                await asyncio.sleep(self._settings.reconnect_min_s)

    def _reconnect_wait(self, rs: Any) -> None:
        error = str(rs.outcome.exception()) if rs.outcome else None
        self.last_error = error
        log.warning(
            "mqtt.reconnect_wait",
            broker=self.broker,
            attempt=rs.attempt_number,
            delay_s=round(rs.next_action.sleep, 2) if rs.next_action else None,
            error=error,
        )

    def disconnected_s(self) -> float | None:
        """Seconds since the link went down (since start, before the first connect)."""
        if self._down_since is None:
            return None
        return round(time.monotonic() - self._down_since, 1)

    async def _session(self) -> None:
        client = self._make_client()
        try:
            async with client:
                began = time.monotonic()
                self._client = client
                self.session += 1
                for topic_filter in self._filters:
                    await client.subscribe(topic_filter, qos=1)
                # `online` only once subscribed: a publisher that waits for it cannot send
                # into a first session that does not hold its subscription yet.
                await client.publish(self._topics.available, b"online", qos=1, retain=True)
                self._stats.mqtt_connected = True
                self._stats.mqtt_connects += 1
                self._disconnected.clear()
                self.connected.set()
                self.last_error = None
                self._down_since = None
                log.info(
                    "mqtt.connected",
                    host=self._settings.host,
                    port=self._settings.port,
                    client_id=self._settings.client_id,
                )
                try:
                    async for message in client.messages:
                        self._deliver(client, message)
                except aiomqtt.MqttError as exc:
                    self.last_error = f"connection lost: {exc}"
                    log.warning("mqtt.connection_lost", broker=self.broker, error=str(exc))
                    if time.monotonic() - began >= _HEALTHY_SESSION_S:
                        raise _SessionLost from exc
                    raise
        finally:
            if self._client is client:
                self._client = None
            if self.connected.is_set():
                self._stats.mqtt_disconnects += 1
                self._down_since = time.monotonic()
            self._stats.mqtt_connected = False
            self.connected.clear()
            self._disconnected.set()

    def _deliver(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        """One message to the callback, inside its own guard."""
        ack = Ack(self, client._client, message.mid, message.qos, self.session)
        try:
            self._on_message(message, ack)
        except Exception as exc:  # contained here, reported below
            ack()  # refused by a bug of ours: redelivering it would only repeat the bug
            self._stats.rejected["internal_error"] += 1
            log.exception("mqtt.message_failed", topic=message.topic.value)
            if self._on_error is not None:
                try:
                    self._on_error(message, exc)
                except Exception:  # the report of a failure must not fail us
                    log.exception("mqtt.message_error_report_failed")

    # -- publishing ---------------------------------------------------------------------

    async def publish(
        self, topic: str, payload: bytes, *, qos: int = 1, retain: bool = False
    ) -> None:
        """Publish and, for QoS 1, return only after the broker's PUBACK.

        Raises:
            NotConnectedError: no connection, or it failed during the publish.
            PublishRefused: the broker answered with a failure reason code (MQTT 5).
        """
        client = self._client
        if client is None or not self.connected.is_set():
            raise NotConnectedError(f"not connected to {self._settings.host}:{self._settings.port}")
        try:
            async with timeout(self._settings.publish_timeout_s):
                await client.publish(topic, payload, qos=qos, retain=retain)
        except BrokerRefused as exc:
            raise PublishRefused(topic, exc.reason_code, exc.reason) from exc
        except (aiomqtt.MqttError, TimeoutError) as exc:
            raise NotConnectedError(f"publish to {topic} failed: {exc!r}") from exc

    async def wait_disconnected(self) -> None:
        await self._disconnected.wait()

    async def announce_stopped(self) -> None:
        """Set `available` to `stopped` (retained) before a clean disconnect."""
        try:
            await self.publish(self._topics.available, b"stopped", retain=True)
        except NotConnectedError as exc:
            log.warning("mqtt.stopped_not_announced", error=str(exc))
