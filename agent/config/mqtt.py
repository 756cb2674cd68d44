"""`mqtt:`: the broker, its TLS and the session."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, field_validator, model_validator
from typing_extensions import Self

from agent.config.base import TOPIC_LEVEL, SectionModel

__all__ = ["MqttSettings", "TlsSettings"]


class TlsSettings(SectionModel):
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


class MqttSettings(SectionModel):
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
        if not v or not TOPIC_LEVEL.match(v):
            raise ValueError("must be a non-empty topic without wildcards (+, #)")
        return v

    @model_validator(mode="after")
    def _delays_ordered(self) -> Self:
        if self.reconnect_min_s > self.reconnect_max_s:
            raise ValueError("reconnect_min_s must not exceed reconnect_max_s")
        if self.password_credential is not None and self.username is None:
            raise ValueError("password_credential needs username")
        return self
