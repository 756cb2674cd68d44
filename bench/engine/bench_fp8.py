"""fp8 weights against bf16 on the H200 4B shape: batch-1 decode and its share of the floor.

    python bench/engine/bench_fp8.py --out DIR [--configs bf16,fp8] [--tokens 512]

The Qwen3-4B shape of bench_engine.py, random weights (`load_format="dummy"`), token-id
prompts, vLLM's default compilation and CUDA graphs, one request at a time. `fp8` is vLLM's
`quantization="fp8"`: the linear layers' weights quantized to fp8 (e4m3, per-tensor scale)
at load, activations quantized per token on the fly; embeddings and the LM head stay bf16.
Per configuration: engine start, decode tokens/s (median of 3 requests of --tokens tokens
after a 64-token prompt) and its share of two floors measured in the same run: the bf16
floor (bf16 weight bytes / copy bandwidth) and the configuration's own (its weight bytes).
Writes DIR/results.json and DIR/table.md after each configuration.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from bench._common import md_table
from bench.engine.bench_engine import Prompts, decode_rate, generate, measure_device
from bench.shapes import QWEN3_4B, TINY

T0 = time.monotonic()


def weight_bytes(cfg: dict[str, Any], fp8: bool) -> int:
    """Bytes one decode step reads: the linear layers at 1 or 2 bytes, the rest bf16."""
    h, i, n = cfg["hidden_size"], cfg["intermediate_size"], cfg["num_hidden_layers"]
    q = cfg["num_attention_heads"] * cfg["head_dim"]
    kv = cfg["num_key_value_heads"] * cfg["head_dim"]
    linear = n * (h * q + 2 * h * kv + q * h + 3 * h * i)
    rest = n * (2 * h + 2 * cfg["head_dim"]) + h
    embed = cfg["vocab_size"] * h * (1 if cfg["tie_word_embeddings"] else 2)
    return linear * (1 if fp8 else 2) + 2 * (rest + embed)


async def run(
    name: str, model_dir: Path, cfg: dict[str, Any], args: argparse.Namespace, on_gpu: bool
) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kw: dict[str, Any] = {
        "model": str(model_dir),
        "load_format": "dummy",
        "skip_tokenizer_init": True,
        "dtype": "bfloat16",
        "max_model_len": 4096,
        "max_num_seqs": 1,
        "enable_prefix_caching": False,
        "seed": 0,
    }
    if on_gpu:
        kw["gpu_memory_utilization"] = 0.5
    else:
        kw["enforce_eager"] = True
        kw["kv_cache_memory_bytes"] = 256 << 20
    if name == "fp8":
        kw["quantization"] = "fp8"
    t0 = time.perf_counter()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
    start_s = time.perf_counter() - t0
    print(f"[{name}] engine start {start_s:.1f}s", flush=True)
    try:
        p = Prompts(cfg["vocab_size"], seed=1)
        await generate(llm, p.fresh(64), 32)  # warm-up
        rates = []
        for _ in range(3):
            rates.append(decode_rate(await generate(llm, p.fresh(64), args.tokens)))
    finally:
        llm.shutdown()
        del llm
        gc.collect()
    return {
        "start_s": round(start_s, 1),
        "decode_tok_s": round(statistics.median(rates), 1),
        "runs": [round(r, 1) for r in rates],
    }


def _r(x: float | None, n: int) -> str:
    return "-" if x is None else str(round(x, n))


def render(results: dict[str, Any], floors: dict[str, Any], cfg: dict[str, Any]) -> str:
    rows: list[list[object]] = []
    gbps = floors.get("copy_gbps")
    bf16_floor = gbps * 1e9 / weight_bytes(cfg, False) if gbps else None
    for name, r in results.items():
        wb = weight_bytes(cfg, name == "fp8")
        if "error" in r:
            rows.append([name, f"failed: {r['error'][:80]}", "", f"{wb / 1e9:.2f}", "", "", ""])
            continue
        own = gbps * 1e9 / wb if gbps else None
        rows.append([
            name, str(r["start_s"]), str(r["decode_tok_s"]), f"{wb / 1e9:.2f}", _r(own, 1),
            _r(r["decode_tok_s"] / own if own else None, 3),
            _r(r["decode_tok_s"] / bf16_floor if bf16_floor else None, 3),
        ])  # fmt: skip
    headers = [
        "weights", "start s", "decode tok/s", "weight GB", "own floor tok/s", "vs own floor",
        "vs bf16 floor",
    ]  # fmt: skip
    return md_table(headers, rows)


async def main_async(args: argparse.Namespace) -> None:
    import torch

    on_gpu = torch.cuda.is_available()
    cfg = QWEN3_4B if on_gpu else TINY
    model_dir = args.model_dir
    model_dir.mkdir(parents=True, exist_ok=True)  # a stable path: vLLM's compile cache keys on it
    (model_dir / "config.json").write_text(json.dumps(cfg))
    floors = measure_device()
    print(f"floors: {floors}", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, Any] = {}
    for name in args.configs.split(","):
        if time.monotonic() - T0 > args.deadline_s:
            results[name] = {"error": "skipped: past the deadline"}
            continue
        try:
            results[name] = await run(name, model_dir, cfg, args, on_gpu)
        except Exception as exc:
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"[:500]}
        await asyncio.sleep(2)
        table = render(results, floors, cfg)
        (args.out / "results.json").write_text(
            json.dumps({"floors": floors, "shape": cfg, "configs": results}, indent=1)
        )
        (args.out / "table.md").write_text(table + "\n")
        print(table, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--configs", default="bf16,fp8")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument(
        "--model-dir",
        type=Path,
        default=Path.home() / ".cache" / "edge-agent-bench" / "qwen3-4b-shape",
    )
    ap.add_argument("--deadline-s", type=float, default=1e9)
    args = ap.parse_args()
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
