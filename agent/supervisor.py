"""The engine supervisor: keeps the embedded engine serving, or says loudly why it is not.

It starts the engine on the ladder's current rung (agent.watchdog.ladder) beside the
pipeline (the keyword tier never waits for it), and restarts it when

- the engine core died (vLLM's EngineDeadError, or the health check finds it gone: what an
  OOM kill of the child looks like), or a request failed with an out-of-memory error;
- memory headroom went critical (the memory watchdog reports it);
- a request hangs past `watchdog.hang_s`;
- an operator asks for it (same rung);

taking one rung down the ladder for every cause but the operator's, and persisting the rung
so that a reboot starts from the safe settings. After `stable_s` on a lowered rung without
trouble it tries one rung back up. Failed starts are retried with jittered exponential
backoff (tenacity); more than `restart_limit` restarts within `restart_window_s`, or a start
that keeps failing, put the service in *degraded* mode: engine stopped, keyword alerts only,
`degraded` in the status, another try after `degraded_retry_s`. Never a restart loop.

A profile the memory planner refuses is a configuration error, not memory trouble: the
service stays keyword-only with the planner's verdict (`agentctl plan` explains it) and
the ladder is not walked.

Contexts live in the agent (pipelines.analysis), not in the engine: after a restart every
stream continues where it was, and its next analysis re-prefills the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import re
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog
from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from agent.engine import (
    Engine,
    EngineDead,
    EngineError,
    EngineNotRunning,
    EngineProfile,
    EngineWontFit,
)
from agent.engine.results import ChatMessage, GenerationResult
from agent.engine.stats import EngineStats
from agent.watchdog.events import EventLog
from agent.watchdog.ladder import KvRates, Rung, build_ladder, ladder_fingerprint
from agent.watchdog.settings import WatchdogSettings
from agent.watchdog.store import RungRecord, RungStore
from pipelines.compat import TaskGroup

__all__ = ["EngineSupervisor", "SupervisorState", "Trouble", "is_out_of_memory", "supervised"]

log = structlog.get_logger(__name__)

SupervisorState = Literal["stopped", "starting", "running", "restarting", "refused", "degraded"]
_OOM_MARKERS = ("out of memory", "outofmemoryerror", "cannot allocate memory")
# vLLM's multiprocess start reports a core killed by a signal as its negative exit code:
# "Engine core initialization failed ... Failed core proc(s): {'EngineCore_DP0': -9}".
# SIGKILL during a start is what the kernel's OOM killer does.
_KILLED = re.compile(r"failed core proc.*:\s*-9\b|killed by signal 9|sigkill")


def is_out_of_memory(exc: BaseException) -> bool:
    """An error whose text (or cause's) says the allocator ran out: CUDA OOM, torch's
    OutOfMemoryError, ENOMEM from the host allocator."""
    seen: BaseException | None = exc
    while seen is not None:
        text = f"{type(seen).__name__}: {seen}".lower()
        if any(marker in text for marker in _OOM_MARKERS) or _KILLED.search(text):
            return True
        seen = seen.__cause__
    return False


@dataclass(frozen=True)
class Trouble:
    reason: str  # engine_dead, engine_unhealthy, oom_error, memory_critical, analysis_hang, ...
    detail: str
    step: int  # rungs to move: +1 down, -1 up, 0 stay


class _StartFailed(Exception):
    pass


class EngineSupervisor:
    def __init__(
        self,
        profile: EngineProfile,
        settings: WatchdogSettings | None = None,
        *,
        store: RungStore | None = None,
        events: EventLog | None = None,
        context_tokens: int | None = None,
        answer_tokens: int = 0,
        on_window: Callable[[int], None] | None = None,
        engine: Engine | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """`store` None: the rung is not persisted (benchmarks, tests of one engine)."""
        self.profile = profile
        self.settings = settings or WatchdogSettings()
        self.store = store
        self.events = events or EventLog()
        self.engine = engine or Engine()
        self._context_tokens = context_tokens
        self._answer_tokens = answer_tokens
        self._on_window = on_window
        self._clock = clock
        self.state: SupervisorState = "stopped"
        self.detail: str | None = None
        self.ready = asyncio.Event()  # the engine serves requests
        self.admit = asyncio.Event()  # ... and new analyses may start (not shedding load)
        self.shedding = False
        self.ladder: list[Rung] = [Rung(0, "none", "as configured", profile, context_tokens)]
        self.record = RungRecord()
        self.restarts = 0
        self.restarts_by_reason: Counter[str] = Counter()
        self.last_restart: dict[str, Any] | None = None
        self._restart_times: deque[float] = deque()
        self._troubles: asyncio.Queue[Trouble] = asyncio.Queue()
        self._trouble_pending = False
        self._trouble_at: float | None = None
        self._stable_since = clock()
        self._retry_now = asyncio.Event()
        self._inflight: dict[int, float] = {}
        self._prepared = False
        self._model_dir: Path | None = None  # for the planner's verdict on each rung
        self._last_good = 0  # the last rung the engine started on
        self._last_pressure = float("-inf")  # monotonic time memory was last tight
        self._quiet_saved = 0.0  # monotonic time the quiet clock was last persisted
        self._retry_at: float | None = None  # degraded: when supervision tries again
        self._saving: set[asyncio.Task[None]] = set()
        self._save_lock = asyncio.Lock()
        self._ids = itertools.count()

    # -- what the rest of the service sees ---------------------------------------------------
    @property
    def rung(self) -> Rung:
        return self.ladder[min(self.record.rung, len(self.ladder) - 1)]

    @property
    def degraded(self) -> bool:
        return self.state == "degraded"

    async def complete(
        self, prompt: Sequence[int] | Sequence[ChatMessage], **kwargs: Any
    ) -> GenerationResult:
        """Engine.complete while the engine serves; failures that mean the engine is gone
        are reported here (the restart begins at once) and raised as EngineNotRunning or
        EngineDead.

        Raises:
            EngineNotRunning: not serving now (starting, restarting, degraded, shedding
                restarts, or the request was aborted by a restart).
            EngineDead: the engine core died under this request.
            EngineError: the request itself was bad (the engine is fine).
        """
        if not self.ready.is_set():
            raise EngineNotRunning(f"engine is {self.state}")
        token = next(self._ids)
        self._inflight[token] = self._clock()
        try:
            result = await self.engine.complete(prompt, **kwargs)
        except EngineDead as exc:
            self.report(Trouble("engine_dead", str(exc), 1))
            raise
        except EngineNotRunning:
            raise
        except EngineError as exc:
            if is_out_of_memory(exc):
                self.report(Trouble("oom_error", str(exc)[:300], 1))
                raise EngineNotRunning(f"out of memory: {exc}") from exc
            raise
        finally:
            self._inflight.pop(token, None)
        if result.finish_reason == "abort":
            # shutdown() aborts what is in flight: not an answer, nothing to parse
            raise EngineNotRunning("request aborted: the engine is restarting")
        return result

    def report(self, trouble: Trouble) -> bool:
        """Ask for a restart; ignored (False) unless the engine is serving and no restart is
        already on its way. Requests stop at once; the restart runs in the supervisor."""
        if self.state != "running" or self._trouble_pending:
            log.debug("supervisor.trouble_ignored", reason=trouble.reason, state=self.state)
            return False
        self._trouble_pending = True
        self.ready.clear()
        self.admit.clear()
        self._troubles.put_nowait(trouble)
        return True

    def request_restart(self, reason: str = "operator") -> bool:
        """An operator's restart on the same rung; in degraded mode, retry now."""
        if self.degraded:
            self._retry_now.set()
            return True
        return self.report(Trouble(reason, "requested", 0))

    def set_shedding(self, on: bool) -> None:
        """Warn level: no new analyses; those in flight finish; keyword alerts go on."""
        self.shedding = on
        if on:
            self.admit.clear()
            self.note_pressure()
        elif self.ready.is_set():
            self.admit.set()

    def note_pressure(self) -> None:
        """Memory was tight: the stable period before climbing a rung starts again (also
        across a reboot: persisted, at most every ten minutes)."""
        now = self._clock()
        self._stable_since = self._last_pressure = now
        if self.record.rung > 0 and self.store is not None and now - self._quiet_saved > 600:
            self._quiet_saved = now
            self.record.quiet_since = time.time()
            task = asyncio.create_task(self._save())
            self._saving.add(task)
            task.add_done_callback(self._saving.discard)

    def oldest_request_s(self) -> float | None:
        if not self._inflight:
            return None
        return self._clock() - min(self._inflight.values())

    # -- the supervising loop ------------------------------------------------------------------
    async def run(self) -> None:
        """Supervise until cancelled (or the profile is refused). A bug in here must not
        take the keyword tier down with it: it is logged, the engine is stopped, the service
        is degraded, and supervision starts over after degraded_retry_s."""
        while True:
            try:
                await self._supervise()
                return
            except Exception as exc:
                log.exception("supervisor.failed")
                try:
                    await self.engine.shutdown()
                except Exception:  # the engine may be half gone: say so, degrade anyway
                    log.exception("supervisor.shutdown_after_error_failed")
                self._clear_troubles()
                await self._degrade(f"supervisor error: {type(exc).__name__}: {exc}")

    async def _supervise(self) -> None:
        if not self._prepared:
            await self._prepare()
            self._prepared = True
        async with TaskGroup() as tg:
            monitor = tg.create_task(self._monitor(), name="engine.monitor")
            try:
                while await self._start():
                    await self._recover(await self._wait_trouble())
            finally:
                monitor.cancel()

    async def wait_serving(self) -> bool:
        """Until the engine serves (True) or will not for now: refused, degraded (False)."""
        while not self.ready.is_set():
            if self.state in ("refused", "degraded"):
                return False
            await asyncio.sleep(0.05)
        return True

    async def stop(self) -> None:
        self.ready.clear()
        self.admit.clear()
        if self.engine.state != "stopped":
            await self.engine.shutdown()
        if self._saving:  # a quiet-clock save still writing: let it finish
            await asyncio.gather(*self._saving, return_exceptions=True)
        self.state = "stopped"

    async def _prepare(self) -> None:
        kv = await asyncio.to_thread(self._kv_rates)
        self.ladder = build_ladder(
            self.profile,
            context_tokens=self._context_tokens,
            answer_tokens=self._answer_tokens,
            kv=kv,
        )
        fingerprint = ladder_fingerprint(
            self.profile, self._context_tokens, self._answer_tokens, kv
        )
        record = RungRecord(fingerprint=fingerprint)
        if self.store is not None:
            record = await asyncio.to_thread(self.store.load, fingerprint)
            if self.store.notice is not None:
                self.events.record(
                    "watchdog.state_reset",
                    "warning",
                    path=str(self.store.path),
                    detail=self.store.notice,
                )
        record.rung = max(0, min(record.rung, len(self.ladder) - 1))
        self.record = record
        rung = self.rung
        quiet = time.time() - (record.quiet_since or record.at or time.time())
        if rung.index and quiet > 0:
            # The stable period counts across reboots: a device power-cycled every night
            # must still climb back one day.
            self._stable_since = self._clock() - quiet
        if rung.index:
            self.events.record(
                "watchdog.resume_rung",
                "error" if rung.loud else "warning",
                rung=rung.index,
                name=rung.name,
                reason=record.reason,
                detail="starting on the rung persisted before this start",
            )
            self._apply_window(rung)

    def _kv_rates(self) -> KvRates | None:
        """From the memory planner, so that KV rungs stay above one full context; None when
        the model cannot be planned (the engine's own planner then judges each rung)."""
        from agent.engine.model_prep import model_dir_for
        from agent.engine.planner import plan_memory

        try:
            model_dir = model_dir_for(self.profile)
            plan = plan_memory(model_dir, self.profile)
            self._model_dir = model_dir
            return KvRates(plan.kv_bytes_per_token, plan.fixed_bytes_per_seq)
        except Exception as exc:  # the start will report the real problem
            log.warning("watchdog.ladder_without_plan", error=f"{type(exc).__name__}: {exc}")
            return None

    def _fits(self, rung: Rung) -> bool:
        """The memory planner's verdict on a rung (True when the model cannot be planned:
        the engine's own planner judges it at start)."""
        from agent.engine.planner import plan_memory

        if self._model_dir is None:
            return True
        try:
            return plan_memory(self._model_dir, rung.profile).fits
        except Exception as exc:  # planning problems surface at the start itself
            log.warning(
                "watchdog.rung_unplanned",
                rung=rung.index,
                name=rung.name,
                error=f"{type(exc).__name__}: {exc}",
            )
            return True

    async def _fitting_below(self, index: int) -> int | None:
        """The first rung from `index` down that the planner accepts."""
        for rung in self.ladder[index:]:
            if await asyncio.to_thread(self._fits, rung):
                return rung.index
            self.events.record("watchdog.rung_unfit", "warning", rung=rung.index, name=rung.name)
        return None

    def _clear_troubles(self) -> None:
        self._trouble_pending = False
        while not self._troubles.empty():
            self._troubles.get_nowait()

    async def _save(self) -> None:
        """Persist the record. Saves run one at a time (they share the temporary file), each
        writing a snapshot taken on the loop when its turn comes, so the newest state wins."""
        if self.store is None:
            return
        store = self.store
        try:
            async with self._save_lock:
                await asyncio.to_thread(store.save, store.encode(self.record))
        except OSError as exc:  # a full or read-only state directory: keep going
            self.events.record(
                "watchdog.state_unwritable", "error", path=str(self.store.path), error=str(exc)
            )

    async def _start(self) -> bool:
        """Start on the current rung; True once serving, False when refused for good."""
        cfg = self.settings
        while True:
            try:
                async for attempt in AsyncRetrying(
                    retry=retry_if_exception_type(_StartFailed),
                    stop=stop_after_attempt(cfg.restart_limit),
                    # full jitter, as for the broker: devices restarted together by one
                    # power cut do not retry their engines in lockstep
                    wait=wait_random_exponential(
                        multiplier=cfg.backoff_initial_s, max=cfg.backoff_max_s
                    ),
                    before_sleep=self._before_retry,
                    reraise=True,
                ):
                    with attempt:
                        await self._start_once()
                return True
            except EngineWontFit as exc:
                rung = self.rung
                if rung.index > 0:
                    # A rung the watchdog reached for memory trouble, refused on paper (the
                    # ladder is pre-checked, so only where the model could not be planned):
                    # the next rung that fits, else back to the last one that started.
                    self.events.record(
                        "watchdog.rung_unfit", "error", rung=rung.index, verdict=exc.verdict
                    )
                    below = rung.index + 1 < len(self.ladder)
                    target = rung.index + 1 if below else self._last_good
                    await self._set_rung(target, f"rung {rung.index} refused: {exc.verdict}")
                    if not below:
                        await self._degrade(f"rung {rung.index} refused: {exc.verdict}")
                    continue
                self.state, self.detail = "refused", exc.verdict
                self.events.record("engine.refused", "error", verdict=exc.verdict)
                log.error("engine.refused_plan", plan=exc.plan_text)
                return False
            except _StartFailed as exc:
                await self._degrade(f"the engine failed to start {cfg.restart_limit} times: {exc}")

    def _before_retry(self, state: RetryCallState) -> None:
        wait = state.next_action.sleep if state.next_action else 0.0
        self.events.record(
            "engine.start_retry", "warning", attempt=state.attempt_number, wait_s=round(wait, 1)
        )

    async def _start_once(self) -> None:
        rung = self.rung
        self.state, self.detail = "starting", None
        attempt_at = self._clock()
        try:
            if self.engine.profile is None:
                info = await self.engine.start(rung.profile)
            else:
                info = await self.engine.restart(rung.profile)
        except EngineWontFit:
            raise
        except Exception as exc:
            detail = f"{type(exc).__name__}: {exc}"[:500]
            self.detail = detail
            # Out of memory by its text, by the core's SIGKILL exit, or because memory was
            # tight (warn or critical) while it started: the next rung before the retry.
            oom = is_out_of_memory(exc) or self._last_pressure >= attempt_at
            self.events.record(
                "engine.start_failed", "error", rung=rung.index, out_of_memory=oom, error=detail
            )
            if oom and rung.index + 1 < len(self.ladder):
                target = await self._fitting_below(rung.index + 1)
                if target is not None:
                    await self._set_rung(target, f"out of memory at start: {detail[:200]}")
            raise _StartFailed(detail) from exc
        self.state, self.detail = "running", info.plan_verdict
        self._last_good = rung.index
        recovery_s = None
        if self._trouble_at is not None:
            recovery_s = round(self._clock() - self._trouble_at, 2)
            if self.last_restart is not None:
                self.last_restart["recovery_s"] = recovery_s
            self._trouble_at = None
        self.ready.set()
        if not self.shedding:
            self.admit.set()
        self.events.record(
            "engine.ready",
            "info",
            backend=info.backend,
            vllm_version=info.vllm_version,
            start_s=round(info.start_seconds, 1),
            spec=f"{info.spec_method} k={info.spec_k}",
            rung=rung.index,
            rung_name=rung.name,
            recovery_s=recovery_s,
            plan=info.plan_verdict,
        )

    async def _wait_trouble(self) -> Trouble:
        """The next reported trouble; on a lowered rung, a climb once stable_s is quiet."""
        while True:
            # A report that landed while a wait timed out is still queued: take it first.
            if not self._troubles.empty():
                return self._troubles.get_nowait()
            timeout = None
            if self.record.rung > 0:
                timeout = self._stable_since + self.settings.stable_s - self._clock()
                if timeout <= 0:
                    self._trouble_pending = True
                    self.ready.clear()
                    self.admit.clear()
                    stable = f"{self.settings.stable_s:.0f} s without trouble"
                    return Trouble("stable", stable, -1)
            with contextlib.suppress(asyncio.TimeoutError):
                return await asyncio.wait_for(self._troubles.get(), timeout)

    async def _recover(self, trouble: Trouble) -> None:
        now = self._clock()
        self._trouble_at = now
        self._stable_since = now  # any restart, a climb too: the stable period starts over
        frm = self.rung
        target = max(0, min(frm.index + trouble.step, len(self.ladder) - 1))
        if trouble.step > 0 and target != frm.index:
            # Only rungs the memory planner accepts: a persisted rung that can never start
            # would outlive the trouble (reboots included).
            fitting = await self._fitting_below(target)
            target = frm.index if fitting is None else fitting
        # A climb is not a failure, and an operator's restart is intended: neither counts
        # toward the rate limit (both are still counted restarts).
        self.restarts += 1
        if trouble.step >= 0 and trouble.reason != "operator":
            self._restart_times.append(now)
            window = self.settings.restart_window_s
            while self._restart_times and now - self._restart_times[0] > window:
                self._restart_times.popleft()
        self.restarts_by_reason[trouble.reason] += 1
        self.last_restart = {
            "at": round(time.time(), 3),
            "reason": trouble.reason,
            "detail": trouble.detail,
            "from_rung": frm.index,
            "to_rung": target,
            "recovery_s": None,
        }
        self.events.record(
            "engine.restart",
            "error" if trouble.step > 0 else "warning",
            reason=trouble.reason,
            detail=trouble.detail,
            from_rung=frm.index,
            to_rung=target,
            to_name=self.ladder[target].name,
        )
        if trouble.step > 0 and target == frm.index:
            self.events.record(
                "watchdog.ladder_exhausted",
                "error",
                rung=frm.index,
                detail="no lower rung (or none the planner accepts): restarting on this one",
            )
        self.state = "restarting"
        if target != frm.index:
            # Persisted before the shutdown (up to 30 s): a service killed meanwhile still
            # boots on the safer rung.
            await self._set_rung(target, f"{trouble.reason}: {trouble.detail}"[:300])
        await self.engine.shutdown()
        self._clear_troubles()
        failures = len(self._restart_times)
        cfg = self.settings
        if failures > cfg.restart_limit:
            await self._degrade(
                f"{failures} restarts within {cfg.restart_window_s:.0f} s "
                f"(limit {cfg.restart_limit})"
            )
        elif trouble.step >= 0 and trouble.reason != "operator" and failures >= 2:
            # The first restart is at once (the cause is known); repeated ones within the
            # window back off, full jitter, like failed starts.
            wait = random.uniform(  # noqa: S311 (jitter, not a secret)
                0, min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** (failures - 2))
            )
            self.events.record(
                "engine.restart_backoff", "warning", failures=failures, wait_s=round(wait, 2)
            )
            await asyncio.sleep(wait)

    async def _set_rung(self, index: int, reason: str) -> None:
        frm, to = self.rung, self.ladder[index]
        record = self.record
        record.history.append(
            {"at": round(time.time(), 3), "from": frm.index, "to": to.index, "reason": reason}
        )
        record.rung, record.name, record.reason = to.index, to.name, reason
        record.at = record.quiet_since = time.time()
        await self._save()
        self.events.record(
            "watchdog.rung",
            "error" if to.loud or to.index > frm.index else "info",
            rung=to.index,
            name=to.name,
            knob=to.knob,
            direction="down" if to.index > frm.index else "up",
            reason=reason,
            persisted=str(self.store.path) if self.store is not None else None,
        )
        self._apply_window(to)

    def _apply_window(self, rung: Rung) -> None:
        if self._on_window is not None and rung.context_tokens is not None:
            self._on_window(rung.context_tokens)

    async def _degrade(self, why: str) -> None:
        self.state, self.detail = "degraded", why
        self.ready.clear()
        self.admit.clear()
        retry = self.settings.degraded_retry_s
        self._retry_at = self._clock() + retry
        self.events.record("engine.degraded", "error", detail=why, retry_in_s=retry)
        if self.engine.state != "stopped":
            await self.engine.shutdown()
        self._retry_now.clear()
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._retry_now.wait(), retry)
        finally:
            self._retry_at = None
        self.events.record("engine.degraded_retry", "warning", rung=self.rung.index)

    async def _monitor(self) -> None:
        """Health of a serving engine: its core alive and answering, no request hanging."""
        cfg = self.settings
        while True:
            await asyncio.sleep(cfg.interval_s)
            if self.state != "running" or self._trouble_pending:
                continue
            health = await self.engine.health(timeout=max(5.0, cfg.interval_s))
            if not health.healthy and self.state == "running":
                reason = "engine_dead" if self.engine.state == "dead" else "engine_unhealthy"
                self.report(Trouble(reason, health.detail, 1))
                continue
            age = self.oldest_request_s()
            if age is not None and age > cfg.hang_s:
                hang = f"a request has run {age:.0f} s (> {cfg.hang_s:.0f} s)"
                self.report(Trouble("analysis_hang", hang, 1))

    # -- reporting -----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        info = self.engine.info
        rung = self.rung
        now = self._clock()
        climb_at = self._stable_since + self.settings.stable_s if rung.index else None
        return {
            "state": self.state,
            "detail": self.detail,
            "vllm_version": info.vllm_version if info else None,
            "backend": info.backend if info else None,
            "model": self.engine.model.as_dict() if self.engine.model else None,
            "spec": f"{info.spec_method} k={info.spec_k}" if info else None,
            "spec_reason": info.spec_reason if info else None,
            "degraded": self.degraded,
            "retry_in_s": _until(self._retry_at, now),
            "shedding": self.shedding,
            "rung": {
                **rung.as_dict(),
                "of": len(self.ladder) - 1,
                "reason": self.record.reason,
                "since": self.record.at,
                "climb_in_s": _until(climb_at, now),
            },
            "restarts": self.restarts,
            "restarts_by_reason": dict(self.restarts_by_reason),
            "last_restart": self.last_restart,
            "requests_in_flight": len(self._inflight),
            "engine_pids": self.engine.core_pids(),
            "engine": _engine_figures(self.engine.stats()),
        }


