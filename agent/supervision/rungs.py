"""The rungs the supervisor walks: the ladder for this profile, the current rung, the
memory planner's outcome on each, and the rung record persisted through the store.

`prepare()` builds the ladder (agent.supervision.ladder) with the planner's KV rates and
loads the record persisted before this start (agent.supervision.store); `fitting_below()`
skips rungs the planner refuses; `move()` takes a rung and persists it before the engine
is touched, so that a service killed meanwhile still boots on the safer rung. The
supervisor decides when to move (agent.supervision.supervisor); this module knows how.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import structlog

from agent.engine import EngineProfile
from agent.supervision.ladder import KvRates, Rung, build_ladder, ladder_fingerprint
from agent.supervision.store import RungRecord, RungStore
from agent.watchdog.events import EventLog

__all__ = ["Rungs"]

log = structlog.get_logger(__name__)

_QUIET_SAVE_S = 600.0  # the quiet clock is persisted at most this often


class Rungs:
    def __init__(
        self,
        profile: EngineProfile,
        *,
        store: RungStore | None,
        events: EventLog,
        context_tokens: int | None,
        answer_tokens: int,
        on_window: Callable[[int], None] | None,
    ) -> None:
        self.profile = profile
        self.store = store
        self.events = events
        self._context_tokens = context_tokens
        self._answer_tokens = answer_tokens
        self._on_window = on_window
        self.ladder: list[Rung] = [Rung(0, "none", "as configured", profile, context_tokens)]
        self.record = RungRecord()
        self.last_good = 0  # the last rung the engine started on
        self._model_dir: Path | None = None  # for the planner's outcome on each rung
        self._quiet_saved = 0.0  # monotonic time the quiet clock was last persisted
        self._saving: set[asyncio.Task[None]] = set()
        self._save_lock = asyncio.Lock()

    @property
    def current(self) -> Rung:
        return self.ladder[min(self.record.rung, len(self.ladder) - 1)]

    @property
    def top(self) -> int:
        """The index of the last rung."""
        return len(self.ladder) - 1

    async def prepare(self) -> float:
        """Build the ladder and load the persisted record; the seconds the current rung has
        been quiet (memory not tight), counted across reboots (0 on rung 0). `resume()`
        next."""
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
        record.rung = max(0, min(record.rung, self.top))
        self.record = record
        quiet = time.time() - (record.quiet_since or record.at or time.time())
        return quiet if self.current.index else 0.0

    def resume(self) -> None:
        """Starting on a persisted lowered rung: say so, and apply its window."""
        rung = self.current
        if rung.index:
            self.events.record(
                "watchdog.resume_rung",
                "error" if rung.loud else "warning",
                rung=rung.index,
                name=rung.name,
                reason=self.record.reason,
                detail="starting on the rung persisted before this start",
            )
            self.apply_window(rung)

    def _kv_rates(self) -> KvRates | None:
        """From the memory planner, so that KV rungs stay above one full context; None when
        the model cannot be planned (the engine's own planner then judges each rung)."""
        from agent.engine.model_prep import model_dir_for
        from agent.engine.planner import plan_memory

        try:
            model_dir = model_dir_for(self.profile)
            plan = plan_memory(model_dir, self.profile)
            self._model_dir = model_dir
            # vLLM refuses a token budget under a hybrid's attention block with prefix
            # caching (the planner says so too): no rung below it.
            block = plan.layout.block_size if plan.layout else 0
            floor = block if self.profile.enable_prefix_caching else 0
            return KvRates(plan.kv_bytes_per_token, plan.fixed_bytes_per_seq, floor)
        except Exception as exc:  # the start will report the real problem
            log.warning("watchdog.ladder_without_plan", error=f"{type(exc).__name__}: {exc}")
            return None

    def _fits(self, rung: Rung) -> bool:
        """The memory planner's outcome on a rung (True when the model cannot be planned:
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

    async def fitting_below(self, index: int) -> int | None:
        """The first rung from `index` down that the planner accepts."""
        for rung in self.ladder[index:]:
            if await asyncio.to_thread(self._fits, rung):
                return rung.index
            self.events.record("watchdog.rung_unfit", "warning", rung=rung.index, name=rung.name)
        return None

    async def move(self, index: int, reason: str) -> None:
        """Take rung `index`: recorded, persisted, reported, and its window applied."""
        frm, to = self.current, self.ladder[index]
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
        self.apply_window(to)

    def apply_window(self, rung: Rung) -> None:
        if self._on_window is not None and rung.context_tokens is not None:
            self._on_window(rung.context_tokens)

    def note_pressure(self, now: float) -> None:
        """Memory was tight at monotonic `now`: on a lowered rung, persist the quiet clock
        (at most every ten minutes) so that the stable period starts over across a reboot."""
        if (
            self.record.rung > 0
            and self.store is not None
            and now - self._quiet_saved > (_QUIET_SAVE_S)
        ):
            self._quiet_saved = now
            self.record.quiet_since = time.time()
            task = asyncio.create_task(self._save())
            self._saving.add(task)
            task.add_done_callback(self._saving.discard)

    async def drain(self) -> None:
        """Wait for a quiet-clock save still writing."""
        if self._saving:
            await asyncio.gather(*self._saving, return_exceptions=True)

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
