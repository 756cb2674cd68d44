"""The service as a Sparkplug B edge node, on the real broker: births, data on each alarm
change, rebirth on a host's command, death by its will when killed, bdSeq across restarts.

Everything the node publishes is decoded by pysparkplug (a second, independent Sparkplug
implementation), and the spec's rules are checked over the whole recording: NBIRTH first
with seq 0, every later message seq + 1 mod 256, a device's DBIRTH before its DDATA, the
NDEATH's bdSeq equal to its session's NBIRTH's.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import aiomqtt
import pysparkplug as spb
import pytest
from pysparkplug._protobuf import Payload as RawPayload

from agent.devbroker import DevBroker
from tests.helpers import AgentProcess, publish_all, segment_items, until

NODE = "line3-edge-01"  # configs/agent.yaml's device_id: the default edge node id
STREAM = "line3-mic1"

_DECODERS: dict[spb.MessageType, Any] = {
    spb.MessageType.NBIRTH: spb.NBirth, spb.MessageType.NDEATH: spb.NDeath,
    spb.MessageType.DBIRTH: spb.DBirth, spb.MessageType.DDATA: spb.DData,
    spb.MessageType.DDEATH: spb.DDeath, spb.MessageType.NCMD: spb.NCmd,
    spb.MessageType.NDATA: spb.NData,
}  # fmt: skip


@dataclass
class Message:
    topic: spb.Topic
    payload: Any  # pysparkplug's decoded payload
    raw: bytes

    @property
    def kind(self) -> spb.MessageType:
        return self.topic.message_type

    @property
    def seq(self) -> int | None:
        raw = RawPayload.FromString(self.raw)
        return raw.seq if raw.HasField("seq") else None

    def metrics(self) -> dict[str, Any]:
        if self.kind is spb.MessageType.NDEATH:
            return {self.payload.bd_seq_metric.name: self.payload.bd_seq_metric.value}
        return {m.name: m.value for m in self.payload.metrics}


class Host:
    """A Sparkplug host's view: everything on `spBv1.0/<group>/#`, decoded by pysparkplug."""

    def __init__(self, port: int, group: str) -> None:
        self.port, self.group = port, group
        self.messages: list[Message] = []
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()

    async def start(self) -> None:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self._ready.wait(), 10)

    async def _run(self) -> None:
        async with aiomqtt.Client(
            "127.0.0.1", self.port, identifier=f"host-{uuid.uuid4().hex[:8]}"
        ) as c:
            await c.subscribe(f"spBv1.0/{self.group}/#", qos=1)
            self._ready.set()
            async for msg in c.messages:
                raw = bytes(msg.payload) if isinstance(msg.payload, (bytes, bytearray)) else b""
                topic = spb.Topic.from_str(msg.topic.value)
                if topic.message_type is spb.MessageType.NCMD:  # the host's own, some malformed
                    self.messages.append(Message(topic, None, raw))
                    continue
                decoded = _DECODERS[topic.message_type].decode(raw)  # raises on a bad payload
                self.messages.append(Message(topic, decoded, raw))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def of(self, kind: spb.MessageType, device: str | None = None) -> list[Message]:
        return [
            m for m in self.messages
            if m.kind is kind and (device is None or m.topic.device_id == device)
        ]  # fmt: skip

    def alarm(self, message: Message, name: str) -> Any:
        return message.metrics().get(f"Alarms/bearing_noise/{name}")

    async def wait(self, check: Callable[[], bool], what: str, limit: float = 30) -> None:
        if self._task is not None and self._task.done():
            self._task.result()  # a payload pysparkplug could not decode fails here
        await until(check, what, limit)


@pytest.fixture
async def host(broker: DevBroker) -> AsyncIterator[Host]:
    h = Host(broker.port, f"g{uuid.uuid4().hex[:8]}")
    await h.start()
    yield h
    await h.stop()


_BASE = time.time() - 600


def segment(seq: int, text: str) -> dict[str, Any]:
    """Segment `seq` of the stream: 5 s of audio, 10 s after the one before (no overlap)."""
    start = _BASE + 10 * seq
    return {"stream_id": STREAM, "seq": seq, "start": start, "end": start + 5, "text": text,
            "lang": "en"}  # fmt: skip


def check_sparkplug_rules(messages: list[Message]) -> None:
    """The spec's sequence and birth rules over a whole recording of one node."""
    node = [m for m in messages if m.kind is not spb.MessageType.NCMD]  # NCMDs are the host's
    assert node[0].kind is spb.MessageType.NBIRTH, "the node's first message is its NBIRTH"
    prev: int | None = None
    bdseq: int | None = None
    born: set[str] = set()
    for m in node:
        if m.kind is spb.MessageType.NBIRTH:
            assert m.seq == 0, "an NBIRTH carries seq 0"
            bdseq, prev, born = m.metrics()["bdSeq"], 0, set()
            assert m.metrics()["Node Control/Rebirth"] is False
            continue
        if m.kind is spb.MessageType.NDEATH:
            assert m.seq is None, "an NDEATH carries no seq"
            assert m.metrics()["bdSeq"] == bdseq, "the NDEATH pairs with its session's NBIRTH"
            prev = None
            continue
        assert prev is not None, f"{m.kind} outside a session"
        assert m.seq == (prev + 1) % 256, f"{m.kind} seq {m.seq} after {prev}"
        prev = m.seq
        device = m.topic.device_id
        if m.kind is spb.MessageType.DBIRTH:
            born.add(device)
        elif m.kind is spb.MessageType.DDEATH:
            born.discard(device)
        elif m.kind is spb.MessageType.DDATA:
            assert device in born, f"DDATA of {device} before its DBIRTH"


