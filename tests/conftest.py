"""Shared fixtures: a real mosquitto on loopback, the daemon as a subprocess, MQTT helpers."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from agent.devbroker import DevBroker
from tests.helpers import AgentProcess, MqttWatcher
from tests.orphans import MARK, settle

REPO = Path(__file__).resolve().parents[1]
AGENT_YAML = REPO / "configs" / "agent.yaml"

# What starts a real process of the system (mosquitto, the daemon, vLLM's engine core): a
# test that uses one of these fixtures, or is marked broker or vllm, is `slow`, so that
# `-m "not slow"` runs no real process.
_PROCESS_FIXTURES = frozenset({"broker", "agent_factory", "watcher", "engine"})


# Every process a test starts carries this session's mark (tests/orphans.py).
SESSION = os.environ.setdefault(MARK, uuid.uuid4().hex)


@pytest.fixture(autouse=True)
def nothing_left_running() -> Iterator[None]:
    """Fails the test after which a process it started is still running orphaned (an
    engine core that outlived its service), and kills it so the next test starts clean."""
    yield
    left = settle(SESSION)
    for pid, _, _ in left:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    if left:
        pytest.fail(f"processes left running by this test: {left}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        fixtures = set(getattr(item, "fixturenames", ()))
        marked = any(item.get_closest_marker(m) for m in ("broker", "vllm"))
        if (marked or fixtures & _PROCESS_FIXTURES) and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[DevBroker]:
    """A fresh mosquitto per test (tests stop and freeze it)."""
    if shutil.which("mosquitto") is None:
        pytest.fail("mosquitto is not installed: `make setup` (or apt-get install mosquitto)")
    workdir = tmp_path / "broker"
    workdir.mkdir()
    with DevBroker(workdir=workdir) as b:
        yield b


@pytest.fixture
def prefix() -> str:
    """A topic prefix of this test alone."""
    return f"test/{uuid.uuid4().hex[:10]}"


@pytest.fixture
def agent_factory(
    tmp_path: Path, broker: DevBroker, prefix: str
) -> Iterator[type[AgentProcess] | object]:
    """Build `edge-agent run` subprocesses on the shipped config, pointed at this test's
    broker, prefix and state folder; every one is killed at teardown."""
    started: list[AgentProcess] = []

    def make(*overrides: str) -> AgentProcess:
        proc = AgentProcess(
            AGENT_YAML,
            [
                f"mqtt.port={broker.port}",
                f"mqtt.topic_prefix={prefix}",
                f"mqtt.client_id=agent-{prefix.rsplit('/', 1)[1]}",
                f"outbox.path={tmp_path / 'state' / 'outbox.sqlite'}",
                "mqtt.reconnect_max_s=1",
                "mqtt.status_interval_s=1",
                "llm.enabled=false",  # the engine only where a test asks for it (slow start)
                # AF_UNIX paths hold 107 bytes; pytest's tmp paths can be longer
                f"control.socket_path=/tmp/ea-{uuid.uuid4().hex[:10]}.sock",
                "metrics.port=0",  # a free port each: tests run agents side by side
                *overrides,
            ],
            tmp_path / f"agent-{len(started)}.log",
        )
        started.append(proc)
        return proc

    yield make
    for proc in started:
        proc.kill()


@pytest.fixture
async def watcher(broker: DevBroker, prefix: str) -> AsyncIterator[MqttWatcher]:
    """Everything published under the prefix, kept across broker restarts."""
    w = MqttWatcher(broker.port, prefix)
    await w.start()
    yield w
    await w.stop()


@pytest.fixture(scope="session")
def smollm2_model() -> Path:
    """The converted SmolLM2-135M-Instruct (converted once, ~30 s, then reused from the
    cache): the smallest bundled base, for the tests of the engine's mechanics; the
    default model's own tests use the config's profile (Gemma 3 270M + our adapter)."""
    pytest.importorskip("transformers")
    pytest.importorskip("gguf")
    from agent.engine.model_prep import ModelPrepError, ensure_base

    try:
        return ensure_base("smollm2-135m-instruct")
    except ModelPrepError as exc:
        pytest.skip(f"SmolLM2 unavailable: {exc}")
