"""Engine benchmark: vLLM defaults against our tuned profile, in one run, on one machine.

Model: random weights of a 4B-class dense shape (bench/shapes.py's QWEN3_4B, Qwen3-4B's
published config with YaRN x4 for 128K: 36 layers, hidden 2560, 8 KV heads of 128),
`load_format="dummy"`, no tokenizer, token-id prompts. Configurations:

    defaults   vLLM's own settings (only the model, dummy weights and the context length)
    eager      no CUDA graphs, no torch.compile
    nochunk    CUDA graphs, chunked prefill off (one step per prompt)
    tuned      our profile (configs/profiles/h200-bench.yaml), as the service builds it
    tuned-ngram  the same with prompt-lookup speculation (k=3)
    mtp        our Engine wrapper on a small random Qwen3-Next shape with one MTP layer:
               detection from config.json, speculative config, acceptance stats, k-stepping

Per configuration: engine start, batch-1 decode tokens/s (and its ratio to the floor:
weight bytes / measured copy bandwidth), TTFT of 4K/32K/128K prompts, TTFT of 4.5K new
tokens appended to a prefix-cached 120K context (against its compute floor and against a
window that slid), the inter-token gaps of a decoding stream while another stream
prefills 128K tokens, and peak device memory (NVML).

    python bench/engine/bench_engine.py --out DIR [--configs defaults,eager,...] [--scale 1.0]

`--scale` shrinks every length (0.03 on the CPU makes a smoke run of the code paths).
Writes DIR/results.json, DIR/table.md and DIR/chart.png; prints the table.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import gc
import itertools
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench._common import md_table, percentile  # noqa: E402
from bench.shapes import QWEN3_4B, QWEN3_NEXT_SMALL, TINY  # noqa: E402

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


def shape_params(cfg: dict[str, Any]) -> int:
    """Parameters of a dense Qwen3-shaped model (what one decode step reads)."""
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * cfg["head_dim"]
    embed = cfg["vocab_size"] * h * (1 if cfg["tie_word_embeddings"] else 2)
    return n * per_layer + embed + h


def attention_flops(cfg: dict[str, Any], new: int, past: int) -> float:
    """QK^T and PV FLOPs of `new` query tokens over `past` cached + causal new tokens."""
    per_pair = 4 * cfg["num_hidden_layers"] * cfg["num_attention_heads"] * cfg["head_dim"]
    pairs = new * past + new * (new + 1) / 2
    return per_pair * pairs


# -- device probes ---------------------------------------------------------------------


def measure_device() -> dict[str, Any]:
    """Copy bandwidth and bf16 matrix rate of this GPU, measured here (the floors)."""
    import torch

    if not torch.cuda.is_available():
        return {"device": "cpu", "copy_gbps": None, "matmul_tflops": None}
    dev = torch.device("cuda")
    n = 1 << 30  # 2 GiB of bf16 each way
    a = torch.empty(n, dtype=torch.bfloat16, device=dev)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    reps = 20
    start.record()
    for _ in range(reps):
        b.copy_(a)
    end.record()
    torch.cuda.synchronize()
    copy_gbps = 2 * a.numel() * 2 * reps / (start.elapsed_time(end) / 1e3) / 1e9
    del a, b
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    y = torch.randn(m, m, dtype=torch.bfloat16, device=dev)
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    start.record()
    for _ in range(reps):
        x @ y
    end.record()
    torch.cuda.synchronize()
    tflops = 2 * m**3 * reps / (start.elapsed_time(end) / 1e3) / 1e12
    del x, y
    torch.cuda.empty_cache()
    return {
        "device": torch.cuda.get_device_name(),
        "copy_gbps": round(copy_gbps, 1),
        "matmul_tflops": round(tflops, 1),
    }


class MemorySampler:
    """Peak used device memory (all processes: the engine core is a child) via NVML."""

    def __init__(self) -> None:
        self.peak = 0
        self.baseline = 0
        self._stop = threading.Event()
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            self.baseline = self.used()
        except Exception:  # no NVML (CPU run): peak stays 0
            self._handle = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def used(self) -> int:
        return int(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used) if self._handle else 0

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.used())
            time.sleep(0.02)

    def __enter__(self) -> MemorySampler:
        self.baseline = self.used()
        self.peak = self.baseline
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()


# -- generation helpers ------------------------------------------------------------------


@dataclass
class Timed:
    ttft: float
    total: float
    tokens: int
    cached: int | None
    stamps: list[tuple[float, int]] = field(default_factory=list)  # (time, tokens in delta)


class Prompts:
    def __init__(self, vocab: int, seed: int = 0) -> None:
        self.rng = random.Random(seed)
        self.vocab = vocab

    def fresh(self, n: int) -> list[int]:
        return [self.rng.randrange(100, self.vocab - 100) for _ in range(n)]


async def generate(
    llm: Any,
    ids: list[int],
    max_tokens: int,
    *,
    rid: str | None = None,
    stamps: list[tuple[float, int]] | None = None,
) -> Timed:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    sp = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    t0 = time.perf_counter()
    ttft = None
    n = 0
    cached = None
    stamps = [] if stamps is None else stamps  # the caller's list survives an abort
    async for out in llm.generate(
        TokensPrompt(prompt_token_ids=ids), sp, request_id=rid or uuid.uuid4().hex
    ):
        now = time.perf_counter()
        got = len(out.outputs[0].token_ids) if out.outputs else 0
        if got:
            if ttft is None:
                ttft = now - t0
            stamps.append((now, got))
            n += got
        if out.num_cached_tokens is not None:
            cached = out.num_cached_tokens
    total = time.perf_counter() - t0
    return Timed(ttft if ttft is not None else total, total, n, cached, stamps)


def decode_rate(t: Timed) -> float:
    return (t.tokens - 1) / (t.total - t.ttft) if t.tokens > 1 and t.total > t.ttft else 0.0


async def measure_config(
    llm: Any,
    cfg: dict[str, Any],
    scale: float,
    floors: dict[str, Any],
    note: Callable[[str], None],
    seed: int,
) -> dict[str, Any]:
    # Every configuration gets its own prompts: nothing is served from another's cache.
    p = Prompts(cfg["vocab_size"], seed=seed)
    k = lambda n: max(16, int(n * scale))  # noqa: E731
    res: dict[str, Any] = {}
    await generate(llm, p.fresh(k(512)), 8)  # warm-up
    # 1. batch-1 decode
    rates = [decode_rate(await generate(llm, p.fresh(64), k(384))) for _ in range(3)]
    res["decode_tok_s"] = round(statistics.median(rates), 1)
    note(f"decode {res['decode_tok_s']} tok/s")
    # 2. TTFT of fresh prompts
    for label, n in (("4k", 4096), ("32k", 32768), ("128k", 131072 - 256)):
        t = await generate(llm, p.fresh(k(n)), 1)
        res[f"ttft_{label}_s"] = round(t.ttft, 3)
        note(f"ttft {label} {t.ttft:.3f}s")
    # 3. 4.5K appended to a prefix-cached 120K window; the same after a slide; alone
    prefix, s1, s2 = p.fresh(k(120_000)), p.fresh(k(4500)), p.fresh(k(4500))
    await generate(llm, prefix + s1, 1)  # fills the cache
    app = await generate(llm, prefix + s1 + s2, 1)
    res["append_ttft_s"] = round(app.ttft, 3)
    res["append_cached_tokens"] = app.cached
    slid = await generate(llm, prefix[k(4500) :] + s1 + s2, 1)
    res["slid_ttft_s"] = round(slid.ttft, 3)
    alone = await generate(llm, p.fresh(k(4500)), 1)
    res["alone_4k5_ttft_s"] = round(alone.ttft, 3)
    if floors.get("matmul_tflops"):
        past = len(prefix) + len(s1)
        flops = 2 * shape_params(cfg) * len(s2) + attention_flops(cfg, len(s2), past)
        res["append_floor_s"] = round(flops / (floors["matmul_tflops"] * 1e12), 3)
        res["append_vs_floor"] = round(app.ttft / res["append_floor_s"], 2)
    res["slid_over_append"] = round(slid.ttft / app.ttft, 1)
    note(
        f"append {app.ttft:.3f}s (cached {app.cached}), slid {slid.ttft:.3f}s, "
        f"alone {alone.ttft:.3f}s"
    )
    # 4. one stream decodes while another prefills 128K
    long_ids = p.fresh(k(131072 - 256))
    decode_id = uuid.uuid4().hex
    stamps: list[tuple[float, int]] = []
    decoding = asyncio.create_task(
        generate(llm, p.fresh(64), k(100_000), rid=decode_id, stamps=stamps)
    )
    await asyncio.sleep(1.5)  # let it reach steady decoding first
    t_start = time.perf_counter()
    pre = await generate(llm, long_ids, 1)
    t_end = time.perf_counter()
    await llm.abort(decode_id)
    with contextlib.suppress(Exception):
        await asyncio.wait_for(decoding, 30)
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(stamps) if t_start <= b <= t_end + 0.5]
    if (p99 := percentile(gaps, 0.99)) is not None:
        res["itl_p50_ms"] = round(1e3 * statistics.median(gaps), 1)
        res["itl_p99_ms"] = round(1e3 * p99, 1)
        res["itl_max_ms"] = round(1e3 * max(gaps), 1)
    res["prefill_128k_busy_s"] = round(pre.ttft, 3)
    res["prefill_busy_over_alone"] = round(pre.ttft / res["ttft_128k_s"], 2)
    note(
        f"while prefilling 128K: gaps p50 {res.get('itl_p50_ms')} ms, p99 "
        f"{res.get('itl_p99_ms')} ms, max {res.get('itl_max_ms')} ms; prefill "
        f"{pre.ttft:.2f}s ({res['prefill_busy_over_alone']}x alone)"
    )
    return res


# -- configurations ----------------------------------------------------------------------


def tuned_kwargs(model_dir: Path, k: int | None) -> dict[str, Any]:
    """Exactly what the service would pass to vLLM for the h200-bench profile."""
    from agent.engine.args import engine_kwargs
    from agent.engine.profile import load_engine_profile
    from agent.engine.speculative import choose_speculation

    profile = load_engine_profile("h200-bench").model_copy(update={"model": str(model_dir)})
    if k == 0:
        profile = profile.model_copy(
            update={"speculative": profile.speculative.model_copy(update={"method": "off"})}
        )
    spec = choose_speculation(profile, model_dir, k)
    kw = engine_kwargs(profile, model_dir, spec)
    kw.pop("additional_config", None)  # GDN-only setting; a dense model does not need it
    return kw


def config_kwargs(name: str, model_dir: Path, max_len: int, on_gpu: bool) -> dict[str, Any]:
    base = {
        "model": str(model_dir),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "max_model_len": max_len,
        "disable_log_stats": False,
    }
    if not on_gpu:  # CPU smoke run: keep it small and quick
        base |= {"enforce_eager": True, "kv_cache_memory_bytes": 1 << 30}
    if name == "defaults":
        return base
    if name == "eager":
        return base | {"enforce_eager": True}
    if name == "nochunk":
        return base | {"enable_chunked_prefill": False, "max_num_batched_tokens": max_len}
    base_name, _, budget = name.partition("-b")  # tuned-b512: the profile, another budget
    if base_name in ("tuned", "tuned-ngram"):
        kw = tuned_kwargs(model_dir, 3 if base_name == "tuned-ngram" else 0)
        kw |= {"max_model_len": max_len, "disable_log_stats": False}
        if budget:
            kw["max_num_batched_tokens"] = int(budget)
        if not on_gpu:
            kw.pop("compilation_config", None)
            kw.pop("gpu_memory_utilization", None)
            kw |= {"enforce_eager": True, "kv_cache_memory_bytes": 1 << 30}
        return kw
    raise ValueError(name)


async def run_dense(
    name: str,
    model_dir: Path,
    cfg: dict[str, Any],
    args: argparse.Namespace,
    floors: dict[str, Any],
    on_gpu: bool,
) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    max_len = max(1024, int(131072 * args.scale) + 1024)
    kw = config_kwargs(name, model_dir, max_len, on_gpu)
    known = set(AsyncEngineArgs.__dataclass_fields__)
    dropped = sorted(set(kw) - known)
    kw = {k: v for k, v in kw.items() if k in known}
    note = lambda s: print(f"[{name}] {s}", flush=True)  # noqa: E731
    note(f"kwargs {json.dumps(kw, default=str)}" + (f" (dropped {dropped})" if dropped else ""))
    with MemorySampler() as mem:
        t0 = time.perf_counter()
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
        start_s = time.perf_counter() - t0
        note(f"engine start {start_s:.1f}s")
        try:
            res = await measure_config(llm, cfg, args.scale, floors, note, seed=sum(map(ord, name)))
        finally:
            llm.shutdown()
            del llm
            gc.collect()
    res["start_s"] = round(start_s, 1)
    res["peak_mem_gib"] = round((mem.peak - mem.baseline) / 2**30, 2) if mem.peak else None
    if floors.get("copy_gbps"):
        floor_tok_s = floors["copy_gbps"] * 1e9 / (2 * shape_params(cfg))
        res["decode_floor_tok_s"] = round(floor_tok_s, 1)
        res["decode_vs_floor"] = round(res["decode_tok_s"] / floor_tok_s, 3)
    res["kwargs"] = {k: v for k, v in kw.items() if k != "model"}
    await asyncio.sleep(2)  # let the engine core process exit and free its memory
    return res


async def run_mtp(model_dir: Path, args: argparse.Namespace, on_gpu: bool) -> dict[str, Any]:
    """Our Engine wrapper on a random MTP-bearing shape: detection, config, stats, stepping."""
    from agent.engine import Engine, load_engine_profile

    profile = load_engine_profile(args.mtp_profile).model_copy(
        update={
            "model": str(model_dir),
            "max_model_len": 16384,
            "max_num_batched_tokens": 2048,
            "load_format": "dummy",
            "skip_tokenizer_init": True,
        }
    )
    profile = profile.model_copy(
        update={
            "speculative": profile.speculative.model_copy(
                update={"method": "auto", "num_speculative_tokens": 2, "window_draft_tokens": 64}
            )
        }
    )
    note = lambda s: print(f"[mtp] {s}", flush=True)  # noqa: E731
    engine = Engine()
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    info = await engine.start(profile)
    out["start_s"] = round(time.perf_counter() - t0, 1)
    out["spec_method"], out["spec_k"] = info.spec_method, info.spec_k
    note(
        f"started in {out['start_s']}s: vLLM {info.vllm_version} on {info.backend}, "
        f"speculation {info.spec_method} k={info.spec_k}"
    )
    rng = Prompts(json.loads((model_dir / "config.json").read_text())["vocab_size"], seed=7)
    results = [
        await engine.complete(rng.fresh(256), max_tokens=128, repetition=None) for _ in range(4)
    ]
    await asyncio.sleep(1.5)  # let the last stats reach our logger
    stats = dataclasses.asdict(engine.stats())
    out["stats"] = stats
    note(
        "stats after 4 requests: "
        + json.dumps(
            {
                k: stats.get(k)
                for k in (
                    "spec_method",
                    "spec_k",
                    "spec_target_k",
                    "spec_window_acceptance",
                    "spec_step_downs",
                )
            },
            default=str,
        )
        + " "
        + json.dumps(
            {k: v for k, v in stats.items() if "spec" in k or "draft" in k or "accept" in k},
            default=str,
        )[:400]
    )
    out["decode_tok_s"] = round(statistics.median(r.tokens_per_s or 0 for r in results), 1)
    target = stats.get("spec_target_k")
    out["k_target_after_window"] = target
    note(f"acceptance controller asks for k={target} (random weights: acceptance is meaningless)")
    if target is not None and target != info.spec_k:
        t0 = time.perf_counter()
        info2 = await engine.restart()
        out["restart_s"] = round(time.perf_counter() - t0, 1)
        out["spec_k_after_restart"] = info2.spec_k
        out["spec_method_after_restart"] = info2.spec_method
        note(f"restarted with {info2.spec_method} k={info2.spec_k} in {out['restart_s']}s")
    await engine.shutdown()
    return out


def render(results: dict[str, Any], floors: dict[str, Any]) -> str:
    cols = [
        ("start_s", "start s"),
        ("decode_tok_s", "decode tok/s"),
        ("decode_vs_floor", "vs floor"),
        ("ttft_4k_s", "TTFT 4K s"),
        ("ttft_32k_s", "TTFT 32K s"),
        ("ttft_128k_s", "TTFT 128K s"),
        ("append_ttft_s", "4.5K on 120K s"),
        ("append_vs_floor", "vs floor"),
        ("slid_ttft_s", "after slide s"),
        ("itl_p50_ms", "gap p50 ms"),
        ("itl_p99_ms", "gap p99 ms"),
        ("itl_max_ms", "gap max ms"),
        ("prefill_busy_over_alone", "128K prefill x"),
        ("peak_mem_gib", "peak GiB"),
    ]
    lines = [
        f"Device: {floors.get('device')}, copy {floors.get('copy_gbps')} GB/s, bf16 matmul "
        f"{floors.get('matmul_tflops')} TFLOP/s (measured in this run)",
        "",
        md_table(
            ["config", *(c[1] for c in cols)],
            [
                [name, *(str(r.get(c[0], "")) for c in cols)]
                for name, r in results.items()
                if name != "mtp" and "error" not in r
            ],
        ),
    ]
    for name, r in results.items():
        if "error" in r:
            lines.append(f"\n{name}: FAILED: {r['error']}")
    if "mtp" in results and "error" not in results["mtp"]:
        m = results["mtp"]
        lines.append(
            f"\nMTP (random weights: acceptance is meaningless): method {m['spec_method']}"
            f" k={m['spec_k']}, start {m['start_s']} s, decode {m['decode_tok_s']} tok/s,"
            f" controller target k={m.get('k_target_after_window')}, k after restart "
            f"{m.get('spec_k_after_restart')}"
        )
    return "\n".join(lines)


def chart(results: dict[str, Any], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing: no chart")
        return
    names = [n for n, r in results.items() if n != "mtp" and "error" not in r]
    metrics = [
        ("decode_tok_s", "decode tok/s (batch 1)"),
        ("append_ttft_s", "4.5K on 120K: TTFT s"),
        ("itl_max_ms", "longest decode gap during 128K prefill, ms"),
    ]
    fig, axes = plt.subplots(1, len(metrics), figsize=(15, 4))
    for ax, (key, title) in zip(axes, metrics, strict=True):
        ax.bar(names, [results[n].get(key) or 0 for n in names], color="#4a7ab5")
        ax.set_title(title, fontsize=10)
        if key == "itl_max_ms":
            ax.set_yscale("log")  # chunking off stalls 9 s; the others differ within 100s of ms
            ax.axhline(100, color="#c0392b", linestyle="--", linewidth=1)
        ax.tick_params(axis="x", rotation=30)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def main_async(args: argparse.Namespace) -> None:
    import torch

    on_gpu = torch.cuda.is_available()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = QWEN3_4B if on_gpu else TINY
    work = Path(tempfile.mkdtemp(prefix="bench-model-"))
    dense_dir = work / "dense"
    dense_dir.mkdir()
    (dense_dir / "config.json").write_text(json.dumps(cfg))
    mtp_dir = work / "mtp"
    mtp_dir.mkdir()
    (mtp_dir / "config.json").write_text(json.dumps(QWEN3_NEXT_SMALL))
    floors = measure_device()
    print(f"floors: {floors}", flush=True)
    path = out / "results.json"
    results: dict[str, Any] = json.loads(path.read_text())["configs"] if path.exists() else {}
    for name in args.configs.split(","):
        try:
            if name == "mtp":
                model = mtp_dir if args.mtp_model == "qwen3-next-small" else dense_dir
                results[name] = await run_mtp(model, args, on_gpu)
            else:
                results[name] = await run_dense(name, dense_dir, cfg, args, floors, on_gpu)
        except Exception as exc:  # one failed config must not lose the others
            import traceback

            traceback.print_exc()
            results[name] = {"error": repr(exc)[:500]}
        path.write_text(
            json.dumps(
                {
                    "floors": floors,
                    "shape": cfg,
                    "scale": args.scale,
                    "weight_bytes": 2 * shape_params(cfg),
                    "configs": results,
                },
                indent=2,
                default=str,
            )
        )
    table = render(results, floors)
    (out / "table.md").write_text(table + "\n")
    print(table, flush=True)
    chart(results, out / "chart.png")


def merge(out: Path, parts: list[Path]) -> None:
    """One table and chart from the results.json of several commands of one lease (a device
    command may run 10 minutes at most; the floors are re-measured in each)."""
    results: dict[str, Any] = {}
    floors: list[dict[str, Any]] = []
    for part in parts:
        data = json.loads(part.read_text())
        floors.append(data["floors"])
        for name, r in data["configs"].items():
            key = name if name not in results else f"{name} (repeat)"
            results[key] = r
    merged_floors = dict(floors[0])
    for key in ("copy_gbps", "matmul_tflops"):
        values = [f[key] for f in floors if f.get(key)]
        merged_floors[key] = round(statistics.median(values), 1) if values else None
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(
        json.dumps(
            {
                "floors": merged_floors,
                "floors_per_command": floors,
                "shape": QWEN3_4B,
                "weight_bytes": 2 * shape_params(QWEN3_4B),
                "configs": results,
            },
            indent=2,
        )
    )
    table = render(results, merged_floors)
    (out / "table.md").write_text(table + "\n")
    print(table)
    chart(results, out / "chart.png")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument(
        "--merge",
        nargs="+",
        type=Path,
        help="only merge these results.json files into --out (no engine runs)",
    )
    ap.add_argument("--configs", default="defaults,eager,nochunk,tuned,tuned-ngram,mtp")
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument(
        "--mtp-profile",
        default="h200-bench",
        help="profile for the mtp configuration (cpu-dev for a CPU smoke run)",
    )
    ap.add_argument(
        "--mtp-model",
        choices=["qwen3-next-small", "dense"],
        default="qwen3-next-small",
        help="dense: a CPU smoke run of the code path",
    )
    args = ap.parse_args()
    if args.merge:
        merge(Path(args.out), args.merge)
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
