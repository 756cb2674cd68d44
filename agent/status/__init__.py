"""The status snapshot as typed models: the source of truth for `<prefix>/status`,
`agentctl status` and `/metrics` (docs/mqtt.md, docs/metrics.md). One module per section;
`document.Status` is the whole. The models depend on nothing of the service: the daemon
validates its sections' snapshots into them, the readers read attributes."""

from __future__ import annotations

from agent.status.alarms import AlarmsStatus
from agent.status.alerts import AlertsStatus, DetectStatus, ErrorsStatus, LatencySummary
from agent.status.analysis import AnalysisStatus, ContextStatus
from agent.status.asr import AsrOff, AsrQueue, AsrStatus
from agent.status.document import ServiceState, Status
from agent.status.engine import EngineFigures, ModelStatus
from agent.status.fleet import FleetAnswer, FleetOff, FleetStatus
from agent.status.ingest import IngestStatus, QueueStatus
from agent.status.llm import EngineState, LastRestart, LlmOff, LlmStatus, RungStatus
from agent.status.local import ControlStatus, MetricsStatus
from agent.status.mqtt import MqttStatus
from agent.status.outbox import OutboxStatus
from agent.status.sparkplug import SparkplugStatus
from agent.status.streams import StreamStatus
from agent.status.watchdog import (
    LeakStatus,
    MemoryFigures,
    MemoryThresholds,
    WatchdogEvent,
    WatchdogOff,
    WatchdogStatus,
)

__all__ = [
    "AlarmsStatus",
    "AlertsStatus",
    "AnalysisStatus",
    "AsrOff",
    "AsrQueue",
    "AsrStatus",
    "ContextStatus",
    "ControlStatus",
    "DetectStatus",
    "EngineFigures",
    "EngineState",
    "ErrorsStatus",
    "FleetAnswer",
    "FleetOff",
    "FleetStatus",
    "IngestStatus",
    "LastRestart",
    "LatencySummary",
    "LeakStatus",
    "LlmOff",
    "LlmStatus",
    "MemoryFigures",
    "MemoryThresholds",
    "MetricsStatus",
    "ModelStatus",
    "MqttStatus",
    "OutboxStatus",
    "QueueStatus",
    "RungStatus",
    "ServiceState",
    "SparkplugStatus",
    "Status",
    "StreamStatus",
    "WatchdogEvent",
    "WatchdogOff",
    "WatchdogStatus",
]
