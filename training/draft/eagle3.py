"""An EAGLE-3 draft head for a Llama target, in plain torch, laid out the way vLLM loads it.

vLLM's `eagle3` method (vllm/model_executor/models/llama_eagle3.py, Eagle3LlamaForCausalLM)
runs one decoder layer whose attention takes the concatenation of the normed token
embedding and the normed hidden feature (2 x hidden in, hidden out). The first draft step's
feature is `fc` of the target's hidden states at three layers (the inputs of layers
`aux_layers`, i.e. Hugging Face's `hidden_states[i]`); every later step feeds the layer's
own pre-norm output back. Logits are over a reduced draft vocabulary; `d2t[i]` is the offset
from draft id i to its target id (target = i + d2t[i]); `t2d` marks the target ids kept.
The embedding is the target's (not stored: vLLM shares it when the checkpoint has none).

This module mirrors that computation (same norms, residual order, RoPE, GQA) so that what
trains here is what vLLM runs, and writes the checkpoint vLLM reads (`config.json` with
`architectures: [Eagle3LlamaForCausalLM]`, weights `midlayer.*`, `fc`, `norm`, `lm_head`,
`d2t`, `t2d`, in shards under 16 MB).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

ARCH = "Eagle3LlamaForCausalLM"
SHARD_LIMIT = 15_000_000  # bytes a weights file may hold (results come back in 16 MB files)


@dataclass(frozen=True)
class DraftShape:
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    draft_vocab: int
    rope_theta: float
    rms_eps: float
    max_positions: int
    aux_layers: tuple[int, int, int]

    @classmethod
    def from_target(cls, cfg: dict[str, Any], draft_vocab: int) -> DraftShape:
        n_layers = int(cfg["num_hidden_layers"])
        heads = int(cfg["num_attention_heads"])
        rope = cfg.get("rope_parameters") or {}
        theta = float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0)
        return cls(
            hidden=int(cfg["hidden_size"]),
            heads=heads,
            kv_heads=int(cfg.get("num_key_value_heads", heads)),
            head_dim=int(cfg.get("head_dim") or cfg["hidden_size"] // heads),
            intermediate=int(cfg["intermediate_size"]),
            vocab=int(cfg["vocab_size"]),
            draft_vocab=min(draft_vocab, int(cfg["vocab_size"])),
            rope_theta=theta,
            rms_eps=float(cfg.get("rms_norm_eps", 1e-5)),
            max_positions=int(cfg.get("max_position_embeddings", 8192)),
            # vLLM's default for Llama targets: (2, n // 2, n - 3); written explicitly.
            aux_layers=(2, n_layers // 2, n_layers - 3),
        )


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return (self.weight.float() * x32).to(dtype)


def rope(x: torch.Tensor, pos: torch.Tensor, theta: float) -> torch.Tensor:
    """Llama (neox-style, rotate-half) RoPE. x [..., n, d], pos broadcastable to [..., n]."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = pos.to(torch.float32)[..., None] * inv  # [..., n, d/2]
    cos, sin = torch.cat([ang, ang], -1).cos(), torch.cat([ang, ang], -1).sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2 :]
    rot = torch.cat([-x2, x1], -1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


class Eagle3Draft(nn.Module):
    """The draft: fc, one mid layer, final norm, reduced lm_head (vLLM's parameter names)."""

    d2t: torch.Tensor
    t2d: torch.Tensor

    def __init__(self, shape: DraftShape) -> None:
        super().__init__()
        s = self.shape = shape
        h, q_out, kv_out = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.q_proj = nn.Linear(2 * h, q_out, bias=False)
        self.k_proj = nn.Linear(2 * h, kv_out, bias=False)
        self.v_proj = nn.Linear(2 * h, kv_out, bias=False)
        self.o_proj = nn.Linear(q_out, h, bias=False)
        self.gate_proj = nn.Linear(h, s.intermediate, bias=False)
        self.up_proj = nn.Linear(h, s.intermediate, bias=False)
        self.down_proj = nn.Linear(s.intermediate, h, bias=False)
        self.input_layernorm = RMSNorm(h, s.rms_eps)
        self.hidden_norm = RMSNorm(h, s.rms_eps)
        self.post_attention_layernorm = RMSNorm(h, s.rms_eps)
        self.norm = RMSNorm(h, s.rms_eps)
        self.lm_head = nn.Linear(h, s.draft_vocab, bias=False)
        for lin in (self.fc, self.q_proj, self.k_proj, self.v_proj, self.o_proj):
            nn.init.normal_(lin.weight, std=0.02)
        for lin in (self.gate_proj, self.up_proj, self.down_proj):
            nn.init.normal_(lin.weight, std=0.02)
        self.register_buffer("d2t", torch.zeros(s.draft_vocab, dtype=torch.long))
        self.register_buffer("t2d", torch.zeros(s.vocab, dtype=torch.bool))

    # -- vocabulary ------------------------------------------------------------------

    def set_vocab(self, draft_to_target: torch.Tensor, target_embed: torch.Tensor) -> None:
        """Draft ids -> target ids (sorted ascending); lm_head starts from their embeddings."""
        ids = draft_to_target.to(torch.long).cpu()
        assert ids.numel() == self.shape.draft_vocab and bool((ids[1:] > ids[:-1]).all())
        self.d2t.copy_(ids - torch.arange(ids.numel()))
        t2d = torch.zeros(self.shape.vocab, dtype=torch.bool)
        t2d[ids] = True
        self.t2d.copy_(t2d)
        with torch.no_grad():
            self.lm_head.weight.copy_(target_embed[ids.to(target_embed.device)].float())

    def target_to_draft(self) -> torch.Tensor:
        """[vocab] draft id of each target id, -1 where the draft vocabulary lacks it."""
        lut = torch.full((self.shape.vocab,), -1, dtype=torch.long, device=self.d2t.device)
        ids = self.d2t + torch.arange(self.shape.draft_vocab, device=self.d2t.device)
        lut[ids] = torch.arange(self.shape.draft_vocab, device=self.d2t.device)
        return lut

    # -- the layer ---------------------------------------------------------------------

    def qkv(
        self, emb: torch.Tensor, feat: torch.Tensor, pos: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys, values [B, heads, n, d] of inputs (token embedding, feature)."""
        s = self.shape
        x = torch.cat([self.input_layernorm(emb), self.hidden_norm(feat)], -1)
        b, n, _ = x.shape
        q = self.q_proj(x).view(b, n, s.heads, s.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, n, s.kv_heads, s.head_dim).transpose(1, 2)
        return rope(q, pos[:, None], s.rope_theta), rope(k, pos[:, None], s.rope_theta), v

    def finish(self, attn: torch.Tensor, feat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention output [B, n, heads*d] -> (normed output for logits, pre-norm feature)."""
        residual = self.o_proj(attn) + feat  # residual = the feature before hidden_norm
        h = self.post_attention_layernorm(residual)
        h = self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        pre = h + residual
        return self.norm(pre), pre

    # -- checkpoint --------------------------------------------------------------------

    def vllm_state(self) -> dict[str, torch.Tensor]:
        out = {
            key: getattr(self, attr).weight.detach().to(torch.bfloat16).cpu().contiguous()
            for attr, key in _attr_names().items()
        }
        out["d2t"] = self.d2t.detach().cpu().contiguous()
        out["t2d"] = self.t2d.detach().cpu().contiguous()
        return out

    def load_vllm_state(self, state: dict[str, torch.Tensor]) -> None:
        inverse = {v: k for k, v in _attr_names().items()}
        with torch.no_grad():
            for key, tensor in state.items():
                if key in ("d2t", "t2d"):
                    getattr(self, key).copy_(tensor)
                else:
                    getattr(self, inverse[key]).weight.copy_(tensor.float())


def _attr_names() -> dict[str, str]:
    layer = {"q_proj", "k_proj", "v_proj", "o_proj"}
    mlp = {"gate_proj", "up_proj", "down_proj"}
    norms = {"input_layernorm", "hidden_norm", "post_attention_layernorm"}
    out = {"fc": "fc.weight", "norm": "norm.weight", "lm_head": "lm_head.weight"}
    out |= {a: f"midlayer.self_attn.{a}.weight" for a in layer}
    out |= {a: f"midlayer.mlp.{a}.weight" for a in mlp}
    out |= {a: f"midlayer.{a}.weight" for a in norms}
    return out


def draft_config(shape: DraftShape, target_cfg: dict[str, Any]) -> dict[str, Any]:
    """config.json of the draft, as vLLM's eagle3 loader reads it."""
    return {
        "architectures": [ARCH],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "target_hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": shape.rms_eps,
        "rope_theta": shape.rope_theta,
        "rope_parameters": {"rope_theta": shape.rope_theta, "rope_type": "default"},
        "max_position_embeddings": shape.max_positions,
        "vocab_size": shape.vocab,
        "draft_vocab_size": shape.draft_vocab,
        "tie_word_embeddings": False,
        "attention_bias": False,
        "mlp_bias": False,
        "bos_token_id": target_cfg.get("bos_token_id"),
        "eos_token_id": target_cfg.get("eos_token_id"),
        "torch_dtype": "bfloat16",
        "eagle_aux_hidden_state_layer_ids": list(shape.aux_layers),
        "eagle_config": {
            "eagle_aux_hidden_state_layer_ids": list(shape.aux_layers),
            "use_aux_hidden_state": True,
        },
    }


def save_draft(model: Eagle3Draft, target_cfg: dict[str, Any], out: Path) -> list[str]:
    """config.json + safetensors shards (each under SHARD_LIMIT) + the index; file names."""
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    state = model.vllm_state()
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for key in sorted(state, key=lambda k: (k == "lm_head.weight", k)):
        nbytes = state[key].numel() * state[key].element_size()
        if shards[-1] and size + nbytes > SHARD_LIMIT:
            shards.append({})
            size = 0
        shards[-1][key] = state[key]
        size += nbytes
    files: list[str] = []
    weight_map: dict[str, str] = {}
    for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(out / name), metadata={"format": "pt"})
        files.append(name)
        weight_map |= {key: name for key in shard}
    total = sum(t.numel() * t.element_size() for t in state.values())
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / "model.safetensors.index.json").write_text(json.dumps(index, indent=1))
    cfg = draft_config(model.shape, target_cfg)
    (out / "config.json").write_text(json.dumps(cfg, indent=1))
    return [*files, "model.safetensors.index.json", "config.json"]


