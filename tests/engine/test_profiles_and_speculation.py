"""Device profiles, the arguments handed to vLLM, speculative-method detection, the
acceptance controller and the repetition check (no vLLM needed)."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from agent.engine import EngineProfile, ProfileError, load_engine_profile
from agent.engine.args import engine_env, engine_kwargs
from agent.engine.paths import CACHE_DIR_ENV, default_model_dir
from agent.engine.profile import SpeculativeSettings
from agent.engine.repetition import RepetitionGuard, tail_repeats
from agent.engine.speculative import AcceptanceController, choose_speculation, detect_mtp
from bench.shapes import QWEN3_4B, QWEN3_NEXT
from tests.engine.conftest import ModelDirFactory

PROFILES = ["cpu-dev", "orin-nx-8gb", "orin-nx-16gb", "rtx4070-laptop-8gb", "h200-bench"]


@pytest.mark.parametrize("name", PROFILES)
def test_every_profile_validates_and_graphs_cover_speculation(name: str) -> None:
    profile = load_engine_profile(name)
    k = profile.speculative.num_speculative_tokens
    need = profile.graph_tokens_needed()
    sizes = profile.capture_sizes_for(k)
    if need:  # CUDA graphs in use: the widest verify batch must be captured
        assert sizes is not None
        assert max(sizes) >= profile.max_num_seqs * (1 + k) == need
        decode_sizes = {n * (1 + k) for n in range(1, profile.max_num_seqs + 1)}
        assert decode_sizes <= set(sizes)
    assert profile.max_num_batched_tokens >= profile.max_num_seqs


def test_unified_memory_cuda_profiles_state_the_start_check_fraction() -> None:
    for name in ("orin-nx-8gb", "orin-nx-16gb"):
        mem = load_engine_profile(name).memory
        assert mem.kv_cache_memory_bytes is not None
        assert mem.gpu_memory_utilization is not None
    with pytest.raises(ValidationError, match="gpu_memory_utilization must be set"):
        EngineProfile(
            device={"kind": "cuda", "unified_memory": True},
            memory={"kv_cache_memory_bytes": "1GiB"},
        )


def test_profile_rejects_unknown_keys_and_uncovered_graphs() -> None:
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        EngineProfile.model_validate({"max_num_seq": 4})
    with pytest.raises(ValidationError, match=r"max_num_seqs x \(1 \+ k\) = 16"):
        EngineProfile(
            device={"kind": "cuda"},
            memory={"gpu_memory_utilization": 0.8},
            max_num_seqs=4,
            cuda_graphs={"capture_sizes": [1, 2, 4, 8]},
        )


def test_unknown_profile_name_is_a_profile_error() -> None:
    with pytest.raises(ProfileError, match="no profile 'nope'"):
        load_engine_profile("nope")


def test_cpu_dev_model_path_follows_the_cache_dir(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path))
    profile = load_engine_profile("cpu-dev")
    assert profile.model_path() == default_model_dir() == tmp_path / "models" / "gemma3-270m"
    assert profile.compile_cache_path() == tmp_path / "vllm"


def test_engine_kwargs_for_cpu_dev_and_orin(model_dir: ModelDirFactory) -> None:
    folder = model_dir(QWEN3_4B)
    cpu = load_engine_profile("cpu-dev")
    spec = choose_speculation(cpu, folder)
    kw = engine_kwargs(cpu, folder, spec)
    assert kw["distributed_executor_backend"] == "uni"
    assert kw["kv_cache_memory_bytes"] == 256 << 20
    assert kw["max_num_seqs"] == 2 and kw["max_num_batched_tokens"] == 2048
    assert kw["enforce_eager"] is True and "compilation_config" not in kw
    assert kw["speculative_config"]["method"] == "ngram"
    env, remove = engine_env(cpu)
    assert env["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert "VLLM_CPU_KVCACHE_SPACE" in remove  # it would override kv_cache_memory_bytes

    orin = load_engine_profile("orin-nx-16gb")
    kw = engine_kwargs(orin, folder, choose_speculation(orin, folder))
    assert kw["compilation_config"]["cudagraph_mode"] == "FULL_DECODE_ONLY"
    assert kw["compilation_config"]["cudagraph_capture_sizes"] == [1, 2, 4, 8]
    assert kw["kv_cache_dtype"] == "fp8"
    assert "distributed_executor_backend" not in kw


# -- speculative method ----------------------------------------------------------------------


def test_mtp_detected_with_weights_in_the_index(model_dir: ModelDirFactory) -> None:
    folder = model_dir(QWEN3_NEXT, index_names=["model.embed_tokens.weight", "mtp.fc.weight"])
    info = detect_mtp(folder)
    assert info is not None
    assert (info.layers, info.field, info.weights_present) == (1, "mtp_num_hidden_layers", True)
    plan = choose_speculation(load_engine_profile("orin-nx-16gb"), folder)
    assert plan.vllm_config == {"method": "mtp", "num_speculative_tokens": 3}


def test_mtp_declared_inside_text_config(model_dir: ModelDirFactory) -> None:
    config = {"architectures": ["X"], "text_config": {**QWEN3_NEXT}}
    folder = model_dir(config, index_names=["model.language_model.mtp.layers.0.mlp.weight"])
    info = detect_mtp(folder)
    assert info is not None and info.weights_present is True


def test_deepseek_style_mtp_layers_after_the_decoder(model_dir: ModelDirFactory) -> None:
    config = {**QWEN3_4B, "num_hidden_layers": 2, "num_nextn_predict_layers": 2}
    folder = model_dir(
        config, index_names=["model.layers.1.mlp.weight", "model.layers.2.eh_proj.weight"]
    )
    info = detect_mtp(folder)
    assert info is not None and (info.layers, info.weights_present) == (2, True)
    # k=3 is not a multiple of the 2 MTP layers: vLLM would refuse it
    plan = choose_speculation(load_engine_profile("orin-nx-16gb"), folder)
    assert (plan.method, plan.k) == ("mtp", 2)


def test_declared_mtp_without_weights_falls_back_to_ngram(model_dir: ModelDirFactory) -> None:
    folder = model_dir(QWEN3_NEXT, index_names=["model.embed_tokens.weight"])
    profile = load_engine_profile("orin-nx-16gb")
    plan = choose_speculation(profile, folder)
    assert plan.method == "ngram" and "weights missing" in plan.reason
    explicit = profile.model_copy(
        update={"speculative": profile.speculative.model_copy(update={"method": "mtp"})}
    )
    with pytest.raises(ValueError, match="ships no weights"):
        choose_speculation(explicit, folder)
    # random weights everywhere (benchmarks): MTP mechanics are still worth running
    dummy = profile.model_copy(update={"load_format": "dummy"})
    assert choose_speculation(dummy, folder).method == "mtp"


def test_dense_model_gets_prompt_lookup(model_dir: ModelDirFactory) -> None:
    folder = model_dir(QWEN3_4B)
    assert detect_mtp(folder) is None
    plan = choose_speculation(load_engine_profile("cpu-dev"), folder)
    assert plan.vllm_config == {
        "method": "ngram",
        "num_speculative_tokens": 3,
        "prompt_lookup_min": 2,
        "prompt_lookup_max": 5,
    }
    assert choose_speculation(load_engine_profile("cpu-dev"), folder, k=0).vllm_config is None


# -- acceptance controller -------------------------------------------------------------------


def test_controller_steps_k_down_3_2_1_off_one_step_per_restart() -> None:
    settings = SpeculativeSettings(min_acceptance=0.6, window_draft_tokens=30)
    ctl = AcceptanceController(settings, running_k=3)
    assert ctl.observe(15, 14) is None  # half a window: no verdict yet
    assert ctl.observe(15, 14) is None  # 28/30 accepted
    assert ctl.last_window_acceptance == pytest.approx(28 / 30)
    step = ctl.observe(30, 10)  # 1/3 accepted
    assert step is not None and (step.from_k, step.to_k) == (3, 2)
    assert ctl.pending and ctl.target_k == 2
    assert ctl.observe(300, 0) is None  # still measuring the old k: ignored
    ctl.applied(2)
    assert ctl.observe(30, 17) is not None and ctl.target_k == 1  # 0.57 < 0.6
    ctl.applied(1)
    assert ctl.observe(30, 0) is not None and ctl.target_k == 0
    ctl.applied(0)
    assert ctl.observe(30, 0) is None  # off stays off
    assert [(s.from_k, s.to_k) for s in ctl.steps] == [(3, 2), (2, 1), (1, 0)]


def test_controller_holds_when_not_adaptive() -> None:
    ctl = AcceptanceController(SpeculativeSettings(adaptive=False, window_draft_tokens=16), 3)
    assert ctl.observe(16, 0) is None and ctl.target_k == 3


# -- repetition ----------------------------------------------------------------------------


def test_tail_repetition() -> None:
    guard = RepetitionGuard(min_pattern=4, max_pattern=16, min_count=3)
    loop = [7, 8, 9, 10, 11]
    assert tail_repeats([1, 2, 3] + loop * 3, guard)
    assert not tail_repeats([1, 2, 3] + loop * 2, guard)
    assert not tail_repeats([5] * 2 + [1, 2] * 5, guard)  # only 2-token loops: below min_pattern
    assert not tail_repeats(list(range(100)), guard)
