"""The planner against bench_profiles.py's measurements, and the projected Orin NX figures.

Run here (no GPU, no vLLM needed) on the results.json files the device commands returned:

    PYTHONPATH=$PWD python bench/engine/compare_plan.py RESULTS.json [MORE.json ...] [--md OUT.md]

For every profile it plans the measured shape with `plan_memory` (what `agentctl plan
--model DIR --profile NAME` prints), with the token budget and speculation the run used,
and prints planner vs measured per memory line (target: within 10%), the timings, and the
Orin NX projections:

    decode_orin = decode_H200 x 102 GB/s / (H200 copy rate measured in the same run)
    TTFT_orin   = TTFT_H200 x (H200 bf16 matmul TFLOP/s measured in the run / Orin NX FP16
                  tensor peak)

Orin NX FP16 dense tensor peak: 8 Ampere SMs x 2048 FLOP/clock x GPU clock (918 MHz on the
16 GB module, 765 MHz on the 8 GB), from NVIDIA's Jetson Orin NX module specifications
(1024 CUDA cores, 32 tensor cores; 100 / 70 sparse INT8 TOPS with the DLAs, which these
figures reproduce); 15.0 and 12.5 TFLOP/s. The projection assumes the Orin reaches its peak
as well as the H200 reached its measured rate, so it is a lower bound on the Orin's TTFT.
The decode projection holds if the H200's step is bandwidth-bound; at batch 1 with 4-bit
weights much of it is not (kernel launches, small matrices), so it is a lower bound on the
Orin's decode, and the planner's ceiling (102 GB/s over the weight bytes) an upper bound.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench._common import md_table  # noqa: E402

GiB = 1 << 30
ORIN_BANDWIDTH_GBPS = 102.0
ORIN_FP16_TFLOPS = {
    "orin-nx-16gb": 8 * 2048 * 0.918e9 / 1e12,
    "orin-nx-8gb": 8 * 2048 * 0.765e9 / 1e12,
}
SEGMENT = 4500  # bench_profiles.py's appended segment
TARGETS = {"ttft_s": 0.350, "decode_tok_s": 12.0, "peak_bytes": 6.2e9, "context": 131072}


def load(paths: list[Path]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Runs of all files by label (a later file's run of the same label wins), and each file."""
    runs: dict[str, Any] = {}
    files = []
    for path in paths:
        data = json.loads(path.read_text())
        files.append(data)
        for label, run in data.get("runs", {}).items():
            run["_file"] = data
            # every start of this label, in file order: files of one lease, so a later start
            # of the same configuration found its compile cache warm
            run["_starts"] = [*runs.get(label, {}).get("_starts", []), run.get("start_s")]
            runs[label] = run
    return runs, files


def plan_for(run: dict[str, Any], shape: dict[str, Any], real: bool = False) -> Any:
    from agent.engine import load_engine_profile, plan_memory

    profile = load_engine_profile(run["profile"])
    # The profile as the run started it: the token budget, context, KV dtype and a fixed KV
    # size from the kwargs; a gpu_memory_utilization stays the profile's (the run's was the
    # same bytes of the H200).
    kw = run.get("kwargs", {})
    update: dict[str, Any] = {
        key: kw[key]
        for key in ("max_model_len", "max_num_batched_tokens", "kv_cache_dtype",
                    "enable_prefix_caching", "enforce_eager", "load_format")
        if key in kw
    }  # fmt: skip
    if "kv_cache_memory_bytes" in kw:
        update["memory"] = profile.memory.model_copy(
            update={"kv_cache_memory_bytes": kw["kv_cache_memory_bytes"]}
        )
    if real:
        update.pop("load_format", None)
    if "speculative_config" not in kw:
        update["speculative"] = profile.speculative.model_copy(update={"method": "off"})
    if run.get("variant") == "warm":  # started again, nothing to compile: no transient
        update["device"] = profile.device.model_copy(update={"compile_transient_bytes": 0})
    folder = Path(tempfile.mkdtemp(prefix="plan-shape-"))
    (folder / "config.json").write_text(json.dumps(shape))
    return plan_memory(folder, profile.model_copy(update=update)), profile


def _get(d: Any, *keys: str) -> Any:
    for key in keys:
        if not isinstance(d, dict):
            return None
        d = d.get(key)
    return d


