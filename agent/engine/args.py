"""From a profile to vLLM's engine arguments and environment (pure; vLLM not imported).

Kept apart from vllm_api.py so that what we ask vLLM for can be read and tested without
starting anything, and so the version-tolerance rule lives in one place: keys the installed
vLLM does not know are dropped with a warning instead of failing the start (the service runs
vLLM 0.32 on CPU and 0.26 on the GPU machines, whose argument sets differ).
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

import structlog

from agent.engine.profile import EngineProfile
from agent.engine.speculative import SpeculationPlan

__all__ = ["apply_engine_env", "engine_env", "engine_kwargs", "supported_kwargs"]

log = structlog.get_logger(__name__)


def engine_kwargs(profile: EngineProfile, model_dir: Path, spec: SpeculationPlan) -> dict[str, Any]:
    """AsyncEngineArgs keyword arguments for this profile, model folder and speculation."""
    mem = profile.memory
    kw: dict[str, Any] = {
        "model": str(model_dir),
        "dtype": profile.dtype,
        "load_format": profile.load_format,
        "skip_tokenizer_init": profile.skip_tokenizer_init,
        "max_model_len": profile.max_model_len,
        # AsyncLLM's defaults for these two differ from the server's: always explicit.
        "max_num_seqs": profile.max_num_seqs,
        "max_num_batched_tokens": profile.max_num_batched_tokens,
        "enable_chunked_prefill": True,
        "enable_prefix_caching": profile.enable_prefix_caching,
        "kv_cache_dtype": profile.kv_cache_dtype,
        "enforce_eager": profile.enforce_eager,
        # The default logging stat logger prints every 10 s; our own logger (passed as
        # stat_loggers) keeps stats enabled without it.
        "disable_log_stats": True,
        # Compact JSON under a schema: flexible whitespace let the small model spend a
        # third of an answer's tokens on newlines and indentation. vLLM reads this at
        # engine level only (the per-request flag is ignored by its backends).
        "structured_outputs_config": {"backend": "xgrammar", "disable_any_whitespace": True},
    }
    if profile.quantization is not None:
        kw["quantization"] = profile.quantization
    if mem.kv_cache_memory_bytes is not None:
        kw["kv_cache_memory_bytes"] = int(mem.kv_cache_memory_bytes)
    if mem.gpu_memory_utilization is not None:
        kw["gpu_memory_utilization"] = mem.gpu_memory_utilization
    if profile.block_size is not None:
        kw["block_size"] = profile.block_size
    if profile.long_prefill_token_threshold is not None:
        kw["long_prefill_token_threshold"] = profile.long_prefill_token_threshold
    if profile.executor != "auto":
        kw["distributed_executor_backend"] = profile.executor
    if spec.vllm_config is not None:
        kw["speculative_config"] = dict(spec.vllm_config)
    if profile.additional_config:
        kw["additional_config"] = dict(profile.additional_config)
    if not profile.enforce_eager and profile.device.kind == "cuda":
        compilation: dict[str, Any] = {"cudagraph_mode": profile.cuda_graphs.mode}
        sizes = profile.capture_sizes_for(spec.k)
        if sizes is not None:
            compilation["cudagraph_capture_sizes"] = sizes
        elif profile.cuda_graphs.max_capture_size is not None:
            compilation["max_cudagraph_capture_size"] = profile.cuda_graphs.max_capture_size
        kw["compilation_config"] = compilation
    return kw


def supported_kwargs(kw: Mapping[str, Any], known: Collection[str]) -> dict[str, Any]:
    """`kw` without the keys the installed AsyncEngineArgs lacks (each one logged)."""
    out = {}
    for key, value in kw.items():
        if key in known:
            out[key] = value
        else:
            log.warning("engine_arg_unsupported", arg=key, value=value)
    return out


def engine_env(profile: EngineProfile) -> tuple[dict[str, str], list[str]]:
    """(variables to set, variables to remove) before vLLM starts its engine core.

    The engine core is a spawned child: it sees the parent's environment at spawn time,
    so these are applied just before each start.
    """
    env = {
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        # Nothing may reach a model hub, whatever the caller's environment says.
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    remove: list[str] = []
    if profile.executor == "uni":
        # Without this the CPU platform silently switches "uni" back to "mp".
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    cache = profile.compile_cache_path()
    if cache is not None:
        env["VLLM_CACHE_ROOT"] = str(cache)
    if profile.memory.kv_cache_memory_bytes is not None:
        remove.append("VLLM_CPU_KVCACHE_SPACE")  # it would override kv_cache_memory_bytes
    return env, remove


def apply_engine_env(profile: EngineProfile) -> None:
    env, remove = engine_env(profile)
    for key in remove:
        if key in os.environ:
            log.warning("engine_env_removed", var=key, why="kv_cache_memory_bytes is set")
            del os.environ[key]
    os.environ.update(env)
    cache = profile.compile_cache_path()
    if cache is not None:
        cache.mkdir(parents=True, exist_ok=True)
