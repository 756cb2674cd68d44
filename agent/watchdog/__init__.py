"""The OOM watchdog: memory probes, the headroom policy, the tuning ladder and its persisted
rung, the leak detector (docs/watchdog.md). The engine supervisor (agent.supervisor) acts on
what it decides.

Import the submodules directly; this package imports nothing, so that agent.supervisor and
agent.watchdog.monitor can depend on its parts without a cycle.
"""