async def test_the_node_births_publishes_changes_rebirths_and_dies_by_its_will(
    agent_factory: Callable[..., AgentProcess], broker: DevBroker, host: Host, prefix: str
) -> None:
    overrides = (
        "sparkplug.enabled=true", f"sparkplug.group_id={host.group}",
        "streams.defaults.alerts.debounce_s=0", "streams.defaults.alerts.quiet_end_s=3",
    )  # fmt: skip
    births = lambda: host.of(spb.MessageType.NBIRTH)  # noqa: E731
    agent = agent_factory(*overrides).start()
    await host.wait(lambda: len(births()) == 1, "the NBIRTH")
    first = births()[0]
    assert first.topic.edge_node_id == NODE
    assert first.metrics()["bdSeq"] == 0  # a fresh device's first session
    assert first.metrics()["Properties/Device Id"] == NODE

    # An alarm raised: the stream's DBIRTH (its first message) carries it.
    await publish_all(broker.port, segment_items(prefix, [
        segment(1, "I hear a bearing abnormal noise on roller four.")]))  # fmt: skip
    dbirths = lambda: host.of(spb.MessageType.DBIRTH, STREAM)  # noqa: E731
    await host.wait(lambda: bool(dbirths()), "the stream's DBIRTH")
    assert host.alarm(dbirths()[0], "State") == "unack_active"
    assert host.alarm(dbirths()[0], "Active") is True
    assert host.alarm(dbirths()[0], "Severity") == "warning"
    assert host.alarm(dbirths()[0], "Tiers") == "keyword"
    # every fault of the catalogue has its folder, at normal where nothing was raised
    assert dbirths()[0].metrics()["Alarms/motor_overload/State"] == "normal"
    alert_id = host.alarm(dbirths()[0], "AlertId")
    assert alert_id.startswith(f"{STREAM}:bearing_noise:")

    # Each later change is a DDATA with the alarm's state: an update, then the end.
    await publish_all(broker.port, segment_items(prefix, [
        segment(2, "The bearing abnormal noise is getting louder.")]))  # fmt: skip
    ddata = lambda: host.of(spb.MessageType.DDATA, STREAM)  # noqa: E731
    await host.wait(lambda: any(host.alarm(m, "Count") == 2 for m in ddata()), "the update",
                    limit=15)  # fmt: skip
    await host.wait(
        lambda: any(host.alarm(m, "State") == "unack_cleared" for m in ddata()), "the end"
    )
    ended = next(m for m in ddata() if host.alarm(m, "State") == "unack_cleared")
    assert host.alarm(ended, "Active") is False
    assert host.alarm(ended, "Event") == "end"
    assert host.alarm(ended, "AlertId") == alert_id
    assert set(ended.metrics()) == {f"Alarms/bearing_noise/{n}" for n in (
        "State", "Active", "Acked", "Shelved", "Severity", "Label", "Evidence", "Tiers",
        "AlertId", "Count", "Event", "RaisedAt")}, "a DDATA carries the changed folder"  # fmt: skip

    # A malformed NCMD is ignored; a rebirth (written by pysparkplug) yields NBIRTH + DBIRTH.
    ncmd = f"spBv1.0/{host.group}/NCMD/{NODE}"
    rebirth = spb.NCmd(timestamp=spb.get_current_timestamp(), metrics=(spb.Metric(
        timestamp=spb.get_current_timestamp(), name="Node Control/Rebirth",
        datatype=spb.DataType.BOOLEAN, value=True),)).encode()  # fmt: skip
    await publish_all(broker.port, [(ncmd, b"\xff not sparkplug"), (ncmd, rebirth)])
    await host.wait(lambda: len(births()) == 2 and len(dbirths()) == 2, "the rebirth")
    assert births()[1].metrics()["bdSeq"] == 0  # the same session
    assert host.alarm(dbirths()[1], "State") == "unack_cleared"  # the current state
    assert host.messages.index(births()[1]) < host.messages.index(dbirths()[1])
    assert agent.events("sparkplug.command_malformed"), "the malformed NCMD is logged"
    assert agent.alive

    # SIGKILL: the broker delivers the will, the NDEATH of the session's bdSeq.
    agent.kill()
    deaths = lambda: host.of(spb.MessageType.NDEATH)  # noqa: E731
    await host.wait(lambda: len(deaths()) == 1, "the will (NDEATH)")
    assert deaths()[0].metrics()["bdSeq"] == 0

    # A restart is a new session: bdSeq advances, and the standing alarm is born again.
    again = agent_factory(*overrides).start()
    await host.wait(lambda: len(births()) == 3 and len(dbirths()) == 3, "the next session")
    assert births()[2].metrics()["bdSeq"] == 1
    assert host.alarm(dbirths()[2], "State") == "unack_cleared"
    assert host.alarm(dbirths()[2], "AlertId") == alert_id

    # A clean stop: the node publishes its NDEATH itself, with this session's bdSeq.
    assert again.terminate() == 0
    await host.wait(lambda: len(deaths()) == 2, "the clean stop's NDEATH")
    assert deaths()[1].metrics()["bdSeq"] == 1

    check_sparkplug_rules(host.messages)
    ours = [m for m in host.messages if m.kind is not spb.MessageType.NCMD]
    assert all(isinstance(m.payload, _DECODERS[m.kind]) for m in ours)
    kinds = [m.kind for m in ours]
    assert kinds.count(spb.MessageType.DDATA) >= 2  # the update and the end, at least