def load_draft(folder: Path) -> Eagle3Draft:
    from safetensors.torch import load_file

    cfg = json.loads((folder / "config.json").read_text())
    shape = DraftShape(
        hidden=cfg["hidden_size"],
        heads=cfg["num_attention_heads"],
        kv_heads=cfg["num_key_value_heads"],
        head_dim=cfg["head_dim"],
        intermediate=cfg["intermediate_size"],
        vocab=cfg["vocab_size"],
        draft_vocab=cfg["draft_vocab_size"],
        rope_theta=cfg["rope_theta"],
        rms_eps=cfg["rms_norm_eps"],
        max_positions=cfg["max_position_embeddings"],
        aux_layers=tuple(cfg["eagle_aux_hidden_state_layer_ids"]),
    )
    model = Eagle3Draft(shape)
    state: dict[str, torch.Tensor] = {}
    for f in sorted(folder.glob("*.safetensors")):
        state |= load_file(str(f))
    model.load_vllm_state(state)
    return model


def shape_dict(shape: DraftShape) -> dict[str, Any]:
    return asdict(shape)


def attention(
    q: torch.Tensor,
    k0: torch.Tensor,
    v0: torch.Tensor,
    key_ok: torch.Tensor,
    extra_k: list[torch.Tensor],
    extra_v: list[torch.Tensor],
) -> torch.Tensor:
    """Training-time-test attention.

    q [B, H, P, d]: queries at P chosen positions; k0/v0 [B, KV, T, d]: the keys of the
    first step at every position (what vLLM's draft KV cache holds for accepted tokens);
    key_ok [B, P, T]: which of them a query may see (causal, not padding); extra_k/v: for a
    later step j, the keys of steps 1..j at the query's own index [B, KV, P, d] (the
    positions the draft itself wrote). Returns [B, P, H*d].
    """
    b, h, p, d = q.shape
    rep = h // k0.shape[1]
    k0r, v0r = k0.repeat_interleave(rep, 1), v0.repeat_interleave(rep, 1)
    scale = 1.0 / math.sqrt(d)
    s0 = torch.matmul(q, k0r.transpose(-1, -2)).float() * scale  # [B, H, P, T]
    s0 = s0.masked_fill(~key_ok[:, None], float("-inf"))
    parts = [s0]
    for ek in extra_k:
        parts.append(((q * ek.repeat_interleave(rep, 1)).sum(-1).float() * scale)[..., None])
    w = torch.softmax(torch.cat(parts, -1), -1).to(q.dtype)
    out = torch.matmul(w[..., : s0.shape[-1]], v0r)
    for i, ev in enumerate(extra_v):
        out = out + w[..., s0.shape[-1] + i, None] * ev.repeat_interleave(rep, 1)
    return out.transpose(1, 2).reshape(b, p, h * d)
