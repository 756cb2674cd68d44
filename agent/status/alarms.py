"""`status.alarms`: the alarm list by ISA-18.2 state and the operators' commands
(docs/alarms.md)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["AlarmsStatus"]


class AlarmsStatus(StatusModel):
    by_state: dict[str, int] = Field(
        title="By state",
        description="Alarms on the list by state (`unack_active`, `ack_active`, "
        "`unack_cleared`, `shelved`), every state from the start at 0.",
    )
    standing: int = Field(
        title="Standing", description="Alarms that cleared unacknowledged and wait for an ack."
    )
    dropped: int = Field(
        title="Dropped", description="Standing alarms dropped past `alarms.max_standing`."
    )
    applied: dict[str, int] = Field(
        title="Commands applied", description="Operator commands applied, by action."
    )
    refused: dict[str, int] = Field(
        title="Commands refused",
        description="Operator commands refused, by reason (`unknown_alert`, `not_allowed`, "
        "`forbidden`, `invalid`, `shelve_too_long`, `critical_not_shelvable`, `busy`); each "
        "also on `<prefix>/errors`.",
    )
    pending: int = Field(title="Pending", description="Commands received, not yet applied.")
