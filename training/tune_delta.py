"""A full fine-tune shipped small: every projection trained, the change kept as an adapter.

`--full` in training/train.py trains every linear projection of the decoder (the seven
LoRA targets of every layer) in full; embeddings and norms stay frozen, so all that
changed is those matrices. The change W' - W of each is then factored by truncated SVD
into B @ A of rank r: a LoRA adapter (scale 1) that the service merges with the same code
as a trained LoRA (agent/engine/lora.py). A rank that keeps models/ small loses some of
the fine-tune; train.py reports the validation of the full model and of the shipped
factorisation side by side, so the loss is measured, not assumed.

torch only (a GPU machine with nothing of the service installed).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

__all__ = ["export_delta", "trainable_projections"]

_PEFT_PREFIX = "base_model.model."


def trainable_projections(model: Any, targets: Iterable[str]) -> list[Any]:
    """Freeze everything but the decoder's linear projections named in `targets`; return
    those weights (they train)."""
    names = set(targets)
    params = []
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 2)
        train = len(leaf) == 3 and leaf[1] in names and leaf[2] == "weight" and ".layers." in name
        p.requires_grad_(train)
        if train:
            params.append(p)
    return params


def export_delta(
    base: dict[str, Any], tuned: dict[str, Any], rank: int, targets: Iterable[str]
) -> tuple[dict[str, Any], dict[str, Any], dict[str, float]]:
    """(adapter tensors in peft's names, adapter config, how much of the change it keeps).

    `base`/`tuned`: state dicts of the same model before and after. Each changed target
    weight becomes lora_B (out x r) @ lora_A (r x in) = its best rank-r approximation; the
    report gives the share of the change's Frobenius norm the factors keep (overall and the
    worst matrix).
    """
    import torch

    names = set(targets)
    tensors: dict[str, Any] = {}
    kept_sq = total_sq = 0.0
    worst = 1.0
    modules = set()
    for key, w1 in tuned.items():
        parts = key.rsplit(".", 2)
        if len(parts) != 3 or parts[1] not in names or parts[2] != "weight" or key not in base:
            continue
        delta = w1.float() - base[key].float()
        norm_sq = float((delta * delta).sum())
        if norm_sq == 0.0:
            continue
        u, s, vh = torch.linalg.svd(
            delta.cuda() if torch.cuda.is_available() else delta, full_matrices=False
        )
        r = min(rank, s.numel())
        b = torch.zeros(delta.shape[0], rank)
        a = torch.zeros(rank, delta.shape[1])
        b[:, :r] = (u[:, :r] * s[:r]).cpu()  # a matrix of lower rank than r: zeros pad it
        a[:r] = vh[:r].cpu()
        kept = float((s[:r] ** 2).sum())
        kept_sq += kept
        total_sq += norm_sq
        worst = min(worst, (kept / norm_sq) ** 0.5)
        module = key[: -len(".weight")]
        modules.add(parts[1])
        tensors[f"{_PEFT_PREFIX}{module}.lora_A.weight"] = a.to(torch.bfloat16).contiguous()
        tensors[f"{_PEFT_PREFIX}{module}.lora_B.weight"] = b.to(torch.bfloat16).contiguous()
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "r": rank,
        "lora_alpha": rank,  # scale 1: B @ A is the change itself
        "lora_dropout": 0.0,
        "target_modules": sorted(modules),
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
    }
    report = {
        "rank": rank,
        "matrices": len(tensors) // 2,
        "kept_norm_share": round((kept_sq / total_sq) ** 0.5, 4) if total_sq else 1.0,
        "worst_matrix_share": round(worst, 4),
    }
    return tensors, config, report
