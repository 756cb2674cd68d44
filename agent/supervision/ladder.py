"""The tuning ladder: the engine settings the supervisor steps down, cheapest first.

Rung 0 is the profile as configured. Each further rung changes one knob more, in the order
the field found least costly (docs/watchdog.md):

1. speculative tokens k-1 ... 1, then off (less verify compute and draft memory);
2. CUDA graphs: decode-only graphs of the smallest batches (graph memory);
3. KV cache budget: 85 %, 80 %, 75 % of the configured bytes (never below what one full
   context needs), or gpu_memory_utilization 0.85, 0.80, 0.75 on a discrete GPU;
4. max_num_batched_tokens halved twice (activation memory; recompiles on CUDA), never below
   what the engine accepts (a hybrid's attention block with prefix caching: vLLM refuses
   less, so such a rung would only be refused and stepped past);
5. last, and loudly: the context window, to 75 % then 50 % (never under 2048 tokens), with
   max_model_len following it and, where the KV cache is sized in bytes, the KV budget
   shrinking in proportion (that is the memory this rung frees). This one shortens what
   the analysis can see.

Rungs are cumulative (rung n carries every change of rungs 1..n) and each is validated as a
profile; a step that a profile cannot take (no graphs on CPU, no speculation configured) is
not on its ladder at all.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ByteSize, ValidationError

from agent.engine.profile import CudaGraphSettings, EngineProfile

__all__ = [
    "MIN_CONTEXT_TOKENS",
    "Knob",
    "KvRates",
    "Rung",
    "build_ladder",
    "ladder_fingerprint",
]

MIN_CONTEXT_TOKENS = 2048  # the config's own floor for a window (agent.config.models)
_KV_FRACTIONS = (0.85, 0.80, 0.75)
_UTILIZATIONS = (0.85, 0.80, 0.75)
_CONTEXT_FRACTIONS = (0.75, 0.5)
_MIN_BATCHED_TOKENS = 256

Knob = Literal["none", "speculative", "cuda_graphs", "kv_cache", "batched_tokens", "context"]


@dataclass(frozen=True)
class KvRates:
    """From the memory planner: KV bytes per token and the fixed state per sequence
    (recurrent layers of hybrid models), so that KV rungs keep one full context; and the
    smallest token budget the engine starts with (a hybrid's attention block when prefix
    caching is on, else 0), so that no batched-tokens rung goes below it."""

    per_token: int
    fixed_per_seq: int = 0
    min_batched_tokens: int = 0

    def needed(self, profile: EngineProfile) -> int:
        block = profile.block_size or (128 if profile.device.kind == "cpu" else 16)
        return self.per_token * (profile.max_model_len + block) + self.fixed_per_seq


@dataclass(frozen=True)
class Rung:
    index: int
    knob: Knob
    name: str  # what this rung changed, for logs and status
    profile: EngineProfile
    context_tokens: int | None  # the analysis window on this rung (None: no slow tier)

    @property
    def loud(self) -> bool:
        """Shortens what the analysis sees: logged as an error, not a warning."""
        return self.knob == "context"

    def as_dict(self) -> dict[str, Any]:
        return {"index": self.index, "knob": self.knob, "name": self.name}


def _set(profile: EngineProfile, **changes: Any) -> EngineProfile | None:
    """`profile` with top-level `changes`, validated (None: the result is not a valid profile)."""
    data = profile.model_dump(mode="python")
    data.update(changes)
    try:
        return EngineProfile.model_validate(data)
    except ValidationError:
        return None


class _Builder:
    """Rungs in the making: each push applies one more change on top of the last rung."""

    def __init__(self, profile: EngineProfile, window: int | None) -> None:
        self.rungs = [Rung(0, "none", "as configured", profile, window)]

    @property
    def cur(self) -> EngineProfile:
        return self.rungs[-1].profile

    @property
    def window(self) -> int | None:
        return self.rungs[-1].context_tokens

    def push(
        self, knob: Knob, name: str, new: EngineProfile | None, window: int | None = None
    ) -> None:
        if new is not None:
            self.rungs.append(Rung(len(self.rungs), knob, name, new, window or self.window))


def build_ladder(
    profile: EngineProfile,
    *,
    context_tokens: int | None,
    answer_tokens: int = 0,
    kv: KvRates | None = None,
) -> list[Rung]:
    """The rungs for `profile` (rung 0 first). `context_tokens` is the analysis window
    (None without the slow tier); `kv` (from the memory planner) keeps the KV steps above
    one full context; unknown, the KV steps are taken as they are and a rung the engine's
    own planner refuses is stepped past by the supervisor."""
    b = _Builder(profile, context_tokens)
    _speculative(b)
    _graphs(b)
    _kv_cache(b, kv)
    _batched_tokens(b, kv.min_batched_tokens if kv else 0)
    if context_tokens is not None:
        _context(b, context_tokens, answer_tokens, kv)
    return b.rungs


def _speculative(b: _Builder) -> None:
    spec = b.cur.speculative
    if not spec.enabled:
        return
    for k in range(spec.num_speculative_tokens - 1, 0, -1):
        update = {"num_speculative_tokens": k}
        b.push(
            "speculative",
            f"speculative k={k}",
            _set(b.cur, speculative=spec.model_copy(update=update)),
        )
    off = b.cur.speculative.model_copy(update={"method": "off"})
    b.push("speculative", "speculative off", _set(b.cur, speculative=off))


def _graphs(b: _Builder) -> None:
    need = b.cur.graph_tokens_needed()
    if not need:
        return
    sizes = sorted({s for s in (1, 2, 4, 8) if s < need} | {need})
    graphs = CudaGraphSettings(mode="FULL_DECODE_ONLY", capture_sizes=sizes)
    if graphs != b.cur.cuda_graphs:
        name = f"CUDA graphs decode-only, sizes {sizes}"
        b.push("cuda_graphs", name, _set(b.cur, cuda_graphs=graphs))


def _kv_cache(b: _Builder, kv: KvRates | None) -> None:
    mem = b.cur.memory
    if mem.kv_cache_memory_bytes is not None:
        base = int(mem.kv_cache_memory_bytes)
        floor = kv.needed(b.cur) if kv else 0
        for fraction in _KV_FRACTIONS:
            size = int(base * fraction)
            if size < floor:
                return
            update: dict[str, Any] = {"kv_cache_memory_bytes": ByteSize(size)}
            name = f"KV cache {size / (1 << 20):.0f} MiB ({fraction:.0%})"
            b.push("kv_cache", name, _set(b.cur, memory=mem.model_copy(update=update)))
    elif mem.gpu_memory_utilization is not None:
        for util in _UTILIZATIONS:
            if util < mem.gpu_memory_utilization:
                name = f"gpu_memory_utilization {util:.2f}"
                lower = mem.model_copy(update={"gpu_memory_utilization": util})
                b.push("kv_cache", name, _set(b.cur, memory=lower))


def _batched_tokens(b: _Builder, floor: int) -> None:
    for _ in range(2):
        smaller = b.cur.max_num_batched_tokens // 2
        if smaller < max(_MIN_BATCHED_TOKENS, b.cur.max_num_seqs, floor):
            return
        compiled = b.cur.device.kind == "cuda" and not b.cur.enforce_eager
        name = f"max_num_batched_tokens {smaller}{' (recompiles)' if compiled else ''}"
        b.push("batched_tokens", name, _set(b.cur, max_num_batched_tokens=smaller))


def _context(b: _Builder, context_tokens: int, answer_tokens: int, kv: KvRates | None) -> None:
    for fraction in _CONTEXT_FRACTIONS:
        tokens = max(int(context_tokens * fraction) // 256 * 256, MIN_CONTEXT_TOKENS)
        if b.window is None or tokens >= b.window:
            return
        cur = b.cur
        max_len = min(cur.max_model_len, tokens + answer_tokens)
        changes: dict[str, Any] = {"max_model_len": max_len}
        name = f"context window {tokens} tokens (max_model_len {max_len}"
        kv_bytes = cur.memory.kv_cache_memory_bytes
        if kv_bytes is not None:
            # Shrink the KV budget with the context: otherwise this rung frees no memory.
            smaller = _set(cur, max_model_len=max_len)
            floor = kv.needed(smaller) if kv and smaller else 0
            size = max(int(kv_bytes * max_len / cur.max_model_len), floor)
            if size < kv_bytes:
                changes["memory"] = cur.memory.model_copy(
                    update={"kv_cache_memory_bytes": ByteSize(size)}
                )
                name += f", KV cache {size / (1 << 20):.0f} MiB"
        b.push("context", name + ")", _set(cur, **changes), tokens)


# Device fields the planner gained after ladders were persisted (issue 20, fourth lease).
_PLAN_ONLY_DEVICE_FIELDS = ("context_bytes", "compile_transient_bytes")


def ladder_fingerprint(
    profile: EngineProfile,
    context_tokens: int | None,
    answer_tokens: int = 0,
    kv: KvRates | None = None,
) -> str:
    """Identifies the ladder a persisted rung was taken on (profile, window, answer size and
    the model's KV rates, which change with the model): a different ladder starts again
    from rung 0 instead of applying a rung of another one."""
    rates = [kv.per_token, kv.fixed_per_seq] if kv else None
    if kv and kv.min_batched_tokens and rates:  # only where there is a floor, so that other
        rates.append(kv.min_batched_tokens)  # ladders keep the fingerprint they had
    dumped = profile.model_dump(mode="json")
    for key in _PLAN_ONLY_DEVICE_FIELDS:  # added later: unset, a ladder keeps its fingerprint
        if not dumped["device"].get(key):
            dumped["device"].pop(key, None)
    data = {
        "profile": dumped,
        "context": context_tokens,
        "answer": answer_tokens,
        "kv": rates,
    }
    blob = json.dumps(data, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:16]
