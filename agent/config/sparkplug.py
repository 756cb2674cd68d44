"""`sparkplug:`: the device as a Sparkplug B edge node, off by default (docs/sparkplug.md)."""

from __future__ import annotations

from pydantic import Field

from agent.config.base import SectionModel

__all__ = ["SparkplugSettings"]

_ID = r"^[A-Za-z0-9_.-]{1,64}$"  # a Sparkplug id is a topic level: no `/`, `+`, `#`


class SparkplugSettings(SectionModel):
    enabled: bool = Field(
        False,
        title="Sparkplug B",
        description="Run a Sparkplug B edge node beside the JSON contract: NBIRTH/NDEATH, "
        "one device per stream (DBIRTH, DDATA on each alarm change), rebirth on a host's "
        "`Node Control/Rebirth`.",
    )
    group_id: str = Field(
        "edge-agent",
        pattern=_ID,
        title="Group id",
        description="The Sparkplug group (`spBv1.0/<group_id>/...`).",
    )
    edge_node_id: str | None = Field(
        None,
        pattern=_ID,
        title="Edge node id",
        description="The node's id in its group; None: the device id (`device_id`, with "
        "characters outside [A-Za-z0-9_.-] as `_`).",
    )
    client_id: str | None = Field(
        None,
        min_length=1,
        max_length=64,
        title="Client id",
        description="The node's own MQTT client id (a clean session, as Sparkplug wants); "
        "None: `<mqtt.client_id>-spb`.",
    )
    host: str | None = Field(
        None,
        title="Broker host",
        description="None: the service's broker (`mqtt.host`). Username, password, TLS, "
        "protocol and keep-alive are always the `mqtt:` section's.",
    )
    port: int | None = Field(
        None, ge=1, le=65535, title="Broker port", description="None: `mqtt.port`."
    )
    queue_size: int = Field(
        1024,
        ge=1,
        le=100_000,
        title="Event queue bound",
        description="Alert events waiting for the node; past it the oldest is dropped and "
        "counted (`status.sparkplug.dropped`); that fault's metrics stay as last published "
        "until its next event.",
    )