def _engine_figures(stats: EngineStats) -> dict[str, Any]:
    """What an operator reads of the engine's own statistics (this run's counters; the
    latencies span every run)."""
    return {
        "requests": stats.requests,
        "generated_tokens": stats.generated_tokens,
        "num_waiting_reqs": stats.num_waiting_reqs,
        "kv_cache_usage": round(stats.kv_cache_usage, 3),
        "prefix_cache_hit_rate": _round(stats.prefix_cache_hit_rate),
        "spec_method": stats.spec_method,
        "spec_k": stats.spec_k,
        "spec_acceptance_rate": _round(stats.spec_acceptance_rate),
        "spec_mean_accepted_length": _round(stats.spec_mean_accepted_length),
        "preemptions": stats.preemptions,
        "ttft_p50_s": _round(stats.ttft_p50_s),
        "ttft_p95_s": _round(stats.ttft_p95_s),
        "per_token_p50_s": _round(stats.per_token_p50_s, 4),
        "per_token_p95_s": _round(stats.per_token_p95_s, 4),
    }


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def _until(at: float | None, now: float) -> float | None:
    """Seconds from `now` until `at` (0 when past), rounded; None when nothing is due."""
    return None if at is None else round(max(0.0, at - now), 1)


@contextlib.asynccontextmanager
async def supervised(sup: EngineSupervisor) -> AsyncIterator[EngineSupervisor]:
    """Run `sup` in a task for the block (tests, benchmarks); stop the engine after it."""
    task = asyncio.create_task(sup.run(), name="engine.supervisor")
    try:
        yield sup
    finally:
        task.cancel()
        await asyncio.wait([task])
        await sup.stop()
