"""The Sparkplug B edge node: its own MQTT client, births, data, deaths and rebirths.

- One aiomqtt client of its own (`sparkplug.client_id`), a clean session (MQTT 5: clean
  start, session expiry 0; 3.1.1: clean session), the will an NDEATH (QoS 1, not retained)
  carrying the session's bdSeq, taken from disk and advanced before each CONNECT.
- On every connect: subscribe to `NCMD`, then the NBIRTH (QoS 0, seq 0, the same bdSeq,
  `Node Control/Rebirth`), then a DBIRTH per known device (stream).
- Each alert event the service published (`offer`, from agent/publish.py: in outbox order,
  after its PUBACK) updates the device's alarms; when connected it becomes a DDATA of the
  fault's folder, after the device's DBIRTH (first DDATA of a device, or a fault its DBIRTH
  did not have: DDEATH and DBIRTH again). Every message after the NBIRTH takes the next
  `seq` (agent.sparkplug.sequence), under one lock, so the order on the wire is the order
  of the numbers.
- An NCMD `Node Control/Rebirth` = true: a new NBIRTH (seq 0 again, same bdSeq: the session
  is the same) and every DBIRTH. A malformed NCMD is counted, logged and ignored.
- Reconnects with tenacity's jittered exponential backoff (as agent/mqtt.py); a clean stop
  publishes the NDEATH itself before disconnecting (a DISCONNECT suppresses the will).
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
import structlog
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from tenacity import AsyncRetrying, retry_if_exception_type, wait_random_exponential

from agent.config.models import MqttSettings, SparkplugSettings
from agent.sparkplug import payloads
from agent.sparkplug.devices import Change, Device, DeviceTable
from agent.sparkplug.payloads import FaultInfo, MalformedCommand
from agent.sparkplug.sequence import BdSeqStore, SeqCounter
from agent.sparkplug.topics import SparkplugTopics, sparkplug_id
from pipelines.queues import SheddingQueue

__all__ = ["NodeIdentity", "SparkplugNode"]

log = structlog.get_logger(__name__)

_HEALTHY_SESSION_S = 30.0


class _SessionLost(Exception):
    """A connection that had been up for a while dropped: start the backoff afresh."""


@dataclass(frozen=True)
class NodeIdentity:
    group_id: str
    edge_node_id: str
    client_id: str
    host: str
    port: int

    @classmethod
    def of(cls, sp: SparkplugSettings, mqtt: MqttSettings, device_id: str) -> NodeIdentity:
        return cls(
            group_id=sp.group_id,
            edge_node_id=sp.edge_node_id or sparkplug_id(device_id),
            client_id=sp.client_id or f"{mqtt.client_id}-spb"[:64],
            host=sp.host or mqtt.host,
            port=sp.port or mqtt.port,
        )


class SparkplugNode:
    def __init__(
        self,
        identity: NodeIdentity,
        mqtt: MqttSettings,
        password: str | None,
        *,
        state_path: Path,
        faults: Callable[[], Sequence[FaultInfo]],
        properties: Mapping[str, str],
        queue_size: int = 1024,
    ) -> None:
        """`mqtt`: the service's broker settings (credentials, TLS, protocol, keep-alive,
        backoff); `state_path`: the bdSeq file; `faults`: the catalogue now;
        `properties`: the NBIRTH's `Properties/<name>` strings."""
        self.identity = identity
        self.topics = SparkplugTopics(identity.group_id, identity.edge_node_id)
        self._mqtt = mqtt
        self._password = password
        self._properties = dict(properties)
        self.bdseq = BdSeqStore(state_path)
        self.seq = SeqCounter()
        self.table = DeviceTable(faults)
        self._queue: SheddingQueue[bytes] = SheddingQueue(queue_size)
        self._lock = asyncio.Lock()  # one message at a time: seq order is wire order
        self._client: aiomqtt.Client | None = None
        self._stopping = False
        self._busy = False  # an event taken from the queue and not yet sent
        self.connected = asyncio.Event()
        # counters (status.sparkplug)
        self.dropped = 0  # events shed from the full queue
        self.invalid_events = 0  # an offered payload that is not an alert event (a bug)
        self.births = 0  # NBIRTHs
        self.rebirths = 0  # NBIRTHs a host asked for
        self.messages = 0  # everything published
        self.commands_malformed = 0
        self.connects = 0
        self.last_error: str | None = None

    # -- input: the publisher's sink ------------------------------------------------------

    def offer(self, payload: bytes) -> None:
        """One published alert event (its JSON), never blocking: a full queue drops its
        oldest event, counted (that fault's metrics stay as last sent until its next event)."""
        if self._queue.put(payload) is not None:
            self.dropped += 1
            log.warning("sparkplug.event_dropped", dropped=self.dropped)

    def seed(self, alerts: Iterable[Mapping[str, Any]]) -> None:
        """The alarms on the list at start, so the first births show them."""
        self.table.seed(alerts)

    # -- the tasks --------------------------------------------------------------------------

    async def run(self) -> None:
        """The connection and the event worker, until cancelled."""
        events = asyncio.create_task(self._events(), name="sparkplug.events")
        try:
            await self._connection()
        finally:
            events.cancel()
            await asyncio.wait([events])

    async def stop(self) -> None:
        """A clean stop: the NDEATH (QoS 1, waited for), and nothing after it. The caller
        then cancels `run`, whose DISCONNECT keeps the broker from sending the will."""
        async with self._lock:
            self._stopping = True
            client = self._client
            bdseq = self.bdseq.current
            if client is None or bdseq is None or not self.connected.is_set():
                return
            try:
                await client.publish(self.topics.ndeath, payloads.ndeath(bdseq), qos=1)
                self.messages += 1
                log.info("sparkplug.ndeath", bdseq=bdseq)
            except aiomqtt.MqttError as exc:  # the will says it instead
                log.warning("sparkplug.ndeath_failed", error=str(exc))

    async def drain(self, limit_s: float) -> None:
        """Until the queued events are sent, the link is down or `limit_s` passed."""
        deadline = time.monotonic() + limit_s
        while (
            (len(self._queue) or self._busy)
            and self.connected.is_set()
            and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.02)

    async def _connection(self) -> None:
        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(aiomqtt.MqttError),
                wait=wait_random_exponential(
                    multiplier=self._mqtt.reconnect_min_s, max=self._mqtt.reconnect_max_s
                ),
                before_sleep=self._reconnect_wait,
            )
            try:
                async for attempt in retrying:
                    with attempt:
                        await self._session()
            except _SessionLost:
                await asyncio.sleep(self._mqtt.reconnect_min_s)

    def _reconnect_wait(self, rs: Any) -> None:
        error = str(rs.outcome.exception()) if rs.outcome else None
        self.last_error = error
        log.warning(
            "sparkplug.reconnect_wait",
            broker=f"{self.identity.host}:{self.identity.port}",
            attempt=rs.attempt_number,
            delay_s=round(rs.next_action.sleep, 2) if rs.next_action else None,
            error=error,
        )

    def _client_for(self, bdseq: int) -> aiomqtt.Client:
        s, ident = self._mqtt, self.identity
        tls_params = None
        if s.tls.enabled:
            tls_params = aiomqtt.TLSParameters(
                ca_certs=str(s.tls.ca_file) if s.tls.ca_file else None,
                certfile=str(s.tls.cert_file) if s.tls.cert_file else None,
                keyfile=str(s.tls.key_file) if s.tls.key_file else None,
                cert_reqs=ssl.CERT_REQUIRED,
            )
        session: dict[str, Any]
        if s.protocol == "5":  # Sparkplug 3.0: clean start, session expiry 0
            props = Properties(PacketTypes.CONNECT)  # type: ignore[no-untyped-call]
            props.SessionExpiryInterval = 0
            session = {
                "protocol": aiomqtt.ProtocolVersion.V5,
                "clean_start": True,
                "properties": props,
            }
        else:
            session = {"protocol": aiomqtt.ProtocolVersion.V311, "clean_session": True}
        return aiomqtt.Client(
            ident.host,
            ident.port,
            identifier=ident.client_id,
            username=s.username,
            password=self._password,
            keepalive=s.keepalive_s,
            **session,
            will=aiomqtt.Will(self.topics.ndeath, payloads.ndeath(bdseq), qos=1, retain=False),
            tls_params=tls_params,
            tls_insecure=s.tls.insecure if s.tls.enabled else None,
            timeout=s.publish_timeout_s,
        )

    async def _session(self) -> None:
        if self._stopping:
            await asyncio.Event().wait()  # stopped: no new session, until cancelled
        bdseq = await self.bdseq.advance()  # on disk before the CONNECT that uses it
        client = self._client_for(bdseq)
        try:
            async with client:
                began = time.monotonic()
                await client.subscribe(self.topics.ncmd, qos=1)
                async with self._lock:
                    if self._stopping:
                        return
                    self._client = client
                    await self._birth(client, bdseq)
                    self.connected.set()
                self.connects += 1
                self.last_error = None
                log.info(
                    "sparkplug.connected",
                    client_id=self.identity.client_id,
                    group_id=self.identity.group_id,
                    edge_node_id=self.identity.edge_node_id,
                    bdseq=bdseq,
                )
                try:
                    async for message in client.messages:
                        await self._command(client, message)
                except aiomqtt.MqttError as exc:
                    self.last_error = f"connection lost: {exc}"
                    log.warning("sparkplug.connection_lost", error=str(exc))
                    if time.monotonic() - began >= _HEALTHY_SESSION_S:
                        raise _SessionLost from exc
                    raise
        finally:
            self.connected.clear()
            if self._client is client:
                self._client = None

    # -- births, data, commands (each under the lock) ------------------------------------

    async def _send(self, client: aiomqtt.Client, topic: str, body: bytes) -> None:
        await client.publish(topic, body, qos=0)
        self.messages += 1

    async def _birth(self, client: aiomqtt.Client, bdseq: int) -> None:
        """NBIRTH (seq 0) and every device's DBIRTH."""
        self.seq.birth()
        await self._send(client, self.topics.nbirth, payloads.nbirth(bdseq, self._properties))
        self.births += 1
        self.table.unborn()
        for device in list(self.table.devices.values()):
            await self._device_birth(client, device)

    async def _device_birth(self, client: aiomqtt.Client, device: Device) -> None:
        faults = self.table.device_faults(device)
        body = payloads.device_birth(faults, device.last, self.seq.next())
        await self._send(client, self.topics.device("DBIRTH", device.device_id), body)
        device.born = frozenset(f.code for f in faults)

    async def _change(self, client: aiomqtt.Client, change: Change) -> None:
        device, fault = change.device, change.fault
        if device.born is not None and fault.code not in device.born:
            # A fault its DBIRTH did not declare (a fleet apply grew the catalogue).
            body = payloads.encode([], seq=self.seq.next())
            await self._send(client, self.topics.device("DDEATH", device.device_id), body)
            device.born = None
        if device.born is None:
            await self._device_birth(client, device)  # carries the change already
            return
        metrics = payloads.alarm_metrics(fault, device.last.get(fault.code))
        body = payloads.encode(metrics, seq=self.seq.next())
        await self._send(client, self.topics.device("DDATA", device.device_id), body)

    async def _events(self) -> None:
        while True:
            self._busy = False
            raw = await self._queue.get()
            self._busy = True
            try:
                event = json.loads(raw)
                change = self.table.apply(event)
            except (ValueError, KeyError, TypeError) as exc:
                self.invalid_events += 1
                log.error("sparkplug.event_invalid", error=str(exc), size=len(raw))
                continue
            if change is None:
                continue
            async with self._lock:
                client = self._client
                if client is None or self._stopping or not self.connected.is_set():
                    continue  # the next birth carries it
                try:
                    await self._change(client, change)
                except aiomqtt.MqttError as exc:  # the session ends; its rebirth carries it
                    log.warning("sparkplug.publish_failed", error=str(exc))

    async def _command(self, client: aiomqtt.Client, message: aiomqtt.Message) -> None:
        """An NCMD: a rebirth when asked; anything malformed is counted and ignored."""
        raw = message.payload if isinstance(message.payload, bytes) else b""
        try:
            rebirth = payloads.rebirth_requested(raw)
        except MalformedCommand as exc:
            self.commands_malformed += 1
            log.warning(
                "sparkplug.command_malformed",
                topic=message.topic.value,
                size=len(raw),
                error=str(exc),
                malformed=self.commands_malformed,
            )
            return
        if not rebirth:
            return
        async with self._lock:
            bdseq = self.bdseq.current
            if self._stopping or bdseq is None:
                return
            self.rebirths += 1
            log.info("sparkplug.rebirth", bdseq=bdseq, devices=len(self.table.devices))
            await self._birth(client, bdseq)

    def snapshot(self) -> dict[str, Any]:
        """`status.sparkplug`."""
        return {
            "connected": self.connected.is_set(),
            "group_id": self.identity.group_id,
            "edge_node_id": self.identity.edge_node_id,
            "client_id": self.identity.client_id,
            "bdseq": self.bdseq.current,
            "seq": self.seq.last,
            "devices": len(self.table.devices),
            "births": self.births,
            "rebirths": self.rebirths,
            "messages": self.messages,
            "connects": self.connects,
            "queued": len(self._queue),
            "dropped": self.dropped,
            "invalid_events": self.invalid_events,
            "commands_malformed": self.commands_malformed,
            "last_error": self.last_error,
        }
