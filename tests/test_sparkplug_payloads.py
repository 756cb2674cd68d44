"""agent.sparkplug's counters, payloads and device table, alone; every payload decoded by a
second implementation (pysparkplug), not by the module that wrote it."""

from __future__ import annotations

import json
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pysparkplug as spb
import pytest

from agent.config.models import AgentConfig
from agent.sparkplug import payloads
from agent.sparkplug.devices import DeviceTable
from agent.sparkplug.payloads import FaultInfo, MalformedCommand
from agent.sparkplug.sequence import BdSeqStore, SeqCounter
from agent.sparkplug.topics import SparkplugTopics, sparkplug_id

BEARING = FaultInfo("bearing_noise", "bearing abnormal noise", "warning")
MOTOR = FaultInfo("motor_overload", "motor overload", "critical")


def event(kind: str, seq: int, state: str, **alert: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "line3-mic1:bearing_noise:1", "stream_id": "line3-mic1", "fault": "bearing_noise",
        "label": "bearing abnormal noise", "severity": "warning", "source": "keyword",
        "sources": ["keyword", "llm"], "count": 2, "raised_at": 1795939211.02,
        "evidence": [{"text": "I hear a bearing abnormal noise", "seq": 42}],
        "alarm": {"state": state, "acked_by": None},
    }  # fmt: skip
    body.update(alert)
    return {"type": kind, "seq": seq, "ts": 1795939212.0, "alert": body}


def by_name(metrics: tuple[spb.Metric, ...]) -> dict[str, spb.Metric]:
    out = {m.name: m for m in metrics}
    assert len(out) == len(metrics), "a metric name twice"
    return out


# -- seq and bdSeq ----------------------------------------------------------------------


def test_seq_starts_at_the_birth_and_wraps_after_255() -> None:
    seq = SeqCounter()
    with pytest.raises(RuntimeError):
        seq.next()  # nothing before an NBIRTH
    assert seq.birth() == 0
    values = [seq.next() for _ in range(300)]
    assert values[:3] == [1, 2, 3]
    assert values[254:257] == [255, 0, 1]
    assert seq.birth() == 0  # a rebirth starts again
    assert seq.next() == 1


async def test_bdseq_advances_per_session_survives_restarts_and_wraps(tmp_path: Path) -> None:
    path = tmp_path / "state" / "sparkplug.json"
    assert await BdSeqStore(path).advance() == 0  # a fresh device
    assert await BdSeqStore(path).advance() == 1  # another process: read from disk
    store = BdSeqStore(path)
    assert await store.advance() == 2
    assert store.current == 2
    path.write_text(json.dumps({"bdseq": 255}))
    assert await store.advance() == 0
    assert json.loads(path.read_text()) == {"bdseq": 0}


@pytest.mark.parametrize("content", ["not json", '{"bdseq": 256}', '{"bdseq": "3"}', "[1]"])
async def test_a_damaged_bdseq_file_starts_again_at_zero(tmp_path: Path, content: str) -> None:
    path = tmp_path / "sparkplug.json"
    path.write_text(content)
    assert await BdSeqStore(path).advance() == 0
    assert await BdSeqStore(path).advance() == 1


# -- payloads, decoded by pysparkplug ---------------------------------------------------------


def test_nbirth_carries_seq_0_bdseq_and_the_rebirth_control() -> None:
    raw = payloads.nbirth(7, {"Software": "edge-agent 0.1.0"}, ts=1795939200000)
    birth = spb.NBirth.decode(raw)
    assert birth.seq == 0
    assert birth.timestamp == 1795939200000
    metrics = by_name(birth.metrics)
    assert metrics["bdSeq"].value == 7
    assert metrics["bdSeq"].datatype is spb.DataType.UINT64
    assert metrics["Node Control/Rebirth"].value is False
    assert metrics["Node Control/Rebirth"].datatype is spb.DataType.BOOLEAN
    assert metrics["Properties/Software"].value == "edge-agent 0.1.0"


def test_ndeath_carries_the_bdseq_and_no_seq() -> None:
    raw = payloads.ndeath(7)
    death = spb.NDeath.decode(raw)
    assert death.bd_seq_metric.name == "bdSeq"
    assert death.bd_seq_metric.value == 7
    assert death.bd_seq_metric.datatype is spb.DataType.UINT64
    from pysparkplug._protobuf import Payload  # the second library's schema classes

    assert not Payload.FromString(raw).HasField("seq")


def test_an_alarm_folder_has_every_field_with_its_datatype() -> None:
    raw = payloads.encode(payloads.alarm_metrics(BEARING, event("update", 2, "ack_active",
                                                   alarm={"state": "ack_active",
                                                          "acked_by": "ops"})), seq=5)  # fmt: skip
    data = spb.DData.decode(raw)
    assert data.seq == 5
    m = by_name(data.metrics)
    prefix = "Alarms/bearing_noise/"
    assert {n.removeprefix(prefix) for n in m} == {n for n, _ in payloads.ALARM_FIELDS}
    assert m[prefix + "State"].value == "ack_active"
    assert m[prefix + "State"].datatype is spb.DataType.STRING
    assert m[prefix + "Active"].value is True
    assert m[prefix + "Acked"].value is True
    assert m[prefix + "Shelved"].value is False
    assert m[prefix + "Severity"].value == "warning"
    assert m[prefix + "Label"].value == "bearing abnormal noise"
    assert m[prefix + "Evidence"].value == "I hear a bearing abnormal noise"
    assert m[prefix + "Tiers"].value == "keyword+llm"
    assert m[prefix + "AlertId"].value == "line3-mic1:bearing_noise:1"
    assert m[prefix + "Count"].value == 2
    assert m[prefix + "Count"].datatype is spb.DataType.UINT32
    assert m[prefix + "Event"].value == "update"
    assert m[prefix + "RaisedAt"].value == datetime.fromtimestamp(1795939211.02, timezone.utc)
    assert m[prefix + "RaisedAt"].datatype is spb.DataType.DATETIME


