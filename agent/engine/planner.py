"""The memory planner: will this model run with this profile, and with how much context?

Read before anything is loaded (config.json and safetensors headers only), so that the
service can refuse an impossible profile with a sentence instead of dying inside vLLM's
startup. The arithmetic, for one sequence at max_model_len:

    KV bytes/token  = full-attention layers x (2 x KV heads x head dim, or the MLA latent
                      kv_lora_rank + qk_rope_head_dim) x KV dtype bytes
    fixed per seq   = linear-attention state + sliding-window layers x window
    KV budget       = kv_cache_memory_bytes, or
                      gpu_memory_utilization x device memory - weights - activations
                      - CUDA graphs - runtime (and, on a start that compiles, less the
                      compile transient: capacity and outcome hold for that first start)
    engine total    = runtime + weights + activations + CUDA graphs + KV budget + the CUDA
                      context outside vLLM's budget, which must fit memory_bytes -
                      reserve_bytes (on a discrete GPU: the card less the desktop and ASR)

Activations and graphs are allowances, not measurements (documented in docs/engine.md);
weights and KV are exact for dense models (vLLM sizes its pool with the same formula).
A Gated-DeltaNet hybrid on a GPU is planned in vLLM's own pool layout (hybrid_layout.py:
unified pages, the MTP layer's KV, 2 + k state blocks per layer group with prefix caching),
which the H200 run of issue 20 measured.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.engine.hybrid_layout import (
    HybridLayout,
    gdn_activation_bytes,
    hybrid_layout,
    token_budget_needed,
)
from agent.engine.model_config import ModelFolderError, read_config, text_config
from agent.engine.model_shape import ModelShape, model_shape
from agent.engine.plan_weights import int4_option, plan_weights
from agent.engine.profile import EngineProfile
from agent.engine.speculative import detect_mtp

__all__ = ["MemoryPlan", "PlanError", "plan_memory"]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}
_DTYPE_LABEL = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32"}
_UNSCALED_ROPE = {"default", "llama3", "longrope", "su", "mrope", "linear_dynamic"}
_DEFAULT_UTIL = 0.92  # vLLM's default gpu_memory_utilization
# Measured on the H200 (issue 20; vLLM logs 0.01 GiB steps): FULL_DECODE_ONLY 0.08 GiB for 3
# and for 4 sizes; FULL_AND_PIECEWISE 0.07 GiB for 4 sizes with the MTP drafter, 0.06 for 3
# without it: the piecewise graphs share the pool, so they add no second set of sizes.
_GRAPH_BASE = {"FULL_DECODE_ONLY": 80 << 20, "FULL_AND_PIECEWISE": 60 << 20}


class PlanError(Exception):
    """The model folder cannot be planned (missing or unreadable config)."""


@dataclass(frozen=True)
class MemoryPlan:
    model_dir: Path
    shape: ModelShape
    dtype: str
    kv_dtype_label: str
    weight_bytes: int
    weights_source: str
    kv_bytes_per_token: int
    fixed_bytes_per_seq: int
    activation_bytes: int
    graph_bytes: int
    graph_sizes: int
    runtime_bytes: int
    kv_budget_bytes: int  # a start with the compile cache warm
    kv_budget_source: str
    engine_total_bytes: int
    engine_limit_bytes: int
    kv_needed_bytes: int
    kv_capacity_tokens: int
    position_limit: int | None
    max_context_tokens: int
    max_context_fp8_tokens: int | None
    max_model_len: int
    decode_floor_tps: float | None
    fits: bool
    outcome: str
    int4_weight_bytes: int | None = None  # the same model as AWQ/GPTQ int4 (cuda profiles)
    attention_layers: int | None = None  # layers with KV, the MTP layers included
    layout: HybridLayout | None = None  # vLLM's pool of a GDN hybrid
    max_num_seqs: int = 1
    context_bytes: int = 0  # the CUDA context outside vLLM's budget (discrete GPUs)
    kv_first_start_bytes: int | None = None  # a start that compiles, when it is smaller

    @property
    def full_windows(self) -> int | None:
        """Sequences of max_model_len the pool holds at their peak at once (GDN hybrids)."""
        if self.layout is None:
            return None
        return self.layout.usable_blocks(self.kv_worst_bytes) // self.layout.blocks_per_seq(
            self.max_model_len
        )

    @property
    def kv_worst_bytes(self) -> int:
        """The KV pool of the smallest start: a start that compiles, if that is smaller."""
        first = self.kv_first_start_bytes
        return self.kv_budget_bytes if first is None else min(first, self.kv_budget_bytes)

    def render(self, profile_name: str | None = None) -> str:
        s = self.shape
        kv_elems = s.kv_elements_per_token_per_layer()
        how = (
            f"MLA latent {kv_elems}"
            if s.mla_latent_dim is not None
            else f"2 x {s.num_kv_heads} KV heads x {s.head_dim}"
        )
        n_attn = self.attention_layers or s.full_attention_layers
        kv_bytes = self.kv_bytes_per_token // max(1, n_attn * kv_elems)
        mtp = n_attn - s.full_attention_layers
        lines = [("profile", profile_name)] if profile_name else []
        lines += [
            ("model", f"{self.model_dir} ({s.architecture}, {s.describe_layers()})"),
            ("weights", f"{_gb(self.weight_bytes)} {self.dtype} ({self.weights_source})"),
            (
                "KV / token",
                f"{_kb(self.kv_bytes_per_token)} {self.kv_dtype_label} "
                f"({n_attn} full-attention layers{f' ({mtp} MTP)' if mtp else ''} x {how} "
                f"x {kv_bytes} B)",
            ),
        ]
        if self.layout is not None:
            lo = self.layout
            lines.append((
                "KV layout",
                f"blocks of {lo.block_size:,} tokens, {lo.group_size} pages of "
                f"{lo.page_bytes / 1e6:.2f} MB ({lo.block_bytes / 1e6:.1f} MB a block); "
                "a sequence: "
                f"{lo.attention_groups} x ceil(tokens / {lo.block_size:,}) attention + "
                f"{lo.state_blocks} state blocks ({lo.state_groups} GDN groups x "
                f"{lo.state_blocks_per_group})"
                + (f" + {lo.peak_state_blocks - lo.state_blocks} while a prefill crosses a "
                   "block" if lo.peak_state_blocks > lo.state_blocks else "")
                + f"; pool {lo.blocks(self.kv_budget_bytes)} blocks, "
                f"{lo.usable_blocks(self.kv_budget_bytes)} usable",
            ))  # fmt: skip
        if self.fixed_bytes_per_seq:
            what = "linear state, windows"
            if self.layout is not None:
                peak = self.layout.peak_state_blocks > self.layout.state_blocks
                what = "state blocks, a prefill's peak" if peak else "state blocks"
            lines.append(("fixed / seq", f"{_gb(self.fixed_bytes_per_seq)} ({what})"))
        context = f" + {_gb(self.context_bytes)} outside the budget" if self.context_bytes else ""
        first = ""
        if self.kv_first_start_bytes is not None:
            first = f"; a start that compiles: {_gb(self.kv_first_start_bytes)}"
        lines += [
            ("activations", f"{_gb(self.activation_bytes)} (allowance for one prefill chunk)"),
            ("CUDA graphs", f"{_gb(self.graph_bytes)} ({self.graph_sizes} capture sizes)"),
            (
                "runtime",
                f"{_gb(self.runtime_bytes)} (Python processes; CUDA context on GPUs)" + context,
            ),
            ("KV budget", f"{_gb(self.kv_budget_bytes)} ({self.kv_budget_source}){first}"),
            ("engine total", f"{_gb(self.engine_total_bytes)} of {_gb(self.engine_limit_bytes)}"),
            (
                "KV capacity",
                f"{self.kv_capacity_tokens:,} tokens{' (a start that compiles)' if first else ''}",
            ),
        ]
        ctx = f"{_ctx(self.max_context_tokens)}"
        if self.position_limit is not None and self.max_context_tokens == self.position_limit:
            ctx += " (the model's position limit)"
        if self.max_context_fp8_tokens is not None:
            ctx += f"; with fp8 KV: {_ctx(self.max_context_fp8_tokens)}"
        lines.append(("largest context", ctx))
        if self.full_windows and self.full_windows < self.max_num_seqs:  # 0: the outcome says
            # measured (issue 20, lease 3): vLLM 0.26 neither finishes nor refuses such a
            # prefill; it preempts it and takes it back from the prefix cache, over and over
            lines.append(("full windows", f"{self.full_windows} of max_num_seqs "
                          f"{self.max_num_seqs} at once: a long prefill beside them stalls "
                          "vLLM 0.26 (docs/profiles.md)"))  # fmt: skip
        if self.decode_floor_tps is not None:
            lines.append(("decode ceiling", f"{self.decode_floor_tps:.1f} tok/s at batch 1 "
                          "(weights read once per token)"))  # fmt: skip
        if self.int4_weight_bytes is not None:
            saved = self.weight_bytes - self.int4_weight_bytes
            lines.append(("int4 option", f"{_gb(self.int4_weight_bytes)} of weights as AWQ/GPTQ "
                          f"4-bit (group 128): saves {_gb(saved)}"))  # fmt: skip
        lines.append(("outcome", self.outcome))
        width = max(len(k) for k, _ in lines)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in lines)


def _gb(n: int | float) -> str:
    return f"{n / 1e9:.1f} GB" if abs(n) >= 1e8 else f"{n / 1e6:.0f} MB"


def _kb(n: int) -> str:
    return f"{n / 1e3:.1f} KB"


def _ctx(tokens: int) -> str:
    if tokens >= 1024 and tokens % 1024 == 0:
        return f"{tokens // 1024}K"
    return f"{tokens:,} tokens"


def _resolve_dtype(profile_dtype: str, config_dtype: str | None) -> str:
    if profile_dtype != "auto":
        return profile_dtype
    name = (config_dtype or "bfloat16").replace("torch.", "")
    # vLLM's auto dtype downcasts float32 checkpoints to the platform's half type.
    return "bfloat16" if name not in ("bfloat16", "float16") else name


def _position_limit(cfg: Mapping[str, Any]) -> int | None:
    base = cfg.get("max_position_embeddings")
    if not isinstance(base, int):
        return None
    rope = cfg.get("rope_scaling") or cfg.get("rope_parameters")
    if isinstance(rope, Mapping):
        kind = str(rope.get("rope_type") or rope.get("type") or "default")
        factor = rope.get("factor")
        if kind not in _UNSCALED_ROPE and isinstance(factor, int | float) and factor > 1:
            original = rope.get("original_max_position_embeddings")
            start = original if isinstance(original, int) else base
            return int(start * factor)
    return base


def _activations(
    profile: EngineProfile, shape: ModelShape, cfg: Mapping[str, Any], dtype_bytes: int, k: int
) -> int:
    """Peak of one forward pass over a full prefill chunk, plus the sampler's logits.

    Per token: the residual stream and its normed copy, q/k/v and the attention output,
    the MLP's gate+up and activated intermediate; logits in fp32 for every sequence's
    verify positions, twice (logits and probabilities).
    """
    s = shape
    qkv = (s.num_heads + 2 * s.num_kv_heads) * s.head_dim
    per_token = (4 * s.hidden_size + qkv + 3 * s.mlp_width) * dtype_bytes
    logits = profile.max_num_seqs * (1 + k) * s.vocab_size * 4 * 2
    tokens = profile.max_num_batched_tokens
    return (
        max(
            tokens * per_token,
            gdn_activation_bytes(cfg, s.hidden_size, s.linear_layers, tokens, dtype_bytes),
        )
        + logits
    )


def _graphs(profile: EngineProfile, k: int) -> tuple[int, int]:
    """(bytes, number of capture sizes): a coarse allowance, vLLM logs 0.1-1 GiB."""
    if profile.graph_tokens_needed() == 0 and (
        profile.enforce_eager or profile.device.kind != "cuda" or profile.cuda_graphs.mode == "NONE"
    ):
        return 0, 0
    sizes = profile.capture_sizes_for(k)
    if sizes is None:
        limit = profile.cuda_graphs.max_capture_size or min(512, 2 * profile.max_num_seqs * (1 + k))
        sizes = [s for s in (1, 2, 4, *range(8, 256, 8), *range(256, 1025, 16)) if s <= limit]
    per_size = 2 << 20
    base = _GRAPH_BASE.get(profile.cuda_graphs.mode, _GRAPH_BASE["FULL_DECODE_ONLY"])
    return base + per_size * len(sizes), len(sizes)


def _capacity(budget: int, fixed: int, per_token: int, block: int, cap: int) -> int:
    if per_token <= 0:
        return cap
    blocks = max(0, budget - fixed) // (per_token * block)
    return min(cap, blocks * block)


def _kv_rates(
    shape: ModelShape, profile: EngineProfile, dtype_bytes: int, kv_bytes: int
) -> tuple[int, int]:
    """(KV bytes per token, fixed bytes per sequence) at `kv_bytes` per KV element."""
    per_layer = shape.kv_elements_per_token_per_layer() * kv_bytes
    window = min(shape.sliding_window or 0, profile.max_model_len)
    # Recurrent state stays in the model dtype: an fp8 KV cache does not shrink it.
    fixed = shape.linear_layers * shape.linear_state_elements * dtype_bytes
    return (
        shape.full_attention_layers * per_layer,
        fixed + shape.sliding_layers * window * per_layer,
    )


def _budget(profile: EngineProfile, non_kv: int) -> tuple[int, int, str]:
    """(KV budget, memory limit of the whole engine, where the budget comes from)."""
    device, mem = profile.device, profile.memory
    util = mem.gpu_memory_utilization
    shares_ram = device.unified_memory or device.kind == "cpu"
    left_by_reserve = int(device.memory_bytes) - int(device.reserve_bytes)
    # The engine, its CUDA context outside vLLM's share included, must leave reserve_bytes:
    # on unified memory the OS, this daemon and ASR; on a discrete GPU the desktop and ASR.
    if mem.kv_cache_memory_bytes is not None:
        return int(mem.kv_cache_memory_bytes), left_by_reserve, "kv_cache_memory_bytes"
    assert util is not None  # MemorySettings requires one of the two
    share = int(util * device.memory_bytes)
    source = f"gpu_memory_utilization {util} of {_gb(device.memory_bytes)}, minus the rest"
    if shares_ram:  # the reserve also caps what vLLM may take of the shared RAM
        limit = min(share, left_by_reserve)
        return max(0, limit - non_kv), limit, source
    # On a discrete GPU vLLM takes its share whatever the reserve: a share over the card
    # less the reserve shows as an engine total over the limit, not as a smaller pool.
    return max(0, share - non_kv), left_by_reserve, source


def _kv_reasons(
    profile: EngineProfile, layout: HybridLayout | None, needed: int, worst: int, first: bool
) -> list[str]:
    """Why the KV pool cannot hold max_model_len (none if it can); `worst` the smallest pool,
    `first` whether that is a start that compiles."""
    on_first = " on a start that compiles" if first else ""
    if needed <= worst:
        return []
    if layout is None:
        return [f"{_gb(needed)} of KV needed, {_gb(worst)} available{on_first}"]
    return [
        f"{needed / 1e9:.2f} GB of KV needed ({layout.blocks_per_seq(profile.max_model_len)}"
        f" blocks + vLLM's null block), {worst / 1e9:.2f} GB available{on_first} "
        f"({layout.blocks(worst)} blocks)"
    ]


def _first_start(profile: EngineProfile, kv_budget: int) -> int | None:
    """The KV pool of a start that compiles, where the profile says it is smaller (measured,
    issue 20 lease 4: vLLM's profiling run then also holds compile buffers); None if not."""
    transient = int(profile.device.compile_transient_bytes)
    if not transient or profile.memory.kv_cache_memory_bytes is not None:
        return None
    return max(0, kv_budget - transient)


@dataclass(frozen=True)
class _KvArgs:
    dtype_bytes: int
    fp8: bool
    k: int
    mtp: int


def _kv(
    shape: ModelShape,
    cfg: Mapping[str, Any],
    profile: EngineProfile,
    a: _KvArgs,
    *,
    budget: int,
    cap: int,
) -> tuple[HybridLayout | None, int, int, int, int, int | None]:
    """(hybrid layout, KV bytes/token, fixed bytes/seq, one sequence's capacity in tokens,
    bytes needed at max_model_len, the capacity with fp8 KV if the KV is not fp8)."""

    def layout_at(kv_bytes: int) -> HybridLayout | None:
        if profile.device.kind == "cpu":
            return None
        return hybrid_layout(
            cfg,
            full_attention_layers=shape.full_attention_layers,
            linear_layers=shape.linear_layers,
            attn_bytes_per_token_layer=shape.kv_elements_per_token_per_layer() * kv_bytes,
            dtype_bytes=a.dtype_bytes,
            k=a.k,
            mtp_layers=a.mtp,
            prefix_caching=profile.enable_prefix_caching,
        )

    kv_bytes = 1 if a.fp8 else a.dtype_bytes
    block = profile.block_size or (128 if profile.device.kind == "cpu" else 16)
    layout = layout_at(kv_bytes)
    if layout is not None:
        per_token, fixed = layout.bytes_per_token, layout.peak_state_bytes_per_seq
        capacity = layout.one_seq_tokens(budget)
        needed = layout.needed_bytes(profile.max_model_len)
    else:
        per_token, fixed = _kv_rates(shape, profile, a.dtype_bytes, kv_bytes)
        capacity = _capacity(budget, fixed, per_token, block, 1 << 40)
        needed = per_token * profile.max_model_len + fixed
    fp8_context = None
    if not a.fp8:
        layout_fp8 = layout_at(1)
        if layout_fp8 is not None:
            fp8_context = min(cap, layout_fp8.one_seq_tokens(budget))
        else:
            per_token_fp8, fixed_fp8 = _kv_rates(shape, profile, a.dtype_bytes, 1)
            fp8_context = _capacity(budget, fixed_fp8, per_token_fp8, block, cap)
    return layout, per_token, fixed, capacity, needed, fp8_context


def plan_memory(model_dir: Path, profile: EngineProfile) -> MemoryPlan:
    """Plan `profile` for the model in `model_dir` (reads config.json and headers only).

    Raises:
        PlanError: no readable config.json, or one the planner cannot interpret.
    """
    spec = profile.speculative
    k = spec.num_speculative_tokens if spec.enabled else 0
    try:
        config = read_config(model_dir)
        cfg = text_config(config)
        shape = model_shape(config)
        dtype = _resolve_dtype(profile.dtype, shape.config_dtype)
        mtp = _mtp_layers(model_dir, profile)
        weight_bytes, weights_source = plan_weights(
            model_dir, profile, shape, _DTYPE_BYTES[dtype], mtp
        )
    except (ModelFolderError, ValueError) as exc:
        raise PlanError(str(exc)) from exc
    dtype_bytes = _DTYPE_BYTES[dtype]
    fp8 = profile.kv_cache_dtype.startswith("fp8")
    kv_label = "fp8" if fp8 else _DTYPE_LABEL[dtype]

    activations = _activations(profile, shape, cfg, dtype_bytes, k)
    graph_bytes, graph_sizes = _graphs(profile, k)
    runtime = int(profile.device.runtime_overhead_bytes)
    non_kv = runtime + weight_bytes + activations + graph_bytes
    kv_budget, limit, budget_source = _budget(profile, non_kv)
    context = int(profile.device.context_bytes)
    total = non_kv + kv_budget + context
    first_start = _first_start(profile, kv_budget)
    worst = kv_budget if first_start is None else first_start
    positions = _position_limit(cfg)
    cap = positions if positions is not None else 1 << 40
    kv = _kv(shape, cfg, profile, _KvArgs(dtype_bytes, fp8, k, mtp), budget=worst, cap=cap)
    layout, per_token, fixed, capacity, kv_needed, fp8_context = kv
    bandwidth = profile.device.memory_bandwidth_gbps
    floor = bandwidth * 1e9 / weight_bytes if bandwidth and weight_bytes else None
    reasons = []  # all of them, so that one run of `agentctl plan` shows everything to fix
    if positions is not None and profile.max_model_len > positions:
        reasons.append(
            f"max_model_len {profile.max_model_len:,} exceeds the model's {positions:,} positions"
        )
    reasons += _kv_reasons(profile, layout, kv_needed, worst, first_start is not None)
    if layout is not None and profile.enable_prefix_caching:
        tokens = profile.max_num_batched_tokens
        if tokens < layout.block_size:
            reasons.append(
                f"max_num_batched_tokens {tokens:,} is below the hybrid's attention block of "
                f"{layout.block_size:,} tokens, which vLLM refuses with prefix caching "
                f"(mamba align mode): use {token_budget_needed(layout, profile.max_num_seqs, k):,}"
            )
    if profile.memory.kv_cache_memory_bytes is None and kv_budget == 0:
        reasons.append(
            f"weights, activations, graphs and runtime ({_gb(non_kv)}) leave nothing of the "
            f"gpu_memory_utilization share for KV"
        )
    if total > limit:
        reasons.append(
            f"the engine needs {_gb(total)} (weights {_gb(weight_bytes)}, KV {_gb(kv_budget)}, "
            f"activations and graphs {_gb(activations + graph_bytes)}, runtime {_gb(runtime)}"
            + (f", CUDA context {_gb(context)}" if context else "")
            + "), "
            f"{_gb(limit)} available"
        )
    fits = not reasons
    if fits:
        outcome = f"fits {_ctx(profile.max_model_len)} with {kv_label} KV"
    else:
        outcome = "does not fit: " + "; ".join(reasons)
    return MemoryPlan(
        model_dir=model_dir,
        shape=shape,
        dtype=dtype,
        kv_dtype_label=kv_label,
        weight_bytes=weight_bytes,
        weights_source=weights_source,
        kv_bytes_per_token=per_token,
        fixed_bytes_per_seq=fixed,
        activation_bytes=activations,
        graph_bytes=graph_bytes,
        graph_sizes=graph_sizes,
        runtime_bytes=runtime,
        context_bytes=context,
        kv_budget_bytes=kv_budget,
        kv_first_start_bytes=first_start,
        kv_budget_source=budget_source,
        engine_total_bytes=total,
        engine_limit_bytes=limit,
        kv_needed_bytes=kv_needed,
        kv_capacity_tokens=capacity,
        position_limit=positions,
        max_context_tokens=min(capacity, cap),
        max_context_fp8_tokens=fp8_context,
        max_model_len=profile.max_model_len,
        decode_floor_tps=floor,
        fits=fits,
        outcome=outcome,
        int4_weight_bytes=int4_option(shape, cfg, profile, dtype_bytes, mtp),
        attention_layers=shape.full_attention_layers + (mtp if layout is not None else 0),
        layout=layout,
        max_num_seqs=profile.max_num_seqs,
    )


def _mtp_layers(model_dir: Path, profile: EngineProfile) -> int:
    """MTP layers vLLM loads (weights and KV) when speculation resolves to MTP."""
    if profile.speculative.method not in ("auto", "mtp"):
        return 0
    info = detect_mtp(model_dir)
    return info.layers if info is not None and info.weights_present is not False else 0
