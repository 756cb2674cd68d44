"""Streaming one request: chunks out of vLLM's stream, timed, guarded against repetition.

`Engine.generate` (agent/engine/engine.py) turns a prompt into token ids and sampling
parameters and iterates `stream`; `Engine.complete` is `collect` over it. Two rules:
- vLLM's stream holds the AsyncLLM: it is always closed (aclosing), and closed *before*
  the final chunk is yielded, since a consumer that stops at the final chunk never resumes
  us.
- Callers see our exceptions only: vLLM's EngineDeadError becomes EngineDead (and the
  engine is marked dead); any other failure of a request is an EngineError.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from typing import Any

from agent.engine.errors import EngineDead, EngineError
from agent.engine.repetition import RepetitionGuard, tail_repeats
from agent.engine.results import GenerationChunk, GenerationResult
from agent.engine.run import Run
from agent.engine.vllm_api import Output
from pipelines.analysis.protocols import TokenLogprob

__all__ = ["collect", "request_params", "stream"]


def request_params(
    run: Run,
    *,
    max_tokens: int,
    temperature: float,
    top_p: float,
    seed: int | None,
    json_schema: Mapping[str, Any] | None,
    stop: list[str],
    repetition: RepetitionGuard | None,
    logprobs: bool = False,
) -> Any:
    """vLLM's sampling parameters for one request on this run."""
    if json_schema is not None and run.tokenizer is None:
        raise EngineError("JSON schemas need the tokenizer (skip_tokenizer_init is set)")
    return run.vllm.sampling_params(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        detokenize=run.tokenizer is not None,
        stop=stop,
        json_schema=json_schema,
        repetition=repetition if run.vllm.supports_repetition else None,
        logprobs=logprobs,
    )


async def stream(
    run: Run,
    ids: list[int],
    params: Any,
    rid: str,
    *,
    own_guard: RepetitionGuard | None,
    died: Callable[[BaseException], None],
) -> AsyncGenerator[GenerationChunk, None]:
    """The chunks of request `rid`; `own_guard` is our repetition guard where vLLM has
    none; `died` is told when the engine core turns out dead."""
    produced: list[int] = []
    t0 = last = time.perf_counter()
    run.active.add(rid)
    run.requests += 1
    # aclosing: vLLM's generator holds the AsyncLLM; left un-closed after our early
    # return it would keep the engine alive until interpreter exit.
    outputs = run.vllm.generate(ids, params, rid)
    try:
        async with contextlib.aclosing(outputs):
            async for raw in outputs:
                out = Output(raw)
                new = out.token_ids
                now = time.perf_counter()
                if new:
                    if not produced:
                        run.collector.on_first_token(now - t0)
                    else:
                        run.collector.on_tokens(now - last, len(new))
                    last = now
                    produced.extend(new)
                    run.generated_tokens += len(new)
                reason = out.finish_reason
                finished = out.finished
                if not finished and own_guard and tail_repeats(produced, own_guard):
                    await run.vllm.abort(rid)
                    finished, reason = True, "repetition"
                if finished:
                    # Release vLLM's stream and our bookkeeping before the last yield:
                    # a consumer that stops at the final chunk never resumes us.
                    await outputs.aclose()
                    run.active.discard(rid)
                yield GenerationChunk(
                    request_id=rid,
                    text=out.text,
                    token_ids=new,
                    finished=finished,
                    finish_reason=reason,
                    num_prompt_tokens=len(ids),
                    num_cached_tokens=out.num_cached_tokens if finished else None,
                    token_logprobs=out.token_logprobs,
                )
                if finished:
                    return
    except EngineError:
        raise
    except Exception as exc:
        if run.vllm.is_dead(exc):
            died(exc)
            raise EngineDead(str(exc)) from exc
        # A bad request (prompt longer than max_model_len, invalid schema, ...): the
        # engine itself is fine. Callers see our exception type, never vLLM's.
        raise EngineError(f"{type(exc).__name__}: {exc}") from exc
    finally:
        run.active.discard(rid)


async def collect(chunks: AsyncIterator[GenerationChunk]) -> GenerationResult:
    """A request's chunks collected into one result, timed from this call."""
    t0 = time.perf_counter()
    ttft: float | None = None
    text: list[str] = []
    tokens: list[int] = []
    scored: list[TokenLogprob] | None = []
    last: GenerationChunk | None = None
    async for chunk in chunks:
        if chunk.token_ids and ttft is None:
            ttft = time.perf_counter() - t0
        text.append(chunk.text)
        tokens.extend(chunk.token_ids)
        if chunk.token_logprobs is None:
            scored = None  # one chunk without them: the answer has none
        elif scored is not None:
            scored.extend(chunk.token_logprobs)
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
        tokens=tuple(scored) if scored is not None and len(scored) == len(tokens) else None,
    )
