"""What vLLM's scheduler did, step by step, for a request that does not return (issue 20).

The 2026-12-01 lease saw orin-nx-8gb's 60,780-token window prefill never return, twice, with
no log line saying why: in-process, vLLM prints its periodic stats only when someone calls
`do_log_stats()` (the API server does; we did not). Two tools make such a stall explain itself:

- `trace_factory()`: a stat logger (vLLM's `StatLoggerBase`) that keeps every step's
  scheduler counters (running and waiting requests, KV pool usage, preemptions, prompt and
  generated tokens) in a ring, and prints one line every few seconds while the engine runs.
  A request waiting for blocks it never gets shows as running 0 / waiting 1 with no tokens;
  one that preempts itself and recomputes shows preemptions and prompt tokens without end.
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


class Trace:
    """Per-step scheduler counters, a ring of the last `keep` steps plus running totals."""

    def __init__(self, keep: int = 4000, every_s: float = 5.0) -> None:
        self.steps: collections.deque[tuple[float, int, int, float, int, int, int]] = (
            collections.deque(maxlen=keep)
        )
        self.totals = {"steps": 0, "preempted": 0, "prompt_tokens": 0, "generated_tokens": 0}
        self.every_s, self._last_print, self.t0 = every_s, 0.0, time.monotonic()

    def record(self, sched: Any, it: Any) -> None:
        now = time.monotonic() - self.t0
        running = int(getattr(sched, "num_running_reqs", 0) or 0)
        waiting = int(getattr(sched, "num_waiting_reqs", 0) or 0)
        usage = float(getattr(sched, "kv_cache_usage", 0.0) or 0.0)
        pre = int(getattr(it, "num_preempted_reqs", 0) or 0)
        prompt = int(getattr(it, "num_prompt_tokens", 0) or 0)
        gen = int(getattr(it, "num_generation_tokens", 0) or 0)
        self.steps.append((round(now, 3), running, waiting, round(usage, 4), pre, prompt, gen))
        t = self.totals
        t["steps"] += 1
        t["preempted"] += pre
        t["prompt_tokens"] += prompt
        t["generated_tokens"] += gen
        if now - self._last_print >= self.every_s:
            self._last_print = now
            print(
                f"[sched] t={now:.1f}s running={running} waiting={waiting} "
                f"kv={100 * usage:.1f}% totals={t}",
                flush=True,
            )

    def summary(self, since_s: float | None = None) -> dict[str, Any]:
        """Totals, and the steps from `since_s` (this trace's clock) on, thinned to 200."""
        rows = [s for s in self.steps if since_s is None or s[0] >= since_s]
        stride = max(1, len(rows) // 200)
        return {
            "totals": dict(self.totals),
            "columns": ["t_s", "running", "waiting", "kv_usage", "preempted", "prompt", "gen"],
            "steps": rows[::stride] + (rows[-1:] if rows and (len(rows) - 1) % stride else []),
            "steps_in_window": len(rows),
        }

    def now(self) -> float:
        return time.monotonic() - self.t0


def trace_factory(trace: Trace) -> Any:
    """A vLLM stat logger factory that feeds `trace` (pass it in `stat_loggers=[...]`)."""
    from vllm.v1.metrics.loggers import StatLoggerBase

    class _Logger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            if scheduler_stats is not None:
                trace.record(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            return None

    return _Logger


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
