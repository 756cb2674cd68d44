"""Sparkplug B payloads (the Eclipse Tahu protobuf schema), and the alarm metric tree.

The node (NBIRTH) carries `bdSeq`, `Node Control/Rebirth` and a few `Properties/...`; each
device (a stream) carries one folder per fault of the catalogue, `Alarms/<fault>/...`
(`ALARM_FIELDS`, docs/sparkplug.md has the table). A DBIRTH declares every metric of the
device with its datatype and current value; a DDATA carries only the folder of the fault
whose alarm changed. Timestamps are milliseconds since the epoch (UTC), as the spec says.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

# The generated module (scripts/gen_sparkplug.sh), untyped: protobuf ships no stubs.
pb: Any = importlib.import_module("agent.sparkplug.sparkplug_b_pb2")

__all__ = [
    "ALARM_FIELDS",
    "BDSEQ",
    "REBIRTH",
    "FaultInfo",
    "MalformedCommand",
    "Metric",
    "alarm_metrics",
    "device_birth",
    "encode",
    "nbirth",
    "ndeath",
    "now_ms",
    "rebirth_requested",
]

BDSEQ = "bdSeq"
REBIRTH = "Node Control/Rebirth"

_BOOLEAN, _STRING, _UINT32, _UINT64 = (
    pb.DataType.Value("Boolean"),
    pb.DataType.Value("String"),
    pb.DataType.Value("UInt32"),
    pb.DataType.Value("UInt64"),
)
_DATETIME = pb.DataType.Value("DateTime")

# The folder of one fault: (metric name under Alarms/<fault>/, Sparkplug datatype).
ALARM_FIELDS: tuple[tuple[str, int], ...] = (
    ("State", _STRING),  # normal, unack_active, ack_active, unack_cleared, shelved, ...
    ("Active", _BOOLEAN),  # the fault is heard now (an alert that has not ended)
    ("Acked", _BOOLEAN),
    ("Shelved", _BOOLEAN),
    ("Severity", _STRING),
    ("Label", _STRING),
    ("Evidence", _STRING),  # the latest evidence's text
    ("Tiers", _STRING),  # keyword, llm, keyword+llm
    ("AlertId", _STRING),
    ("Count", _UINT32),
    ("Event", _STRING),  # the last alert event: new, update, end, ack, shelve, unshelve
    ("RaisedAt", _DATETIME),
)

_MAX_TEXT = 1024  # characters of evidence in a metric (a host's tag, not the archive)


def now_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True)
class FaultInfo:
    """A fault of the catalogue, for the metrics of a device that has no alarm of it."""

    code: str
    label: str
    severity: str


@dataclass(frozen=True)
class Metric:
    """One metric; `value` None is sent as a null of its datatype."""

    name: str
    datatype: int
    value: str | bool | int | None


class MalformedCommand(ValueError):
    """An NCMD that is not a Sparkplug payload, or not one we can read."""


def alarm_metrics(fault: FaultInfo, event: Mapping[str, Any] | None) -> list[Metric]:
    """The folder `Alarms/<fault>/` for the alert event last seen of that fault (None: no
    alarm of it, the state `normal`)."""
    prefix = f"Alarms/{fault.code}/"
    if event is None:
        values: dict[str, str | bool | int | None] = {
            "State": "normal", "Active": False, "Acked": False, "Shelved": False,
            "Severity": fault.severity, "Label": fault.label, "Evidence": None,
            "Tiers": None, "AlertId": None, "Count": 0, "Event": None, "RaisedAt": None,
        }  # fmt: skip
    else:
        alert = event["alert"]
        alarm = alert.get("alarm") or {}
        state = str(alarm.get("state") or "unack_active")
        kind = str(event.get("type"))
        evidence = alert.get("evidence") or []
        raised = alert.get("raised_at")
        values = {
            "State": state,
            "Active": kind != "end" and state in ("unack_active", "ack_active", "shelved"),
            "Acked": alarm.get("acked_by") is not None,
            "Shelved": state == "shelved",
            "Severity": str(alert.get("severity", fault.severity)),
            "Label": str(alert.get("label", fault.label)),
            "Evidence": str(evidence[-1].get("text", ""))[:_MAX_TEXT] if evidence else None,
            "Tiers": "+".join(alert.get("sources") or [alert.get("source", "")]) or None,
            "AlertId": str(alert["id"]),
            "Count": int(alert.get("count", 0)),
            "Event": kind,
            "RaisedAt": int(raised * 1000) if isinstance(raised, (int, float)) else None,
        }
    return [Metric(prefix + name, dtype, values[name]) for name, dtype in ALARM_FIELDS]


def _put(target: Any, metric: Metric, ts: int) -> None:
    m = target.metrics.add()
    m.name = metric.name
    m.timestamp = ts
    m.datatype = metric.datatype
    value = metric.value
    if value is None:
        m.is_null = True
    elif metric.datatype == _BOOLEAN:
        m.boolean_value = bool(value)
    elif metric.datatype == _STRING:
        m.string_value = str(value)
    elif metric.datatype == _UINT32:
        m.int_value = max(0, min(int(value), 0xFFFFFFFF))
    elif metric.datatype in (_UINT64, _DATETIME):
        m.long_value = max(0, int(value))
    else:  # pragma: no cover - every datatype this module uses is above
        raise ValueError(f"no encoding for datatype {metric.datatype}")


def encode(metrics: Iterable[Metric], *, seq: int | None, ts: int | None = None) -> bytes:
    """A Payload: its timestamp, `seq` (None: left out, as an NDEATH must) and metrics."""
    stamp = now_ms() if ts is None else ts
    payload = pb.Payload()
    payload.timestamp = stamp
    if seq is not None:
        payload.seq = seq
    for metric in metrics:
        _put(payload, metric, stamp)
    return bytes(payload.SerializeToString())


def nbirth(bdseq: int, properties: Mapping[str, str], *, ts: int | None = None) -> bytes:
    """The NBIRTH: seq 0, the session's bdSeq, the rebirth control, the node's properties."""
    metrics: list[Metric] = [
        Metric(BDSEQ, _UINT64, bdseq),
        Metric(REBIRTH, _BOOLEAN, False),
        *(Metric(f"Properties/{k}", _STRING, v) for k, v in properties.items()),
    ]
    return encode(metrics, seq=0, ts=ts)


def ndeath(bdseq: int, *, ts: int | None = None) -> bytes:
    """The NDEATH (the will, and a clean stop's last word): the bdSeq alone, no seq."""
    return encode([Metric(BDSEQ, _UINT64, bdseq)], seq=None, ts=ts)


def device_birth(
    faults: Sequence[FaultInfo], last: Mapping[str, Mapping[str, Any]], seq: int
) -> bytes:
    """A DBIRTH: every fault's folder, from the last event of each (`last`: by fault)."""
    metrics = [m for f in faults for m in alarm_metrics(f, last.get(f.code))]
    return encode(metrics, seq=seq)


def rebirth_requested(raw: bytes) -> bool:
    """Whether an NCMD asks for a rebirth (`Node Control/Rebirth` = true).

    Raises:
        MalformedCommand: not a Sparkplug payload, or a rebirth metric that is not a boolean.
    """
    try:
        payload = pb.Payload.FromString(raw)
    except Exception as exc:  # protobuf's DecodeError and friends
        raise MalformedCommand(f"not a Sparkplug B payload: {exc}") from exc
    asked = False
    for metric in payload.metrics:
        if metric.name != REBIRTH:
            continue
        if metric.WhichOneof("value") != "boolean_value":
            raise MalformedCommand(f"{REBIRTH} is not a boolean")
        asked = asked or metric.boolean_value
    return asked
