"""Probes for bench_profiles.py: what the engine holds, read from inside and outside it.

- `worker_memory` and `worker_kv` run inside vLLM's worker process (through
  `AsyncLLM.collective_rpc`, which pickles them by reference: this module must be importable
  there, so the repository root is on PYTHONPATH): torch's allocator counters and the KV cache
  layout vLLM actually built (groups, block size, page size, blocks).
- `process_memory`: NVML per-process GPU memory and /proc RSS of this process and its
  children (the engine core and its worker), and the device-wide NVML figure.
- `LogTap`: copies this process's stdout/stderr (inherited by vLLM's child processes) to a
  log file and keeps the lines that carry vLLM's own memory figures (weights loaded, CUDA
  graph pool, KV cache size, block size), which no API returns.
- `hybrid_block_size`: the attention block size vLLM 0.26 forces on a Gated-DeltaNet hybrid
  (platforms/interface.py `_align_hybrid_block_size`), to choose a token budget it accepts.
"""

from __future__ import annotations

import contextlib
import math
import os
import re
import threading
from pathlib import Path
from typing import Any

__all__ = [
    "LOG_PATTERNS",
    "LogTap",
    "hybrid_block_size",
    "process_memory",
    "worker_kv",
    "worker_memory",
]


# -- inside the worker ---------------------------------------------------------------------


def worker_memory(worker: Any, reset_peak: bool = False) -> dict[str, Any]:
    """torch allocator counters of the worker (bytes); optionally reset the peak after."""
    import torch

    out: dict[str, Any] = {"pid": os.getpid()}
    runner = getattr(worker, "model_runner", None)
    out["model_memory_usage"] = _int_or_none(getattr(runner, "model_memory_usage", None))
    if torch.cuda.is_available():
        free, total = torch.cuda.mem_get_info()
        out |= {
            "allocated": torch.cuda.memory_allocated(),
            "reserved": torch.cuda.memory_reserved(),
            "max_allocated": torch.cuda.max_memory_allocated(),
            "max_reserved": torch.cuda.max_memory_reserved(),
            "device_free": free,
            "device_total": total,
        }
        if reset_peak:
            torch.cuda.reset_peak_memory_stats()
    return out


def worker_kv(worker: Any) -> dict[str, Any]:
    """The KV cache vLLM built: groups, pages, blocks, and what one sequence can hold."""
    runner = worker.model_runner
    vcfg = worker.vllm_config
    cfg = runner.kv_cache_config
    groups = []
    for group in cfg.kv_cache_groups:
        spec = group.kv_cache_spec
        entry: dict[str, Any] = {
            "type": type(spec).__name__,
            "layers": len(group.layer_names),
            "block_size": spec.block_size,
            "page_size_bytes": spec.page_size_bytes,
        }
        with contextlib.suppress(Exception):
            entry["max_memory_usage_bytes"] = spec.max_memory_usage_bytes(vcfg)
        for attr in ("num_speculative_blocks", "mamba_cache_mode", "dtype", "num_kv_heads"):
            if hasattr(spec, attr):
                entry[attr] = str(getattr(spec, attr))
        groups.append(entry)
    out: dict[str, Any] = {
        "num_blocks": cfg.num_blocks,
        "tensor_bytes": sum(t.size for t in cfg.kv_cache_tensors),
        "num_tensors": len(cfg.kv_cache_tensors),
        "groups": groups,
        "cache_block_size": vcfg.cache_config.block_size,
        "mamba_cache_mode": str(getattr(vcfg.cache_config, "mamba_cache_mode", None)),
        "max_model_len": vcfg.model_config.max_model_len,
    }
    with contextlib.suppress(Exception):
        from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

        tokens, concurrency = get_kv_cache_capacity(vcfg, cfg)
        out["vllm_kv_tokens"], out["vllm_max_concurrency"] = tokens, concurrency
    # One sequence: the blocks left once every non-attention group has its state pages,
    # times the attention block size (what a single stream's window can grow to).
    attn = [g for g in groups if "Attention" in g["type"]]
    state_pages = sum(
        math.ceil(g.get("max_memory_usage_bytes", 0) / g["page_size_bytes"])
        for g in groups
        if "Attention" not in g["type"] and g["page_size_bytes"]
    )
    if attn:  # every group spans the same tensors: one block id = one page in each
        block = attn[0]["block_size"]
        out["one_seq_tokens"] = max(0, cfg.num_blocks - state_pages) // len(attn) * block
        out["state_pages_per_seq"] = state_pages
        out["state_bytes_per_seq"] = state_pages * attn[0]["page_size_bytes"] * attn[0]["layers"]
        out["attn_bytes_per_token"] = sum(
            g["page_size_bytes"] * g["layers"] // g["block_size"] for g in attn
        )
    return out


