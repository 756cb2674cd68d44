"""Weight bytes for the memory planner: from safetensors headers, or estimated from config.json.

The estimate counts every parameter of the shape (model_shape) plus what a Qwen3-Next-style
hybrid adds (hybrid_layout.extra_params: the attention output gate, the MTP layers vLLM
loads) in the engine dtype, the decoder's projections at one byte with `quantization: fp8`
or at int4 bytes when config.json declares GPTQ/AWQ 4-bit and real weights will be loaded
(or, for GPTQ, a dummy load of a config that names its quantized layers). Every projection
counts as int4 then, also where the list leaves a small one in bf16 (the 4B hybrid's
in_proj_ba and MTP fc: the measured weights were 3.5% above the plan).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from agent.engine.hybrid_layout import extra_params
from agent.engine.model_config import (
    SAFETENSORS_DTYPE_BYTES,
    read_config,
    safetensors_files,
    tensor_infos,
    text_config,
)
from agent.engine.model_shape import ModelShape
from agent.engine.profile import EngineProfile

__all__ = ["int4_option", "plan_weights"]

_FLOAT_TENSORS = {"F32", "F16", "BF16"}  # cast to the engine dtype on load; others kept
# AWQ / GPTQ 4-bit with groups of 128: half a byte a weight plus an fp16 scale and a 4-bit
# zero point per group. Embeddings and the LM head stay in the model dtype.
_INT4_BYTES_PER_WEIGHT = 0.5 + 2.5 / 128
_PREQUANTIZED = ("awq", "gptq", "marlin", "compressed", "bitsandbytes", "gguf")


def _is_linear(name: str) -> bool:
    """A decoder layer's projection (what fp8 and int4 quantize; not embeddings or norms)."""
    return (".layers." in f".{name}" and name.endswith("proj.weight")) or ".experts." in name


def _embed_params(shape: ModelShape, cfg: Mapping[str, Any]) -> int:
    tied = bool(cfg.get("tie_word_embeddings", False))
    return shape.vocab_size * shape.hidden_size * (1 if tied else 2)


def _int4_config(cfg: Mapping[str, Any]) -> str | None:
    """'gptq' / 'awq' when config.json declares 4-bit weights of that kind."""
    quant = cfg.get("quantization_config")
    if not isinstance(quant, Mapping):
        return None
    method = str(quant.get("quant_method", "")).lower()
    bits = quant.get("bits", quant.get("w_bit"))
    return method if method in ("gptq", "awq") and bits == 4 else None


def _names_quantized_layers(cfg: Mapping[str, Any]) -> bool:
    """Whether a GPTQ config itself names the layers it quantizes.

    vLLM 0.26's GPTQ config takes them from `modules_in_block_to_quantize` and, without it,
    from the dtypes in the checkpoint's safetensors headers; a dummy load has no checkpoint,
    so only a config that names them gets int4 layers from a dummy load."""
    quant = cfg.get("quantization_config")
    return isinstance(quant, Mapping) and bool(quant.get("modules_in_block_to_quantize"))


def plan_weights(
    model_dir: Path, profile: EngineProfile, shape: ModelShape, dtype_bytes: int, mtp: int
) -> tuple[int, str]:
    """Weight bytes in memory. `quantization: fp8` (vLLM quantizes a bf16 checkpoint at
    load) stores the decoder's projections at one byte.

    Without weight files the projections of a config that declares GPTQ/AWQ 4-bit are
    planned at int4 bytes. A dummy load only where the config names its quantized layers
    (`modules_in_block_to_quantize`): otherwise vLLM 0.26 takes them from the checkpoint's
    headers, and with none it loaded the 4B hybrid's projections in bf16 (issue 20: 8.08 GB
    measured without the list, 3.13 GB with it)."""
    linear_bytes: float = 1 if profile.quantization == "fp8" else dtype_bytes
    note = ", fp8 projections" if profile.quantization == "fp8" else ""
    files = safetensors_files(model_dir)
    if profile.load_format == "dummy" or not files:
        why = "dummy load" if profile.load_format == "dummy" else "no weight files"
        cfg = text_config(read_config(model_dir))
        int4 = _int4_config(cfg)
        dummy_int4 = int4 == "gptq" and _names_quantized_layers(cfg)
        if int4 and profile.load_format == "dummy" and not dummy_int4:
            note += f", config.json's {int4} 4-bit not applied by a dummy load"
        elif int4:
            linear_bytes, note = _INT4_BYTES_PER_WEIGHT, f", {int4} 4-bit projections"
        embed = _embed_params(shape, cfg)
        linear = max(0, shape.estimated_params + extra_params(cfg, mtp) - embed)
        total = math.ceil(linear * linear_bytes) + embed * dtype_bytes
        return total, f"estimated from config, {why}{note}"
    total = 0
    for t in tensor_infos(model_dir):
        if t.dtype in _FLOAT_TENSORS:
            total += math.ceil(t.numel * (linear_bytes if _is_linear(t.name) else dtype_bytes))
        else:  # quantized payloads stay as stored
            total += t.nbytes or math.ceil(t.numel * SAFETENSORS_DTYPE_BYTES.get(t.dtype, 1))
    n = len(files)
    return total, f"{n} safetensors file{'s' if n > 1 else ''}{note}"


def int4_option(
    shape: ModelShape, cfg: Mapping[str, Any], profile: EngineProfile, dtype_bytes: int, mtp: int
) -> int | None:
    """The weights as AWQ/GPTQ int4 (a plan for CUDA devices; None if already quantized)."""
    quant = (profile.quantization or "").lower()
    if profile.device.kind != "cuda" or any(q in quant for q in _PREQUANTIZED):
        return None
    if _int4_config(cfg):
        return None
    embed = _embed_params(shape, cfg)
    linear = max(0, shape.estimated_params + extra_params(cfg, mtp) - embed)
    return math.ceil(linear * _INT4_BYTES_PER_WEIGHT) + embed * dtype_bytes