def test_a_fault_without_an_alarm_is_normal_with_nulls() -> None:
    data = spb.DBirth.decode(payloads.device_birth([BEARING, MOTOR], {}, seq=1))
    m = by_name(data.metrics)
    assert m["Alarms/motor_overload/State"].value == "normal"
    assert m["Alarms/motor_overload/Severity"].value == "critical"
    assert m["Alarms/motor_overload/Active"].value is False
    assert m["Alarms/motor_overload/AlertId"].is_null
    assert m["Alarms/motor_overload/AlertId"].datatype is spb.DataType.STRING
    assert m["Alarms/bearing_noise/Count"].value == 0


def test_an_ended_alarm_is_not_active() -> None:
    raw = payloads.encode(payloads.alarm_metrics(BEARING, event("end", 3, "unack_cleared")), seq=1)
    m = by_name(spb.DData.decode(raw).metrics)
    assert m["Alarms/bearing_noise/State"].value == "unack_cleared"
    assert m["Alarms/bearing_noise/Active"].value is False
    assert m["Alarms/bearing_noise/Event"].value == "end"


def test_a_rebirth_command_written_by_the_second_library_is_read() -> None:
    metric = spb.Metric(
        timestamp=1, name="Node Control/Rebirth", datatype=spb.DataType.BOOLEAN, value=True
    )
    assert payloads.rebirth_requested(spb.NCmd(timestamp=1, metrics=(metric,)).encode())
    off = spb.Metric(timestamp=1, name="Node Control/Rebirth", datatype=spb.DataType.BOOLEAN,
                     value=False)  # fmt: skip
    assert not payloads.rebirth_requested(spb.NCmd(timestamp=1, metrics=(off,)).encode())
    other = spb.Metric(timestamp=1, name="Other", datatype=spb.DataType.BOOLEAN, value=True)
    assert not payloads.rebirth_requested(spb.NCmd(timestamp=1, metrics=(other,)).encode())


@pytest.mark.parametrize("raw", [b"\xff\xff\xff", b'{"rebirth": true}', b"\x12\x05"])
def test_a_malformed_command_is_refused(raw: bytes) -> None:
    with pytest.raises(MalformedCommand):
        payloads.rebirth_requested(raw)


def test_a_rebirth_that_is_not_a_boolean_is_refused() -> None:
    metric = spb.Metric(timestamp=1, name="Node Control/Rebirth", datatype=spb.DataType.STRING,
                        value="yes")  # fmt: skip
    with pytest.raises(MalformedCommand):
        payloads.rebirth_requested(spb.NCmd(timestamp=1, metrics=(metric,)).encode())


# -- topics, ids, devices -------------------------------------------------------------------


def test_topics_are_the_second_librarys_topics() -> None:
    topics = SparkplugTopics("plant", "line3-edge-01")
    parsed = spb.Topic.from_str(topics.device("DDATA", "line3-mic1"))
    assert (parsed.group_id, parsed.message_type, parsed.edge_node_id, parsed.device_id) == (
        "plant",
        spb.MessageType.DDATA,
        "line3-edge-01",
        "line3-mic1",
    )
    assert spb.Topic.from_str(topics.ndeath).message_type is spb.MessageType.NDEATH
    assert spb.Topic.from_str(topics.ncmd).message_type is spb.MessageType.NCMD


def test_ids_are_sanitised() -> None:
    assert sparkplug_id("line3-mic1") == "line3-mic1"
    assert sparkplug_id("line 3/mic+1#") == "line_3_mic_1_"
    assert sparkplug_id("") == "_"


def test_the_device_table_drops_redeliveries_and_older_events() -> None:
    table = DeviceTable(lambda: [BEARING])
    change = table.apply(event("new", 1, "unack_active"))
    assert change is not None
    assert change.device.device_id == "line3-mic1"
    assert change.fault == BEARING
    assert table.apply(event("new", 1, "unack_active")) is None  # redelivered
    assert table.apply(event("update", 2, "ack_active")) is not None
    assert table.apply(event("new", 1, "unack_active")) is None  # older
    assert table.devices["line3-mic1"].last["bearing_noise"]["alert"]["alarm"]["state"] == (
        "ack_active"
    )
    # A fault the catalogue does not have (removed by a fleet apply) still gets a folder.
    gone = table.apply(event("new", 1, "unack_active", id="x", fault="belt_slip"))
    assert gone is not None
    assert gone.fault.code == "belt_slip"


def test_the_section_is_off_by_default_and_strict() -> None:
    cfg = AgentConfig()
    assert cfg.sparkplug.enabled is False
    assert cfg.sparkplug.edge_node_id is None
    with pytest.raises(ValueError, match="extra"):
        AgentConfig.model_validate({"sparkplug": {"enabled": True, "groupid": "x"}})
    with pytest.raises(ValueError, match="pattern"):
        AgentConfig.model_validate({"sparkplug": {"group_id": "a/b"}})
