"""The engine supervisor: keeps the embedded engine serving, or says loudly why it is not.

It starts the engine on the ladder's current rung (agent.supervision.rungs) beside the
pipeline (the keyword tier never waits for it), and restarts it when

- the engine core died (vLLM's EngineDeadError, or the health check finds it gone: what an
  OOM kill of the child looks like), or a request failed with an out-of-memory error
  (agent.supervision.oom);
- memory headroom went critical (the memory watchdog, agent.watchdog, reports it);
- a request hangs past `watchdog.hang_s`;
- an operator asks for it (same rung);

taking one rung down the ladder for every cause but the operator's, and persisting the rung
so that a reboot starts from the safe settings. After `stable_s` on a lowered rung without
trouble it tries one rung back up. Failed starts are retried with jittered exponential
backoff; more than `restart_limit` restarts within `restart_window_s`, or a start that
keeps failing, put the service in *degraded* mode: engine stopped, keyword alerts only,
`degraded` in the status, another try after `degraded_retry_s` (the restart budget,
agent.supervision.budget). Never a restart loop.

A profile the memory planner refuses is a configuration error, not memory trouble: the
service stays keyword-only with the planner's outcome (`agentctl plan` explains it) and
the ladder is not walked.

Requests pass its gate (agent.supervision.gate): `ready` while the engine serves, `admit`
while new analyses may also start; the health check here finds the ones that hang.

Contexts live in the agent (pipelines.analysis), not in the engine: after a restart every
stream continues where it was, and its next analysis re-prefills the window.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import structlog
from tenacity import RetryCallState

from agent.engine import (
    Engine,
    EngineDead,
    EngineError,
    EngineNotRunning,
    EngineProfile,
    EngineWontFit,
)
from agent.engine.protocol import EngineProtocol
from agent.engine.results import ChatMessage, GenerationResult
from agent.supervision.budget import DegradedRetry, RestartBudget, StartFailed
from agent.supervision.cores import CoreRecord
from agent.supervision.gate import RequestGate
from agent.supervision.ladder import Rung
from agent.supervision.oom import is_out_of_memory
from agent.supervision.rungs import Rungs
from agent.supervision.snapshot import supervisor_snapshot, until
from agent.supervision.store import RungRecord, RungStore
from agent.watchdog.events import EventLog
from agent.watchdog.settings import WatchdogSettings
from pipelines.compat import TaskGroup

__all__ = ["EngineSupervisor", "SupervisorState", "Trouble", "supervised"]

log = structlog.get_logger(__name__)

SupervisorState = Literal["stopped", "starting", "running", "restarting", "refused", "degraded"]


@dataclass(frozen=True)
class Trouble:
    reason: str  # engine_dead, engine_unhealthy, oom_error, memory_critical, analysis_hang, ...
    detail: str
    step: int  # rungs to move: +1 down, -1 up, 0 stay


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
        engine: EngineProtocol | None = None,
        clock: Callable[[], float] = time.monotonic,
        cores: CoreRecord | None = None,
    ) -> None:
        """`store` None: the rung is not persisted (benchmarks, tests of one engine);
        `cores`: where the serving engine's processes are recorded (agent.supervision.cores),
        None for none."""
        self.cores = cores
        self.profile = profile
        self.settings = settings or WatchdogSettings()
        self.events = events or EventLog()
        self.engine: EngineProtocol = engine or Engine()
        self.rungs = Rungs(
            profile,
            store=store,
            events=self.events,
            context_tokens=context_tokens,
            answer_tokens=answer_tokens,
            on_window=on_window,
        )
        self.budget = RestartBudget(self.settings)
        self._clock = clock
        self.state: SupervisorState = "stopped"
        self.detail: str | None = None
        self.gate = RequestGate(clock)
        self.ready = self.gate.ready  # the engine serves requests
        self.admit = self.gate.admit  # ... and new analyses may start (not shedding load)
        self.restarts = 0
        self.restarts_by_reason: Counter[str] = Counter()
        self.last_restart: dict[str, Any] | None = None
        self._troubles: asyncio.Queue[Trouble] = asyncio.Queue()
        self._trouble_pending = False
        self._trouble_at: float | None = None
        self._stable_since = clock()
        self._retry = DegradedRetry(clock)
        self._prepared = False
        self._last_pressure = float("-inf")  # monotonic time memory was last tight

    # -- what the rest of the service sees ---------------------------------------------------
    @property
    def rung(self) -> Rung:
        return self.rungs.current

    @property
    def ladder(self) -> list[Rung]:
        return self.rungs.ladder

    @property
    def record(self) -> RungRecord:
        return self.rungs.record

    @property
    def shedding(self) -> bool:
        return self.gate.shedding

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
        try:
            with self.gate.request():
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
        self.gate.close()
        self._troubles.put_nowait(trouble)
        return True

    def report_memory_critical(self, reasons: str) -> bool:
        """The memory watchdog's critical level: restart one rung down (see report)."""
        return self.report(Trouble("memory_critical", reasons, 1))

    def request_restart(self, reason: str = "operator") -> bool:
        """An operator's restart on the same rung; in degraded mode, retry now."""
        if self.degraded:
            self._retry.request()
            return True
        return self.report(Trouble(reason, "requested", 0))

    def set_shedding(self, on: bool) -> None:
        """Warn level: no new analyses; those in flight finish; keyword alerts go on."""
        self.gate.shed(on)
        if on:
            self.note_pressure()

    def note_pressure(self) -> None:
        """Memory was tight: the stable period before climbing a rung starts again (also
        across a reboot: persisted, at most every ten minutes)."""
        now = self._clock()
        self._stable_since = self._last_pressure = now
        self.rungs.note_pressure(now)

    def oldest_request_s(self) -> float | None:
        return self.gate.oldest_s()

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
        if not self._prepared and self.cores is not None:
            for pid in await asyncio.to_thread(self.cores.reap):
                self.events.record("engine.orphan_reaped", "error", pid=pid)
        if not self._prepared:
            quiet = await self.rungs.prepare()
            if quiet > 0:
                # The stable period counts across reboots: a device power-cycled every
                # night must still climb back one day.
                self._stable_since = self._clock() - quiet
            self.rungs.resume()
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
        self.gate.close()
        if self.engine.state != "stopped":
            await self.engine.shutdown()
        if self.cores is not None:
            await asyncio.to_thread(self.cores.clear)
        await self.rungs.drain()
        self.state = "stopped"

    async def _start(self) -> bool:
        """Start on the current rung; True once serving, False when refused for good."""
        cfg = self.settings
        while True:
            try:
                async for attempt in self.budget.start_attempts(self._before_retry):
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
                        "watchdog.rung_unfit", "error", rung=rung.index, outcome=exc.outcome
                    )
                    below = rung.index + 1 < len(self.ladder)
                    target = rung.index + 1 if below else self.rungs.last_good
                    await self.rungs.move(target, f"rung {rung.index} refused: {exc.outcome}")
                    if not below:
                        await self._degrade(f"rung {rung.index} refused: {exc.outcome}")
                    continue
                self.state, self.detail = "refused", exc.outcome
                self.events.record("engine.refused", "error", outcome=exc.outcome)
                log.error("engine.refused_plan", plan=exc.plan_text)
                return False
            except StartFailed as exc:
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
                target = await self.rungs.fitting_below(rung.index + 1)
                if target is not None:
                    await self.rungs.move(target, f"out of memory at start: {detail[:200]}")
            raise StartFailed(detail) from exc
        self.state, self.detail = "running", info.plan_outcome
        if self.cores is not None:
            await asyncio.to_thread(self.cores.record, self.engine.core_pids())
        self.rungs.last_good = rung.index
        recovery_s = None
        if self._trouble_at is not None:
            recovery_s = round(self._clock() - self._trouble_at, 2)
            if self.last_restart is not None:
                self.last_restart["recovery_s"] = recovery_s
            self._trouble_at = None
        self.gate.open()
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
            plan=info.plan_outcome,
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
                    self.gate.close()
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
            fitting = await self.rungs.fitting_below(target)
            target = frm.index if fitting is None else fitting
        # A climb is not a failure, and an operator's restart is intended: neither counts
        # toward the rate limit (both are still counted restarts).
        self.restarts += 1
        counted = trouble.step >= 0 and trouble.reason != "operator"
        if counted:
            self.budget.charge(now)
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
            await self.rungs.move(target, f"{trouble.reason}: {trouble.detail}"[:300])
        await self.engine.shutdown()
        self._clear_troubles()
        if self.budget.exhausted:
            await self._degrade(self.budget.exhausted_detail())
        elif counted and self.budget.spent >= 2:
            # The first restart is at once (the cause is known); repeated ones within the
            # window back off, full jitter, like failed starts.
            wait = self.budget.backoff_s()
            self.events.record(
                "engine.restart_backoff",
                "warning",
                failures=self.budget.spent,
                wait_s=round(wait, 2),
            )
            await asyncio.sleep(wait)

    def _clear_troubles(self) -> None:
        self._trouble_pending = False
        while not self._troubles.empty():
            self._troubles.get_nowait()

    async def _degrade(self, why: str) -> None:
        self.state, self.detail = "degraded", why
        self.gate.close()
        retry = self.settings.degraded_retry_s
        self._retry.arm(retry)
        self.events.record("engine.degraded", "error", detail=why, retry_in_s=retry)
        if self.engine.state != "stopped":
            await self.engine.shutdown()
        await self._retry.wait(retry)
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
        rung = self.rung
        now = self._clock()
        climb_at = self._stable_since + self.settings.stable_s if rung.index else None
        return supervisor_snapshot(
            state=self.state,
            detail=self.detail,
            engine=self.engine,
            degraded=self.degraded,
            retry_in_s=until(self._retry.at, now),
            shedding=self.shedding,
            rung=rung,
            top_rung=len(self.ladder) - 1,
            record=self.record,
            climb_in_s=until(climb_at, now),
            restarts=self.restarts,
            restarts_by_reason=self.restarts_by_reason,
            last_restart=self.last_restart,
            requests_in_flight=self.gate.in_flight,
        )


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
