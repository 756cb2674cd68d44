"""vLLM settings shared by the answer regeneration (regen.py) and the speculation benchmark
(bench/engine/bench_spec.py), so that both start the tuned model with the same engine
arguments: the second start then finds vLLM's compile cache warm (its key covers the model
path and these settings, not k), and the answers the draft learns are the ones served.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

MAX_MODEL_LEN = 4608  # the corpus' longest prompt (3,857 tokens) + an answer
MAX_NUM_SEQS = 32
MAX_BATCHED = 8192


def engine_kwargs(
    model: Path, *, on_gpu: bool, spec: dict[str, Any] | None = None, eager: bool = False
) -> dict[str, Any]:
    kw: dict[str, Any] = {
        "model": str(model),
        "dtype": "bfloat16",
        "max_model_len": MAX_MODEL_LEN,
        "max_num_seqs": MAX_NUM_SEQS if on_gpu else 2,
        "max_num_batched_tokens": MAX_BATCHED,
        "enable_prefix_caching": True,
        "disable_log_stats": False,
        "seed": 0,
    }
    if on_gpu:
        kw["gpu_memory_utilization"] = 0.30
    else:
        kw["enforce_eager"] = True
        kw["kv_cache_memory_bytes"] = 256 << 20
    if eager:
        kw["enforce_eager"] = True
    if spec is not None:
        kw["speculative_config"] = dict(spec)
    return kw


def load_prompts(corpus: Path, limit: int = 0) -> list[list[int]]:
    import numpy as np

    data = np.load(corpus / "corpus.npz")
    p_ids, p_off = data["prompt_ids"], data["prompt_offsets"]
    out = [p_ids[p_off[i] : p_off[i + 1]].astype("int64").tolist() for i in range(len(p_off) - 1)]
    return out[:limit] if limit else out
