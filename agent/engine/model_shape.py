"""A model's shape as the memory planner sees it, from config.json alone.

What costs memory per token is only the layers that keep every token's K and V (full
attention). Sliding-window layers keep at most a window; linear-attention (Gated DeltaNet)
and Mamba layers keep a fixed state per sequence. MLA layers keep one compressed latent
(kv_lora_rank + qk_rope_head_dim) instead of K and V.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.engine.model_config import text_config

__all__ = ["ModelShape", "model_shape"]

_FULL = {"full_attention", "attention", "global", "global_attention", "full"}
_SLIDING = {"sliding_attention", "sliding_window", "local", "local_attention", "chunked_attention"}
_LINEAR = {"linear_attention", "mamba", "mamba2", "gated_deltanet", "deltanet", "ssm", "conv"}


def _int(cfg: Mapping[str, Any], *names: str, default: int | None = None) -> int | None:
    for name in names:
        value = cfg.get(name)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return default


def _need(cfg: Mapping[str, Any], *names: str) -> int:
    value = _int(cfg, *names)
    if value is None:
        raise ValueError(f"config.json lacks {' / '.join(names)}")
    return value


@dataclass(frozen=True)
class ModelShape:
    architecture: str
    model_type: str
    config_dtype: str | None
    num_layers: int
    full_attention_layers: int
    sliding_layers: int
    sliding_window: int | None
    linear_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    mla_latent_dim: int | None  # kv_lora_rank + qk_rope_head_dim for MLA models
    linear_state_elements: int  # recurrent + conv state per linear layer per sequence
    mlp_width: int  # intermediate activations per token (dense or active experts)
    estimated_params: int

    def kv_elements_per_token_per_layer(self) -> int:
        if self.mla_latent_dim is not None:
            return self.mla_latent_dim  # one latent, shared by K and V
        return 2 * self.num_kv_heads * self.head_dim

    def describe_layers(self) -> str:
        parts = [f"{self.full_attention_layers} full attention"]
        if self.sliding_layers:
            parts.append(f"{self.sliding_layers} sliding window ({self.sliding_window})")
        if self.linear_layers:
            parts.append(f"{self.linear_layers} linear attention")
        return f"{self.num_layers} layers: " + ", ".join(parts)


def _classify(cfg: Mapping[str, Any], n_layers: int) -> tuple[int, int, int]:
    """(full, sliding, linear) layer counts."""
    layer_types = cfg.get("layer_types")
    if isinstance(layer_types, list) and layer_types:
        kinds = [str(t).lower() for t in layer_types[:n_layers]]
        sliding = sum(k in _SLIDING for k in kinds)
        linear = sum(k in _LINEAR for k in kinds)
        # Unknown kinds count as full attention: over-estimating KV is the safe error.
        return len(kinds) - sliding - linear, sliding, linear
    interval = _int(cfg, "full_attention_interval")
    if interval:  # Qwen3-Next: every interval-th layer is full attention, the rest GDN
        full = n_layers // interval
        return full, 0, n_layers - full
    pattern = cfg.get("hybrid_override_pattern")
    if isinstance(pattern, str) and pattern:  # Nemotron-H: '*' attention, 'M' Mamba
        return pattern.count("*"), 0, pattern.count("M")
    window = _int(cfg, "sliding_window")
    if window and cfg.get("use_sliding_window", True) is not False:
        every = _int(cfg, "sliding_window_pattern")
        if every:  # Gemma 2/3: one full layer per `every`
            full = n_layers // every
            return full, n_layers - full, 0
        return 0, n_layers, 0
    return n_layers, 0, 0


def _linear_state(cfg: Mapping[str, Any]) -> int:
    """Elements of one sequence's state in one Gated DeltaNet layer (Qwen3-Next/3.5)."""
    v_heads = _int(cfg, "linear_num_value_heads")
    if not v_heads:
        return 0
    k_heads = _int(cfg, "linear_num_key_heads", default=v_heads) or v_heads
    k_dim = _int(cfg, "linear_key_head_dim", default=128) or 128
    v_dim = _int(cfg, "linear_value_head_dim", default=128) or 128
    kernel = _int(cfg, "linear_conv_kernel_dim", default=4) or 4
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return v_heads * k_dim * v_dim + conv_dim * (kernel - 1)


