"""The long fuzz run of bench/chaos: N hostile payloads (bench/chaos/payloads.py) on every
topic the service subscribes to and on its control socket; the service must still be the
same process at the end, serving, with every payload counted in its status."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agent.devbroker import DevBroker
from bench._common import md_table
from bench.chaos.bench_chaos import Service, Subscriber, _until
from bench.chaos.payloads import Payload, Target, counted, payloads, send

_BATCH = 50


def draw(n: int) -> list[Payload]:
    """n payloads, drawn by hypothesis (its generation, not its shrinking: nothing fails)."""
    out: list[Payload] = []

    @settings(max_examples=max(1, n // _BATCH) + 1, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(batch=st.lists(payloads(), min_size=_BATCH, max_size=_BATCH))
    def collect(batch: list[Payload]) -> None:
        out.extend(batch)

    collect()
    return out[:n]


async def fuzz(n: int, work: Path) -> str:
    work.mkdir(parents=True, exist_ok=True)
    (work / "broker").mkdir(exist_ok=True)
    (work / "keys").mkdir(exist_ok=True)
    prefix = f"fuzz/{uuid.uuid4().hex[:8]}"
    batch = await asyncio.to_thread(draw, n)
    sent: Counter[str] = Counter()
    with DevBroker(workdir=work / "broker") as broker:
        sub = Subscriber(broker.port, prefix)
        await sub.start()
        sock = Path(f"/tmp/ea-fuzz-{uuid.uuid4().hex[:8]}.sock")
        service = Service(
            broker.port, prefix, work,
            ["llm.enabled=false", f"control.socket_path={sock}", "fleet.enabled=true",
             "fleet.groups=[fz]", f"fleet.trusted_keys_dir={work / 'keys'}",
             "mqtt.errors_per_minute=100000"],
        )  # fmt: skip
        service.start()
        await _until(lambda: sub.seen.status.get("state") == "running", 120)
        assert service.proc is not None
        pid = service.proc.pid
        t0 = time.monotonic()
        target = Target(broker.port, prefix, sock)
        for i in range(0, len(batch), _BATCH):
            await send(target, batch[i : i + _BATCH], sent)
        took = time.monotonic() - t0
        ok = await _until(lambda: counted(sub.seen.status, sent), 300)
        status: dict[str, Any] = dict(sub.seen.status)
        alive = service.proc.poll() is None and service.proc.pid == pid
        service.stop()
        await sub.stop()
    ingest, asr, control = (
        status.get("ingest", {}),
        status.get("asr", {}),
        status.get("control", {}),
    )
    fleet = status.get("fleet") or {}
    # Audio refused for its properties never reaches the ASR stage's `received`.
    asr_counted = asr.get("received", 0) + asr.get("rejected", {}).get("invalid_properties", 0)
    rows: list[list[Any]] = [
        ["transcript", sent["transcript"], ingest.get("received"), ingest.get("accepted"),
         dict(ingest.get("rejected", {}))],
        ["audio", sent["audio"], asr_counted, asr.get("clips"),
         dict(asr.get("rejected", {}))],
        ["fleet", sent["fleet"], fleet.get("documents"), None, None],
        ["control", sent["control"], control.get("requests", 0) + control.get("bad_requests", 0),
         control.get("requests"), {"bad_requests": control.get("bad_requests")}],
    ]  # fmt: skip
    verdict = "every payload counted" if ok else "NOT every payload counted"
    return (
        f"# fuzz: {len(batch)} payloads in {took:.0f} s; service alive, same process: {alive}; "
        f"{verdict}; internal errors: {ingest.get('rejected', {}).get('internal_error', 0)}\n\n"
        + md_table(
            ["channel", "sent", "counted by the service", "accepted", "refused, by reason"], rows
        )
        + "\n"
    )
