"""`alarms:`: how operators may act on alarms (ack, shelve, unshelve; docs/alarms.md)."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field

from agent.config.base import SectionModel
from pipelines.alarms import ShelvePolicy

__all__ = ["AlarmsSettings"]

OperatorName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[^\s/#+]+$")]


class AlarmsSettings(SectionModel):
    commands: bool = Field(
        True,
        title="Operator commands over MQTT",
        description="Subscribe to `<prefix>/alerts/+/ack`, `.../shelve` and `.../unshelve`. "
        "Restrict who may publish there with the broker's ACL (docs/alarms.md); `agentctl "
        "alerts ack|shelve|unshelve` works through the control socket either way.",
    )
    operators: list[OperatorName] | None = Field(
        None,
        title="Allowed operators",
        description="Names a command's `by` (or its MQTT 5 user property `operator`) must be "
        "one of; None: any. The name is the publisher's claim: the broker's ACL on the "
        "command topics is what makes it true. Local commands are `local:<user>`, allowed "
        "to anyone the control socket lets in.",
    )
    max_shelve_s: float = Field(
        8 * 3600,
        ge=60,
        le=7 * 86400,
        title="Longest shelf (s)",
        description="A shelve asking for longer is refused (`shelve_too_long`).",
    )
    shelve_critical: bool = Field(
        False,
        title="Shelve critical faults",
        description="Whether a fault of severity `critical` may be shelved at all.",
    )
    max_standing: int = Field(
        256,
        ge=1,
        le=100_000,
        title="Standing alarms bound",
        description="Most alarms kept that cleared unacknowledged; past it the oldest is "
        "dropped (logged, counted in status.alarms.dropped).",
    )
    max_pending_commands: int = Field(
        64,
        ge=1,
        le=10_000,
        title="Command queue bound",
        description="Commands received and not yet applied; past it a command is refused "
        "(`busy`) and reported on `<prefix>/errors`.",
    )

    def shelving(self) -> ShelvePolicy:
        return ShelvePolicy(max_shelve_s=self.max_shelve_s, shelve_critical=self.shelve_critical)
