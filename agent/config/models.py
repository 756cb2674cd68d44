"""The agent's configuration schema.

Every section forbids unknown keys (a typo fails validation instead of being ignored) and
every field carries a title and a description: the schema is the reference documentation
(`agentctl config schema` prints it).
"""

from __future__ import annotations

import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from typing_extensions import Self

from agent.config.merge import deep_merge
from agent.engine.profile import EngineProfile
from agent.watchdog.settings import WatchdogSettings
from pipelines.analysis import AnalysisSettings
from pipelines.asr.settings import AsrSettings
from pipelines.catalogue import FaultRule, class_refs
from pipelines.keyword_settings import KeywordSettings

__all__ = [
    "AgentConfig",
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
    "StreamOverride",
    "StreamSettings",
    "StreamsSettings",
    "TlsSettings",
]

_TOPIC_LEVEL = re.compile(r"^[^#+\x00]+$")
_FLEET_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"  # a group or device id in fleet topics


class LocatedError(ValueError):
    """A cross-field error that knows which key it is about, so the loader can point at that
    key's line instead of at the whole file."""

    def __init__(self, message: str, loc: tuple[str | int, ...]) -> None:
        super().__init__(message)
        self.loc = loc


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())


class TlsSettings(_Model):
    enabled: bool = Field(False, title="TLS", description="Connect to the broker over TLS.")
    ca_file: Path | None = Field(
        None, title="CA file", description="PEM bundle to verify the broker; system CAs if unset."
    )
    cert_file: Path | None = Field(
        None, title="Client certificate", description="PEM client certificate for mutual TLS."
    )
    key_file: Path | None = Field(
        None, title="Client key", description="PEM private key matching `cert_file`."
    )
    insecure: bool = Field(
        False,
        title="Skip hostname check",
        description="Do not verify the broker's hostname. Only for lab brokers.",
    )

    @model_validator(mode="after")
    def _cert_needs_key(self) -> Self:
        if (self.cert_file is None) != (self.key_file is None):
            raise ValueError("cert_file and key_file must be set together")
        return self


class MqttSettings(_Model):
    host: str = Field("127.0.0.1", title="Broker host", description="Hostname or IP of the broker.")
    port: int = Field(1883, ge=1, le=65535, title="Broker port", description="TCP port.")
    topic_prefix: str = Field(
        "edge-agent",
        title="Topic prefix",
        description="Every topic the agent reads or writes starts with this prefix.",
    )
    client_id: str = Field(
        "edge-agent",
        min_length=1,
        max_length=64,
        title="Client id",
        description="MQTT client identifier; unique per device (the broker keeps its session).",
    )
    username: str | None = Field(None, title="Username", description="Broker username, if any.")
    password_credential: str | None = Field(
        None,
        title="Password credential",
        description=(
            "Name of the credential holding the broker password: a file of that name in "
            "$CREDENTIALS_DIRECTORY (systemd LoadCredential=), else the environment variable "
            "EDGE_AGENT_MQTT_PASSWORD. The password itself never appears in YAML or logs."
        ),
    )
    tls: TlsSettings = Field(default_factory=TlsSettings, title="TLS", description="TLS settings.")
    protocol: Literal["5", "3.1.1"] = Field(
        "5",
        title="MQTT protocol",
        description="5 carries the user properties audio clips may send (`seq`, `start`); "
        "3.1.1 for an old broker (clips then take arrival order and time).",
    )
    session_expiry_s: int = Field(
        86400,
        ge=0,
        le=0xFFFFFFFF,  # MQTT 5's four-byte field (the maximum means "never expires")
        title="Session expiry (MQTT 5)",
        description="How long the broker keeps our session (subscriptions and queued QoS 1 "
        "input) while we are away. 3.1.1 sessions last until the broker drops them.",
    )
    keepalive_s: int = Field(
        30, ge=5, le=3600, title="Keep-alive", description="MQTT keep-alive in seconds."
    )
    reconnect_min_s: float = Field(
        0.5, gt=0, title="Reconnect min delay", description="First reconnect delay (seconds)."
    )
    reconnect_max_s: float = Field(
        30.0,
        gt=0,
        title="Reconnect max delay",
        description="Cap of the jittered exponential reconnect delay (seconds).",
    )
    publish_timeout_s: float = Field(
        10.0,
        gt=0,
        title="Publish timeout",
        description="How long to wait for the broker's PUBACK before treating the link as down.",
    )
    status_interval_s: float = Field(
        15.0,
        gt=0,
        title="Status interval",
        description="Seconds between retained status snapshots.",
    )
    errors_per_minute: int = Field(
        60,
        ge=1,
        title="Error report rate",
        description="At most this many input-error events a minute on <prefix>/errors; the rest "
        "are counted as suppressed.",
    )

    @field_validator("protocol", mode="before")
    @classmethod
    def _protocol_as_text(cls, v: object) -> object:
        return str(v) if isinstance(v, int) and not isinstance(v, bool) else v  # YAML `5`

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_topic(cls, v: str) -> str:
        v = v.strip("/")
        if not v or not _TOPIC_LEVEL.match(v):
            raise ValueError("must be a non-empty topic without wildcards (+, #)")
        return v

    @model_validator(mode="after")
    def _delays_ordered(self) -> Self:
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError("reconnect_min_s must not exceed reconnect_max_s")
        if self.password_credential is not None and self.username is None:
            raise ValueError("password_credential needs username")
        return self


