"""vLLM itself: the one module that imports vLLM and touches `AsyncLLM` and its internals.

Everything else in agent/engine deals in our own types and calls `VllmHandle`, a thin
holder of one `AsyncLLM`: construction (`construct`, in a worker thread), the warm-up,
sampling parameters, the request stream and how its outputs read (`Output`), abort,
health, shutdown, the engine-core process ids, the stat logger, and which exception means
the engine core died. vLLM's interfaces used here are few and version-dependent (the
service runs vLLM 0.32 on CPU and 0.26 on the GPU machines): they are read by name,
arrive typed as Any (agent/engine/lazy.py), and are checked by the tests against the real
engine. What we ask vLLM for (its engine arguments and environment) is agent/engine/args.py,
pure and tested without vLLM.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
from collections.abc import AsyncGenerator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, cast

import structlog

from agent.engine.args import engine_kwargs, supported_kwargs
from agent.engine.lazy import optional_module, require_module
from agent.engine.profile import EngineProfile
from agent.engine.repetition import RepetitionGuard
from agent.engine.speculative import SpeculationPlan
from agent.engine.stats import StatsCollector, StepStats
from pipelines.analysis.protocols import TokenLogprob

__all__ = ["Output", "VllmHandle", "construct", "stat_logger_factory", "vllm_installed"]

log = structlog.get_logger(__name__)


class VllmHandle:
    """One constructed AsyncLLM and what we learnt about the vLLM that built it."""

    def __init__(
        self,
        llm: Any,
        *,
        version: str,
        device: str,
        dead_error: type[BaseException] | None,
        repetition_params: Any | None,
    ) -> None:
        self._llm = llm  # None once released
        self.version = version
        self.device = device  # vLLM's platform device type: cpu, cuda, ...
        self._dead_error = dead_error
        self._sampling = require_module("vllm.sampling_params")
        # vLLM's own repetition detection, where the version has it; else our guard runs.
        self.supports_repetition = repetition_params is not None

    def start_output_handler(self) -> None:
        """Start vLLM's output tasks on the running loop now (constructed off-loop they
        would start at the first request), so an engine-core failure is noticed while idle."""
        run_handler = getattr(self._llm, "_run_output_handler", None)
        if callable(run_handler):
            run_handler()

    def kv_capacity_tokens(self) -> int | None:
        return _kv_capacity_tokens(self._llm.vllm_config)

    async def warm_up(self, *, detokenize: bool) -> None:
        """A 4-token greedy request on token ids valid in any vocabulary; straight to vLLM
        so that it does not count in our latency statistics."""
        params = self._sampling.SamplingParams(
            max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=detokenize
        )
        stream = self._llm.generate(
            {"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}, params, "warmup"
        )
        async with contextlib.aclosing(stream):
            async for _ in stream:
                pass

    def sampling_params(
        self,
        *,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None,
        detokenize: bool,
        stop: list[str],
        json_schema: Mapping[str, Any] | None,
        repetition: RepetitionGuard | None,
        logprobs: bool = False,
    ) -> Any:
        """vLLM's SamplingParams for one request; chunks carry only what is new.
        `logprobs`: the sampled token's log-probability with each token (vLLM's
        `logprobs=0`; under a schema, over the tokens the grammar allows)."""
        sp = self._sampling
        kw: dict[str, Any] = {
            "max_tokens": max_tokens,
            "temperature": temperature,
            "top_p": top_p,
            "seed": seed,
            "output_kind": sp.RequestOutputKind.DELTA,
        }
        if not detokenize:
            kw["detokenize"] = False  # skip_tokenizer_init: token ids only
        if stop:
            kw["stop"] = stop
        if logprobs:
            kw["logprobs"] = 0
        if json_schema is not None:
            kw["structured_outputs"] = sp.StructuredOutputsParams(json=dict(json_schema))
        if repetition is not None:
            kw["repetition_detection"] = sp.RepetitionDetectionParams(
                max_pattern_size=repetition.max_pattern,
                min_pattern_size=repetition.min_pattern,
                min_count=repetition.min_count,
            )
        return sp.SamplingParams(**kw)

    def generate(self, ids: list[int], params: Any, request_id: str) -> AsyncGenerator[Any, None]:
        """vLLM's stream of outputs (read each with `Output`). It holds the AsyncLLM: close
        it (aclosing), or the engine outlives shutdown()."""
        prompt = {"prompt_token_ids": ids}  # vLLM's TokensPrompt is this TypedDict
        return cast("AsyncGenerator[Any, None]", self._llm.generate(prompt, params, request_id))

    async def abort(self, request_ids: str | Sequence[str]) -> None:
        await self._llm.abort(request_ids)

    @property
    def errored(self) -> bool:
        """vLLM's flag: the engine core is gone."""
        return bool(self._llm.errored)

    def is_dead(self, exc: BaseException) -> bool:
        """Whether `exc` is vLLM's EngineDeadError (the engine core died)."""
        return self._dead_error is not None and isinstance(exc, self._dead_error)

    async def check_health(self) -> None:
        await self._llm.check_health()

    def shutdown(self, *timeout: float | None) -> None:
        """Join the engine core (blocking: call it off the loop). vLLM's shutdown is written
        to be called from another thread (it cancels its tasks thread-safely). The timeout,
        where given, is passed on."""
        self._llm.shutdown(*timeout)

    def release(self) -> None:
        """Drop the AsyncLLM (after shutdown), so that it goes now, not at interpreter exit."""
        self._llm = None

    def core_pids(self) -> list[int]:
        """Process ids of the engine-core child(ren), read from vLLM's process manager (an
        internal: [] where a version lays it out differently, or once released)."""
        if self._llm is None:
            return []
        manager = getattr(
            getattr(getattr(self._llm, "engine_core", None), "resources", None),
            "engine_manager",
            None,
        )
        procs = getattr(manager, "processes", None) or []
        return [int(p.pid) for p in procs if getattr(p, "pid", None)]


