"""The trained draft (EAGLE-3 head) shipped beside a tuned model: where it is, and whether it
fits the model the engine serves.

A draft is a folder beside the adapter it was trained for: `models/<adapter>-eagle3/`
(config.json with `architectures: [Eagle3LlamaForCausalLM]`, safetensors shards, the
model card), or the folder the adapter's `adapter_meta.json` names under `"draft"`. It was
trained on that adapter's merged model, so it is only used when that adapter is the one
merged and served. The check reads config.json and the safetensors headers only (no
weights): architecture, the target's hidden size, vocabulary and layer count, and the
shape of every tensor vLLM's eagle3 loader expects.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.engine.adapters import ADAPTER_META, model_folders
from agent.engine.model_config import read_config, text_config

__all__ = [
    "DRAFT_ARCHS",
    "DRAFT_SUFFIX",
    "DraftInfo",
    "DraftInvalid",
    "find_draft",
    "resolve_draft",
    "validate_draft",
]

DRAFT_SUFFIX = "-eagle3"
DRAFT_ARCHS = ("Eagle3LlamaForCausalLM", "LlamaForCausalLMEagle3")


class DraftInvalid(Exception):
    """A draft folder that is missing, damaged or does not fit the served model."""


@dataclass(frozen=True)
class DraftInfo:
    path: Path
    name: str
    draft_vocab: int
    aux_layers: tuple[int, ...]


def _by_name(name_or_path: str) -> Path | None:
    return next((f for f in model_folders(name_or_path) if f.is_dir()), None)


def find_draft(setting: str | None, adapter: Path | None) -> Path | None:
    """The draft folder for `speculative.draft` and the merged adapter's folder.

    "auto": the one the adapter's meta names, else `<adapter>-eagle3` beside it or in the
    models search path; None when the served model has no adapter or none is shipped.
    Another string: that name (models search path) or path. None: no draft.

    Raises:
        DraftInvalid: a draft named explicitly (or by the adapter's meta) is not there.
    """
    if setting is None:
        return None
    if setting != "auto":
        found = _by_name(setting)
        if found is None:
            raise DraftInvalid(f"no draft folder {setting!r}")
        return found
    if adapter is None:
        return None
    meta_path = adapter / ADAPTER_META
    if meta_path.is_file():
        try:
            named = json.loads(meta_path.read_text(encoding="utf-8")).get("draft")
        except (OSError, ValueError, AttributeError):
            named = None
        if isinstance(named, str) and named:
            found = _by_name(named) or (
                adapter.parent / named if (adapter.parent / named).is_dir() else None
            )
            if found is None:
                raise DraftInvalid(f"{adapter.name} names draft {named!r}, which is not there")
            return found
    sibling = adapter.parent / f"{adapter.name}{DRAFT_SUFFIX}"
    return sibling if sibling.is_dir() else _by_name(f"{adapter.name}{DRAFT_SUFFIX}")


def _shapes(folder: Path) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise DraftInvalid(f"{folder}: no safetensors weights")
    for path in files:
        try:
            with path.open("rb") as fh:
                (n,) = struct.unpack("<Q", fh.read(8))
                if n > 16 << 20:
                    raise DraftInvalid(f"{path}: header of {n} bytes")
                header: Any = json.loads(fh.read(n))
        except (OSError, ValueError, struct.error) as exc:
            raise DraftInvalid(f"{path}: unreadable safetensors header: {exc}") from exc
        for name, meta in header.items():
            if name != "__metadata__" and isinstance(meta, dict):
                out[name] = [int(d) for d in meta.get("shape", [])]
    return out


def _tensor_problems(  # noqa: PLR0917  # the shape's numbers, named as in config.json
    draft: Path, h: int, th: int, heads: int, kv: int, hd: int, inter: int, dv: int, vocab: int
) -> list[str]:
    """What differs between the draft's tensors and those vLLM's eagle3 loader expects."""
    problems: list[str] = []
    expect = {
        "fc.weight": [h, 3 * th],
        "midlayer.self_attn.q_proj.weight": [heads * hd, 2 * h],
        "midlayer.self_attn.k_proj.weight": [kv * hd, 2 * h],
        "midlayer.self_attn.v_proj.weight": [kv * hd, 2 * h],
        "midlayer.self_attn.o_proj.weight": [h, heads * hd],
        "midlayer.mlp.gate_proj.weight": [inter, h],
        "midlayer.mlp.up_proj.weight": [inter, h],
        "midlayer.mlp.down_proj.weight": [h, inter],
        "midlayer.hidden_norm.weight": [h],
        "midlayer.input_layernorm.weight": [h],
        "midlayer.post_attention_layernorm.weight": [h],
        "norm.weight": [h],
        "lm_head.weight": [dv, h],
    }
    if dv != vocab:
        expect["d2t"] = [dv]
    shapes = _shapes(draft)
    for name, shape in expect.items():
        got = shapes.get(name)
        if got is None:
            problems.append(f"no tensor {name}")
        elif got != shape:
            problems.append(f"{name} is {got}, expected {shape}")
    return problems


def validate_draft(draft: Path, target: Path) -> DraftInfo:
    """The draft's shape against the served model's; raises DraftInvalid with the reason."""
    try:
        cfg = read_config(draft)
        tcfg = text_config(read_config(target))
    except Exception as exc:  # ModelFolderError: no or broken config.json
        raise DraftInvalid(str(exc)) from exc
    archs = cfg.get("architectures") or []
    if not any(a in DRAFT_ARCHS for a in archs):
        raise DraftInvalid(f"{draft.name}: architectures {archs} is not an EAGLE-3 Llama draft")
    if tcfg.get("model_type") != "llama":
        raise DraftInvalid(
            f"{draft.name}: an EAGLE-3 Llama draft, target is {tcfg.get('model_type')}"
        )
    try:
        h, th = int(cfg["hidden_size"]), int(cfg.get("target_hidden_size", cfg["hidden_size"]))
        vocab, dv = int(cfg["vocab_size"]), int(cfg.get("draft_vocab_size") or cfg["vocab_size"])
        heads, kv = int(cfg["num_attention_heads"]), int(cfg["num_key_value_heads"])
        hd = int(cfg.get("head_dim") or h // heads)
        inter = int(cfg["intermediate_size"])
        aux = tuple(int(i) for i in cfg.get("eagle_aux_hidden_state_layer_ids") or ())
    except (KeyError, TypeError, ValueError) as exc:
        raise DraftInvalid(f"{draft.name}: config.json lacks or mangles {exc}") from exc
    n_target = int(tcfg.get("num_hidden_layers") or 0)
    problems = []
    if th != tcfg.get("hidden_size"):
        problems.append(f"target hidden size {th} != served model's {tcfg.get('hidden_size')}")
    if vocab != tcfg.get("vocab_size"):
        problems.append(f"vocabulary {vocab} != served model's {tcfg.get('vocab_size')}")
    if not 0 < dv <= vocab:
        problems.append(f"draft vocabulary {dv} outside 1..{vocab}")
    if aux and (len(aux) != 3 or not all(0 <= i < n_target for i in aux)):
        problems.append(f"aux layers {list(aux)} do not fit a {n_target}-layer target")
    problems += _tensor_problems(draft, h, th, heads, kv, hd, inter, dv, vocab)
    if problems:
        raise DraftInvalid(f"{draft.name}: " + "; ".join(problems))
    return DraftInfo(draft, draft.name, dv, aux)


def resolve_draft(
    setting: str | None, adapter: str | None, model_dir: Path
) -> tuple[DraftInfo | None, str | None]:
    """(the draft to use, None) or (None, why there is none) for the served model.

    `adapter` is the merged adapter's name (None when the base is served: a draft trained
    on the tuned model does not fit the base, so none is used).
    """
    from agent.engine.adapters import find_adapter
    from agent.engine.lora import AdapterInvalid

    if setting is None:
        return None, "speculative.draft is null"
    folder: Path | None = None
    if adapter is not None:
        try:
            folder = find_adapter(adapter)
        except AdapterInvalid as exc:
            return None, str(exc)
    elif setting == "auto":
        return None, "no tuned adapter served, so no trained draft"
    try:
        path = find_draft(setting, folder)
    except DraftInvalid as exc:
        return None, str(exc)
    if path is None:
        return None, f"no trained draft shipped for {adapter}"
    try:
        return validate_draft(path, model_dir), None
    except DraftInvalid as exc:
        return None, f"draft invalid: {exc}"