def _log(run: dict[str, Any], key: str, index: int = 0) -> float | None:
    label = f"{run['profile']}:{run['variant']}"
    groups = _get(run["_file"], "log_lines", label, key)
    if not groups or groups[index] is None:
        return None
    return float(str(groups[index]).replace(",", ""))


def _gpu_engine(run: dict[str, Any], snap: str) -> int | None:
    """GPU bytes of the engine's processes (NVML per process, else device used - before)."""
    proc = _get(run, snap, "proc") or {}
    if proc.get("gpu_ours_matched"):
        return int(proc["gpu_ours"])
    used, before = proc.get("device_used"), _get(run, "before_start", "device_used")
    return int(used - before) if used is not None and before is not None else None


def measured_lines(run: dict[str, Any]) -> dict[str, float | None]:
    kv = run.get("kv") or {}
    worker = _get(run, "after_load", "worker") or {}
    graphs = _log(run, "graph_capture", 1)
    peak = _get(run, "at_window", "worker", "max_allocated")
    before = _get(run, "at_window", "allocated_before")
    gpu_full = _gpu_engine(run, "at_full_window") or _gpu_engine(run, "after_load")
    rss = _get(run, "at_full_window", "proc", "host_rss_total") or _get(
        run, "after_load", "proc", "host_rss_total"
    )
    reserved = _get(run, "at_full_window", "worker", "reserved") or worker.get("reserved")
    needed = None
    if kv.get("groups"):
        needed = sum(g.get("max_memory_usage_bytes", 0) * g["layers"] for g in kv["groups"])
    load_gib = _log(run, "model_load", 0)
    weights = worker.get("model_memory_usage") or (load_gib * GiB if load_gib else None)
    return {
        "weights": weights,
        "kv_per_token": kv.get("attn_bytes_per_token"),
        "fixed_per_seq": kv.get("state_bytes_per_seq"),
        "kv_budget": kv.get("tensor_bytes"),
        "kv_needed": needed,
        "kv_capacity": kv.get("one_seq_tokens"),
        "activations": peak - before if peak is not None and before is not None else None,
        "graphs": graphs * GiB if graphs is not None else None,
        "runtime_gpu": gpu_full - reserved if gpu_full and reserved else None,
        "host_rss": rss,
        "engine_gpu": gpu_full,
    }


def memory_table(label: str, run: dict[str, Any], plan: Any, unified: bool) -> str:
    m = measured_lines(run)
    engine = (m["engine_gpu"] or 0) + ((m["host_rss"] or 0) if unified else 0)
    runtime = (m["runtime_gpu"] or 0) + ((m["host_rss"] or 0) if unified else 0)
    held_state = plan.layout.state_bytes_per_seq if plan.layout else plan.fixed_bytes_per_seq
    rows_spec = [
        ("weights", plan.weight_bytes, m["weights"]),
        ("KV bytes / token (attention)", plan.kv_bytes_per_token, m["kv_per_token"]),
        # vLLM's layout holds the state and the attention blocks; the planner plans a
        # sequence's peak, one block more a GDN group while a prefill crosses a block (lease
        # 3: the stalls), so the last two rows are vLLM's count against the planner's peak
        ("state / sequence, held", held_state, m["fixed_per_seq"]),
        # the smaller pool of a start that compiles where the profile names a transient
        ("KV budget (pool)", plan.kv_worst_bytes, m["kv_budget"]),
        (
            "KV needed at max_model_len (planner: peak + null block)",
            plan.kv_needed_bytes,
            m["kv_needed"],
        ),
        (
            "KV capacity, one sequence (tokens; planner: at the peak)",
            plan.kv_capacity_tokens,
            m["kv_capacity"],
        ),
        ("activations (peak, window prefill)", plan.activation_bytes, m["activations"]),
        ("CUDA graphs", plan.graph_bytes, m["graphs"]),
        (
            "runtime (GPU non-torch" + (" + host RSS)" if unified else ")"),
            plan.runtime_bytes + plan.context_bytes,
            runtime or None,
        ),
        (
            "engine total (GPU" + (" + host RSS)" if unified else ")"),
            plan.engine_total_bytes - (plan.kv_budget_bytes - plan.kv_worst_bytes),
            engine or None,
        ),
    ]
    rows = []
    for name, planned, measured in rows_spec:
        ratio = measured / planned if measured and planned else None
        ok = None if ratio is None else ("yes" if abs(ratio - 1) <= 0.10 else "**no**")
        tokens = "tokens" in name or "/ token" in name
        rows.append([name, _fmt(planned, tokens), _fmt(measured, tokens), ratio, ok])
    head = f"**{label}** (planner: {plan.outcome})"
    return head + "\n\n" + md_table(["line", "planner", "measured", "measured / planner",
                                     "within 10%"], rows)  # fmt: skip


