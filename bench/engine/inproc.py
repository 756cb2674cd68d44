"""vLLM's engine core inside the calling process: the synchronous `LLMEngine` with
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, stepped from a worker thread behind the few async calls
bench_runtime's child makes of an AsyncLLM (`generate`, `collective_rpc`, `shutdown`).

AsyncLLM itself refuses an in-process engine core in vLLM 0.26 ("Running EngineCore in
asyncio without multiprocessing is not currently supported"), so this is how one process,
one torch import and one CUDA context can serve, measured against the two processes of the
service today (docs/profiles.md, "vLLM's own memory"). One request at a time, as the
benchmark sends them; each `step` runs in a thread so the event loop stays free, and
nothing else touches the engine meanwhile.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Callable
from typing import Any


class InprocLLM:
    """One `LLMEngine` whose engine core runs in this process (no engine-core child)."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine

    @classmethod
    def from_engine_args(cls, kwargs: dict[str, Any]) -> InprocLLM:
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") != "0":
            raise RuntimeError("set VLLM_ENABLE_V1_MULTIPROCESSING=0 before importing vLLM")
        from vllm.engine.arg_utils import EngineArgs
        from vllm.v1.engine.llm_engine import LLMEngine

        return cls(LLMEngine.from_engine_args(EngineArgs(**kwargs)))

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        """The request's outputs as the engine steps (its `output_kind` as given)."""
        self._engine.add_request(request_id, prompt, params)
        try:
            while True:
                outs = await asyncio.to_thread(self._engine.step)
                for out in outs:
                    if out.request_id != request_id:
                        continue
                    yield out
                    if out.finished:
                        return
                if not self._engine.has_unfinished_requests():
                    return
        finally:
            if self._engine.has_unfinished_requests():
                self._engine.abort_request([request_id])

    async def collective_rpc(self, method: Callable[..., Any]) -> list[Any]:
        return list(await asyncio.to_thread(self._engine.collective_rpc, method))

    def shutdown(self) -> None:
        core = getattr(self._engine, "engine_core", None)
        if core is not None:
            core.shutdown()
