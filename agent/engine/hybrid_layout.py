"""vLLM's KV pool for a Gated-DeltaNet hybrid (Qwen3-Next / Qwen3.5 style), for the planner.

Measured on the H200 with vLLM 0.26 (bench/engine/results/h200-2026-12-01-profiles/, the
orin-nx-16gb run) and reproduced here to the byte:

- Every layer's page has the same size. The recurrent state of one GDN layer (delta-net
  state v_heads x k_dim x v_dim plus the conv state conv_dim x (kernel - 1 + k), k the
  speculative tokens, in the model dtype) sets it; the attention block is the number of
  tokens whose K and V fill such a page, rounded up to a multiple of 16 (1120 tokens for
  the 4B shape with fp8 KV and k=3).
- Layers are grouped by type into groups of `group_size` layers (the smaller type's count,
  unless the larger is within 1.5x of it); the MTP layer counts as full attention. Short
  groups are padded. The pool is `group_size` tensors; one block id takes one page in each,
  so a block costs page x group_size bytes whichever group owns it.
- One sequence takes ceil(tokens / block) blocks in each attention group and, in each GDN
  group, 2 + k blocks with prefix caching (mamba "align" mode), 1 + k without (not measured).
- One block of the pool is vLLM's null block, never given to a sequence (BlockPool; its
  usage figure divides by num_blocks - 1).
- With prefix caching a prefill chunk that crosses a block needs one block more in each GDN
  group while it runs (measured, results/h200-2026-12-01-lease3/: a 65,280-token prompt, 74
  blocks held as vLLM counts, stalled in orin-nx-8gb's 76-block pool, 75 usable; a
  60,780-token one, 73 at the peak, completed). vLLM 0.26 does not refuse such a request: it
  goes on between running and waiting (preempted, taken back from the prefix cache to the
  same place), forever. So the planner counts the peak, not what vLLM's start check counts.
- With prefix caching vLLM refuses to start when max_num_batched_tokens is below the block.

Qwen3-Next's attention also gates its output (q_proj is twice as wide) and the MTP module
is one more decoder layer plus a 2h x h projection; `extra_params` counts what the generic
shape estimate leaves out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from agent.engine.model_shape import _mlp as mlp_params  # the same MLP the layers have

__all__ = [
    "HybridLayout",
    "extra_params",
    "gdn_activation_bytes",
    "hybrid_layout",
    "token_budget_needed",
]

_ALIGN = 16  # attention kernel block alignment


@dataclass(frozen=True)
class HybridLayout:
    block_size: int  # tokens per attention block
    page_bytes: int  # one layer's page
    group_size: int  # layers per group = tensors in the pool
    attention_groups: int
    state_groups: int
    state_blocks_per_group: int  # per sequence
    attention_layers: int  # MTP layers included
    linear_layers: int
    transient_blocks_per_group: int = 0  # more, while a prefill chunk crosses a block

    @property
    def block_bytes(self) -> int:
        return self.page_bytes * self.group_size

    @property
    def state_blocks(self) -> int:
        return self.state_groups * self.state_blocks_per_group

    @property
    def peak_state_blocks(self) -> int:
        """State blocks a sequence needs at its peak (held + transient)."""
        return self.state_groups * (self.state_blocks_per_group + self.transient_blocks_per_group)

    @property
    def state_bytes_per_seq(self) -> int:
        """What vLLM holds for a sequence's recurrent state."""
        return self.state_blocks * self.block_bytes

    @property
    def peak_state_bytes_per_seq(self) -> int:
        return self.peak_state_blocks * self.block_bytes

    @property
    def bytes_per_token(self) -> int:
        """Pool bytes one more token of context costs (all attention groups)."""
        return self.attention_groups * self.block_bytes // self.block_size

    def blocks(self, budget: int) -> int:
        """Blocks of a pool of `budget` bytes (vLLM's null block included)."""
        return max(0, budget) // self.block_bytes

    def usable_blocks(self, budget: int) -> int:
        """Blocks sequences can get: all but vLLM's null block."""
        return max(0, self.blocks(budget) - 1)

    def blocks_per_seq(self, tokens: int) -> int:
        """Blocks a sequence of `tokens` needs at its peak (what the pool must hold)."""
        attention = self.attention_groups * math.ceil(tokens / self.block_size)
        return attention + self.peak_state_blocks

    def needed_bytes(self, tokens: int) -> int:
        """The pool one sequence of `tokens` needs: its peak and the null block."""
        return (self.blocks_per_seq(tokens) + 1) * self.block_bytes

    def one_seq_tokens(self, budget: int) -> int:
        free = max(0, self.usable_blocks(budget) - self.peak_state_blocks)
        return free // max(1, self.attention_groups) * self.block_size