def _attention_params(cfg: Mapping[str, Any], hidden: int, heads: int, kv: int, hd: int) -> int:
    q_lora = _int(cfg, "q_lora_rank")
    kv_lora = _int(cfg, "kv_lora_rank")
    if kv_lora:  # MLA (DeepSeek-V2/V3 layout)
        rope = _int(cfg, "qk_rope_head_dim", default=64) or 64
        nope = _int(cfg, "qk_nope_head_dim", default=128) or 128
        v_hd = _int(cfg, "v_head_dim", default=128) or 128
        q = (
            hidden * q_lora + q_lora * heads * (nope + rope)
            if q_lora
            else hidden * heads * (nope + rope)
        )
        return (
            q + hidden * (kv_lora + rope) + kv_lora * heads * (nope + v_hd) + heads * v_hd * hidden
        )
    qk_norm = 2 * hd if str(cfg.get("model_type", "")).startswith("qwen3") else 0
    return hidden * heads * hd + 2 * hidden * kv * hd + heads * hd * hidden + qk_norm


def _linear_params(cfg: Mapping[str, Any], hidden: int) -> int:
    v_heads = _int(cfg, "linear_num_value_heads") or 0
    if not v_heads:
        return 0
    k_heads = _int(cfg, "linear_num_key_heads", default=v_heads) or v_heads
    k_dim = _int(cfg, "linear_key_head_dim", default=128) or 128
    v_dim = _int(cfg, "linear_value_head_dim", default=128) or 128
    kernel = _int(cfg, "linear_conv_kernel_dim", default=4) or 4
    key, value = k_heads * k_dim, v_heads * v_dim
    in_proj = hidden * (2 * key + 2 * value + 2 * v_heads)  # q, k, v, z and the b, a gates
    conv = (2 * key + value) * kernel
    return in_proj + conv + value * hidden + 2 * v_heads + v_dim


def _mlp(cfg: Mapping[str, Any], hidden: int) -> tuple[int, int]:
    """(params per layer, active intermediate width per token)."""
    experts = _int(cfg, "num_experts", "n_routed_experts", "num_local_experts")
    dense_inter = _int(cfg, "intermediate_size", default=4 * hidden) or 4 * hidden
    if not experts:
        return 3 * hidden * dense_inter, dense_inter
    moe_inter = _int(cfg, "moe_intermediate_size", default=dense_inter) or dense_inter
    top_k = _int(cfg, "num_experts_per_tok", "moe_topk", default=1) or 1
    shared = _int(cfg, "shared_expert_intermediate_size", default=0) or 0
    n_shared = _int(cfg, "n_shared_experts", default=0) or 0
    if n_shared and not shared:
        shared = n_shared * moe_inter
    params = experts * 3 * hidden * moe_inter + 3 * hidden * shared + hidden * experts
    if shared and str(cfg.get("model_type", "")).startswith("qwen"):
        params += hidden  # Qwen's shared-expert gate
    return params, top_k * moe_inter + shared


def model_shape(config: Mapping[str, Any]) -> ModelShape:
    """Shape of the language model in `config` (text_config of wrappers included).

    Raises:
        ValueError: a field the planner cannot do without is missing.
    """
    cfg = text_config(config)
    n_layers = _need(cfg, "num_hidden_layers", "n_layer", "num_layers")
    hidden = _need(cfg, "hidden_size", "n_embd", "d_model")
    heads = _need(cfg, "num_attention_heads", "n_head")
    kv_heads = _int(cfg, "num_key_value_heads", default=heads) or heads
    head_dim = _int(cfg, "head_dim", default=hidden // heads) or hidden // heads
    vocab = _need(cfg, "vocab_size")
    full, sliding, linear = _classify(cfg, n_layers)
    kv_lora = _int(cfg, "kv_lora_rank")
    mla = kv_lora + (_int(cfg, "qk_rope_head_dim", default=64) or 64) if kv_lora else None
    tied = bool(cfg.get("tie_word_embeddings", False))
    mlp_params, mlp_width = _mlp(cfg, hidden)
    attn = _attention_params(cfg, hidden, heads, kv_heads, head_dim)
    layers = (full + sliding) * attn + linear * _linear_params(cfg, hidden)
    layers += n_layers * (mlp_params + 2 * hidden)  # + the two RMSNorms of each block
    params = vocab * hidden * (1 if tied else 2) + layers + hidden  # + final norm
    archs = cfg.get("architectures")
    dtype = cfg.get("torch_dtype") or cfg.get("dtype")  # transformers 5 writes `dtype`
    return ModelShape(
        architecture=str(archs[0]) if isinstance(archs, list) and archs else "unknown",
        model_type=str(cfg.get("model_type", "unknown")),
        config_dtype=str(dtype) if dtype else None,
        num_layers=n_layers,
        full_attention_layers=full,
        sliding_layers=sliding,
        sliding_window=_int(cfg, "sliding_window") if sliding else None,
        linear_layers=linear,
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        vocab_size=vocab,
        max_position_embeddings=_int(cfg, "max_position_embeddings"),
        tie_word_embeddings=tied,
        mla_latent_dim=mla,
        linear_state_elements=_linear_state(cfg),
        mlp_width=mlp_width,
        estimated_params=params,
    )
