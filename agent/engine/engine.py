"""Our wrapper of vLLM's in-process AsyncLLM: start, generate, abort, health, stats, shutdown.

The supervisor and the pipelines depend on this small surface, never on vLLM. AsyncLLM
always runs its engine core in a child process: that child is what an OOM kill takes, and
vLLM's EngineDeadError (re-raised here as EngineDead) is how we learn it.

Decisions worth knowing:
- Starting blocks for seconds to minutes (model load, torch.compile, graph capture), so the
  AsyncLLM is constructed in a worker thread; the event loop keeps serving MQTT and keyword
  alerts meanwhile. vLLM supports construction outside a loop (its output tasks start
  lazily); we start them right after, so an engine-core failure is seen before the first
  request.
- The planner runs before vLLM is touched: a profile that cannot fit is refused with the
  planner's sentence (EngineWontFit) instead of an OOM in the middle of vLLM's startup.
- Prompts are tokenized with our own tokenizer instance on one dedicated thread: the
  Rust tokenizer is not safe to share with vLLM's detokenizer across threads, and a long
  transcript takes long enough to tokenize that it must not run on the loop.
- shutdown() aborts in-flight requests first (their streams end with finish_reason
  "abort" instead of hanging), then joins the engine core; after it no child is left, so
  start() can run again in the same process (the watchdog's restart).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import importlib.util
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import structlog

from agent.engine.args import apply_engine_env, engine_kwargs, supported_kwargs
from agent.engine.draft import resolve_draft
from agent.engine.errors import (
    EngineDead,
    EngineError,
    EngineNotRunning,
    EngineStartError,
    EngineWontFit,
)
from agent.engine.lazy import optional_module, require_module
from agent.engine.model_prep import ModelChoice, ModelPrepError, resolve_model
from agent.engine.planner import MemoryPlan, PlanError, plan_memory
from agent.engine.profile import EngineProfile
from agent.engine.repetition import RepetitionGuard, tail_repeats
from agent.engine.speculative import AcceptanceController, SpeculationPlan, choose_speculation
from agent.engine.stats import EngineStats, StatsCollector, stat_logger_factory
from pipelines.latency import TOKEN_BUCKETS_S, LatencyWindow

__all__ = [
    "ChatMessage",
    "Engine",
    "EngineHealth",
    "EngineInfo",
    "EngineState",
    "GenerationChunk",
    "GenerationResult",
]

log = structlog.get_logger(__name__)

ChatMessage = Mapping[str, str]  # {"role": ..., "content": ...}
EngineState = Literal["stopped", "starting", "running", "stopping", "dead"]
DEFAULT_GUARD = RepetitionGuard()


@dataclass(frozen=True)
class EngineInfo:
    vllm_version: str
    backend: str
    model_dir: Path
    model: ModelChoice
    start_seconds: float
    kv_capacity_tokens: int | None
    max_model_len: int
    spec_method: str
    spec_k: int
    plan_verdict: str
    spec_reason: str = ""  # why this method: MTP found, the draft used, or why not


@dataclass(frozen=True)
class EngineHealth:
    state: EngineState
    healthy: bool
    detail: str


@dataclass(frozen=True)
class GenerationChunk:
    """New output since the previous chunk of one request."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None  # stop, length, abort, repetition, error
    num_prompt_tokens: int
    num_cached_tokens: int | None  # prompt tokens served from the prefix cache


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int | None
    ttft_s: float | None
    total_s: float

    @property
    def tokens_per_s(self) -> float | None:
        """Decode rate after the first token (None for fewer than two tokens)."""
        if self.ttft_s is None or len(self.token_ids) < 2 or self.total_s <= self.ttft_s:
            return None
        return (len(self.token_ids) - 1) / (self.total_s - self.ttft_s)