def _int(cfg: Mapping[str, Any], name: str, default: int) -> int:
    value = cfg.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def _gdn_state_bytes(cfg: Mapping[str, Any], k: int, dtype_bytes: int) -> int:
    v_heads = _int(cfg, "linear_num_value_heads", 0)
    k_heads = _int(cfg, "linear_num_key_heads", v_heads)
    k_dim = _int(cfg, "linear_key_head_dim", 128)
    v_dim = _int(cfg, "linear_value_head_dim", 128)
    kernel = _int(cfg, "linear_conv_kernel_dim", 4)
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    return (conv_dim * (kernel - 1 + k) + v_heads * k_dim * v_dim) * dtype_bytes


def hybrid_layout(
    cfg: Mapping[str, Any],
    *,
    full_attention_layers: int,
    linear_layers: int,
    attn_bytes_per_token_layer: int,
    dtype_bytes: int,
    k: int,
    mtp_layers: int,
    prefix_caching: bool,
) -> HybridLayout | None:
    """The pool layout of a GDN hybrid (`cfg` its text config); None for other models."""
    if not linear_layers or not _int(cfg, "linear_num_value_heads", 0):
        return None
    if attn_bytes_per_token_layer <= 0:
        return None
    state = _gdn_state_bytes(cfg, k, dtype_bytes)
    block = _ALIGN * math.ceil(state / (_ALIGN * attn_bytes_per_token_layer))
    n_attn = full_attention_layers + mtp_layers
    small, large = min(n_attn, linear_layers), max(n_attn, linear_layers)
    group = large if large < 1.5 * small else small
    return HybridLayout(
        block_size=block,
        page_bytes=block * attn_bytes_per_token_layer,
        group_size=group,
        attention_groups=math.ceil(n_attn / group),
        state_groups=math.ceil(linear_layers / group),
        state_blocks_per_group=(2 if prefix_caching else 1) + k,
        transient_blocks_per_group=1 if prefix_caching else 0,
        attention_layers=n_attn,
        linear_layers=linear_layers,
    )


def token_budget_needed(layout: HybridLayout, max_num_seqs: int, k: int) -> int:
    """The smallest max_num_batched_tokens to use: one block plus every stream's decode
    tokens (a step that prefills a whole block while the others decode), to a multiple of 128."""
    return 128 * math.ceil((layout.block_size + max_num_seqs * (1 + k)) / 128)


def extra_params(cfg: Mapping[str, Any], mtp_layers: int) -> int:
    """Parameters of a Qwen3-Next / Qwen3.5 model that the generic estimate does not count:
    the attention output gate (q_proj twice as wide) and the MTP layers vLLM loads."""
    if not str(cfg.get("model_type", "")).startswith(("qwen3_next", "qwen3_5")):
        return 0
    hidden = _int(cfg, "hidden_size", 0)
    heads = _int(cfg, "num_attention_heads", 0)
    kv = _int(cfg, "num_key_value_heads", heads)
    hd = _int(cfg, "head_dim", hidden // max(1, heads))
    n_layers = _int(cfg, "num_hidden_layers", 0)
    interval = _int(cfg, "full_attention_interval", 0)
    types = cfg.get("layer_types")
    if isinstance(types, list) and types:
        full = sum(str(t) == "full_attention" for t in types[:n_layers])
    else:
        full = n_layers // interval if interval else 0
    gate = hidden * heads * hd if cfg.get("attn_output_gate", True) else 0
    attention = 2 * hidden * heads * hd + gate + 2 * hidden * kv * hd + 2 * hd
    # One MTP layer: a full-attention decoder layer with the model's MLP, the 2h -> h input
    # projection and five RMSNorms (two inputs, the layer's two, the output).
    mlp, _ = mlp_params(cfg, hidden)
    mtp = attention + mlp + 2 * hidden * hidden + 5 * hidden
    return full * gate + mtp_layers * mtp


def gdn_activation_bytes(
    cfg: Mapping[str, Any], hidden: int, linear_layers: int, tokens: int, dtype_bytes: int
) -> int:
    """A Gated-DeltaNet layer's chunked prefill: the residual and its normed copy, the
    in_proj output (q, k, v, z, b, a), the conv output and the core output in the model
    dtype, the fp32 w and u of every token, and one fp32 state per 64-token chunk.
    Calibrated on one run: 151 MB planned, 146 MB measured (4B hybrid, 1152 tokens)."""
    v_heads = cfg.get("linear_num_value_heads")
    if not linear_layers or not isinstance(v_heads, int):
        return 0
    k_heads = int(cfg.get("linear_num_key_heads", v_heads))
    k_dim = int(cfg.get("linear_key_head_dim", 128))
    v_dim = int(cfg.get("linear_value_head_dim", 128))
    key, value = k_heads * k_dim, v_heads * v_dim
    in_proj = 2 * key + 2 * value + 2 * v_heads
    per_token = (2 * hidden + in_proj + 2 * key + value + value) * dtype_bytes
    per_token += v_heads * (k_dim + v_dim) * 4
    states = math.ceil(tokens / 64) * v_heads * k_dim * v_dim * 4
    return tokens * per_token + states
