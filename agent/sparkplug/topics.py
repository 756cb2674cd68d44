"""Sparkplug B topic names, and the ids that go into them.

`spBv1.0/<group_id>/<message type>/<edge_node_id>[/<device_id>]`. The ids are topic levels,
so Sparkplug forbids `/`, `+` and `#` in them; `sparkplug_id` maps anything outside
`[A-Za-z0-9_.-]` to `_` (a stream id is already of those characters: docs/mqtt.md).
"""

from __future__ import annotations

import re

__all__ = ["NAMESPACE", "SPARKPLUG_ID", "SparkplugTopics", "sparkplug_id"]

NAMESPACE = "spBv1.0"
SPARKPLUG_ID = r"^[A-Za-z0-9_.-]{1,64}$"  # what the config allows for group and node ids
_NOT_ALLOWED = re.compile(r"[^A-Za-z0-9_.-]")


def sparkplug_id(name: str) -> str:
    """`name` as a Sparkplug id: characters outside `[A-Za-z0-9_.-]` become `_`."""
    return _NOT_ALLOWED.sub("_", name) or "_"


class SparkplugTopics:
    """The topics of one edge node."""

    def __init__(self, group_id: str, edge_node_id: str) -> None:
        self.group_id = group_id
        self.edge_node_id = edge_node_id
        base = f"{NAMESPACE}/{group_id}"
        self.nbirth = f"{base}/NBIRTH/{edge_node_id}"
        self.ndeath = f"{base}/NDEATH/{edge_node_id}"
        self.ndata = f"{base}/NDATA/{edge_node_id}"
        self.ncmd = f"{base}/NCMD/{edge_node_id}"

    def device(self, kind: str, device_id: str) -> str:
        """DBIRTH, DDATA, DDEATH (or DCMD) of one device."""
        return f"{NAMESPACE}/{self.group_id}/{kind}/{self.edge_node_id}/{device_id}"
