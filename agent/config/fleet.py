"""`fleet:`: signed configuration documents from the broker."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import Field

from agent.config.base import FLEET_NAME, SectionModel

__all__ = ["FleetSettings"]


class FleetSettings(SectionModel):
    """Fleet configuration over MQTT (docs/fleet.md). Never remotely settable itself."""

    enabled: bool = Field(
        False, title="Fleet config", description="Take signed documents from the broker."
    )
    groups: list[Annotated[str, Field(pattern=FLEET_NAME)]] = Field(
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
