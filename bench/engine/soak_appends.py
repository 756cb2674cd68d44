"""Appends for a while, as a line's rolling window sees them: does anything grow?

Each step appends a fresh 4.5K-token segment to the window and asks for one token (the
service's analysis: a long cached prefix, a short new tail); when the next append would
pass the engine's window, the head is dropped in one large step (a quarter of the window,
docs/context.md's rule: rarely, so the prefix stays cached in between), which costs one
re-prefill. Every `sample_s` the process tree's memory (agent/footprint.py: RSS, PSS, NVML
per process) and torch's allocator in the worker are read. The figures: time to first token
of each append, the re-prefills, and memory at the first and last sample with the slope
between (per hour), which a leak or an unbounded cache would show.
"""

from __future__ import annotations

import os
import time
from typing import Any

from agent.footprint import footprint


async def soak(
    llm: Any,
    fresh: Any,  # Prompts.fresh: n -> token ids
    generate: Any,  # bench_engine.generate
    *,
    seconds: float,
    window_tokens: int,
    segment: int,
    on_gpu: bool,
    sample_s: float = 30.0,
) -> dict[str, Any]:
    from bench.engine.profile_probe import worker_memory

    limit = window_tokens - segment - 256  # room for the answer and the engine's margin
    window: list[int] = fresh(segment)
    steps: list[dict[str, Any]] = []
    samples: list[dict[str, Any]] = []
    t0 = time.monotonic()
    next_sample = t0
    while (now := time.monotonic()) - t0 < seconds:
        slid = False
        if len(window) + segment > limit:
            window = window[len(window) // 4 :]
            slid = True
        window = window + fresh(segment)
        got = await generate(llm, window, 1)
        steps.append({"t": round(now - t0, 1), "tokens": len(window), "slid": slid,
                      "ttft_s": round(got.ttft, 3), "cached": got.cached})  # fmt: skip
        if now >= next_sample:
            samples.append(await _sample(llm, now - t0, on_gpu, worker_memory))
            next_sample = now + sample_s
    samples.append(await _sample(llm, time.monotonic() - t0, on_gpu, worker_memory))
    return {"seconds": round(time.monotonic() - t0, 1), "window_tokens": window_tokens,
            "segment": segment, "steps": steps, "samples": samples,
            "summary": summarise(steps, samples)}  # fmt: skip


async def _sample(llm: Any, t: float, on_gpu: bool, worker_memory: Any) -> dict[str, Any]:
    tree = footprint(os.getpid(), gpu=on_gpu)
    worker = await llm.collective_rpc(worker_memory)
    w = worker[0] if worker else {}
    return {
        "t": round(t, 1),
        "rss": sum(p.rss for p in tree.processes),
        "pss": sum(p.pss for p in tree.processes),
        "gpu": sum(p.gpu_bytes or 0 for p in tree.processes),
        "torch_reserved": w.get("reserved"),
        "torch_allocated": w.get("allocated"),
    }


def summarise(steps: list[dict[str, Any]], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians and p95 of append TTFT (slides apart), and memory first -> last, per hour."""
    appends = sorted(s["ttft_s"] for s in steps if not s["slid"])
    slides = sorted(s["ttft_s"] for s in steps if s["slid"])

    def q(xs: list[float], p: float) -> float | None:
        return xs[min(len(xs) - 1, int(p * len(xs)))] if xs else None

    first, last = samples[0], samples[-1]
    hours = max((last["t"] - first["t"]) / 3600, 1e-9)
    out: dict[str, Any] = {
        "appends": len(appends), "append_ttft_p50_s": q(appends, 0.5),
        "append_ttft_p95_s": q(appends, 0.95), "slides": len(slides),
        "slide_ttft_p50_s": q(slides, 0.5), "span_s": round(last["t"] - first["t"], 1),
    }  # fmt: skip
    for key in ("rss", "pss", "gpu", "torch_reserved"):
        a, b = first.get(key), last.get(key)
        if a is not None and b is not None:
            out[f"{key}_first"], out[f"{key}_last"] = a, b
            out[f"{key}_mib_per_h"] = round((b - a) / 2**20 / hours, 1)
    return out
