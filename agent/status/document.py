"""The whole status document: `<prefix>/status` (retained), `agentctl status` (the control
socket) and `/metrics` all render this one model (docs/mqtt.md, docs/metrics.md).

The daemon assembles its sections' snapshots and validates them here once
(`Status.model_validate`); every key is declared, unknown ones are refused. The fields are
declared in the order the JSON has always had, and `document()` leaves out the fields the
service left out, so the published JSON keeps its keys and their order.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field

from agent.status.alarms import AlarmsStatus
from agent.status.alerts import AlertsStatus, DetectStatus, ErrorsStatus
from agent.status.asr import AsrOff, AsrStatus
from agent.status.base import StatusModel
from agent.status.fleet import FleetOff, FleetStatus
from agent.status.ingest import IngestStatus, QueueStatus
from agent.status.llm import LlmOff, LlmStatus
from agent.status.local import ControlStatus, MetricsStatus
from agent.status.mqtt import MqttStatus
from agent.status.outbox import OutboxStatus
from agent.status.sparkplug import SparkplugStatus
from agent.status.streams import StreamStatus
from agent.status.watchdog import WatchdogOff, WatchdogStatus

__all__ = ["ServiceState", "Status"]

ServiceState = Literal["running", "degraded", "stopped"]


class Status(StatusModel):
    """One snapshot of the running service."""

    uptime_s: float = Field(title="Uptime (s)", description="Seconds since the service started.")
    mqtt: MqttStatus = Field(title="MQTT", description="The broker connection.")
    ingest: IngestStatus = Field(title="Ingest", description="Transcript payloads taken in.")
    detect: DetectStatus = Field(title="Detect", description="What both tiers found.")
    alerts: AlertsStatus = Field(title="Alerts", description="Alert events and their timing.")
    alarms: AlarmsStatus = Field(
        title="Alarms", description="The alarm list by state and the operators' commands."
    )
    errors: ErrorsStatus = Field(title="Errors", description="Error events on `<prefix>/errors`.")
    sparkplug: SparkplugStatus | None = Field(
        None, title="Sparkplug", description="The Sparkplug B edge node; null when disabled."
    )
    streams: dict[str, StreamStatus] = Field(title="Streams", description="By stream id.")
    device_id: str = Field(title="Device id", description="`device_id`.")
    version: str = Field(title="Version", description="The service's version.")
    state: ServiceState = Field(
        title="State",
        description="`degraded`: the engine is held off after too many restarts (keyword "
        "alerts only, until it is tried again); `stopped`: the last status of a clean "
        "shutdown.",
    )
    profile: str = Field(title="Profile", description="The device profile (`profile`).")
    llm: LlmOff | LlmStatus = Field(title="LLM", description="The slow tier.")
    queue: QueueStatus = Field(title="Queue", description="The ingest queue.")
    outbox: OutboxStatus = Field(title="Outbox", description="Alert events not yet delivered.")
    active_alerts: int = Field(title="Active alerts", description="Alerts active now.")
    alerts_last_hour: int = Field(
        title="Alerts in the last hour", description="New alerts in the last hour."
    )
    watchdog: WatchdogOff | WatchdogStatus = Field(
        title="Watchdog", description="The memory watchdog and the supervisor's events."
    )
    control: ControlStatus | None = Field(
        None, title="Control", description="agentctl's socket; absent when it is off or failed."
    )
    fleet: FleetOff | FleetStatus = Field(title="Fleet", description="Fleet configuration.")
    asr: Annotated[AsrOff | AsrStatus, Field(discriminator="state")] = Field(
        title="ASR", description="Audio to transcripts."
    )
    metrics: MetricsStatus | None = Field(
        None,
        title="Metrics",
        description="`/metrics`; absent when the endpoint is off or its port was taken.",
    )

    def document(self) -> dict[str, Any]:
        """The JSON document: the keys the service gave, in their order."""
        return self.model_dump(mode="json", exclude_unset=True)

    def payload(self) -> bytes:
        """The document as `<prefix>/status` publishes it."""
        return json.dumps(self.document(), ensure_ascii=False).encode()