@dataclass
class _Run:
    """Everything that belongs to one started engine; dropped whole at shutdown."""

    llm: Any
    profile: EngineProfile
    info: EngineInfo
    plan: MemoryPlan
    spec: SpeculationPlan
    collector: StatsCollector
    controller: AcceptanceController | None
    tokenizer: Any | None
    tokenize_pool: ThreadPoolExecutor
    dead_error: type[BaseException] | None
    supports_repetition: bool
    started_at: float
    active: set[str] = dataclasses.field(default_factory=set)
    requests: int = 0
    generated_tokens: int = 0


class Engine:
    """One embedded vLLM engine; start() again after shutdown() to restart it."""

    def __init__(self) -> None:
        self._state: EngineState = "stopped"
        self._run: _Run | None = None
        self._transition = asyncio.Lock()
        self._restarts = 0
        self._last_profile: EngineProfile | None = None
        self._last_controller: AcceptanceController | None = None
        self._applied_k: int | None = None  # k of the last start, once a step-down applied
        # What the last start chose to serve (known before vLLM is up, kept after it stops).
        self.model: ModelChoice | None = None
        # Request latencies over the engine's life (every run): /metrics' histograms.
        self.ttft = LatencyWindow()
        self.per_token = LatencyWindow(buckets=TOKEN_BUCKETS_S)

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self._state

    @property
    def info(self) -> EngineInfo | None:
        return self._run.info if self._run else None

    @property
    def profile(self) -> EngineProfile | None:
        return self._run.profile if self._run else self._last_profile

    async def start(
        self, profile: EngineProfile, *, speculative_k: int | None = None
    ) -> EngineInfo:
        """Plan, then start vLLM with `profile` (speculative_k overrides the profile's k).

        Raises:
            EngineWontFit: the planner says the profile cannot fit this model.
            EngineStartError: vLLM failed to start.
            EngineError: already running.
        """
        async with self._transition:
            if self._state in ("running", "starting"):
                raise EngineError(f"engine is already {self._state}")
            if self._run is not None:  # dead: clean up what is left first
                await self._teardown(self._run)
            if self._last_profile is not None:
                self._restarts += 1
            self._state = "starting"
            self._last_profile = profile
            try:
                self._run = await self._start(profile, speculative_k)
                if speculative_k is not None:
                    self._applied_k = speculative_k
            except BaseException:
                self._state = "stopped"
                raise
            self._state = "running"
            return self._run.info

    async def restart(self, profile: EngineProfile | None = None) -> EngineInfo:
        """Shut down and start again, applying the acceptance controller's k target."""
        current = self.profile
        new = profile or current
        if new is None:
            raise EngineError("never started: no profile to restart with")
        controller = self._run.controller if self._run else self._last_controller
        k: int | None
        if controller is not None and controller.pending:
            k = controller.target_k
        else:
            # Keep what was stepped down to: a restart for any other reason (the watchdog's)
            # must not climb back to the profile's k.
            k = self._applied_k
        if current is not None and new.speculative != current.speculative:
            # New speculative settings (a watchdog rung): their k, but never above what the
            # acceptance controller already stepped down to (a rung must not raise k).
            self._applied_k = None
            spec = new.speculative
            if k is not None and spec.enabled and spec.method == current.speculative.method:
                k = min(k, spec.num_speculative_tokens)
            else:
                k = None
        profile = new
        await self.shutdown()
        return await self.start(profile, speculative_k=k)

    async def shutdown(self, timeout: float | None = 30.0) -> None:
        """Abort in-flight requests, stop the engine core and wait for it to exit."""
        async with self._transition:
            run, self._run = self._run, None
            if run is None:
                self._state = "stopped"
                return
            self._state = "stopping"
            try:
                await self._teardown(run, timeout)
            finally:
                self._state = "stopped"

    async def __aenter__(self) -> Engine:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def _start(self, profile: EngineProfile, speculative_k: int | None) -> _Run:
        try:
            choice = await asyncio.to_thread(resolve_model, profile)
        except ModelPrepError as exc:
            raise EngineStartError(_name_missing_vllm(str(exc))) from exc
        self.model = choice
        model_dir = choice.path
        plan, spec = await asyncio.to_thread(
            _plan, model_dir, profile, speculative_k, choice.adapter
        )
        if not plan.fits:
            log.error("engine_refused", model=str(model_dir), verdict=plan.verdict)
            raise EngineWontFit(plan.verdict, plan.render())
        controller = (
            AcceptanceController(profile.speculative, spec.k) if spec.method != "off" else None
        )
        collector = StatsCollector(
            on_spec=controller.observe if controller else None,
            ttft=self.ttft,
            per_token=self.per_token,
        )
        apply_engine_env(profile)
        t0 = time.perf_counter()
        holder: list[Any] = []
        construct = asyncio.ensure_future(
            asyncio.to_thread(_construct, profile, model_dir, spec, collector, holder)
        )
        pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="engine-tokenize")
        try:
            # shield: a cancelled start cannot stop the thread; let it finish, then stop
            # the engine it built (the except below) instead of leaking its process.
            meta = await asyncio.shield(construct)
            llm = holder.pop()
            # Start vLLM's output tasks on our loop now (constructed off-loop they would
            # start at the first request), so an engine-core failure is noticed while idle.
            run_handler = getattr(llm, "_run_output_handler", None)
            if callable(run_handler):
                run_handler()
            tokenizer = None
            if not profile.skip_tokenizer_init:
                tokenizer = await asyncio.get_running_loop().run_in_executor(
                    pool, _load_tokenizer, model_dir
                )
            if profile.warmup:
                await _warm_up(llm, detokenize=not profile.skip_tokenizer_init)
        except BaseException as exc:
            pool.shutdown(wait=False)
            try:
                await construct
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
        elapsed = time.perf_counter() - t0
        collector.on_config(llm.vllm_config)
        info = EngineInfo(
            vllm_version=meta["version"],
            backend=meta["backend"],
            model_dir=model_dir,
            model=choice,
            start_seconds=round(elapsed, 2),
            kv_capacity_tokens=collector.kv_capacity_tokens,
            max_model_len=profile.max_model_len,
            spec_method=spec.method,
            spec_k=spec.k,
            plan_verdict=plan.verdict,
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
            plan=plan.verdict,
        )
        return _Run(
            llm=llm,
            profile=profile,
            info=info,
            plan=plan,
            spec=spec,
            collector=collector,
            controller=controller,
            tokenizer=tokenizer,
            tokenize_pool=pool,
            dead_error=meta["dead_error"],
            supports_repetition=meta["repetition_params"] is not None,
            started_at=time.monotonic(),
        )

    async def _teardown(self, run: _Run, timeout: float | None = 30.0) -> None:
        self._last_controller = run.controller
        if run.active and not run.llm.errored:
            await run.llm.abort(list(run.active))
        t0 = time.perf_counter()
        # Joins the engine-core process: blocking, so off the loop. vLLM's shutdown is
        # written to be called from another thread (it cancels its tasks thread-safely).
        await asyncio.to_thread(run.llm.shutdown, timeout)
        run.tokenize_pool.shutdown(wait=False)
        run.llm = None
        gc.collect()  # drop the AsyncLLM now, not at interpreter exit (its __del__ warns)
        log.info("engine_stopped", shutdown_s=round(time.perf_counter() - t0, 2))

    # -- requests ------------------------------------------------------------------------
    def _require(self) -> _Run:
        run = self._run
        if run is None or self._state != "running":
            if self._state == "dead":
                raise EngineDead("engine core died; restart it")
            raise EngineNotRunning(f"engine is {self._state}")
        return run

    async def encode(self, text: str) -> list[int]:
        """Token ids of plain text (no special tokens added)."""
        run = self._require()
        tok = _need_tokenizer(run)
        loop = asyncio.get_running_loop()
        ids = await loop.run_in_executor(run.tokenize_pool, _encode, tok, text)
        return ids

    async def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Token ids of `messages` under the model's chat template, ready for an answer."""
        run = self._require()
        tok = _need_tokenizer(run)
        loop = asyncio.get_running_loop()
        msgs = [dict(m) for m in messages]
        ids = await loop.run_in_executor(run.tokenize_pool, _encode_chat, tok, msgs)
        return ids

    async def generate(
        self,
        prompt: Sequence[int] | Sequence[ChatMessage],
        *,
        max_tokens: int = 256,
        temperature: float = 0.0,
        top_p: float = 1.0,
        seed: int | None = None,
        json_schema: Mapping[str, Any] | None = None,
        stop: Sequence[str] = (),
        repetition: RepetitionGuard | None = DEFAULT_GUARD,
        request_id: str | None = None,
    ) -> AsyncGenerator[GenerationChunk, None]:
        """Stream the answer to token ids or chat messages.

        json_schema constrains the output through vLLM structured outputs (bound arrays
        with maxItems: a small model otherwise repeats items until max_tokens).
        repetition stops a looping answer (finish_reason "repetition"); None disables it.
        Closing the iterator early aborts the request.

        Raises:
            EngineNotRunning, EngineDead, EngineError (bad request).
        """
        run = self._require()
        if prompt and not isinstance(prompt[0], int):
            ids = await self.encode_chat(prompt)  # type: ignore[arg-type]
        else:
            ids = [int(t) for t in prompt]  # type: ignore[arg-type]
        if not ids:
            raise EngineError("empty prompt")
        params = _sampling_params(
            run,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            json_schema=json_schema,
            stop=list(stop),
            repetition=repetition,
        )
        rid = request_id or uuid.uuid4().hex
        own_guard = repetition if repetition is not None and not run.supports_repetition else None
        async with contextlib.aclosing(self._stream(run, ids, params, rid, own_guard)) as chunks:
            async for chunk in chunks:
                yield chunk

    async def _stream(
        self,
        run: _Run,
        ids: list[int],
        params: Any,
        rid: str,
        own_guard: RepetitionGuard | None,
    ) -> AsyncGenerator[GenerationChunk, None]:
        prompt = {"prompt_token_ids": ids}  # vLLM's TokensPrompt is this TypedDict
        produced: list[int] = []
        t0 = last = time.perf_counter()
        run.active.add(rid)
        run.requests += 1
        # aclosing: vLLM's generator holds the AsyncLLM; left un-closed after our early
        # return it would keep the engine alive until interpreter exit.
        stream = run.llm.generate(prompt, params, rid)
        try:
            async with contextlib.aclosing(stream):
                async for out in stream:
                    comp = out.outputs[0]
                    new = tuple(comp.token_ids)
                    now = time.perf_counter()
                    if new:
                        if not produced:
                            run.collector.on_first_token(now - t0)
                        else:
                            run.collector.on_tokens(now - last, len(new))
                        last = now
                        produced.extend(new)
                        run.generated_tokens += len(new)
                    reason = comp.finish_reason
                    finished = bool(out.finished)
                    if not finished and own_guard and tail_repeats(produced, own_guard):
                        await run.llm.abort(rid)
                        finished, reason = True, "repetition"
                    if finished:
                        # Release vLLM's stream and our bookkeeping before the last yield:
                        # a consumer that stops at the final chunk never resumes us.
                        await stream.aclose()
                        run.active.discard(rid)
                    yield GenerationChunk(
                        request_id=rid,
                        text=comp.text,
                        token_ids=new,
                        finished=finished,
                        finish_reason=str(reason) if reason is not None else None,
                        num_prompt_tokens=len(ids),
                        num_cached_tokens=out.num_cached_tokens if finished else None,
                    )
                    if finished:
                        return
        except EngineError:
            raise
        except Exception as exc:
            if run.dead_error is not None and isinstance(exc, run.dead_error):
                self._state = "dead"
                log.error("engine_dead", error=str(exc))
                raise EngineDead(str(exc)) from exc
            # A bad request (prompt longer than max_model_len, invalid schema, ...): the
            # engine itself is fine. Callers see our exception type, never vLLM's.
            raise EngineError(f"{type(exc).__name__}: {exc}") from exc
        finally:
            run.active.discard(rid)

    async def complete(
        self,
        prompt: Sequence[int] | Sequence[ChatMessage],
        **kwargs: Any,
    ) -> GenerationResult:
        """generate() collected into one result (same keyword arguments)."""
        t0 = time.perf_counter()
        ttft: float | None = None
        text: list[str] = []
        tokens: list[int] = []
        last: GenerationChunk | None = None
        async for chunk in self.generate(prompt, **kwargs):
            if chunk.token_ids and ttft is None:
                ttft = time.perf_counter() - t0
            text.append(chunk.text)
            tokens.extend(chunk.token_ids)
            last = chunk
        if last is None:
            raise EngineError("the engine returned no output")
        return GenerationResult(
            request_id=last.request_id,
            text="".join(text),
            token_ids=tuple(tokens),
            finish_reason=last.finish_reason,
            num_prompt_tokens=last.num_prompt_tokens,
            num_cached_tokens=last.num_cached_tokens,
            ttft_s=ttft,
            total_s=time.perf_counter() - t0,
        )

    async def abort(self, request_id: str) -> None:
        """Abort one request; its stream ends with finish_reason "abort"."""
        run = self._require()
        await run.llm.abort(request_id)

    def core_pids(self) -> list[int]:
        """Process ids of the engine-core child(ren): what an OOM kill takes. Read from
        vLLM's process manager (an internal: [] where a version lays it out differently)."""
        run = self._run
        if run is None or run.llm is None:
            return []
        manager = getattr(
            getattr(getattr(run.llm, "engine_core", None), "resources", None),
            "engine_manager",
            None,
        )
        procs = getattr(manager, "processes", None) or []
        return [int(p.pid) for p in procs if getattr(p, "pid", None)]

    # -- health and stats ----------------------------------------------------------------
    async def health(self, timeout: float = 5.0) -> EngineHealth:
        run = self._run
        if run is None or self._state != "running":
            return EngineHealth(self._state, False, f"engine is {self._state}")
        try:
            await asyncio.wait_for(run.llm.check_health(), timeout)
        except Exception as exc:
            if run.llm.errored:
                self._state = "dead"
                log.error("engine_dead", error=str(exc))
            return EngineHealth(self._state, False, f"{type(exc).__name__}: {exc}")
        return EngineHealth("running", True, "ok")

    def stats(self) -> EngineStats:
        run = self._run
        snap = (
            run.collector if run else StatsCollector(ttft=self.ttft, per_token=self.per_token)
        ).snapshot()
        ctl = run.controller if run else None
        info = run.info if run else None
        return EngineStats(
            state=self._state,
            vllm_version=info.vllm_version if info else None,
            backend=info.backend if info else None,
            model=str(info.model_dir) if info else None,
            start_seconds=info.start_seconds if info else None,
            uptime_seconds=round(time.monotonic() - run.started_at, 1) if run else None,
            restarts=self._restarts,
            requests=run.requests if run else 0,
            requests_running=len(run.active) if run else 0,
            generated_tokens=run.generated_tokens if run else 0,
            spec_method=run.spec.method if run else "off",
            spec_k=ctl.running_k if ctl else 0,
            spec_target_k=ctl.target_k if ctl else 0,
            spec_window_acceptance=ctl.last_window_acceptance if ctl else None,
            spec_step_downs=len(ctl.steps) if ctl else 0,
            **snap,
        )


