"""LoRA adapters merged into a base model's weights, and digests that name weights.

Pure tensor arithmetic over safetensors files, with torch and safetensors only: setup and
the engine's first start merge our adapter (models/) into the converted base once, so vLLM
serves one plain folder (no runtime LoRA), and the training script on the GPU machine runs
the same functions to prove the merge equals the trained model (it loads this file by its
path: the agent package's own imports need the service's dependencies).

The merge is peft's: W' = W + (alpha / r) * B @ A for every adapted linear layer (alpha /
sqrt(r) with rsLoRA), computed in float32 and stored in the base's dtype.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

__all__ = [
    "ADAPTER_CONFIG",
    "ADAPTER_WEIGHTS",
    "AdapterInvalid",
    "adapter_digest",
    "lora_scale",
    "merge_lora",
    "weights_digest",
]

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
_PREFIX = "base_model.model."
_HEADER_MAX = 100 << 20


class AdapterInvalid(ValueError):
    """An adapter that cannot be merged into this base (missing, damaged, mismatched)."""


def weights_digest(path: Path) -> str:
    """sha256 over a safetensors file's tensors: names, dtypes, shapes and bytes, in name
    order. Independent of the header's layout and metadata, so the same weights written by
    two versions of a library have the same digest.

    Raises:
        ValueError: not a readable safetensors file.
    """
    with path.open("rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        if not 0 < length <= _HEADER_MAX:
            raise ValueError(f"{path}: not a safetensors file (header of {length} bytes)")
        header = json.loads(fh.read(length))
        base = 8 + length
        h = hashlib.sha256()
        for name in sorted(k for k in header if k != "__metadata__"):
            entry = header[name]
            start, end = entry["data_offsets"]
            h.update(f"{name}|{entry['dtype']}|{entry['shape']}|".encode())
            fh.seek(base + start)
            left = end - start
            while left:
                chunk = fh.read(min(left, 8 << 20))
                if not chunk:
                    raise ValueError(f"{path}: truncated at tensor {name}")
                h.update(chunk)
                left -= len(chunk)
    return h.hexdigest()


def adapter_digest(folder: Path) -> str:
    """sha256 of an adapter: its config (canonical JSON) and its weights."""
    config = json.loads((folder / ADAPTER_CONFIG).read_text(encoding="utf-8"))
    h = hashlib.sha256(json.dumps(config, sort_keys=True).encode())
    h.update(weights_digest(folder / ADAPTER_WEIGHTS).encode())
    return h.hexdigest()


def lora_scale(config: Mapping[str, Any]) -> float:
    """The factor of B @ A: alpha / r (alpha / sqrt(r) with rsLoRA)."""
    r = int(config["r"])
    alpha = float(config.get("lora_alpha", r))
    if r <= 0:
        raise AdapterInvalid(f"rank {r}")
    return alpha / (r**0.5) if config.get("use_rslora") else alpha / r


def merge_lora(
    base: Mapping[str, Any], lora: Mapping[str, Any], config: Mapping[str, Any]
) -> dict[str, Any]:
    """The base's tensors with every adapted weight replaced by its merged value.

    `base` and `lora` map tensor names to torch tensors (peft's names for `lora`).

    Raises:
        AdapterInvalid: a LoRA tensor without its pair or its base weight, a shape or rank
            that does not fit, or an adapter kind this does not merge.
    """
    import torch

    if config.get("peft_type", "LORA") != "LORA":
        raise AdapterInvalid(f"peft_type {config.get('peft_type')!r} is not LORA")
    for unsupported in ("fan_in_fan_out", "use_dora", "rank_pattern", "alpha_pattern"):
        if config.get(unsupported):
            raise AdapterInvalid(f"{unsupported} adapters are not supported")
    scale = lora_scale(config)
    rank = int(config["r"])
    merged = dict(base)
    for module, ab in sorted(_pairs(lora).items()):
        target = f"{module}.weight"
        if set(ab) != {"lora_A", "lora_B"}:
            raise AdapterInvalid(f"{module}: {sorted(ab)} without its pair")
        if target not in base:
            raise AdapterInvalid(f"{module}: the base has no {target}")
        w = base[target]
        a, b = ab["lora_A"].float(), ab["lora_B"].float()
        if a.shape[0] != rank or b.shape[1] != rank:
            raise AdapterInvalid(f"{module}: rank {a.shape[0]}/{b.shape[1]}, config says {rank}")
        if (b.shape[0], a.shape[1]) != tuple(w.shape):
            raise AdapterInvalid(
                f"{module}: adapter {b.shape[0]}x{a.shape[1]} does not fit {tuple(w.shape)}"
            )
        merged[target] = (w.float() + scale * torch.matmul(b, a)).to(w.dtype)
    return merged


def _pairs(lora: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """peft's tensor names -> {base module: {"lora_A": A, "lora_B": B}}."""
    pairs: dict[str, dict[str, Any]] = {}
    for name, tensor in lora.items():
        for part in ("lora_A", "lora_B"):
            marker = f".{part}.weight"
            if name.endswith(marker):
                module = name[: -len(marker)].removeprefix(_PREFIX)
                pairs.setdefault(module, {})[part] = tensor
                break
        else:
            raise AdapterInvalid(f"unexpected tensor {name!r} (only LoRA A/B weights merge)")
    if not pairs:
        raise AdapterInvalid("no LoRA weights in the adapter")
    return pairs
