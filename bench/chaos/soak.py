"""The accelerated soak of bench/chaos: hours of a line's traffic compressed into minutes,
with faults mixed in, and the service's resources sampled to see whether anything grows.

Traffic: 20 streams, a segment every 0.1 s in turn (chatter, with a fault phrase every
tenth), the LLM tier on; every five minutes a fault: the broker restarted, or the service
SIGKILLed and started again. Every 10 s: the service's RSS (its process and the engine
core), its open files, the outbox and ingest spool depths. At the end, each series'
least-squares slope per hour (after the first five minutes of warm-up) and a chart,
soak-<date>.png.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path

import psutil

from agent.devbroker import DevBroker
from bench._common import Provenance, md_table, stamped, write_result
from bench.chaos.bench_chaos import Publisher, Service, Subscriber, _segment, _until

_SAMPLE_S = 10.0
_FAULT_EVERY_S = 300.0
_WARMUP_S = 300.0
_SETTLE_S = 180.0  # after a fault: the engine restarts and the RSS refills
_CHATTER = [
    "conveyor running at normal speed",
    "count is four hundred so far",
    "forklift coming through aisle four",
    "quality check on batch twelve passed",
]


def _slope_per_hour(points: list[tuple[float, float]]) -> float | None:
    if len(points) < 3:
        return None
    n = len(points)
    mx = sum(t for t, _ in points) / n
    my = sum(v for _, v in points) / n
    den = sum((t - mx) ** 2 for t, _ in points)
    return None if den == 0 else sum((t - mx) * (v - my) for t, v in points) / den * 3600


def _within_slope_per_hour(
    samples: list[dict[str, float]], faults: list[tuple[float, str]], key: str
) -> float | None:
    """The slope of `key` inside the steady stretches (from _SETTLE_S after a fault or an
    engine restart, or the warm-up, to the next), with an intercept per stretch: growth
    within one running service, not the drop and refill of a restart. None with too few
    samples."""
    # The injected faults, and the engine restarts the watchdog made on its own (an RSS
    # drop of a quarter or more between two samples: a hang on a starved machine, say).
    drops = [b["t"] for a, b in itertools.pairwise(samples) if b["rss_mib"] < 0.75 * a["rss_mib"]]
    edges = sorted({*(t for t, _ in faults), *drops})
    stretches: list[list[tuple[float, float]]] = []
    bounds = [(_WARMUP_S, edges[0] if edges else float("inf"))]
    bounds += [(t + _SETTLE_S, (edges[i + 1] if i + 1 < len(edges) else float("inf")))
               for i, t in enumerate(edges)]  # fmt: skip
    for lo, hi in bounds:
        pts = [(x["t"], x[key]) for x in samples if lo <= x["t"] < hi]
        if len(pts) >= 3:
            stretches.append(pts)
    num = den = 0.0
    for pts in stretches:
        mx = sum(t for t, _ in pts) / len(pts)
        my = sum(v for _, v in pts) / len(pts)
        num += sum((t - mx) * (v - my) for t, v in pts)
        den += sum((t - mx) ** 2 for t, _ in pts)
    return None if den == 0 else num / den * 3600


def _resources(service: Service) -> tuple[float, int] | None:
    if service.proc is None or service.proc.poll() is not None:
        return None
    try:
        proc = psutil.Process(service.proc.pid)
        procs = [proc, *proc.children(recursive=True)]
        rss = sum(p.memory_info().rss for p in procs)
        files = proc.num_fds()
    except psutil.Error:
        return None
    return rss / 2**20, files


async def soak(minutes: float, work: Path, results: Path, prov: Provenance) -> str:
    prefix = f"soak/{uuid.uuid4().hex[:8]}"
    work.mkdir(parents=True, exist_ok=True)
    samples: list[dict[str, float]] = []
    faults: list[tuple[float, str]] = []
    published = 0
    (work / "broker").mkdir(exist_ok=True)
    with DevBroker(workdir=work / "broker") as broker:
        sub = Subscriber(broker.port, prefix)
        await sub.start()
        service = Service(broker.port, prefix, work, ["asr.enabled=false"])
        service.start()
        pub = Publisher(broker.port)
        await _until(lambda: (sub.seen.status.get("llm") or {}).get("state") == "running", 300)
        t0 = time.monotonic()
        next_sample, next_fault, i = t0, t0 + _FAULT_EVERY_S, 0
        while (now := time.monotonic()) - t0 < minutes * 60:
            stream = f"soak-{i % 20}"
            text = "bearing abnormal noise on roller four" if i % 10 == 0 else _CHATTER[i % 4]
            topic, body = _segment(prefix, stream, 1_000_000 + i, text)
            await pub.publish(topic, body)
            published += 1
            i += 1
            if now >= next_sample:
                found = _resources(service)
                outbox = (sub.seen.status.get("outbox") or {}).get("depth")
                queue = sub.seen.status.get("queue") or {}
                spool = (queue.get("spool") or {}).get("depth")
                if found is not None:
                    samples.append({"t": now - t0, "rss_mib": found[0], "files": found[1],
                                    "outbox": float(outbox or 0),
                                    "spool": float(spool or 0)})  # fmt: skip
                next_sample = now + _SAMPLE_S
            if now >= next_fault:
                kind = "broker" if len(faults) % 2 == 0 else "agent"
                faults.append((now - t0, kind))
                if kind == "broker":
                    await asyncio.to_thread(broker.stop)
                    await asyncio.sleep(1)
                    await asyncio.to_thread(broker.start)
                else:
                    await asyncio.to_thread(service.kill)
                    service.start()
                next_fault = now + _FAULT_EVERY_S
            await asyncio.sleep(0.1)
        await pub.close()
        service.stop()
        await sub.stop()
    stamp = f"soak-{datetime.now(timezone.utc).strftime('%Y-%m-%d-%H%M')}"
    data = {"minutes": minutes, "published": published, "faults": faults, "samples": samples}
    write_result(results, stamp, prov, data=data)
    text = summarize(results / f"{stamp}.json")
    write_result(results, stamp, prov, text=text)
    return stamped(text, prov)


def summarize(path: Path) -> str:
    """The table and chart of a soak's samples (also: python -m bench.chaos.soak FILE)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    samples: list[dict[str, float]] = data["samples"]
    faults = [(float(t), str(k)) for t, k in data["faults"]]
    drawn = _chart(samples, faults, path.with_suffix(".png"))
    late = [x for x in samples if x["t"] >= min(_WARMUP_S, data["minutes"] * 30)]
    first, last = (samples[0], samples[-1]) if samples else ({}, {})
    rows = []
    keys = [k for k in ("rss_mib", "files", "outbox", "spool") if samples and k in samples[0]]
    for key in keys:
        overall = _slope_per_hour([(x["t"], x[key]) for x in late])
        rows.append([key, first.get(key), last.get(key), overall,
                     _within_slope_per_hour(samples, faults, key)])  # fmt: skip
    kinds = ", ".join(f"{k} at {t / 60:.0f} min" for t, k in faults)
    return (
        f"# soak: {data['minutes']:g} min, {data['published']} segments; faults: {kinds}\n\n"
        + md_table(["series", "first", "last", "slope/h, all samples after warm-up",
                    f"slope/h within each run (from {_SETTLE_S:.0f} s after a fault)"], rows)
        + (f"\n\nchart: {path.with_suffix('.png')}\n" if drawn else
           "\n\nno chart: matplotlib is not installed (pip install -e .[bench])\n")
    )  # fmt: skip


def _chart(samples: list[dict[str, float]], faults: list[tuple[float, str]], path: Path) -> bool:
    """Draw the series to `path`; False where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    series = [("rss_mib", "RSS, MiB (service + engine)"), ("files", "open files"),
              ("outbox", "outbox depth"), ("spool", "ingest spool depth")]  # fmt: skip
    series = [(k, label) for k, label in series if samples and k in samples[0]]
    fig, axes = plt.subplots(len(series), 1, figsize=(8, 2.3 * len(series)), sharex=True)
    for ax, (key, label) in zip(axes, series, strict=True):
        ax.plot([s["t"] / 60 for s in samples], [s[key] for s in samples], lw=1)
        for t, kind in faults:
            ax.axvline(t / 60, color="red" if kind == "agent" else "grey", lw=0.6, ls="--")
        ax.set_ylabel(label)
    axes[-1].set_xlabel("minutes (dashed: broker restart grey, service SIGKILL red)")
    fig.suptitle("edge-agent soak")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    import sys

    print(summarize(Path(sys.argv[1])))
