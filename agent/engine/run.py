"""One engine run: plan it, start vLLM off the loop, and stop it leaving nothing behind.

`Engine` (agent/engine/engine.py) owns the state machine; a `Run` is everything that
belongs to one started engine and is dropped whole at shutdown.

- The planner runs before vLLM is touched: a profile that cannot fit is refused with the
  planner's sentence (EngineWontFit) instead of an OOM in the middle of vLLM's startup.
- Starting blocks for seconds to minutes (model load, torch.compile, graph capture), so the
  AsyncLLM is constructed in a worker thread; the event loop keeps serving MQTT and keyword
  alerts meanwhile. A cancelled start lets that thread finish, then stops what it built.
- Stopping aborts in-flight requests first (their streams end with finish_reason "abort"
  instead of hanging), then joins the engine core; after it no child is left, so a new run
  can start in the same process (the supervisor's restart).
"""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from agent.engine.args import apply_engine_env
from agent.engine.draft import resolve_draft
from agent.engine.errors import EngineStartError, EngineWontFit
from agent.engine.model_prep import ModelChoice
from agent.engine.planner import MemoryPlan, PlanError, plan_memory
from agent.engine.profile import EngineProfile
from agent.engine.results import EngineInfo
from agent.engine.speculative import AcceptanceController, SpeculationPlan, choose_speculation
from agent.engine.stats import StatsCollector
from agent.engine.tokenizer import load_tokenizer
from agent.engine.vllm_api import VllmHandle, construct
from pipelines.latency import LatencyWindow

__all__ = ["Run", "start_run", "stop_run"]

log = structlog.get_logger(__name__)


@dataclass
class Run:
    """Everything that belongs to one started engine; dropped whole at shutdown."""

    vllm: VllmHandle
    profile: EngineProfile
    info: EngineInfo
    plan: MemoryPlan
    spec: SpeculationPlan
    collector: StatsCollector
    controller: AcceptanceController | None
    tokenizer: Any | None
    tokenize_pool: ThreadPoolExecutor
    started_at: float
    active: set[str] = dataclasses.field(default_factory=set)
    requests: int = 0
    generated_tokens: int = 0


async def start_run(
    profile: EngineProfile,
    choice: ModelChoice,
    speculative_k: int | None,
    *,
    ttft: LatencyWindow,
    per_token: LatencyWindow,
) -> Run:
    """Plan, then start vLLM on `choice` with `profile` (speculative_k overrides its k).

    Raises:
        EngineWontFit: the planner says the profile cannot fit this model.
        EngineStartError: vLLM failed to start.
    """
    model_dir = choice.path
    plan, spec = await asyncio.to_thread(_plan, model_dir, profile, speculative_k, choice.adapter)
    if not plan.fits:
        log.error("engine_refused", model=str(model_dir), outcome=plan.outcome)
        raise EngineWontFit(plan.outcome, plan.render())
    controller = AcceptanceController(profile.speculative, spec.k) if spec.method != "off" else None
    collector = StatsCollector(
        on_spec=controller.observe if controller else None, ttft=ttft, per_token=per_token
    )
    apply_engine_env(profile)
    t0 = time.perf_counter()
    holder: list[VllmHandle] = []
    building = asyncio.ensure_future(
        asyncio.to_thread(construct, profile, model_dir, spec, collector, holder)
    )
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-tokenize")
    try:
        # shield: a cancelled start cannot stop the thread; let it finish, then stop
        # the engine it built (the except below) instead of leaking its process.
        await asyncio.shield(building)
        # Left in `holder` until the run is whole: a failure or a cancel while the tokenizer
        # loads or the engine warms up must still shut this engine down (the except below).
        vllm = holder[0]
        # Start vLLM's output tasks on our loop now, so an engine-core failure is noticed
        # while idle.
        vllm.start_output_handler()
        tokenizer = None
        if not profile.skip_tokenizer_init:
            tokenizer = await asyncio.get_running_loop().run_in_executor(
                pool, load_tokenizer, model_dir
            )
        if profile.warmup:
            await vllm.warm_up(detokenize=not profile.skip_tokenizer_init)
    except BaseException as exc:
        pool.shutdown(wait=False)
        try:
            await building
        except BaseException as built_exc:
            # Usually `exc` itself; a second failure of the build is worth a line.
            if built_exc is not exc and isinstance(built_exc, Exception):
                log.warning("engine_construct_failed", error=repr(built_exc))
        if holder:  # built, then something failed (or we were cancelled) after it
            try:
                await asyncio.to_thread(holder.pop().shutdown)
            except Exception:  # a half-built engine: log what its shutdown raised
                log.exception("engine_partial_shutdown_failed", model=str(model_dir))
        log.error("engine_start_failed", model=str(model_dir), error=repr(exc))
        if isinstance(exc, Exception):
            raise EngineStartError(f"vLLM failed to start: {exc}") from exc
        raise
    holder.clear()  # the run owns the engine from here (stop_run shuts it down)
    elapsed = time.perf_counter() - t0
    collector.on_kv_capacity(vllm.kv_capacity_tokens())
    info = EngineInfo(
        vllm_version=vllm.version,
        backend=vllm.device,
        model_dir=model_dir,
        model=choice,
        start_seconds=round(elapsed, 2),
        kv_capacity_tokens=collector.kv_capacity_tokens,
        max_model_len=profile.max_model_len,
        spec_method=spec.method,
        spec_k=spec.k,
        plan_outcome=plan.outcome,
        spec_reason=spec.reason,
    )
    log.info(
        "engine_started",
        vllm_version=info.vllm_version,
        backend=info.backend,
        model=str(model_dir),
        model_line=choice.line(),
        start_s=info.start_seconds,
        kv_capacity_tokens=info.kv_capacity_tokens,
        max_model_len=profile.max_model_len,
        dtype=profile.dtype,
        kv_cache_dtype=profile.kv_cache_dtype,
        executor=profile.executor,
        enforce_eager=profile.enforce_eager,
        spec_method=spec.method,
        spec_k=spec.k,
        spec_reason=spec.reason,
        plan=plan.outcome,
    )
    return Run(
        vllm=vllm,
        profile=profile,
        info=info,
        plan=plan,
        spec=spec,
        collector=collector,
        controller=controller,
        tokenizer=tokenizer,
        tokenize_pool=pool,
        started_at=time.monotonic(),
    )


async def stop_run(run: Run, timeout: float | None = 30.0) -> None:
    """Abort the run's requests, join its engine core (off the loop) and drop the AsyncLLM."""
    if run.active and not run.vllm.errored:
        await run.vllm.abort(list(run.active))
    t0 = time.perf_counter()
    await asyncio.to_thread(run.vllm.shutdown, timeout)
    run.tokenize_pool.shutdown(wait=False)
    run.vllm.release()
    gc.collect()  # drop the AsyncLLM now, not at interpreter exit (its __del__ warns)
    log.info("engine_stopped", shutdown_s=round(time.perf_counter() - t0, 2))


def _plan(
    model_dir: Path, profile: EngineProfile, k: int | None, adapter: str | None = None
) -> tuple[MemoryPlan, SpeculationPlan]:
    try:
        plan = plan_memory(model_dir, profile)
        draft, note = None, None
        if profile.speculative.method in ("auto", "draft"):
            draft, note = resolve_draft(profile.speculative.draft, adapter, model_dir)
            if note and profile.speculative.method == "draft":
                log.warning("spec_draft_unavailable", reason=note)
        spec = choose_speculation(profile, model_dir, k, draft, note)
    except (PlanError, ValueError) as exc:
        raise EngineStartError(str(exc)) from exc
    return plan, spec
