"""`status.fleet`: signed configuration documents (agent.fleet.manager.FleetManager.snapshot;
docs/fleet.md). Without `fleet.enabled` just `{"enabled": false}` (FleetOff)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["FleetAnswer", "FleetOff", "FleetStatus"]


class FleetAnswer(StatusModel):
    """A target's last answer (also published on `<prefix>/config/ack`)."""

    version: int | None = Field(
        title="Version", description="The document's version; null if unreadable."
    )
    status: str = Field(
        title="Status", description="`applied`, `rejected`, `deferred`, `rolled_back`, ..."
    )
    reason: str = Field(title="Reason", description="Why.")
    at: float = Field(title="At", description="Epoch seconds.")


class FleetOff(StatusModel):
    enabled: Literal[False] = Field(title="Enabled", description="`fleet.enabled`.")


class FleetStatus(StatusModel):
    enabled: Literal[True] = Field(title="Enabled", description="`fleet.enabled`.")
    phase: Literal["idle", "verifying", "deferred", "applying", "gating"] = Field(
        title="Phase", description="What the manager is doing."
    )
    targets: list[str] = Field(
        title="Targets", description="This device's targets, in the order their layers apply."
    )
    applied: dict[str, int] = Field(
        title="Applied", description="The document version in force, per target."
    )
    last: dict[str, FleetAnswer] = Field(title="Last", description="Per target: the last answer.")
    documents: int = Field(title="Documents", description="Documents received.")
    handled: int = Field(
        title="Handled", description="Taken up and answered, or found already answered."
    )
    superseded: int = Field(
        title="Superseded", description="Replaced by a newer one before being taken up."
    )
    answers_unpublished: int = Field(
        default=0,
        title="Answers unpublished",
        description="Answers the broker never took (not connected in time, or the publish "
        "failed); each stands in `last` only.",
    )
