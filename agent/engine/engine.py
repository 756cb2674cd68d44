"""The embedded engine: `Engine`, the one object the supervisor and the pipelines hold.

It owns the engine's state machine (stopped, starting, running, stopping, dead) and its
public surface: start / restart / shutdown, encode / generate / complete / abort, health,
stats and the engine-core process ids. The parts live beside it, each in its module:
- run.py: one engine run: plan, start vLLM in a worker thread, stop it leaving no child;
- generate.py: streaming one request, the repetition guard, collecting a result;
- tokenizer.py: our own tokenizer instance, used on one dedicated thread per run;
- results.py: the types handed back (EngineInfo, EngineHealth, GenerationChunk, ...);
- vllm_api.py: vLLM itself, the only module that imports it. AsyncLLM always runs its
  engine core in a child process: that child is what an OOM kill takes, and vLLM's
  EngineDeadError (re-raised as EngineDead) is how we learn it.
The engine never restarts itself: the supervisor decides when, and on which profile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncGenerator, Mapping, Sequence
from typing import Any

import structlog

from agent.engine.errors import EngineDead, EngineError, EngineNotRunning, EngineStartError
from agent.engine.generate import collect, request_params, stream
from agent.engine.model_prep import ModelChoice, ModelPrepError, resolve_model
from agent.engine.profile import EngineProfile
from agent.engine.repetition import RepetitionGuard
from agent.engine.results import (
    ChatMessage,
    EngineHealth,
    EngineInfo,
    EngineState,
    GenerationChunk,
    GenerationResult,
)
from agent.engine.run import Run, start_run, stop_run
from agent.engine.speculative import AcceptanceController
from agent.engine.stats import EngineStats, StatsCollector
from agent.engine.tokenizer import encode, encode_chat
from agent.engine.vllm_api import vllm_installed
from pipelines.latency import TOKEN_BUCKETS_S, LatencyWindow

__all__ = ["Engine"]

log = structlog.get_logger(__name__)

DEFAULT_GUARD = RepetitionGuard()


class Engine:
    """One embedded vLLM engine; start() again after shutdown() to restart it."""

    def __init__(self) -> None:
        self._state: EngineState = "stopped"
        self._run: Run | None = None
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

    async def _start(self, profile: EngineProfile, speculative_k: int | None) -> Run:
        try:
            choice = await asyncio.to_thread(resolve_model, profile)
        except ModelPrepError as exc:
            raise EngineStartError(_name_missing_vllm(str(exc))) from exc
        self.model = choice
        return await start_run(
            profile, choice, speculative_k, ttft=self.ttft, per_token=self.per_token
        )

    async def _teardown(self, run: Run, timeout: float | None = 30.0) -> None:
        self._last_controller = run.controller
        await stop_run(run, timeout)

    def _died(self, exc: BaseException) -> None:
        self._state = "dead"
        log.error("engine_dead", error=str(exc))

    # -- requests ------------------------------------------------------------------------
    def _require(self) -> Run:
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
        ids = await loop.run_in_executor(run.tokenize_pool, encode, tok, text)
        return ids

    async def encode_chat(self, messages: Sequence[ChatMessage]) -> list[int]:
        """Token ids of `messages` under the model's chat template, ready for an answer."""
        run = self._require()
        tok = _need_tokenizer(run)
        loop = asyncio.get_running_loop()
        msgs = [dict(m) for m in messages]
        ids = await loop.run_in_executor(run.tokenize_pool, encode_chat, tok, msgs)
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
        logprobs: bool = False,
    ) -> AsyncGenerator[GenerationChunk, None]:
        """Stream the answer to token ids or chat messages.

        json_schema constrains the output through vLLM structured outputs (bound arrays
        with maxItems: a small model otherwise repeats items until max_tokens).
        repetition stops a looping answer (finish_reason "repetition"); None disables it.
        logprobs: each chunk carries its tokens' log-probabilities (`token_logprobs`).
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
        params = request_params(
            run,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            json_schema=json_schema,
            stop=list(stop),
            repetition=repetition,
            logprobs=logprobs,
        )
        rid = request_id or uuid.uuid4().hex
        own_guard = (
            repetition if repetition is not None and not run.vllm.supports_repetition else None
        )
        async with contextlib.aclosing(
            stream(run, ids, params, rid, own_guard=own_guard, died=self._died)
        ) as chunks:
            async for chunk in chunks:
                yield chunk

    async def complete(
        self,
        prompt: Sequence[int] | Sequence[ChatMessage],
        **kwargs: Any,
    ) -> GenerationResult:
        """generate() collected into one result (same keyword arguments)."""
        return await collect(self.generate(prompt, **kwargs))

    async def abort(self, request_id: str) -> None:
        """Abort one request; its stream ends with finish_reason "abort"."""
        run = self._require()
        await run.vllm.abort(request_id)

    def core_pids(self) -> list[int]:
        """Process ids of the engine-core child(ren): what an OOM kill takes. Read from
        vLLM's process manager (an internal: [] where a version lays it out differently)."""
        run = self._run
        return run.vllm.core_pids() if run is not None else []

    # -- health and stats ----------------------------------------------------------------
    async def health(self, timeout: float = 5.0) -> EngineHealth:
        run = self._run
        if run is None or self._state != "running":
            return EngineHealth(self._state, False, f"engine is {self._state}")
        try:
            await asyncio.wait_for(run.vllm.check_health(), timeout)
        except Exception as exc:
            if run.vllm.errored:
                self._died(exc)
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


def _need_tokenizer(run: Run) -> Any:
    if run.tokenizer is None:
        raise EngineError("profile has skip_tokenizer_init: pass token ids, not text")
    return run.tokenizer


def _name_missing_vllm(error: str) -> str:
    """On a device without vLLM the default model cannot be prepared either (its converter
    needs torch): name vLLM first, or the status would send the operator after a model."""
    if not vllm_installed():
        return f"vLLM is not installed (see `agentctl doctor`); and: {error}"
    return error