# -- helpers run in worker threads ----------------------------------------------------------


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


def _construct(
    profile: EngineProfile,
    model_dir: Path,
    spec: SpeculationPlan,
    collector: StatsCollector,
    holder: list[Any],
) -> dict[str, Any]:
    """Create the AsyncLLM and put it into `holder` (not returned: see below).

    vLLM and the libraries it imports on the way keep some caught exceptions, whose
    tracebacks keep this frame alive (frames reference their callers). A local or a
    return value holding the AsyncLLM would then outlive shutdown(), and its __del__
    would run at interpreter exit, when vLLM's module globals are already gone.
    """
    vllm = require_module("vllm")
    arg_utils = require_module("vllm.engine.arg_utils")
    async_llm = require_module("vllm.v1.engine.async_llm")
    platform = require_module("vllm.platforms").current_platform
    backend = str(getattr(platform, "device_type", "unknown"))
    log.info(
        "engine_starting", vllm_version=vllm.__version__, backend=backend, model=str(model_dir)
    )
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
    holder.append(async_llm.AsyncLLM.from_engine_args(args, stat_loggers=[factory]))
    return {
        "version": str(vllm.__version__),
        "backend": backend,
        "dead_error": getattr(exceptions, "EngineDeadError", None),
        "repetition_params": getattr(sampling, "RepetitionDetectionParams", None),
    }