class Output:
    """One of vLLM's RequestOutputs (DELTA kind), read through the fields we use."""

    __slots__ = ("_comp", "_out")

    def __init__(self, out: Any) -> None:
        self._out = out
        self._comp = out.outputs[0]

    @property
    def text(self) -> str:
        return cast("str", self._comp.text)

    @property
    def token_ids(self) -> tuple[int, ...]:
        return tuple(self._comp.token_ids)

    @property
    def finished(self) -> bool:
        return bool(self._out.finished)

    @property
    def token_logprobs(self) -> tuple[TokenLogprob, ...] | None:
        """The new tokens' log-probabilities (asked with logprobs), else None. vLLM gives
        one {token id: Logprob} per token, the sampled token among them."""
        per_token = getattr(self._comp, "logprobs", None)
        if per_token is None:
            return None
        out = []
        for token_id, entry in zip(self._comp.token_ids, per_token, strict=False):
            chosen = entry.get(token_id)
            if chosen is None:
                return None
            out.append(TokenLogprob(str(chosen.decoded_token or ""), float(chosen.logprob)))
        return tuple(out)

    @property
    def finish_reason(self) -> str | None:
        reason = self._comp.finish_reason
        return str(reason) if reason is not None else None

    @property
    def num_cached_tokens(self) -> int | None:
        """Prompt tokens served from the prefix cache."""
        return cast("int | None", self._out.num_cached_tokens)


