"""The memory watchdog: memory probes, the headroom policy, the leak detector and the
monitor that ties them together (docs/watchdog.md). It acts through the engine supervisor
(agent.supervision) by the small protocol it declares (agent.watchdog.monitor.Supervisor),
never by importing it. `settings` is the configuration's `watchdog:` section, which also
holds the supervisor's restart budget; `events` is the log both write their decisions to.
"""
