"""Sparkplug B: the device as a Sparkplug edge node, off by default (docs/sparkplug.md).

One concern a module: `topics` (names and the Sparkplug ids), `sequence` (`seq` and the
`bdSeq` that survives restarts), `payloads` (the Tahu protobuf messages: births, data,
deaths, the alarm metric tree), `devices` (each stream's alarms as the node last told them)
and `node` (the node's own MQTT client: will, births, data, rebirth, reconnects).
`sparkplug_b_pb2` is generated from the vendored Eclipse Tahu schema (EPL-2.0) by
scripts/gen_sparkplug.sh.
"""
