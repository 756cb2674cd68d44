"""A burst far past the ingest queue, through the real service: nothing acknowledged is shed.

    .venv/bin/python -m bench.chaos.burst --segments 20000 --protocols 5,3.1.1

For each MQTT protocol: a fresh mosquitto and `edge-agent run` (LLM tier off: this is the
input path), then one publisher sends every segment at QoS 1 as fast as the broker takes
them (every fifth stream says a fault phrase once, at a point spread along the burst). Meanwhile
`agentctl status`'s request goes to the control socket every 0.5 s (its answer time is
recorded) and the service's RSS is read. Reported: segments accepted, shed (queue and
spool), spooled, how many of the fault segments alerted, how long until everything was
detected, the status answer time p50 / max, the RSS at start and at its peak. Written to
bench/chaos/results/burst-<date>.md / .json with the revision, the command and the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
import uuid
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import psutil

from agent.control import request
from agent.devbroker import DevBroker
from bench._common import md_table, percentile, provenance, stamped, write_result
from bench.chaos.bench_chaos import Publisher, Service, Subscriber

REPO = Path(__file__).resolve().parents[2]
RESULTS = Path(__file__).resolve().parent / "results"
_FAULT = "the bearing on roller four is making a grinding noise"
_CHATTER = "count is {n} parts so far, all within tolerance"
_STREAMS = 50


async def run_once(
    segments: int, protocol: str, work: Path, extra_set: list[str]
) -> dict[str, Any]:
    prefix = f"burst/{uuid.uuid4().hex[:8]}"
    (work / "broker").mkdir(parents=True)
    with DevBroker(workdir=work / "broker") as broker:
        extra = [f"mqtt.protocol={protocol}", "llm.enabled=false", "asr.enabled=false",
                 *extra_set]  # fmt: skip
        service = Service(broker.port, prefix, work, extra)
        sub = Subscriber(broker.port, prefix)
        await sub.start()
        service.start()
        try:
            return await _drive(segments, service, sub, work)
        finally:
            service.stop()
            await sub.stop()


async def _drive(segments: int, service: Service, sub: Subscriber, work: Path) -> dict[str, Any]:
    sock = work / "control.sock"
    deadline = time.monotonic() + 120
    while sub.seen.online is None:
        assert time.monotonic() < deadline, "the service did not come online"
        await asyncio.sleep(0.1)
    assert service.proc is not None
    proc = psutil.Process(service.proc.pid)
    rss_start = proc.memory_info().rss
    answers: list[float] = []
    rss_peak = rss_start
    faults: set[str] = set()
    per_stream = segments // _STREAMS
    base = time.time() - 6 * per_stream - 60
    items = []
    for n in range(segments):
        index, seq = n % _STREAMS, n // _STREAMS
        stream = f"mic{index}"
        # every fifth stream says a fault once, somewhere along the burst
        fault = index % 5 == 0 and seq == (index * 37) % per_stream
        if fault:
            faults.add(stream)
        text = _FAULT if fault else _CHATTER.format(n=n)
        start = base + 6 * seq
        body = {"stream_id": stream, "seq": seq, "start": start, "end": start + 5, "text": text}
        items.append((f"{sub.prefix}/streams/{stream}/transcript", json.dumps(body).encode()))
    done = asyncio.Event()

    async def probe() -> None:
        nonlocal rss_peak
        while not done.is_set():
            t0 = time.monotonic()
            await request(sock, {"cmd": "status"}, timeout=30)
            answers.append(time.monotonic() - t0)
            rss_peak = max(rss_peak, proc.memory_info().rss)
            await asyncio.sleep(0.5)

    prober = asyncio.create_task(probe())
    began = time.monotonic()
    pub = Publisher(sub.port)
    for topic, body in items:
        await pub.publish(topic, body)
    published_s = time.monotonic() - began
    await pub.close()
    status: dict[str, Any] = {}
    while True:
        status = (await request(sock, {"cmd": "status"}))["status"]
        spool = status["queue"].get("spool") or {}
        if status["ingest"]["accepted"] + status["ingest"]["shed"] >= segments and not (
            spool.get("depth") or status["queue"]["depth"]
        ):
            break
        await asyncio.sleep(0.5)
    detected_s = time.monotonic() - began
    deadline = time.monotonic() + 30
    while len(sub.seen.new) < len(faults) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    done.set()
    await prober
    spool = status["queue"].get("spool") or {}
    return {
        "segments": segments,
        "accepted": status["ingest"]["accepted"],
        "shed": status["ingest"]["shed"],
        "spooled": spool.get("written", 0),
        "fault_streams": len(faults),
        "alerted": len(set(sub.seen.new) & faults),
        "published_s": round(published_s, 1),
        "detected_s": round(detected_s, 1),
        "status_p50_s": round(percentile(answers, 0.5) or 0, 3),
        "status_max_s": round(max(answers), 3),
        "status_answers": len(answers),
        "rss_start_mib": round(rss_start / 2**20, 1),
        "rss_peak_mib": round(rss_peak / 2**20, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.chaos.burst", description=__doc__)
    parser.add_argument("--segments", type=int, default=20000)
    parser.add_argument("--protocols", default="5,3.1.1")
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument(
        "--without-spool", action="store_true", help="also run with ingest.spool_max_segments=0"
    )
    args = parser.parse_args(argv)
    base = Path(f"/tmp/edge-agent-burst-{uuid.uuid4().hex[:6]}")
    rows = {}
    variants = [("", [])] + ([(" without spool", ["ingest.spool_max_segments=0"])]
                             if args.without_spool else [])  # fmt: skip
    for protocol in args.protocols.split(","):
        for name, extra in variants:
            label = f"{protocol}{name}"
            work = base / label.replace(" ", "-")
            rows[label] = asyncio.run(run_once(args.segments, protocol, work, extra))
            print(f"-- MQTT {label}: {rows[label]}", flush=True)
    prov = provenance("bench.chaos.burst", argv)
    headers = ["MQTT", "segments", "accepted", "shed", "spooled", "faults alerted",
               "published in s", "all detected in s", "status answer p50 s", "max s",
               "RSS start MiB", "peak MiB"]  # fmt: skip
    table = md_table(headers, [
        [p, r["segments"], r["accepted"], r["shed"], r["spooled"],
         f"{r['alerted']}/{r['fault_streams']}", r["published_s"], r["detected_s"],
         r["status_p50_s"], r["status_max_s"], r["rss_start_mib"], r["rss_peak_mib"]]
        for p, r in rows.items()
    ])  # fmt: skip
    stamp = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    text = f"# Burst: {args.segments} segments at QoS 1 from one publisher\n\n{table}\n"
    print(stamped(text, prov))
    if not args.no_write:
        write_result(RESULTS, f"burst-{stamp}", prov, text=text, data={"runs": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
