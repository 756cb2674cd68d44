"""Each stream as a Sparkplug device: the last alert event of each of its faults, whether
it has been born in this session, and what an event changes.

Fed with the alert events the service published (agent/publish.py, in outbox order), so a
redelivered or older event of an alert (same id, `seq` not above the last) changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agent.sparkplug.payloads import FaultInfo
from agent.sparkplug.topics import sparkplug_id

__all__ = ["Change", "Device", "DeviceTable"]


@dataclass
class Device:
    device_id: str  # the Sparkplug id (the stream id, sanitised)
    last: dict[str, dict[str, Any]] = field(default_factory=dict)  # fault -> last event
    born: frozenset[str] | None = None  # the faults of its DBIRTH in this session, or None


@dataclass(frozen=True)
class Change:
    """An event that changed a device's alarm of `fault`."""

    device: Device
    fault: FaultInfo


class DeviceTable:
    def __init__(self, faults: Callable[[], Sequence[FaultInfo]]) -> None:
        """`faults`: the catalogue now (asked at each use: a fleet apply may change it)."""
        self._faults = faults
        self.devices: dict[str, Device] = {}
        self._seen: dict[str, int] = {}  # alert id -> highest event seq applied

    def faults(self, extra: Iterable[str] = ()) -> list[FaultInfo]:
        """The catalogue, plus a folder for each of `extra` it no longer has (an alarm of a
        fault removed by a fleet apply still shows until it is gone)."""
        known = list(self._faults())
        codes = {f.code for f in known}
        for code in extra:
            if code not in codes:
                known.append(FaultInfo(code, code, "warning"))
                codes.add(code)
        return known

    def device_faults(self, device: Device) -> list[FaultInfo]:
        return self.faults(device.last)

    def device(self, stream_id: str) -> Device:
        device_id = sparkplug_id(stream_id)
        found = self.devices.get(device_id)
        if found is None:
            found = self.devices[device_id] = Device(device_id)
        return found

    def seed(self, alerts: Iterable[Mapping[str, Any]]) -> None:
        """The alarms on the list at start (`Alert.public()` forms), as their last event."""
        for alert in alerts:
            state = (alert.get("alarm") or {}).get("state", "unack_active")
            kind = "end" if state == "unack_cleared" else "update"
            self.apply({"type": kind, "seq": 0, "alert": dict(alert)})

    def apply(self, event: Mapping[str, Any]) -> Change | None:
        """Take one alert event (its published JSON, parsed); the change, or None for an
        event already applied (a redelivery) or older than the one applied."""
        alert = event["alert"]
        alert_id, seq = str(alert["id"]), int(event.get("seq", 0))
        if alert_id in self._seen and seq <= self._seen[alert_id] and seq != 0:
            return None
        self._seen[alert_id] = max(seq, self._seen.get(alert_id, 0))
        if len(self._seen) > 100_000:  # bounded: the oldest ids go first
            for old in list(self._seen)[:10_000]:
                del self._seen[old]
        device = self.device(str(alert["stream_id"]))
        code = str(alert["fault"])
        device.last[code] = {**event, "alert": alert}
        fault = next(f for f in self.device_faults(device) if f.code == code)
        return Change(device, fault)

    def unborn(self) -> None:
        """A new session (or a rebirth): every device is to be born again."""
        for device in self.devices.values():
            device.born = None