async def _warm_up(llm: Any, *, detokenize: bool) -> None:
    """A 4-token greedy request on token ids valid in any vocabulary; straight to vLLM so
    that it does not count in our latency statistics."""
    sp = require_module("vllm.sampling_params")
    params = sp.SamplingParams(
        max_tokens=4, temperature=0.0, ignore_eos=True, detokenize=detokenize
    )
    stream = llm.generate({"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8]}, params, "warmup")
    async with contextlib.aclosing(stream):
        async for _ in stream:
            pass


def _load_tokenizer(model_dir: Path) -> Any:
    transformers = require_module("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)


def _encode(tokenizer: Any, text: str) -> list[int]:
    return [int(t) for t in tokenizer.encode(text, add_special_tokens=False)]


def _encode_chat(tokenizer: Any, messages: list[dict[str, str]]) -> list[int]:
    # Render to text, then encode: apply_chat_template(tokenize=True) returns different
    # types across transformers 4 and 5. The template adds its own special tokens.
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    return _encode(tokenizer, str(text))


def _need_tokenizer(run: _Run) -> Any:
    if run.tokenizer is None:
        raise EngineError("profile has skip_tokenizer_init: pass token ids, not text")
    return run.tokenizer


def _sampling_params(
    run: _Run,
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    json_schema: Mapping[str, Any] | None,
    stop: list[str],
    repetition: RepetitionGuard | None,
) -> Any:
    sp = require_module("vllm.sampling_params")
    kw: dict[str, Any] = {
        "max_tokens": max_tokens,
        "temperature": temperature,
        "top_p": top_p,
        "seed": seed,
        "output_kind": sp.RequestOutputKind.DELTA,  # chunks carry only what is new
    }
    if run.tokenizer is None:
        kw["detokenize"] = False  # skip_tokenizer_init: token ids only
    if stop:
        kw["stop"] = stop
    if json_schema is not None:
        if run.tokenizer is None:
            raise EngineError("JSON schemas need the tokenizer (skip_tokenizer_init is set)")
        kw["structured_outputs"] = sp.StructuredOutputsParams(json=dict(json_schema))
    if repetition is not None and run.supports_repetition:
        kw["repetition_detection"] = sp.RepetitionDetectionParams(
            max_pattern_size=repetition.max_pattern,
            min_pattern_size=repetition.min_pattern,
            min_count=repetition.min_count,
        )
    return sp.SamplingParams(**kw)


def _name_missing_vllm(error: str) -> str:
    """On a device without vLLM the default model cannot be prepared either (its converter
    needs torch): name vLLM first, or the status would send the operator after a model."""
    if importlib.util.find_spec("vllm") is None:
        return f"vLLM is not installed (see `agentctl doctor`); and: {error}"
    return error
