"""`status.mqtt`: the broker connection (agent.mqtt.MqttLink, counted in agent.stats)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["MqttStatus"]


class MqttStatus(StatusModel):
    connected: bool = Field(title="Connected", description="True while connected to the broker.")
    broker: str = Field("", title="Broker", description="`host:port` of the configured broker.")
    last_error: str | None = Field(
        None,
        title="Last error",
        description="Why the last connection attempt failed or the connection was lost "
        "(refused, unreachable, not authorised...); null once connected.",
    )
    disconnected_s: float | None = Field(
        None, title="Disconnected for (s)", description="Seconds since the link went down; "
        "null while connected.",
    )  # fmt: skip
    connects: int = Field(title="Connects", description="Successful broker connections.")
    disconnects: int = Field(title="Disconnects", description="Broker connections lost.")
    acked: int = Field(
        title="Acknowledged",
        description="Input acknowledged to the broker once its effect was durable.",
    )
    stale_acks: int = Field(
        title="Stale acknowledgements",
        description="Acknowledgements not sent: their session had ended (the broker "
        "redelivers those).",
    )
