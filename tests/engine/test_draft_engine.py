"""The trained-draft path on the real vllm-cpu engine: the service resolves a draft folder
made by our trainer's checkpoint code, validates it against the served tuned model, and
vLLM starts its eagle3 method with it and drafts (an untrained head: acceptance is not the
point here, the mechanics are; the H200 run measures a trained one)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.engine import Engine, load_engine_profile
from agent.engine.model_config import read_config

torch = pytest.importorskip("torch")
eagle3 = pytest.importorskip("training.draft.eagle3")
pytest.importorskip("vllm")

pytestmark = [pytest.mark.vllm, pytest.mark.asyncio(loop_scope="session")]


async def test_service_starts_vllm_cpu_with_the_draft(smollm2_model: Path, tmp_path: Path) -> None:
    profile = load_engine_profile("cpu-dev")
    target_cfg = read_config(smollm2_model)
    shape = eagle3.DraftShape.from_target(target_cfg, 1024)
    head = eagle3.Eagle3Draft(shape)
    head.set_vocab(torch.arange(1024), torch.zeros(shape.vocab, shape.hidden))
    draft = tmp_path / "smollm2-135m-edge-eagle3"
    eagle3.save_draft(head, target_cfg, draft)
    spec = profile.speculative.model_copy(
        update={"method": "draft", "draft": str(draft), "num_speculative_tokens": 2}
    )
    profile = profile.model_copy(update={"model": str(smollm2_model), "speculative": spec})
    eng = Engine()
    await eng.start(profile)
    try:
        result = await eng.complete(
            [{"role": "user", "content": "Say: the belt on line two slipped."}], max_tokens=16
        )
        stats = eng.stats()
    finally:
        await eng.shutdown()
    assert result.text
    assert (stats.spec_method, stats.spec_k) == ("draft", 2)
    assert stats.spec_draft_tokens > 0 and stats.spec_mean_accepted_length is not None