class IngestSettings(_Model):
    max_payload_bytes: int = Field(
        64 * 1024,
        ge=256,
        title="Max payload",
        description="Transcript payloads larger than this are rejected unread.",
    )
    max_text_chars: int = Field(
        8000, ge=1, title="Max text", description="Longest transcript text accepted per segment."
    )
    allowed_streams: list[str] | None = Field(
        None,
        title="Stream allow-list",
        description="If set, segments from any other stream id are rejected (strict mode).",
    )
    max_streams: int = Field(
        256,
        ge=1,
        title="Max streams",
        description="Distinct stream ids kept in memory; segments of further streams are "
        "rejected (too_many_streams), so no publisher can grow the agent without bound.",
    )
    queue_size: int = Field(
        1024,
        ge=1,
        title="Ingest queue",
        description="Segments waiting for detection in memory; when full, new segments go "
        "to the spool on disk (spool_max_segments), in order.",
    )
    spool_max_segments: int = Field(
        200_000,
        ge=0,
        le=10_000_000,
        title="Ingest spool",
        description="Accepted segments the on-disk spool holds once the queue is full (each "
        "acknowledged to the broker only when written); past it, new segments are shed and "
        "counted. 0: no spool, a full queue sheds its oldest (as before the spool).",
    )
    spool_path: Path | None = Field(
        None,
        title="Spool file",
        description="SQLite file of the spool; default `spool.sqlite` beside the outbox.",
    )
    max_future_skew_s: float = Field(
        300.0,
        ge=0,
        title="Clock skew",
        description="Segments timestamped further than this in the future are rejected.",
    )


class AlertSettings(_Model):
    debounce_s: float = Field(
        10.0,
        ge=0,
        title="Debounce",
        description="Repeated matches of an active alert within this window fold into one update.",
    )
    quiet_end_s: float = Field(
        120.0,
        gt=0,
        title="Quiet period",
        description="An alert ends after this many seconds without a new match.",
    )
    max_evidence: int = Field(
        5, ge=1, le=50, title="Evidence kept", description="Most recent evidence items per alert."
    )


class StreamSettings(_Model):
    """Settings that may differ per stream; `streams.defaults` gives the global values."""

    language: str | None = Field(
        None,
        title="Language hint",
        description="Language of the stream (en, zh); None trusts each segment's `lang`.",
    )
    alerts: AlertSettings = Field(
        default_factory=AlertSettings, title="Alerts", description="Alert lifecycle timing."
    )
    disabled_faults: list[str] = Field(
        default_factory=list,
        title="Disabled faults",
        description="Fault codes never raised for this stream.",
    )


class AlertOverride(_Model):
    debounce_s: float | None = Field(None, ge=0, title="Debounce", description="See alerts.")
    quiet_end_s: float | None = Field(None, gt=0, title="Quiet period", description="See alerts.")
    max_evidence: int | None = Field(
        None, ge=1, le=50, title="Evidence kept", description="See alerts."
    )


class StreamOverride(_Model):
    """A partial StreamSettings: only the keys given replace the defaults."""

    language: str | None = Field(None, title="Language hint", description="See defaults.")
    alerts: AlertOverride | None = Field(None, title="Alerts", description="See defaults.")
    disabled_faults: list[str] | None = Field(
        None, title="Disabled faults", description="Replaces the default list."
    )


class StreamsSettings(_Model):
    defaults: StreamSettings = Field(
        default_factory=StreamSettings,
        title="Defaults",
        description="Settings for every stream.",
    )
    overrides: dict[str, StreamOverride] = Field(
        default_factory=dict,
        title="Per-stream overrides",
        description="Partial settings per stream id, merged over the defaults.",
    )

    def for_stream(self, stream_id: str) -> StreamSettings:
        """Effective settings of one stream: the defaults with its override merged over them."""
        override = self.overrides.get(stream_id)
        if override is None:
            return self.defaults
        merged = deep_merge(
            self.defaults.model_dump(mode="python"), override.model_dump(exclude_none=True)
        )
        return StreamSettings.model_validate(merged)