def _int_or_none(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# -- outside: NVML and /proc ---------------------------------------------------------------


def _nvml() -> Any:
    try:
        import pynvml
    except ImportError:
        try:
            from vllm.third_party import pynvml  # type: ignore[no-redef]
        except ImportError:
            return None
    try:
        pynvml.nvmlInit()
    except Exception:
        return None
    return pynvml


def descendants(root: int) -> list[int]:
    """`root` and every process below it (agent/footprint.py's walk of /proc)."""
    from agent.footprint import tree

    return tree(root)


def _rss(pid: int) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def process_memory() -> dict[str, Any]:
    """GPU memory per process of ours (NVML), device used, and host RSS of ours (bytes)."""
    pids = descendants(os.getpid())
    out: dict[str, Any] = {
        "host_rss": {str(p): _rss(p) for p in pids},
        "host_rss_total": sum(_rss(p) for p in pids),
    }
    nv = _nvml()
    if nv is None:
        return out
    handle = nv.nvmlDeviceGetHandleByIndex(0)
    info = nv.nvmlDeviceGetMemoryInfo(handle)
    out["device_used"], out["device_total"] = int(info.used), int(info.total)
    with contextlib.suppress(Exception):
        procs = nv.nvmlDeviceGetComputeRunningProcesses(handle)
        every = {str(p.pid): int(p.usedGpuMemory or 0) for p in procs}
        out["gpu_by_pid_all"] = every
        out["gpu_ours"] = sum(v for k, v in every.items() if int(k) in pids)
        out["gpu_ours_matched"] = any(int(k) in pids for k in every)
    return out


# -- vLLM's log lines ----------------------------------------------------------------------

LOG_PATTERNS: dict[str, str] = {
    "model_load": r"Model loading took ([\d.]+) GiB memory and ([\d.]+) seconds",
    "graph_capture": r"Graph capturing finished in ([\d.]+) secs, took ([\d.-]+) GiB",
    "graph_pool": r"CUDA graph pool memory: ([\d.-]+) GiB \(actual\), ([\d.-]+) GiB \(estimated\)",
    "kv_tokens": r"KV cache size: ([\d,]+) tokens",
    "max_concurrency": r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x",
    "attn_block_size": r"Setting attention block size to (\d+) tokens",
    "mamba_padding_pct": r"Padding mamba page size by ([\d.]+)%",
    "available_kv_gib": r"Available KV cache memory: ([\d.]+) GiB",
    "kv_reserved_gib": r"reserved ([\d.]+) GiB memory for KV Cache",
    "compile_s": r"torch.compile takes ([\d.]+) s in total",
    "init_engine_s": r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s",
    "mamba_cache_mode": r"Mamba cache mode is set to '(\w+)'",
    "attention_backend": r"Using (\S+) (?:attention )?backend",
    "quantization": r"(gptq_marlin|awq_marlin|marlin)\b",
    "spec_metrics": r"SpecDecoding metrics: (.*)",
    "padding_layers": r"Add (\d+) padding layers",
    "kv_needed_gib": r"\(([\d.]+) GiB KV",
}
_COMPILED = {k: re.compile(v) for k, v in LOG_PATTERNS.items()}


class LogTap:
    """Tee fd 1 and 2 (and so every child's output) into `path`, keeping matched lines.

    `label` names the run the next lines belong to; `found[label][key]` is the last match's
    groups for each pattern in LOG_PATTERNS (first match for attention_backend, errors kept
    as a list).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.label = "setup"
        self.found: dict[str, dict[str, Any]] = {}
        self._file = path.open("ab", buffering=0)
        self._saved = os.dup(1)
        read_fd, write_fd = os.pipe()
        self._read = read_fd
        os.dup2(write_fd, 1)
        os.dup2(write_fd, 2)
        os.close(write_fd)
        self._thread = threading.Thread(target=self._pump, daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        buf = b""
        while True:
            try:
                chunk = os.read(self._read, 65536)
            except OSError:
                return
            if not chunk:
                return
            with contextlib.suppress(OSError):
                os.write(self._saved, chunk)
                self._file.write(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for raw in lines:
                self._match(raw.decode("utf-8", "replace"))

    def _match(self, line: str) -> None:
        slot = self.found.setdefault(self.label, {})
        for key, rx in _COMPILED.items():
            m = rx.search(line)
            if m is None or (key in ("attention_backend", "quantization") and key in slot):
                continue
            slot[key] = list(m.groups())
        if "Traceback" in line or "Error" in line:
            errors = slot.setdefault("errors", [])
            if len(errors) < 20:
                errors.append(line[-400:])

    def close(self) -> None:
        os.dup2(self._saved, 1)
        os.dup2(self._saved, 2)
        self._thread.join(timeout=2)
        self._file.close()


# -- vLLM 0.26's hybrid block size ------------------------------------------------------------


def hybrid_block_size(cfg: dict[str, Any], kv_dtype_bytes: int, k: int, align: int = 16) -> int:
    """Tokens per attention block vLLM 0.26 picks for a Gated-DeltaNet hybrid.

    The attention page (block x per-token bytes of one layer) must hold one layer's
    recurrent state (conv state with k extra rows for speculation, plus the delta-net
    state, in the model dtype: 2 bytes), in multiples of the kernel alignment (16).
    """
    v_heads, k_heads = cfg["linear_num_value_heads"], cfg["linear_num_key_heads"]
    k_dim, v_dim = cfg["linear_key_head_dim"], cfg["linear_value_head_dim"]
    conv_dim = 2 * k_heads * k_dim + v_heads * v_dim
    state = (conv_dim * (cfg["linear_conv_kernel_dim"] - 1 + k) + v_heads * k_dim * v_dim) * 2
    per_token = 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * kv_dtype_bytes
    return align * math.ceil(state / (align * per_token))


def hybrid_kv_need(
    cfg: dict[str, Any], kv_dtype_bytes: int, k: int, extra_attn_layers: int, max_len: int
) -> dict[str, int]:
    """What vLLM 0.26 needs for one sequence of `max_len` tokens of a GDN hybrid (align mode).

    Layers are grouped by type into groups of the smallest type's count (kv_cache_utils
    `_get_kv_cache_groups_uniform_page_size`; the MTP layer adds to full attention). Each
    block id spans one page in each of `group_size` tensors; an attention group takes
    ceil(len / block) blocks a sequence, a linear-attention group 2 + k (align mode).
    `check_bytes` is the start check (layer sums, padding not counted), `pool_bytes_min` the
    pool vLLM starts with (the held blocks and its null block), `pool_bytes_peak` the pool that
    lets the sequence finish: one block more in each linear-attention group while a prefill
    chunk crosses a block (the 2026-12-01 lease-3 stalls; agent/engine/hybrid_layout.py).
    """
    layers = cfg["num_hidden_layers"]
    n_attn = layers // cfg["full_attention_interval"] + extra_attn_layers
    n_lin = layers - layers // cfg["full_attention_interval"]
    small, large = min(n_attn, n_lin), max(n_attn, n_lin)
    group = large if large < 1.5 * small else small
    block = hybrid_block_size(cfg, kv_dtype_bytes, k)
    page = block * 2 * cfg["num_key_value_heads"] * cfg["head_dim"] * kv_dtype_bytes
    attn_blocks = -(-max_len // block)
    state_blocks = 2 + k
    blocks = -(-n_attn // group) * attn_blocks + -(-n_lin // group) * state_blocks
    return {
        "block_size": block,
        "page_bytes": page,
        "group_size": group,
        "blocks_per_seq": blocks,
        "check_bytes": (n_attn * attn_blocks + n_lin * state_blocks) * page,
        "transient_blocks": -(-n_lin // group),
        "pool_bytes_min": blocks * page * group,
        "pool_bytes_peak": (blocks + -(-n_lin // group) + 1) * page * group,
    }