def construct(
    profile: EngineProfile,
    model_dir: Path,
    spec: SpeculationPlan,
    collector: StatsCollector,
    holder: list[VllmHandle],
) -> None:
    """Create the AsyncLLM and put it, in its handle, into `holder` (not returned).

    vLLM and the libraries it imports on the way keep some caught exceptions, whose
    tracebacks keep this frame alive (frames reference their callers). A local or a
    return value holding the AsyncLLM would then outlive shutdown(), and its __del__
    would run at interpreter exit, when vLLM's module globals are already gone.
    """
    vllm = require_module("vllm")
    arg_utils = require_module("vllm.engine.arg_utils")
    async_llm = require_module("vllm.v1.engine.async_llm")
    platform = require_module("vllm.platforms").current_platform
    device = str(getattr(platform, "device_type", "unknown"))
    log.info("engine_starting", vllm_version=vllm.__version__, backend=device, model=str(model_dir))
    known = {f.name for f in dataclasses.fields(arg_utils.AsyncEngineArgs)}
    kwargs = supported_kwargs(engine_kwargs(profile, model_dir, spec), known)
    if isinstance(kwargs.get("structured_outputs_config"), dict):
        config = require_module("vllm.config")
        kwargs["structured_outputs_config"] = config.StructuredOutputsConfig(
            **kwargs["structured_outputs_config"]
        )
    args = arg_utils.AsyncEngineArgs(**kwargs)
    exceptions = optional_module("vllm.v1.engine.exceptions")
    sampling = require_module("vllm.sampling_params")
    factory = stat_logger_factory(collector)
    holder.append(
        VllmHandle(
            async_llm.AsyncLLM.from_engine_args(args, stat_loggers=[factory]),
            version=str(vllm.__version__),
            device=device,
            dead_error=getattr(exceptions, "EngineDeadError", None),
            repetition_params=getattr(sampling, "RepetitionDetectionParams", None),
        )
    )


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def stat_logger_factory(collector: StatsCollector) -> Callable[..., Any]:
    """A vLLM StatLoggerBase subclass bound to `collector`; imports vLLM (call at start).

    vLLM hands each engine step's `SchedulerStats` / `IterationStats` to every stat logger
    passed to AsyncLLM, as factory(vllm_config, engine_index) per engine core; the class
    itself is that callable. That interface is marked unstable, so the logger reads the
    fields by name, treats missing ones as zero, and hands the collector plain numbers.
    """
    base = require_module("vllm.v1.metrics.loggers").StatLoggerBase

    class _CollectorLogger(base):  # type: ignore[misc,valid-type]  # vLLM comes in as Any
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self._vllm_config = vllm_config
            self._engine_index = engine_index
            collector.on_kv_capacity(_kv_capacity_tokens(vllm_config))

        def record(
            self,
            scheduler_stats: Any,
            iteration_stats: Any,
            mm_cache_stats: Any = None,
            engine_idx: int = 0,
        ) -> None:
            collector.on_record(_preempted(iteration_stats), _step(scheduler_stats))

        def log_engine_initialized(self) -> None:
            # num_gpu_blocks is only known after the engine core's handshake.
            collector.on_kv_capacity(_kv_capacity_tokens(self._vllm_config))

    return _CollectorLogger


def _kv_capacity_tokens(vllm_config: Any) -> int | None:
    cache = getattr(vllm_config, "cache_config", None)
    blocks = getattr(cache, "num_gpu_blocks", None)
    block_size = getattr(cache, "block_size", None)
    if isinstance(blocks, int) and isinstance(block_size, int):
        return blocks * block_size
    return None


def _preempted(iteration_stats: Any) -> int:
    if iteration_stats is None:
        return 0
    return int(getattr(iteration_stats, "num_preempted_reqs", 0) or 0)


def _step(scheduler_stats: Any) -> StepStats | None:
    if scheduler_stats is None:
        return None
    prefix = getattr(scheduler_stats, "prefix_cache_stats", None)
    spec = getattr(scheduler_stats, "spec_decoding_stats", None)
    return StepStats(
        kv_usage=float(getattr(scheduler_stats, "kv_cache_usage", 0.0) or 0.0),
        num_running=int(getattr(scheduler_stats, "num_running_reqs", 0) or 0),
        num_waiting=int(getattr(scheduler_stats, "num_waiting_reqs", 0) or 0),
        prefix_queries=int(getattr(prefix, "queries", 0) or 0) if prefix is not None else 0,
        prefix_hits=int(getattr(prefix, "hits", 0) or 0) if prefix is not None else 0,
        drafts=int(getattr(spec, "num_drafts", 0) or 0) if spec is not None else 0,
        draft_tokens=int(getattr(spec, "num_draft_tokens", 0) or 0) if spec is not None else 0,
        accepted_tokens=int(getattr(spec, "num_accepted_tokens", 0) or 0)
        if spec is not None
        else 0,
    )