class OutboxSettings(_Model):
    path: Path = Field(
        Path("/var/lib/edge-agent/outbox.sqlite"),
        title="Outbox path",
        description="SQLite database (WAL) holding alert events until the broker acknowledged "
        "them. Relative paths are resolved against the config file's directory.",
    )
    max_events: int = Field(
        100_000,
        ge=10,
        title="Outbox bound",
        description="Most events kept while the broker is away; beyond it the oldest updates "
        "are shed first (new/end events last) and counted.",
    )


class ControlSettings(_Model):
    enabled: bool = Field(
        True, title="Control socket", description="Serve `agentctl` on a Unix socket."
    )
    socket_path: Path | None = Field(
        None,
        title="Socket path",
        description="Unix socket for agentctl (mode 0660, the service's group). None: "
        "control.sock in $RUNTIME_DIRECTORY (systemd's RuntimeDirectory=), else beside the "
        "outbox. Not remotely settable.",
    )
    fault_injection: bool = Field(
        False,
        title="Fault injection",
        description="Accept the fault-injection commands on the control socket "
        "(`fault.block_loop`: blocks the event loop for the given seconds, so a test can "
        "prove systemd's watchdog restarts a hung service; `fault.pause_detect`: input is "
        "queued but not processed or acknowledged for the given seconds;"
        " `fault.pause_fleet_apply`). Off in production. Not remotely settable.",
    )


class FleetSettings(_Model):
    """Fleet configuration over MQTT (docs/fleet.md). Never remotely settable itself."""

    enabled: bool = Field(
        False, title="Fleet config", description="Take signed documents from the broker."
    )
    groups: list[Annotated[str, Field(pattern=_FLEET_NAME)]] = Field(
        default_factory=list,
        title="Groups",
        description="This device's groups: documents on fleet/<group>/config apply, in this "
        "order, then fleet/device/<device_id>/config.",
    )
    trusted_keys_dir: Path = Field(
        Path("/etc/edge-agent/trusted_keys"),
        title="Trusted keys",
        description="Ed25519 public keys, one <key_id>.pub PEM file each. Relative paths are "
        "resolved from the config file's folder.",
    )
    health_gate_s: float = Field(
        180.0,
        gt=0,
        title="Health gate (s)",
        description="After an apply, how long the engine, MQTT and the pipeline have to prove "
        "healthy before the change is rolled back (a cold GPU engine start needs minutes).",
    )
    defer_max_s: float = Field(
        300.0,
        ge=0,
        title="Longest deferral (s)",
        description="An engine-restarting change waits while a critical alert's analysis "
        "runs, at most this long.",
    )
    state_dir: Path | None = Field(
        None,
        title="State folder",
        description="Applied layers and the pending apply. None: fleet/ beside the outbox.",
    )


class MetricsSettings(_Model):
    enabled: bool = Field(
        True, title="Metrics", description="Serve Prometheus `/metrics` (agent.metrics)."
    )
    host: str = Field(
        "127.0.0.1",
        title="Listen address",
        description="Loopback by default: the endpoint has no authentication and names "
        "streams and faults. Scrape with the device's own agent or through a tunnel.",
    )
    port: int = Field(
        9464, ge=0, le=65535, title="Port", description="TCP port; 0 picks a free one."
    )


class LlmSettings(AnalysisSettings):
    """The slow tier: the embedded engine reads each stream's rolling context."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    enabled: bool = Field(
        False, title="LLM analysis", description="Run the embedded engine's slow-tier analysis."
    )

    def context_budget(self, engine: EngineProfile) -> int:
        """Tokens of one stream's prompt: the configured window, else what the engine's
        context length leaves after the answer."""
        if self.context_tokens is not None:
            return self.context_tokens
        return engine.max_model_len - self.max_output_tokens


class LogFormat(str, Enum):
    json = "json"
    console = "console"


class LoggingSettings(_Model):
    level: str = Field("info", title="Level", description="debug, info, warning or error.")
    format: LogFormat = Field(
        LogFormat.json,
        title="Format",
        description="json lines on stdout (journal fields under systemd) or console for humans.",
    )

    @field_validator("level")
    @classmethod
    def _known_level(cls, v: str) -> str:
        v = v.lower()
        if v not in {"debug", "info", "warning", "error"}:
            raise ValueError("must be one of debug, info, warning, error")
        return v


ProfileName = Annotated[str, Field(pattern=r"^[a-z0-9][a-z0-9-]*$")]


class AgentConfig(_Model):
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
        if self.fleet.enabled and not re.match(_FLEET_NAME, self.device_id):
            raise LocatedError(
                f"with fleet.enabled the device id names a topic level "
                f"(fleet/device/<device_id>/config): {_FLEET_NAME}",
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
