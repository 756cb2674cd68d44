"""The agent's configuration schema: `AgentConfig`, assembled from one module per section
(mqtt, ingest, streams, local: outbox, control, metrics and logging; alarms, fleet, llm; the engine,
watchdog, ASR and keyword sections live with their owners), all re-exported here.

Every section forbids unknown keys (a typo fails validation instead of being ignored) and
every field carries a title and a description: the schema is the reference documentation
(`agentctl config schema` prints it).
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import Field, model_validator
from typing_extensions import Self

from agent.config.alarms import AlarmsSettings
from agent.config.base import FLEET_NAME, LocatedError, SectionModel
from agent.config.fleet import FleetSettings
from agent.config.ingest import IngestSettings
from agent.config.llm import LlmSettings
from agent.config.local import (
    ControlSettings,
    LogFormat,
    LoggingSettings,
    MetricsSettings,
    OutboxSettings,
)
from agent.config.mqtt import MqttSettings, TlsSettings
from agent.config.sparkplug import SparkplugSettings
from agent.config.streams import (
    AlertOverride,
    AlertSettings,
    StreamOverride,
    StreamSettings,
    StreamsSettings,
)
from agent.engine.profile import EngineProfile
from agent.watchdog.settings import WatchdogSettings
from pipelines.asr.settings import AsrSettings
from pipelines.catalogue import FaultRule, class_refs
from pipelines.keyword_settings import KeywordSettings

__all__ = [
    "AgentConfig",
    "AlarmsSettings",
    "AlertOverride",
    "AlertSettings",
    "ControlSettings",
    "FleetSettings",
    "IngestSettings",
    "LlmSettings",
    "LocatedError",
    "LogFormat",
    "LoggingSettings",
    "MetricsSettings",
    "MqttSettings",
    "OutboxSettings",
    "SparkplugSettings",
    "StreamOverride",
    "StreamSettings",
    "StreamsSettings",
    "TlsSettings",
]


ProfileName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]


class AgentConfig(SectionModel):
    profile: ProfileName = Field(
        "cpu-dev",
        title="Device profile",
        description="Name of configs/profiles/<name>.yaml, merged under this file.",
    )
    device_id: str = Field(
        "edge-agent",
        min_length=1,
        title="Device id",
        description="Identifies this device in status, alerts and fleet targets.",
    )
    mqtt: MqttSettings = Field(default_factory=MqttSettings, title="MQTT", description="Broker.")
    ingest: IngestSettings = Field(
        default_factory=IngestSettings, title="Ingest", description="Input limits and queues."
    )
    streams: StreamsSettings = Field(
        default_factory=StreamsSettings, title="Streams", description="Per-stream settings."
    )
    keywords: KeywordSettings = Field(
        default_factory=KeywordSettings,
        title="Keyword matching",
        description="Fuzzy and negation settings of the instant keyword tier.",
    )
    faults: list[FaultRule] = Field(
        default_factory=list,
        title="Fault catalogue",
        description="Faults the agent alerts on: code, labels and keywords per language, severity.",
    )
    outbox: OutboxSettings = Field(
        default_factory=OutboxSettings, title="Outbox", description="Durable alert outbox."
    )
    alarms: AlarmsSettings = Field(
        default_factory=AlarmsSettings,
        title="Alarms",
        description="Operator commands on alarms: acknowledge, shelve, unshelve (docs/alarms.md).",
    )
    sparkplug: SparkplugSettings = Field(
        default_factory=SparkplugSettings,
        title="Sparkplug B",
        description="The device as a Sparkplug B edge node, off by default (docs/sparkplug.md).",
    )
    llm: LlmSettings = Field(default_factory=LlmSettings, title="LLM", description="Slow tier.")
    engine: EngineProfile | None = Field(
        None,
        title="Engine",
        description="The embedded vLLM engine's settings; normally from the device profile.",
    )
    control: ControlSettings = Field(
        default_factory=ControlSettings,
        title="Control",
        description="The local control socket agentctl uses.",
    )
    fleet: FleetSettings = Field(
        default_factory=FleetSettings,
        title="Fleet",
        description="Signed configuration documents from the broker, applied with a health "
        "gate and rolled back by themselves.",
    )
    asr: AsrSettings = Field(
        default_factory=AsrSettings,
        title="ASR",
        description="Audio in: faster-whisper transcribes `<prefix>/streams/+/audio`.",
    )
    metrics: MetricsSettings = Field(
        default_factory=MetricsSettings,
        title="Metrics",
        description="The Prometheus endpoint: the status snapshot for scraping.",
    )
    watchdog: WatchdogSettings = Field(
        default_factory=WatchdogSettings,
        title="Watchdog",
        description="Memory thresholds, engine restart limits and the tuning ladder's state; "
        "normally from the device profile.",
    )
    logging: LoggingSettings = Field(
        default_factory=LoggingSettings, title="Logging", description="Log output."
    )

    @model_validator(mode="after")
    def _cross_checks(self) -> Self:
        if self.fleet.enabled and not re.match(FLEET_NAME, self.device_id):
            raise LocatedError(
                f"with fleet.enabled the device id names a topic level "
                f"(fleet/device/<device_id>/config): {FLEET_NAME}",
                ("device_id",),
            )
        if self.llm.enabled and self.engine is None:
            raise LocatedError(
                "llm.enabled needs an `engine:` section (normally from the device profile)",
                ("llm", "enabled"),
            )
        if self.llm.enabled and self.engine is not None:
            if self.engine.skip_tokenizer_init:
                raise LocatedError(
                    "llm.enabled needs the model's tokenizer (windows are counted in its "
                    "tokens, answers follow a JSON schema); the profile sets "
                    "engine.skip_tokenizer_init (benchmark profiles only)",
                    ("llm", "enabled"),
                )
            budget = self.llm.context_budget(self.engine)
            room = self.engine.max_model_len - self.llm.max_output_tokens
            if budget > room:
                raise LocatedError(
                    f"context_tokens {budget} + max_output_tokens {self.llm.max_output_tokens} "
                    f"exceed the engine's max_model_len {self.engine.max_model_len}",
                    ("llm", "context_tokens"),
                )
            wd = self.watchdog
            if wd.hang_s + wd.interval_s >= self.llm.analysis_timeout_s:
                raise LocatedError(
                    f"watchdog.hang_s {wd.hang_s:g} + interval_s {wd.interval_s:g} must be "
                    f"below llm.analysis_timeout_s {self.llm.analysis_timeout_s:g}: the "
                    "watchdog must see a hung request before the analysis gives up on it",
                    ("watchdog", "hang_s"),
                )
            if budget < 2048:
                raise LocatedError(
                    f"the context window would be {budget} tokens; at least 2048 are needed "
                    "(raise engine.max_model_len or lower llm.max_output_tokens)",
                    ("llm", "max_output_tokens"),
                )
        seen = self._catalogue_codes()
        defaults = self.streams.defaults.disabled_faults
        lists: list[tuple[tuple[str | int, ...], list[str]]] = [
            (("streams", "defaults", "disabled_faults"), defaults)
        ]
        lists += [
            (("streams", "overrides", sid, "disabled_faults"), o.disabled_faults or [])
            for sid, o in self.streams.overrides.items()
        ]
        for loc, codes in lists:
            for j, code in enumerate(codes):
                if code not in seen:
                    raise LocatedError(f"unknown codes {[code]}", (*loc, j))
        return self

    def _catalogue_codes(self) -> set[str]:
        """The catalogue's codes, checked unique; every @class a concept names exists."""
        seen: set[str] = set()
        for i, fault in enumerate(self.faults):
            if fault.code in seen:
                raise LocatedError(
                    f"fault codes must be unique: {fault.code!r} is repeated", ("faults", i, "code")
                )
            seen.add(fault.code)
            for loc, ref in class_refs(fault):
                if ref[1:] not in self.keywords.classes:
                    raise LocatedError(
                        f"unknown word class {ref!r} (keywords.classes has "
                        f"{sorted(self.keywords.classes)})",
                        ("faults", i, *loc),
                    )
        return seen
