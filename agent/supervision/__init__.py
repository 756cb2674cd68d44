"""Engine supervision: keeps the embedded engine serving, or says loudly why it is not
(docs/watchdog.md).

- `supervisor`: EngineSupervisor, the loop: start, watch, restart, degrade;
- `gate`: the request gate (ready, admit, requests in flight);
- `rungs`: the ladder walked for memory trouble, the planner's checks, the persisted rung;
- `ladder`: the rungs themselves, cheapest first; `store`: the rung record on disk;
- `budget`: the restart budget (start retries, the rate limit, degraded mode's clock);
- `oom`: whether an engine error means out of memory;
- `snapshot`: the supervisor's part of the status.

The memory watchdog (agent.watchdog) acts through the supervisor without importing it.
"""

from __future__ import annotations

from agent.supervision.oom import is_out_of_memory
from agent.supervision.supervisor import EngineSupervisor, SupervisorState, Trouble, supervised

__all__ = ["EngineSupervisor", "SupervisorState", "Trouble", "is_out_of_memory", "supervised"]
