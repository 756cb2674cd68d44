"""The supervisor's decisions under faults a real engine cannot produce on demand: starts
that fail N times, out-of-memory at start, a request that never ends, a profile refused on
paper. The same decisions against the real engine (SIGKILL, rate limit, degraded mode) are
in test_watchdog_engine.py; this file drives an engine stand-in so that each fault is exact
and each test takes well under a second."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

import pytest

from agent.engine import (
    EngineDead,
    EngineError,
    EngineNotRunning,
    EngineProfile,
    EngineStartError,
    EngineWontFit,
    load_engine_profile,
)
from agent.engine.engine import Engine
from agent.engine.model_prep import ModelChoice
from agent.engine.results import EngineHealth, EngineInfo, EngineState, GenerationResult
from agent.engine.stats import EngineStats, LatencyWindow
from agent.supervision import EngineSupervisor, Trouble, is_out_of_memory, supervised
from agent.supervision.ladder import ladder_fingerprint
from agent.supervision.store import RungRecord, RungStore
from agent.watchdog.events import EventLog
from agent.watchdog.settings import WatchdogSettings
from pipelines.compat import timeout
from tests.helpers import until

# A model folder that does not exist: the stand-in needs none, and the ladder is built
# without the planner's KV rates (the same on every machine, with or without a model).
PROFILE = load_engine_profile("cpu-dev").model_copy(
    update={"load_format": "dummy", "model": "/nonexistent/edge-agent-test-model"}
)
FINGERPRINT = ladder_fingerprint(PROFILE, 4096, 256)
FAST = {
    "interval_s": 0.05,
    "backoff_initial_s": 0.01,
    "backoff_max_s": 0.05,
    "degraded_retry_s": 0.3,
    "restart_window_s": 60,
    "hang_s": 0.3,
}


class StandInEngine:
    """The Engine surface the supervisor uses, with scripted failures."""

    def __init__(self, fail_starts: list[BaseException] | None = None) -> None:
        self.fail_starts = list(fail_starts or [])
        self.state: EngineState = "stopped"
        self.profile: EngineProfile | None = None
        self.info: EngineInfo | None = None
        self.model: ModelChoice | None = None
        self.started: list[EngineProfile] = []
        self.healthy = True
        self.block = asyncio.Event()  # complete() waits on it when `hang` is set
        self.hang = False
        self.finish_reason = "stop"
        self.ttft = LatencyWindow()
        self.per_token = LatencyWindow()

    async def start(self, profile: EngineProfile, **_: Any) -> EngineInfo:
        self.profile = profile
        if self.fail_starts:
            raise self.fail_starts.pop(0)
        self.started.append(profile)
        self.state, self.healthy = "running", True
        k = profile.speculative.num_speculative_tokens if profile.speculative.enabled else 0
        self.model = ModelChoice(Path("m"), "m", None, "m", None)
        self.info = EngineInfo(
            "0.0", "cpu", Path("m"), self.model, 0.01, 1000, profile.max_model_len, "ngram", k,
            "fits",
        )  # fmt: skip
        return self.info

    def core_pids(self) -> list[int]:
        return []

    def stats(self) -> EngineStats:
        return Engine().stats()  # a stopped engine's figures: what the status needs

    async def restart(self, profile: EngineProfile) -> EngineInfo:
        await self.shutdown()
        return await self.start(profile)

    async def shutdown(self) -> None:
        self.state, self.info = "stopped", None
        self.block.set()

    async def health(self, timeout: float = 5.0) -> EngineHealth:
        if self.state == "running" and not self.healthy:
            self.state = "dead"
        return EngineHealth(self.state, self.state == "running", self.state)

    async def complete(self, prompt: Any, **_: Any) -> GenerationResult:
        if self.state != "running":
            raise EngineNotRunning(self.state)
        if self.hang:
            self.block.clear()
            await self.block.wait()
            return GenerationResult("r", "", (), "abort", 3, 0, None, 0.0)
        return GenerationResult("r", "{}", (1,), self.finish_reason, 3, 0, 0.01, 0.02)


def supervisor(
    tmp_path: Path, engine: StandInEngine, windows: list[int] | None = None, **settings: Any
) -> EngineSupervisor:
    return EngineSupervisor(
        PROFILE,
        WatchdogSettings(**{**FAST, **settings}),
        store=RungStore(tmp_path / "watchdog.json"),
        events=EventLog(keep=100),
        context_tokens=4096,
        answer_tokens=256,
        on_window=windows.append if windows is not None else None,
        engine=engine,
    )


def names(sup: EngineSupervisor) -> list[str]:
    return [e["event"] for e in sup.events.recent()]


async def test_a_dead_engine_is_restarted_one_rung_down_and_the_rung_persists(
    tmp_path: Path,
) -> None:
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine)
    async with supervised(sup):
        assert await sup.wait_serving()
        engine.healthy = False  # the core died: the health check sees it
        await until(lambda: len(engine.started) == 2 and sup.ready.is_set(), "restart")
        assert sup.rung.index == 1 and sup.rung.name == "speculative k=2"
        assert engine.started[-1].speculative.num_speculative_tokens == 2
        assert sup.restarts_by_reason == {"engine_dead": 1}
        assert sup.last_restart is not None and sup.last_restart["recovery_s"] is not None
    saved = RungStore(tmp_path / "watchdog.json").load(FINGERPRINT)
    assert (saved.rung, saved.name) == (1, "speculative k=2")
    assert saved.reason is not None and saved.reason.startswith("engine_dead")
    assert names(sup) == ["engine.ready", "engine.restart", "watchdog.rung", "engine.ready"]


async def test_the_rate_limit_puts_the_service_in_degraded_mode_then_retries(
    tmp_path: Path,
) -> None:
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine, restart_limit=2)
    async with supervised(sup):
        for n in (2, 3):
            assert await sup.wait_serving()
            sup.report(Trouble("engine_dead", "test", 1))
            await until(lambda n=n: len(engine.started) == n and sup.ready.is_set(), "restart")
        assert sup.report(Trouble("engine_dead", "third", 1))
        await until(lambda: sup.degraded, "degraded")
        assert engine.state == "stopped" and not sup.ready.is_set()
        assert sup.snapshot()["degraded"] is True
        # while degraded, more trouble changes nothing
        assert not sup.report(Trouble("memory_critical", "x", 1))
        await until(sup.ready.is_set, "retry after degraded_retry_s", limit=3)
        assert len(engine.started) == 4
    assert "engine.degraded" in names(sup) and "engine.degraded_retry" in names(sup)


async def test_failed_starts_back_off_then_succeed(tmp_path: Path) -> None:
    engine = StandInEngine([EngineStartError("disk full"), EngineStartError("disk full")])
    sup = supervisor(tmp_path, engine, restart_limit=3)
    async with supervised(sup):
        assert await sup.wait_serving()
    assert names(sup).count("engine.start_failed") == 2
    assert names(sup).count("engine.start_retry") == 2
    assert sup.rung.index == 0  # not a memory problem: same rung


async def test_starts_that_keep_failing_end_in_degraded_mode_not_a_loop(tmp_path: Path) -> None:
    engine = StandInEngine([EngineStartError("bad model")] * 10)
    sup = supervisor(tmp_path, engine, restart_limit=2, degraded_retry_s=30)
    async with supervised(sup):
        assert not await sup.wait_serving()
        assert sup.degraded and "failed to start 2 times" in (sup.detail or "")
        assert len(engine.fail_starts) == 8  # two attempts, then it waits:
        assert sup.snapshot()["retry_in_s"] > 30 - 5  # the next start is due that far off
        assert sup.request_restart()  # an operator's retry, now
        await until(lambda: len(engine.fail_starts) == 6, "operator retry")


async def test_out_of_memory_at_start_takes_a_rung_down_before_the_retry(tmp_path: Path) -> None:
    oom = EngineStartError("CUDA out of memory. Tried to allocate 2.00 GiB")
    engine = StandInEngine([oom])
    sup = supervisor(tmp_path, engine)
    async with supervised(sup):
        assert await sup.wait_serving()
    assert sup.rung.index == 1
    assert engine.started[0].speculative.num_speculative_tokens == 2


async def test_a_profile_refused_on_paper_is_not_walked_down_the_ladder(tmp_path: Path) -> None:
    engine = StandInEngine([EngineWontFit("does not fit: 65,536 tokens", "plan")])
    sup = supervisor(tmp_path, engine)
    async with timeout(5):
        await sup.run()  # returns: keyword-only until the configuration changes
    assert sup.state == "refused" and sup.detail == "does not fit: 65,536 tokens"
    assert sup.rung.index == 0


async def test_a_hung_request_restarts_the_engine(tmp_path: Path) -> None:
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine)
    async with supervised(sup):
        assert await sup.wait_serving()
        engine.hang = True
        with pytest.raises(EngineNotRunning, match="aborted"):
            await sup.complete([1, 2, 3])
        assert sup.restarts_by_reason == {"analysis_hang": 1}
        await until(sup.ready.is_set, "restarted")


async def test_dead_and_oom_request_errors_report_trouble(tmp_path: Path) -> None:
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine)
    async with supervised(sup):
        assert await sup.wait_serving()

        async def dies(*_: Any, **__: Any) -> GenerationResult:
            raise EngineDead("EngineCore encountered an issue")

        engine.complete = dies  # type: ignore[method-assign]
        with pytest.raises(EngineDead):
            await sup.complete([1])
        assert not sup.ready.is_set()  # no new request goes out meanwhile
        with pytest.raises(EngineNotRunning):
            await sup.complete([1])
        await until(sup.ready.is_set, "restarted")
    assert sup.restarts_by_reason == {"engine_dead": 1}
    assert is_out_of_memory(RuntimeError("torch.OutOfMemoryError: CUDA out of memory"))
    assert not is_out_of_memory(RuntimeError("prompt is longer than max_model_len"))


async def test_the_persisted_rung_is_where_a_new_start_begins(tmp_path: Path) -> None:
    RungStore(tmp_path / "watchdog.json").save(
        RungRecord(
            rung=9,
            name="context window 3072 tokens",
            reason="memory_critical",
            fingerprint=FINGERPRINT,
        )
    )
    engine = StandInEngine()
    windows: list[int] = []
    sup = supervisor(tmp_path, engine, windows)
    async with supervised(sup):
        assert await sup.wait_serving()
    assert sup.rung.knob == "context" and engine.started[0].max_model_len == 3072 + 256
    assert windows == [3072]  # the analysis window shrank before the first analysis
    assert names(sup)[0] == "watchdog.resume_rung"


async def test_after_a_stable_period_it_climbs_one_rung_at_a_time(tmp_path: Path) -> None:
    RungStore(tmp_path / "watchdog.json").save(
        RungRecord(rung=2, name="speculative k=1", fingerprint=FINGERPRINT)
    )
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine, stable_s=0.2, restart_limit=1)
    async with supervised(sup):
        await until(lambda: sup.rung.index == 0 and sup.ready.is_set(), "climbed", limit=5)
    assert [p.speculative.num_speculative_tokens for p in engine.started] == [1, 2, 3]
    # two restarts, and with a limit of one still not degraded: climbing is not a failure
    assert sup.restarts_by_reason == {"stable": 2} and not sup.degraded


async def test_memory_pressure_resets_the_stable_clock(tmp_path: Path) -> None:
    RungStore(tmp_path / "watchdog.json").save(
        RungRecord(rung=1, name="speculative k=2", fingerprint=FINGERPRINT)
    )
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine, stable_s=0.5)
    async with supervised(sup):
        assert await sup.wait_serving()
        for _ in range(16):  # 0.8 s of tight memory, noted every 50 ms
            sup.note_pressure()
            await asyncio.sleep(0.05)
        assert sup.rung.index == 1
        await until(lambda: sup.rung.index == 0, "climbed after pressure ended", limit=3)


async def test_shedding_closes_admission_but_not_requests_in_flight(tmp_path: Path) -> None:
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine)
    async with supervised(sup):
        assert await sup.wait_serving()
        assert sup.admit.is_set()
        sup.set_shedding(True)
        assert not sup.admit.is_set() and sup.ready.is_set()
        result = await sup.complete([1, 2])  # one already admitted still runs
        assert result.text == "{}"
        sup.set_shedding(False)
        assert sup.admit.is_set()


async def test_a_lowered_rung_the_planner_refuses_is_stepped_past(tmp_path: Path) -> None:
    RungStore(tmp_path / "watchdog.json").save(
        RungRecord(rung=4, name="KV cache 218 MiB (85%)", fingerprint=FINGERPRINT)
    )
    engine = StandInEngine([EngineWontFit("does not fit: 0.2 GB of KV needed", "plan")])
    sup = supervisor(tmp_path, engine)
    async with supervised(sup):
        assert await sup.wait_serving()
    assert sup.rung.index == 5 and "watchdog.rung_unfit" in names(sup)


async def test_operator_restarts_do_not_count_toward_the_rate_limit(tmp_path: Path) -> None:
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine, restart_limit=1)
    async with supervised(sup):
        for n in (2, 3, 4):
            assert await sup.wait_serving()
            assert sup.request_restart()
            await until(lambda n=n: len(engine.started) == n and sup.ready.is_set(), "restart")
        assert not sup.degraded and sup.rung.index == 0  # same rung, no limit
    assert sup.restarts_by_reason == {"operator": 3}


async def test_an_unwritable_state_file_is_reported_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the state directory should be")
    engine = StandInEngine()
    sup = EngineSupervisor(
        PROFILE,
        WatchdogSettings(**FAST),
        store=RungStore(blocker / "watchdog.json"),
        engine=engine,
    )
    async with supervised(sup):
        assert await sup.wait_serving()
        sup.report(Trouble("engine_dead", "test", 1))
        await until(lambda: len(engine.started) == 2 and sup.ready.is_set(), "restart")
    assert sup.rung.index == 1  # held in memory
    assert "watchdog.state_unwritable" in names(sup)


async def test_a_bug_in_supervision_degrades_and_starts_over_instead_of_crashing(
    tmp_path: Path,
) -> None:
    calls: list[int] = []

    def flaky(tokens: int) -> None:
        calls.append(tokens)
        if len(calls) == 1:
            raise RuntimeError("bug in a window callback")

    RungStore(tmp_path / "watchdog.json").save(
        RungRecord(rung=9, name="context", fingerprint=FINGERPRINT)
    )
    engine = StandInEngine()
    sup = EngineSupervisor(
        PROFILE,
        WatchdogSettings(**FAST),
        store=RungStore(tmp_path / "watchdog.json"),
        context_tokens=4096,
        answer_tokens=256,
        on_window=flaky,
        engine=engine,
    )
    async with supervised(sup):
        await until(lambda: sup.degraded, "degraded by the error")
        assert "supervisor error: RuntimeError" in (sup.detail or "")
        await until(sup.ready.is_set, "serving after degraded_retry_s")


class RecordingSupervisor(EngineSupervisor):
    """The supervisor as the memory watchdog drives it, recording what it is asked."""

    def __init__(self) -> None:
        super().__init__(PROFILE, WatchdogSettings(**FAST), engine=StandInEngine())
        self.state = "running"
        self.reports: list[Trouble] = []
        self.shed: list[bool] = []

    def report(self, trouble: Trouble) -> bool:
        self.reports.append(trouble)
        return True

    def set_shedding(self, on: bool) -> None:
        self.shed.append(on)

    def note_pressure(self) -> None:
        pass


async def test_only_samples_below_the_critical_line_take_another_rung() -> None:
    """After a critical restart, a reading held at critical only by the hysteresis margin
    (between 512 and 614 MiB here) does not cost another rung; a new fall below does."""
    from agent.watchdog.monitor import MemoryWatchdog
    from agent.watchdog.probes import MemorySample, ReplayProbe

    mib = 1 << 20
    seq = [2000, 400, 600, 560, 300, 2000]
    probe = ReplayProbe([MemorySample(mem_total=8 << 30, mem_available=m * mib) for m in seq])
    sup = RecordingSupervisor()
    dog = MemoryWatchdog(WatchdogSettings(**FAST), probe, events=EventLog(), supervisor=sup)
    levels = [(await dog.check()) for _ in seq]
    assert [a.level.name for a in levels if a] == [
        "ok",
        "critical",
        "critical",
        "critical",
        "critical",
        "ok",
    ]
    assert len(sup.reports) == 2 and all(t.reason == "memory_critical" for t in sup.reports)
    assert sup.shed == [True, False]


async def test_an_out_of_memory_request_restarts_a_rung_down(tmp_path: Path) -> None:
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine)
    async with supervised(sup):
        assert await sup.wait_serving()

        async def oom(*_: Any, **__: Any) -> GenerationResult:
            raise EngineError("RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB")

        engine.complete = oom  # type: ignore[method-assign]
        with pytest.raises(EngineNotRunning, match="out of memory"):
            await sup.complete([1])
        await until(lambda: len(engine.started) == 2 and sup.ready.is_set(), "restart")
    assert sup.restarts_by_reason == {"oom_error": 1} and sup.rung.index == 1


@pytest.mark.parametrize(
    "failure",
    [
        "Engine core initialization failed. See root cause above. "
        "Failed core proc(s): {'EngineCore_DP0': -9}",
        "pressure",  # no telling text, but memory was tight while it started
    ],
)
async def test_a_start_killed_for_memory_takes_a_rung_down(tmp_path: Path, failure: str) -> None:
    engine = StandInEngine([EngineStartError("vLLM failed to start: " + failure)])
    sup = supervisor(tmp_path, engine)
    if failure == "pressure":
        original = engine.start

        async def tight(profile: EngineProfile, **kw: Any) -> EngineInfo:
            sup.note_pressure()  # the watchdog saw warn while the engine loaded
            return await original(profile, **kw)

        engine.start = tight  # type: ignore[method-assign]
    async with supervised(sup):
        assert await sup.wait_serving()
    assert sup.rung.index == 1
    assert engine.started[0].speculative.num_speculative_tokens == 2


async def test_a_report_landing_as_the_stable_period_ends_is_not_lost(tmp_path: Path) -> None:
    """The climb timer and a trouble report in the same loop iteration: the trouble wins,
    and the wait does not spin."""
    sup = supervisor(tmp_path, StandInEngine())
    sup.rungs.record = RungRecord(rung=1, fingerprint=FINGERPRINT)
    sup.rungs.ladder = [
        *__import__("agent.supervision.ladder", fromlist=["build_ladder"]).build_ladder(
            PROFILE, context_tokens=4096, answer_tokens=256
        )
    ]
    sup.state = "running"
    sup._stable_since = -1e9  # the stable period is long over
    assert sup.report(Trouble("engine_dead", "x", 1))
    async with timeout(1):
        trouble = await sup._wait_trouble()
    assert trouble.reason == "engine_dead"


async def test_the_new_rung_is_on_disk_before_the_engine_is_shut_down(tmp_path: Path) -> None:
    engine = StandInEngine()
    on_disk: list[int] = []
    original = engine.shutdown

    async def shutdown() -> None:
        path = tmp_path / "watchdog.json"
        on_disk.append(json.loads(path.read_text())["rung"] if path.exists() else 0)
        await original()

    engine.shutdown = shutdown  # type: ignore[method-assign]
    sup = supervisor(tmp_path, engine)
    async with supervised(sup):
        assert await sup.wait_serving()
        sup.report(Trouble("engine_dead", "x", 1))
        await until(lambda: len(engine.started) == 2 and sup.ready.is_set(), "restart")
    assert on_disk[0] == 1  # a kill during that shutdown still reboots on rung 1


async def test_rungs_the_planner_refuses_are_skipped_and_a_refused_last_rung_goes_back(
    tmp_path: Path,
) -> None:
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine)
    sup.rungs._model_dir = tmp_path  # planning "possible": the outcomes come from below
    sup.rungs._fits = lambda rung: rung.index not in (1, 2)  # type: ignore[method-assign]
    async with supervised(sup):
        assert await sup.wait_serving()
        sup.report(Trouble("memory_critical", "x", 1))
        await until(lambda: len(engine.started) == 2 and sup.ready.is_set(), "restart")
    assert sup.rung.index == 3  # k=2 and k=1 refused on paper: straight to "speculative off"
    # The engine's own planner refuses the last rung: back to the last one that started.
    last = len(sup.ladder) - 1
    store = RungStore(tmp_path / "watchdog.json")
    store.save(RungRecord(rung=last, name="last", fingerprint=FINGERPRINT))
    engine2 = StandInEngine([EngineWontFit("does not fit", "plan")])
    sup2 = supervisor(tmp_path, engine2, degraded_retry_s=0.2)
    async with supervised(sup2):
        await until(lambda: sup2.degraded, "degraded after the refusal")
        await until(sup2.ready.is_set, "serving again on the last good rung")
        assert sup2.rung.index == 0 and sup2.state == "running"


async def test_the_stable_period_counts_across_a_restart_of_the_service(tmp_path: Path) -> None:
    RungStore(tmp_path / "watchdog.json").save(
        RungRecord(
            rung=2,
            name="speculative k=1",
            fingerprint=FINGERPRINT,
            at=time.time() - 3600,
            quiet_since=time.time() - 3600,  # an hour without trouble, before the reboot
        )
    )
    engine = StandInEngine()
    sup = supervisor(tmp_path, engine, stable_s=1800)
    async with supervised(sup):
        await until(lambda: sup.rung.index == 1 and sup.ready.is_set(), "climbed at once")
        # One rung per stable period, counted from the climb: the next is a full period away.
        assert sup.snapshot()["rung"]["climb_in_s"] > 1800 - 60


class _SlowStore(RungStore):
    """A store whose writes take a while and that counts how many run at once (the race
    the supervisor must not have: saves share the temporary file)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.active = 0
        self.most_at_once = 0
        self.writes = 0

    def save(self, record: RungRecord | bytes) -> None:
        self.active += 1
        self.most_at_once = max(self.most_at_once, self.active)
        try:
            time.sleep(0.2)
            super().save(record)
            self.writes += 1
        finally:
            self.active -= 1


async def test_rung_saves_run_one_at_a_time_and_stop_waits_for_them(tmp_path: Path) -> None:
    engine = StandInEngine()
    store = _SlowStore(tmp_path / "watchdog.json")
    sup = EngineSupervisor(
        PROFILE, WatchdogSettings(**FAST), store=store, events=EventLog(keep=100),
        context_tokens=4096, answer_tokens=256, engine=engine,
    )  # fmt: skip
    async with supervised(sup):
        assert await sup.wait_serving()
        engine.healthy = False  # down a rung: a save
        await until(lambda: len(engine.started) == 2 and sup.ready.is_set(), "restart")
        engine.healthy = False  # and again, while memory is tight: two saves at once
        sup.note_pressure()
        await until(lambda: len(engine.started) == 3 and sup.ready.is_set(), "second restart")
        sup.note_pressure()  # rate-limited: no third quiet save within ten minutes
    assert store.active == 0  # stop() waited for the quiet-clock save still writing
    assert store.most_at_once == 1
    assert store.writes >= 3
    saved = RungStore(tmp_path / "watchdog.json").load(FINGERPRINT)
    assert saved.rung == 2
    assert [h["to"] for h in saved.history] == [1, 2]
