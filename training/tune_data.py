"""The corpus as training batches, and the loss on answer tokens (training/train.py's data).

torch and numpy only: it runs on a GPU machine with nothing of the service installed.
The loss is computed on the answer tokens alone, and the output layer runs only there:
Gemma 3's vocabulary is 262,144 tokens, and the logits of every prompt position of a
32K-token batch would be 17 GB for nothing.
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

__all__ = [
    "IGNORE",
    "SOURCES",
    "batches",
    "collate",
    "decision_index",
    "evaluate",
    "load_corpus",
    "weighted_loss",
]

IGNORE = -100
SOURCES = ("generator", "people", "joined")  # training/mix.py's INGREDIENTS, by index


def load_corpus(folder: Path) -> list[dict[str, Any]]:
    import numpy as np

    data = np.load(folder / "corpus.npz")
    p_ids, p_off = data["prompt_ids"], data["prompt_offsets"]
    t_ids, t_off = data["target_ids"], data["target_offsets"]
    source = data["source"] if "source" in data.files else np.zeros(len(p_off) - 1, "uint8")
    out = []
    for i in range(len(p_off) - 1):
        out.append(
            {
                "prompt": p_ids[p_off[i] : p_off[i + 1]].astype("int64"),
                "target": t_ids[t_off[i] : t_off[i + 1]].astype("int64"),
                "val": bool(data["val"][i]),
                "summary": bool(data["summary"][i]),
                "zh": bool(data["zh"][i]),
                "source": SOURCES[int(source[i])],
            }
        )
    return out


def batches(
    examples: list[dict[str, Any]], max_tokens: int, rng: random.Random
) -> list[list[dict[str, Any]]]:
    """Examples of similar length together, each batch's padded size within max_tokens."""
    order = sorted(examples, key=lambda e: len(e["prompt"]) + len(e["target"]))
    out: list[list[dict[str, Any]]] = []
    current: list[dict[str, Any]] = []
    for example in order:
        size = len(example["prompt"]) + len(example["target"])
        if current and size * (len(current) + 1) > max_tokens:
            out.append(current)
            current = []
        current.append(example)
    if current:
        out.append(current)
    rng.shuffle(out)
    return out


def decision_index(examples: list[dict[str, Any]]) -> int:
    """Where an answer says whether there is a fault at all: the empty answer (the most
    common target) is `{"faults":[` then `]}` and the end token, and a positive one opens
    an item in that place (tokenizers differ on where `[` ends: the index is found as the
    first token where the empty answer and a positive one part)."""
    empty_counts = Counter(tuple(e["target"]) for e in examples if not e["summary"])
    if not empty_counts:
        return 0
    empty = empty_counts.most_common(1)[0][0]
    for e in examples:
        target = tuple(e["target"])
        if e["summary"] or target == empty:
            continue
        for i, (a, b) in enumerate(zip(empty, target, strict=False)):
            if a != b:
                return i
    return max(0, len(empty) - 2)


def collate(
    batch: list[dict[str, Any]],
    pad: int,
    device: Any,
    decision_weight: float = 1.0,
    decision_at: int = 0,
) -> dict[str, Any]:
    """Padded ids, mask, labels (answer tokens only) and per-token loss weights: the
    deciding token (`decision_at`, see decision_index) weighs `decision_weight`, every
    other answer token 1."""
    import torch

    width = max(len(e["prompt"]) + len(e["target"]) for e in batch)
    ids = torch.full((len(batch), width), pad, dtype=torch.long)
    labels = torch.full((len(batch), width), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(batch), width), dtype=torch.long)
    weights = torch.zeros((len(batch), width), dtype=torch.float32)
    for row, e in enumerate(batch):
        seq = torch.as_tensor(list(e["prompt"]) + list(e["target"]))
        start = len(e["prompt"])
        ids[row, : len(seq)] = seq
        mask[row, : len(seq)] = 1
        labels[row, start : len(seq)] = torch.as_tensor(e["target"])
        weights[row, start : len(seq)] = 1.0
        if not e["summary"] and len(e["target"]) > decision_at:
            weights[row, start + decision_at] = decision_weight
    return {
        "input_ids": ids.to(device),
        "attention_mask": mask.to(device),
        "labels": labels.to(device),
        "weights": weights.to(device),
    }


def answer_logits(model: Any, inputs: dict[str, Any]) -> tuple[Any, Any, Any]:
    """(logits at the answer positions, their labels, the keep mask over [:, 1:]): the
    decoder over the whole sequence, the output layer only where a label is."""
    import torch

    causal = model.get_base_model() if hasattr(model, "get_base_model") else model
    with torch.autocast(device_type=inputs["input_ids"].device.type, dtype=torch.bfloat16):
        hidden = causal.model(
            input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"]
        ).last_hidden_state
        labels = inputs["labels"][:, 1:]
        keep = labels != IGNORE
        logits = causal.lm_head(hidden[:, :-1][keep]).float()
    cap = getattr(causal.config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits, labels[keep], keep


def weighted_loss(model: Any, inputs: dict[str, Any]) -> Any:
    """Cross-entropy over the answer tokens, weighted (collate's weights)."""
    import torch

    logits, labels, keep = answer_logits(model, inputs)
    per_token = torch.nn.functional.cross_entropy(logits, labels, reduction="none")
    weights = inputs["weights"][:, 1:][keep]
    return (per_token * weights).sum() / weights.sum()


def evaluate(model: Any, val: list[dict[str, Any]], pad: int, max_tokens: int) -> dict[str, float]:
    """Teacher-forced: loss, token accuracy, and the share of answers right in every token,
    over all validation examples and per ingredient and language (`exact_<source>`,
    `exact_zh`, `exact_en`)."""
    import torch

    was_training = model.training
    model.eval()
    total_loss = total_tokens = right_tokens = 0.0
    exact: Counter[str] = Counter()
    counted: Counter[str] = Counter()
    with torch.no_grad():
        for batch in batches(val, max_tokens, random.Random(0)):
            inputs = collate(batch, pad, model.device)
            logits, labels, keep = answer_logits(model, inputs)
            total_loss += torch.nn.functional.cross_entropy(logits, labels, reduction="sum").item()
            hits = logits.argmax(-1) == labels
            total_tokens += labels.numel()
            right_tokens += hits.sum().item()
            per_row = keep.sum(dim=1).tolist()
            start = 0
            for e, n in zip(batch, per_row, strict=True):
                ok = bool(hits[start : start + n].all().item())
                start += n
                for key in ("all", f"exact_{e['source']}", "exact_zh" if e["zh"] else "exact_en"):
                    counted[key] += 1
                    exact[key] += int(ok)
    if was_training:
        model.train()
    n = max(total_tokens, 1.0)
    out = {
        "loss": total_loss / n,
        "token_accuracy": right_tokens / n,
        "exact_answers": exact["all"] / max(counted["all"], 1),
    }
    for key in sorted(counted):
        if key != "all":
            out[key] = exact[key] / counted[key]
    return out
