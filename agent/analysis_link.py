"""The daemon's side of the slow tier: the engine and its tokenizer behind the protocols
pipelines.analysis declares (AnalysisLlm, TokenCodec).

Requests go through the engine supervisor (agent.supervision): it admits new analyses only
while the engine serves and memory is not tight, and learns from every failed request.
The tokenizer is our own instance, loaded once from the engine's model folder on a thread
of its own: contexts live in the agent and must outlive engine restarts, and a Rust
tokenizer shared across threads fails with "Already borrowed".
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import structlog

from agent.engine import EngineDead, EngineNotRunning
from agent.engine.lazy import require_module
from agent.engine.results import GenerationResult
from agent.supervision import EngineSupervisor
from pipelines.analysis import LlmUnavailable
from pipelines.analysis_prompt import ChatFrame, chat_frame_of, encode_texts

__all__ = ["EngineCodec", "EngineLlm"]

log = structlog.get_logger(__name__)


class EngineLlm:
    """AnalysisLlm over the supervised engine."""

    def __init__(self, supervisor: EngineSupervisor) -> None:
        self.supervisor = supervisor

    async def wait_ready(self) -> None:
        # admit, not ready: under memory pressure (warn) no new analysis starts
        await self.supervisor.admit.wait()

    async def complete(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        json_schema: Mapping[str, Any] | None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
    ) -> GenerationResult:
        try:
            return await self.supervisor.complete(
                prompt,
                max_tokens=max_tokens,
                json_schema=json_schema,
                stop=stop,
                logprobs=logprobs,
            )
        except (EngineNotRunning, EngineDead) as exc:  # the supervisor already knows
            raise LlmUnavailable(str(exc)) from exc


class EngineCodec:
    """TokenCodec with the model's own tokenizer, loaded when the engine first served."""

    def __init__(self, supervisor: EngineSupervisor, ready_timeout_s: float = 30.0) -> None:
        self.supervisor = supervisor
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="context-tokenize")
        self._tokenizer: Any | None = None
        self._loading = asyncio.Lock()
        self._ready_timeout_s = ready_timeout_s

    async def _get(self) -> Any:
        if self._tokenizer is not None:
            return self._tokenizer
        # Wait for the engine outside the lock and within a bound: a caller must not hang
        # on an engine that is restarting or degraded, nor hold up the others while it waits.
        try:
            await asyncio.wait_for(self.supervisor.ready.wait(), self._ready_timeout_s)
        except asyncio.TimeoutError as exc:
            raise LlmUnavailable(
                f"engine not serving within {self._ready_timeout_s:.0f} s"
            ) from exc
        async with self._loading:
            if self._tokenizer is None:
                info = self.supervisor.engine.info
                if info is None:
                    raise LlmUnavailable("engine is not running")
                loop = asyncio.get_running_loop()
                self._tokenizer = await loop.run_in_executor(
                    self._pool, _load_tokenizer, info.model_dir
                )
            return self._tokenizer

    async def encode(self, texts: Sequence[str], *, trusted: bool) -> list[list[int]]:
        tok = await self._get()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(
            self._pool, lambda: encode_texts(tok, list(texts), trusted=trusted)
        )

    async def chat_frame(self) -> ChatFrame:
        tok = await self._get()
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, chat_frame_of, tok)

    def close(self) -> None:
        self._pool.shutdown(wait=False)


def _load_tokenizer(model_dir: Path) -> Any:
    transformers = require_module("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
