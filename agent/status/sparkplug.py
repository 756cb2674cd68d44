"""`status.sparkplug`: the Sparkplug B edge node, when `sparkplug.enabled` (docs/sparkplug.md)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["SparkplugStatus"]


class SparkplugStatus(StatusModel):
    connected: bool = Field(title="Connected", description="The node's own MQTT session is up.")
    group_id: str = Field(title="Group id", description="`sparkplug.group_id`.")
    edge_node_id: str = Field(title="Edge node id", description="The node's Sparkplug id.")
    client_id: str = Field(title="Client id", description="The node's MQTT client id.")
    bdseq: int | None = Field(title="bdSeq", description="This session's birth/death sequence.")
    seq: int | None = Field(title="seq", description="The last message's sequence number.")
    devices: int = Field(title="Devices", description="Streams known as Sparkplug devices.")
    births: int = Field(title="Births", description="NBIRTHs published.")
    rebirths: int = Field(title="Rebirths", description="Rebirths a host asked for.")
    messages: int = Field(title="Messages", description="Sparkplug messages published.")
    connects: int = Field(title="Connects", description="Sessions opened.")
    queued: int = Field(title="Queued", description="Alert events waiting for the node.")
    dropped: int = Field(
        title="Dropped", description="Alert events dropped from the node's full queue."
    )
    invalid_events: int = Field(title="Invalid events", description="Events it could not read.")
    commands_malformed: int = Field(
        title="Malformed commands", description="NCMD payloads refused (counted, ignored)."
    )
    last_error: str | None = Field(title="Last error", description="The last connection error.")