def profile_budget_holds(run: dict[str, Any], profile: Any) -> str | None:
    """What the profile's own fixed KV budget holds in the layout vLLM built for the run."""
    kv, budget = run.get("kv") or {}, profile.memory.kv_cache_memory_bytes
    groups = kv.get("groups") or []
    if budget is None or not groups or not kv.get("num_tensors"):
        return None
    page = groups[0]["page_size_bytes"]
    blocks = int(budget) // (page * kv["num_tensors"])
    attn = [g for g in groups if "Attention" in g["type"]]
    block = attn[0]["block_size"] if attn else groups[0]["block_size"]
    state = kv.get("state_pages_per_seq", 0)
    # the peak: one block more in each linear-attention group while a prefill crosses a block
    state += len(groups) - len(attn)
    per_seq = len(attn) * -(-profile.max_model_len // block) + state
    one_seq = max(0, blocks - state) // max(1, len(attn)) * block
    holds = "holds" if blocks >= per_seq else "**does not hold**"
    return (
        f"At the profile's own budget ({int(budget):,} B): {blocks} blocks of {block} tokens; "
        f"one {profile.max_model_len:,}-token sequence needs {per_seq}: it {holds} "
        f"max_model_len; one sequence can reach {one_seq:,} tokens."
    )


def _fmt(value: float | None, raw: bool) -> str | None:
    if value is None:
        return None
    if raw:
        return f"{int(value):,}"
    return f"{value / 1e9:.3f} GB" if abs(value) >= 1e8 else f"{value / 1e6:.1f} MB"


def timing_table(runs: dict[str, Any], names: list[str]) -> str:
    rows = []
    for name in names:
        full = runs.get(f"{name}:full", {})
        warm = runs.get(f"{name}:warm", {})
        nomtp = runs.get(f"{name}:nomtp", {})
        starts = [s for s in full.get("_starts", [full.get("start_s")]) if s is not None]
        cold = starts[0] if starts else None
        again = warm.get("start_s") or (starts[1] if len(starts) > 1 else None)
        rows.append([
            name, cold, again, full.get("ttft_window_s"),
            full.get("window_tokens"), full.get("ttft_append_s"), full.get("append_cached_tokens"),
            full.get("ttft_segment_alone_s"), full.get("decode_tok_s"), nomtp.get("decode_tok_s"),
            full.get("decode_at_window_tok_s"),
            full.get("gap_p50_ms"), full.get("gap_p99_ms"), full.get("gap_max_ms"),
            full.get("reprefill_s"),
        ])  # fmt: skip
    heads = ["profile", "start cold s", "start warm s", "TTFT window s", "window tokens",
             "TTFT 4.5K append s", "cached tokens", "4.5K alone s", "decode MTP tok/s",
             "decode no-spec tok/s", "decode at window tok/s", "gap p50 ms", "gap p99 ms",
             "gap max ms", "re-prefill s"]  # fmt: skip
    return md_table(heads, rows)


def _prefill_flops(plan: Any, cfg: dict[str, Any], new: int, cached: int) -> float:
    """FLOPs of prefilling `new` tokens after `cached` ones: 2 x projection parameters a
    token (embeddings excluded) plus attention, 4 x heads x head dim x the positions attended
    in each attention layer (the MTP layer's included); the GDN layers' own work is small."""
    from agent.engine.hybrid_layout import extra_params

    s = plan.shape
    embed = s.vocab_size * s.hidden_size * (1 if cfg.get("tie_word_embeddings") else 2)
    mtp = (plan.attention_layers or s.full_attention_layers) - s.full_attention_layers
    params = s.estimated_params + extra_params(cfg, mtp) - embed
    attn_layers = plan.attention_layers or s.full_attention_layers
    positions = new * (cached + new / 2)
    return float(2 * params * new + 4 * attn_layers * s.num_heads * s.head_dim * positions)


def projection_table(runs: dict[str, Any], names: list[str], plans: dict[str, Any]) -> str:
    rows: list[list[Any]] = []
    for name in names:
        full = runs.get(f"{name}:full")
        if not full or name not in ORIN_FP16_TFLOPS:
            continue
        fl = full["_file"].get("floors", {})
        copy, tflops = fl.get("copy_gbps"), fl.get("matmul_tflops")
        if not copy or not tflops:
            continue
        orin = ORIN_FP16_TFLOPS[name]
        bw = ORIN_BANDWIDTH_GBPS / copy
        cr = tflops / orin
        nomtp = runs.get(f"{name}:nomtp", {}).get("decode_tok_s")
        m = measured_lines(full)
        engine = (m["engine_gpu"] or 0) + (m["host_rss"] or 0)
        append = full.get("ttft_append_s")
        dec_w = full.get("decode_at_window_tok_s")
        dec = full.get("decode_tok_s")
        ctx = min(m["kv_capacity"] or 0, full.get("kwargs", {}).get("max_model_len", 0))
        weights = m["weights"] or 0
        plan = plans[name]
        int4 = plans.get(f"{name}:int4")
        int4_bytes = int4.weight_bytes if int4 is not None else None
        cached = full.get("append_cached_tokens") or 0
        seg = SEGMENT
        cfg = full.get("config") or full["_file"].get("shape") or {}
        floor_append = _prefill_flops(plan, cfg, seg, cached) / (orin * 1e12)
        floor_alone = _prefill_flops(plan, cfg, seg, 0) / (orin * 1e12)
        alone = full.get("ttft_segment_alone_s")
        engine_int4 = engine - weights + int4_bytes if engine and int4_bytes else None
        named = (cfg.get("quantization_config") or {}).get("modules_in_block_to_quantize")
        sized = "int4 weights" if named else "bf16-sized weights"
        rows += [
            [name, f"decode, MTP k=3 (0 accepted), {sized}",
             f"{dec} x {ORIN_BANDWIDTH_GBPS:g} / {copy}",
             _r(dec and dec * bw), "12 tok/s", _verdict(dec and dec * bw >= 12)],
            [name, "decode, no speculation", f"{nomtp} x {ORIN_BANDWIDTH_GBPS:g} / {copy}",
             _r(nomtp and nomtp * bw), "12 tok/s", _verdict(nomtp and nomtp * bw >= 12)],
            [name, "decode at the full window, MTP k=3",
             f"{dec_w} x {ORIN_BANDWIDTH_GBPS:g} / {copy}",
             _r(dec_w and dec_w * bw), "12 tok/s", _verdict(dec_w and dec_w * bw >= 12)],
            [name, f"decode upper bound, the weights measured ({sized})",
             f"102e9 / {weights:,.0f} B",
             _r(weights and ORIN_BANDWIDTH_GBPS * 1e9 / weights), "12 tok/s",
             _verdict(weights and ORIN_BANDWIDTH_GBPS * 1e9 / weights >= 12)],
            [name, "decode upper bound, int4 weights (planner, not measured)",
             f"102e9 / {int4_bytes or 0:,} B",
             _r(int4_bytes and ORIN_BANDWIDTH_GBPS * 1e9 / int4_bytes), "12 tok/s",
             _verdict(int4_bytes and ORIN_BANDWIDTH_GBPS * 1e9 / int4_bytes >= 12)],
            [name, f"TTFT, 4.5K appended to {cached:,} cached",
             f"{append} s x {tflops} / {orin:.1f}", _r(append and append * cr),
             "0.35 s", _verdict(append and append * cr <= 0.35)],
            [name, "TTFT, 4.5K appended: compute floor (lower bound)",
             f"{_prefill_flops(plan, cfg, seg, cached):.3g} FLOP / {orin:.1f} TFLOP/s",
             _r(floor_append), "0.35 s", _verdict(floor_append <= 0.35)],
            [name, "TTFT, 4.5K with no history", f"{alone} s x {tflops} / {orin:.1f}",
             _r(alone and alone * cr), "0.35 s", _verdict(alone and alone * cr <= 0.35)],
            [name, "TTFT, 4.5K with no history: compute floor",
             f"{_prefill_flops(plan, cfg, seg, 0):.3g} FLOP / {orin:.1f} TFLOP/s",
             _r(floor_alone), "0.35 s", _verdict(floor_alone <= 0.35)],
            [name, "TTFT, whole window cold", f"{full.get('ttft_window_s')} s x {cr:.1f}",
             _r(full.get("ttft_window_s") and full["ttft_window_s"] * cr), "-", None],
            [name, f"engine memory (GPU + host RSS), {sized}", "measured on the H200",
             f"{engine / 1e9:.2f} GB" if engine else None, "6.2 GB",
             _verdict(engine and engine <= 6.2e9)],
            [name, "engine memory with int4 weights", "measured - measured weights + planner int4",
             f"{engine_int4 / 1e9:.2f} GB" if engine_int4 else None, "6.2 GB",
             _verdict(engine_int4 and engine_int4 <= 6.2e9)],
            [name, "context one stream holds", "measured KV layout, up to max_model_len",
             f"{ctx:,}", "128K", _verdict(ctx >= 131072)],
        ]  # fmt: skip
    rows = [r for r in rows if not _redundant(r, runs)]
    for row in rows:  # a figure the run did not reach: say so instead of "None x ..."
        if row[3] is None and ("None" in str(row[2]) or row[2].startswith("measured")):
            row[2], row[5] = "not measured", None
    heads = ["profile", "figure (projection)", "formula", "Orin NX", "target", "meets"]
    return md_table(heads, rows)


def _redundant(row: list[Any], runs: dict[str, Any]) -> bool:
    """A row that repeats another for this run: the int4 lines of a run already int4, the
    append lines of a run that measured no append (its floor is the no-history one)."""
    full = runs.get(f"{row[0]}:full") or {}
    cfg = full.get("config") or full.get("_file", {}).get("shape") or {}
    named = (cfg.get("quantization_config") or {}).get("modules_in_block_to_quantize")
    figure = str(row[1])
    if named and ("int4 weights (planner" in figure or figure.startswith("engine memory with")):
        return True
    return full.get("ttft_append_s") is None and figure.startswith("TTFT, 4.5K appended")


def _r(value: float | None) -> float | None:
    return None if value is None else round(value, 3 if value < 10 else 1)


def _verdict(ok: bool | float | None) -> str | None:
    return None if ok is None else ("yes" if ok else "**no**")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--md", type=Path, help="also write the tables here")
    args = ap.parse_args()
    runs, files = load(args.results)
    names = list(dict.fromkeys(r["profile"] for r in runs.values() if "profile" in r))
    out = []
    plans: dict[str, Any] = {}
    for fl in files:
        f = fl.get("floors", {})
        out.append(f"Floors ({fl.get('machine')}): copy {f.get('copy_gbps')} GB/s, bf16 matmul "
                   f"{f.get('matmul_tflops')} TFLOP/s; weights {fl.get('weights')}")  # fmt: skip
    for label, run in runs.items():
        stalled = "stall" in run and "kv" in run  # what it measured before the stall stands
        if ("error" in run and not stalled) or "skipped" in run or "profile" not in run:
            why = run.get("error") or run.get("skipped")
            out.append(f"\n{label}: not measured: {why}")
            continue
        if stalled:
            out.append(f"\n{label}: {run['error']} (the lines below were measured before it)")
        if "kv" not in run:
            continue
        plan, profile = plan_for(run, run.get("config") or run["_file"]["shape"])
        if run["variant"] == "full":
            plans[run["profile"]] = plan
            # the same profile with a real GPTQ checkpoint (no dummy load): int4 projections
            int4, _ = plan_for(run, run.get("config") or run["_file"]["shape"], real=True)
            plans[f"{run['profile']}:int4"] = int4
        unified = bool(profile.device.unified_memory)
        out.append("\n" + memory_table(label, run, plan, unified))
        changes = {k: v for k, v in run.get("changes", {}).items() if isinstance(v, dict)}
        if changes:
            out.append("\nchanged for the run: " + json.dumps(changes))
        at_profile = profile_budget_holds(run, profile)
        if at_profile:
            out.append("\n" + at_profile)
    out.append("\n" + timing_table(runs, names))
    if plans:
        out.append("\nProjected Orin NX figures (not measured on an Orin):\n")
        out.append(projection_table(runs, names, plans))
    text = "\n".join(out)
    print(text)
    if args.md:
        args.md.write_text(text + "\n")


if __name__ == "__main__":
    main()
