"""What vLLM's scheduler did, step by step, for a request that does not return (issue 20).

The 2026-12-01 lease saw orin-nx-8gb's 60,780-token window prefill never return, twice, with
no log line saying why: in-process, vLLM prints its periodic stats only when someone calls
`do_log_stats()` (the API server does; we did not). Two tools make such a stall explain itself:

- `trace_factory()`: the service's own vLLM stat logger (agent.engine.vllm_api) feeding a
  `Trace`, which keeps every step's scheduler counters (running and waiting requests, KV
  pool usage, preemptions) in a ring and prints one line every few seconds. A request that
  cannot get the blocks it needs shows as running with nearly the whole pool, then waiting
  with none, in turn (the lease-3 stalls; vLLM's preemption counter stays 0 in-process).
- `install_thread_dump_hook()` + `dump_engine_core()`: every Python process started after
  the hook (the spawned engine core included) registers faulthandler on SIGUSR1, so a stalled
  engine core's threads can be printed into the log without stopping it.
"""

from __future__ import annotations

import collections
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from agent.engine.stats import StatsCollector, StepStats

_HOOK = """\
# Written by bench/engine/sched_trace.py: SIGUSR1 prints every thread's stack to stderr; then
# the sitecustomize this one hides (the next on sys.path), if any, runs as before.
import faulthandler, os, signal, sys
faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True)
_here = os.path.dirname(os.path.abspath(__file__))
for _d in sys.path:
    _f = os.path.join(_d or ".", "sitecustomize.py")
    if os.path.abspath(_d or ".") != _here and os.path.isfile(_f):
        with open(_f) as _src:
            exec(compile(_src.read(), _f, "exec"), {"__name__": "sitecustomize", "__file__": _f})
        break
"""


class Trace(StatsCollector):
    """The service's own stats collector (agent.engine.stats, fed by the service's vLLM stat
    logger), keeping every step's counters in a ring of the last `keep` steps as well."""

    def __init__(self, keep: int = 4000, every_s: float = 5.0) -> None:
        super().__init__()
        self.steps_ring: collections.deque[tuple[float, int, int, float, int]] = collections.deque(
            maxlen=keep
        )
        self.every_s, self._last_print, self.t0 = every_s, 0.0, time.monotonic()

    @property
    def totals(self) -> dict[str, int]:
        return {"steps": self.steps, "preempted": self.preemptions,
                "prefix_queries": self.prefix_queries, "prefix_hits": self.prefix_hits}  # fmt: skip

    def on_record(self, preempted: int, step: StepStats | None) -> None:
        super().on_record(preempted, step)
        if step is None:
            return
        now = time.monotonic() - self.t0
        row = (
            round(now, 3),
            step.num_running,
            step.num_waiting,
            round(step.kv_usage, 4),
            preempted,
        )
        self.steps_ring.append(row)
        if now - self._last_print >= self.every_s:
            self._last_print = now
            print(
                f"[sched] t={now:.1f}s running={step.num_running} waiting={step.num_waiting} "
                f"kv={100 * step.kv_usage:.1f}% totals={self.totals}",
                flush=True,
            )

    def summary(self, since_s: float | None = None) -> dict[str, Any]:
        """Totals, and the steps from `since_s` (this trace's clock) on, thinned to 200."""
        rows = [r for r in self.steps_ring if since_s is None or r[0] >= since_s]
        stride = max(1, len(rows) // 200)
        return {
            "totals": self.totals,
            "columns": ["t_s", "running", "waiting", "kv_usage", "preempted"],
            "steps": rows[::stride] + (rows[-1:] if rows and (len(rows) - 1) % stride else []),
            "steps_in_window": len(rows),
        }

    def now(self) -> float:
        return time.monotonic() - self.t0


def trace_factory(trace: Trace) -> Any:
    """The service's vLLM stat logger, feeding `trace` (pass it in `stat_loggers=[...]`)."""
    from agent.engine.vllm_api import stat_logger_factory

    return stat_logger_factory(trace)


def install_thread_dump_hook(folder: Path) -> Path:
    """Write a sitecustomize.py that registers faulthandler on SIGUSR1 and put it on the
    PYTHONPATH of every process started from now on (vLLM spawns its engine core)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(_HOOK)
    parts = [str(folder), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(parts))
    os.environ["EA_THREAD_DUMP_HOOK"] = str(folder)
    return folder


def dump_engine_core() -> list[int]:
    """Send SIGUSR1 to our engine core processes (only where the hook is installed, since
    SIGUSR1's default action ends a process); their stacks go to stderr. Returns the pids."""
    if not os.environ.get("EA_THREAD_DUMP_HOOK"):
        return []
    from bench.engine.profile_probe import descendants

    sent = []
    for pid in descendants(os.getpid()):
        proc = Path("/proc") / str(pid)
        try:
            title = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            title += " " + (proc / "comm").read_text()
        except OSError:
            continue
        if pid != os.getpid() and "EngineCore" in title:
            os.kill(pid, signal.SIGUSR1)
            sent.append(pid)
    print(f"[sched] thread dump asked of engine core pids {sent}", file=sys.stderr, flush=True)
    return sent
