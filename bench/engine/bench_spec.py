"""Speculative decoding on the tuned default model: none / prompt lookup / the trained draft.

    python bench/engine/bench_spec.py --model <merged tuned model> \
        --draft models/smollm2-135m-edge-eagle3 --prompts <corpus dir> --out DIR \
        [--configs none,eagle3-1,...,ngram-4] [--n 32]

One process, one vLLM engine per configuration (AsyncLLM, the engine arguments of
training/draft/vllm_run.py, which the answer regeneration used too, so the compile cache is
shared), the same real analysis prompts (corpus prompts: rendered by the service's prompt
code) one at a time, greedy, up to --max-tokens answer tokens, stopping at the end token as
the service does. Per configuration: engine start, analysis latency p50/p95 (request sent to
last token), TTFT p50, decode tokens/s (tokens after the first delta over the time after it,
summed over requests: on the GPU the first delta is the first token; on a busy CPU vLLM merges
deltas not yet read, so it may hold several), vLLM's own speculation counters (drafts, draft
tokens, accepted, per position) as acceptance rate and mean accepted length (1 + accepted /
drafts: tokens a verify step yields), and how many answers are token-for-token the answers
without speculation. A configuration that fails is logged with its traceback and the next
runs; results are written after each configuration (DIR/results.json, DIR/table.md), and no
new configuration starts after --deadline-s. A configuration named twice (none,eagle3-2,none)
runs twice; the table compares each with the first `none`. On a slow CPU, `--shortest` takes
the n + 1 shortest prompts (prefill is not what is compared) and `--min-answer N` only prompts
whose corpus answer has N tokens or more (most analyses answer `{"faults": []}`, 7 tokens, too
few to measure decode).

    python bench/engine/bench_spec.py --merge DIR/b-results.json DIR/c-results.json --out DIR

re-renders results of several runs (the same prompts, e.g. one lease's runs after a failed
configuration) as one table (DIR/table.md, DIR/results.json): a configuration that failed in
one run and ran in another is taken from where it ran, and "same answers as none" compares
the outputs across the engine starts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import sys
import threading
import time
import traceback
import uuid
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# main() asks torch for the GPU before the first engine starts, so CUDA is initialised in this
# process; vLLM's default fork of its workers then fails ("Cannot re-initialize CUDA in forked
# subprocess", the `none` of the 2026-12-01 run). Spawned workers do not inherit it.
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

from bench._common import md_table, percentile  # noqa: E402
from training.draft.vllm_run import engine_kwargs, load_prompts  # noqa: E402

T0 = time.monotonic()


def spec_for(name: str, draft: Path | None) -> dict[str, Any] | None:
    if name == "none":
        return None
    method, _, k = name.partition("-")
    if method == "ngram":
        return {
            "method": "ngram",
            "num_speculative_tokens": int(k),
            "prompt_lookup_min": 2,
            "prompt_lookup_max": 5,
        }
    if method == "eagle3":
        if draft is None:
            raise ValueError("eagle3 needs --draft")
        return {"method": "eagle3", "model": str(draft), "num_speculative_tokens": int(k)}
    raise ValueError(f"unknown config {name!r}")


class SpecCounts:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.drafts = self.draft_tokens = self.accepted = 0
        self.per_pos: list[int] = []

    def factory(self) -> Any:
        from vllm.v1.metrics.loggers import StatLoggerBase

        counts = self

        class _Logger(StatLoggerBase):  # type: ignore[misc]
            def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
                pass

            def record(self, scheduler_stats: Any, iteration_stats: Any, *a: Any, **k: Any) -> None:
                spec = getattr(scheduler_stats, "spec_decoding_stats", None)
                if spec is None:
                    return
                with counts.lock:
                    counts.drafts += int(getattr(spec, "num_drafts", 0) or 0)
                    counts.draft_tokens += int(getattr(spec, "num_draft_tokens", 0) or 0)
                    counts.accepted += int(getattr(spec, "num_accepted_tokens", 0) or 0)
                    pos = list(getattr(spec, "num_accepted_tokens_per_pos", []) or [])
                    if len(counts.per_pos) < len(pos):
                        counts.per_pos += [0] * (len(pos) - len(counts.per_pos))
                    for i, v in enumerate(pos):
                        counts.per_pos[i] += int(v)

            def log_engine_initialized(self) -> None:
                pass

        return _Logger

    def reset(self) -> None:
        with self.lock:
            self.drafts = self.draft_tokens = self.accepted = 0
            self.per_pos = []


async def one(llm: Any, ids: list[int], max_tokens: int) -> dict[str, Any]:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt
    from vllm.sampling_params import RequestOutputKind

    sp = SamplingParams(
        max_tokens=max_tokens,
        temperature=0.0,
        detokenize=False,
        output_kind=RequestOutputKind.DELTA,
    )
    t0 = time.perf_counter()
    ttft = None
    first = 0  # tokens in the first delta: more than one where outputs queued up unread
    tokens: list[int] = []
    async for out in llm.generate(
        TokensPrompt(prompt_token_ids=ids), sp, request_id=uuid.uuid4().hex
    ):
        got = list(out.outputs[0].token_ids) if out.outputs else []
        if got and ttft is None:
            ttft, first = time.perf_counter() - t0, len(got)
        tokens += got
    total = time.perf_counter() - t0
    return {
        "ttft": ttft if ttft is not None else total,
        "total": total,
        "tokens": tokens,
        "first": first,
    }


async def run_config(
    name: str, args: argparse.Namespace, prompts: list[list[int]], on_gpu: bool
) -> dict[str, Any]:
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    kw = engine_kwargs(args.model, on_gpu=on_gpu, spec=spec_for(name, args.draft), eager=args.eager)
    known = set(AsyncEngineArgs.__dataclass_fields__)
    kw = {k: v for k, v in kw.items() if k in known}
    counts = SpecCounts()
    t0 = time.perf_counter()
    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw), stat_loggers=[counts.factory()])
    start_s = time.perf_counter() - t0
    print(f"[{name}] engine start {start_s:.1f}s", flush=True)
    try:
        await one(llm, prompts[-1], 8)  # warm-up on a prompt not measured
        await asyncio.sleep(0.5)
        counts.reset()
        rows = [await one(llm, p, args.max_tokens) for p in prompts[:-1]]
        await asyncio.sleep(1.5)  # the last stats interval reaches the logger
    finally:
        llm.shutdown()
        del llm
        gc.collect()
    # Decode: the tokens after the first delta over the time after it. vLLM merges deltas the
    # caller has not read yet (a busy CPU), so the first may hold several tokens.
    dec_tokens = sum(max(0, len(r["tokens"]) - r["first"]) for r in rows)
    dec_time = sum(r["total"] - r["ttft"] for r in rows if len(r["tokens"]) > r["first"])
    p95 = percentile([r["total"] for r in rows], 0.95)
    res: dict[str, Any] = {
        "config": name,
        "start_s": round(start_s, 1),
        "requests": len(rows),
        "answer_tokens": sum(len(r["tokens"]) for r in rows),
        "latency_p50_s": round(statistics.median(r["total"] for r in rows), 4),
        "latency_p95_s": None if p95 is None else round(p95, 4),
        "ttft_p50_s": round(statistics.median(r["ttft"] for r in rows), 4),
        "decode_tok_s": round(dec_tokens / dec_time, 1) if dec_time > 0 else None,
        "drafts": counts.drafts,
        "draft_tokens": counts.draft_tokens,
        "accepted": counts.accepted,
        "accepted_per_pos": counts.per_pos,
        "acceptance_rate": round(counts.accepted / counts.draft_tokens, 4)
        if counts.draft_tokens
        else None,
        "mean_accepted_length": round(1 + counts.accepted / counts.drafts, 3)
        if counts.drafts
        else None,
        "first_delta_tokens": [r["first"] for r in rows],
        "outputs": [r["tokens"] for r in rows],
    }
    return res


def _dash(x: float | None) -> str:
    return "-" if x is None else str(x)


def render(results: list[dict[str, Any]]) -> str:
    base = next((r for r in results if r.get("config") == "none" and "outputs" in r), None)
    headers = [
        "config", "start s", "acceptance", "mean accepted length", "decode tok/s", "x none",
        "latency p50 s", "p95 s", "TTFT p50 s", "same answers as none",
    ]  # fmt: skip
    rows: list[list[object]] = []
    for r in results:
        if "error" in r:
            err = str(r["error"])
            label = err if err.startswith(("not run", "skipped")) else f"failed: {err[:80]}"
            rows.append([r["config"], label, *[""] * 8])
            continue
        same = "-"
        if base is not None and r is not base:
            n = sum(a == b for a, b in zip(r["outputs"], base["outputs"], strict=False))
            same = f"{n}/{len(base['outputs'])}"
        speed = "-"
        if base is not None and base.get("decode_tok_s") and r.get("decode_tok_s"):
            speed = f"{r['decode_tok_s'] / base['decode_tok_s']:.2f}"
        rows.append([  # str(): the values as measured, not md_table's three places
            r["config"], str(r["start_s"]), _dash(r["acceptance_rate"]),
            _dash(r["mean_accepted_length"]), str(r["decode_tok_s"]), speed,
            str(r["latency_p50_s"]), str(r["latency_p95_s"]), str(r["ttft_p50_s"]), same,
        ])  # fmt: skip
    return md_table(headers, rows)


async def main_async(args: argparse.Namespace) -> None:
    import torch

    on_gpu = torch.cuda.is_available()
    prompts = load_prompts(args.prompts)
    if args.min_answer:  # prompts whose corpus answer is long (a fault quoted): decode to measure
        import numpy as np

        t_off = np.load(args.prompts / "corpus.npz")["target_offsets"]
        lengths = [int(t_off[i + 1] - t_off[i]) for i in range(len(t_off) - 1)]
        prompts = [p for p, n in zip(prompts, lengths, strict=True) if n >= args.min_answer]
    if args.shortest:  # a slow CPU: the n + 1 shortest, in corpus order (prefill is not measured)
        keep = set(sorted(range(len(prompts)), key=lambda i: len(prompts[i]))[: args.n + 1])
        prompts = [p for i, p in enumerate(prompts) if i in keep]
    # The same prompts for every configuration: the first n (+1 for the warm-up).
    prompts = prompts[: args.n + 1]
    args.out.mkdir(parents=True, exist_ok=True)
    results: list[dict[str, Any]] = []
    for name in args.configs.split(","):
        if time.monotonic() - T0 > args.deadline_s:
            print(f"[{name}] skipped: past the deadline", flush=True)
            results.append({"config": name, "error": "skipped: past the deadline"})
            continue
        try:
            results.append(await run_config(name, args, prompts, on_gpu))
        except Exception as exc:
            traceback.print_exc()
            results.append({"config": name, "error": f"{type(exc).__name__}: {exc}"})
        await asyncio.sleep(2)
        table = render(results)
        meta = {
            "device": torch.cuda.get_device_name() if on_gpu else "cpu",
            "prompts": len(prompts) - 1,
            "max_tokens": args.max_tokens,
            "prompt_tokens": [len(p) for p in prompts[:-1]],
            "min_answer": args.min_answer,
            "model": str(args.model),
            "draft": str(args.draft),
        }
        (args.out / "results.json").write_text(json.dumps({"meta": meta, "results": results}))
        (args.out / "table.md").write_text(table + "\n")
        print(table, flush=True)


def merge(files: list[Path], out: Path, not_run: list[str], why: str) -> None:
    """One table from several results.json of the same prompts (module docstring); the
    configurations in `not_run` get a row that says so, with `why`."""
    metas: list[dict[str, Any]] = []
    done: dict[str, dict[str, Any]] = {}
    failed: dict[str, dict[str, Any]] = {}
    names = ["none"]
    for f in files:
        data = json.loads(f.read_text(encoding="utf-8"))
        metas.append({"file": f.name, **data.get("meta", {})})
        for r in data["results"]:
            (failed if "error" in r else done).setdefault(r["config"], {**r, "from": f.name})
            names.append(r["config"])
    for key in ("prompts", "max_tokens", "model"):
        if len({str(m.get(key)) for m in metas}) > 1:
            raise SystemExit(f"the runs differ in {key}: {[m.get(key) for m in metas]}")
    names = list(dict.fromkeys(names))
    results = [done.get(n) or failed[n] for n in names if n in done or n in failed]
    results += [{"config": n, "error": f"not run: {why}"} for n in not_run if n not in done]
    out.mkdir(parents=True, exist_ok=True)
    table = render(results)
    src = ", ".join(f"{r['config']}: {r['from']}" for r in results if "from" in r)
    (out / "results.json").write_text(json.dumps({"meta": metas, "results": results}))
    note = (
        f"From: {src}. Same answers as none: greedy token ids compared across "
        f"{len(files)} runs (engine starts) on the same prompts."
    )
    (out / "table.md").write_text(f"{table}\n\n{note}\n")
    print(table, flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--model", type=Path)
    ap.add_argument("--draft", type=Path)
    ap.add_argument("--prompts", type=Path, help="a corpus folder (corpus.npz)")
    ap.add_argument("--merge", type=Path, nargs="+", help="results.json files to render as one")
    ap.add_argument("--not-run", default="", help="with --merge: configurations not run")
    ap.add_argument("--why", default="device time ran out", help="with --not-run: the reason")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument(
        "--configs",
        default="none,eagle3-1,eagle3-2,eagle3-3,eagle3-4,ngram-1,ngram-2,ngram-3,ngram-4",
    )
    ap.add_argument("--n", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=160)
    ap.add_argument(
        "--eager", action="store_true", help="enforce_eager (the CPU profile does anyway)"
    )
    ap.add_argument("--deadline-s", type=float, default=1e9)
    ap.add_argument(
        "--shortest", action="store_true", help="the n shortest prompts (a slow CPU's prefill)"
    )
    ap.add_argument(
        "--min-answer", type=int, default=0, help="only prompts whose corpus answer has N tokens"
    )
    args = ap.parse_args()
    if args.merge:
        merge(args.merge, args.out, [c for c in args.not_run.split(",") if c], args.why)
        return
    if args.model is None or args.prompts is None:
        ap.error("--model and --prompts are needed (or --merge)")
    asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
