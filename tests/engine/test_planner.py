"""The memory planner against numbers computed by hand (no vLLM needed).

KV bytes per token = 2 (K and V) x full-attention layers x KV heads x head dim x bytes,
and vLLM's pool holds floor(budget / (bytes per token x block size)) blocks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from agent.engine import (
    EngineProfile,
    EngineWontFit,
    load_engine_profile,
    plan_memory,
)
from agent.engine.profile import DeviceSettings, MemorySettings
from tests.engine.conftest import ModelDirFactory
from tests.engine.model_configs import QWEN3_4B, QWEN3_NEXT, SMOLLM2, smollm2_tensor_shapes

GiB = 1 << 30
K128 = 131072


def kv_profile(kv_bytes: int, **update: object) -> EngineProfile:
    """A CUDA profile with a fixed KV budget on a machine too large to be the limit."""
    base = EngineProfile(
        device=DeviceSettings(kind="cuda", memory_bytes=512 * GiB, unified_memory=True),
        memory=MemorySettings(kv_cache_memory_bytes=kv_bytes, gpu_memory_utilization=0.5),
        max_model_len=K128,
        enforce_eager=True,
        speculative={"method": "off"},
    )
    return base.model_copy(update=update)


# -- dense Qwen3-4B ------------------------------------------------------------------------

QWEN3_4B_PARAMS = (
    151936 * 2560  # embeddings, tied with the LM head
    + 36
    * (
        2560 * 32 * 128  # q
        + 2 * 2560 * 8 * 128  # k, v
        + 32 * 128 * 2560  # o
        + 2 * 128  # q_norm, k_norm
        + 3 * 2560 * 9728  # gate, up, down
        + 2 * 2560  # the two RMSNorms
    )
    + 2560  # final norm
)


def test_dense_qwen3_4b_kv_per_token_and_weights(model_dir: ModelDirFactory) -> None:
    folder = model_dir(QWEN3_4B)
    plan = plan_memory(folder, kv_profile(20 * GiB, kv_cache_dtype="auto"))
    assert plan.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    assert QWEN3_4B_PARAMS == 4_022_468_096
    assert plan.weight_bytes == QWEN3_4B_PARAMS * 2  # bf16, estimated from the config
    assert plan.position_limit == 4 * 32768  # YaRN x4
    assert plan.kv_needed_bytes == K128 * 147_456  # 19.3 GB
    assert plan.fits
    assert plan.verdict == "fits 128K with bf16 KV"


def test_dense_qwen3_4b_does_not_fit_a_4_gb_kv_budget(model_dir: ModelDirFactory) -> None:
    plan = plan_memory(model_dir(QWEN3_4B), kv_profile(4_100_000_000))
    assert not plan.fits
    assert plan.verdict == "does not fit: 19.3 GB of KV needed, 4.1 GB available"
    # 4.1e9 // (147,456 B x 16 tokens per block) = 1737 blocks
    assert plan.kv_capacity_tokens == 1737 * 16 == 27_792
    # fp8 halves the bytes per token: 4.1e9 // (73,728 x 16) = 3475 blocks
    assert plan.max_context_fp8_tokens == 3475 * 16


def test_dense_qwen3_4b_refused_by_orin_16gb_at_128k(model_dir: ModelDirFactory) -> None:
    profile = load_engine_profile("orin-nx-16gb").model_copy(
        update={"model": str(model_dir(QWEN3_4B))}
    )
    plan = plan_memory(profile.model_path(), profile)
    # fp8 KV: 131072 x 73,728 B = 9.66 GB needed; the profile's 2 GiB = 2.15 GB
    assert plan.kv_bytes_per_token == 73_728
    assert plan.verdict.startswith("does not fit: 9.7 GB of KV needed, 2.1 GB available")
    # 2 GiB // (73,728 x 16) = 1820 blocks
    assert plan.max_context_tokens == 1820 * 16 == 29_120
    # and the bf16 weights alone (8.04 GB) exceed what the profile leaves the engine
    assert "the engine needs" in plan.verdict


async def test_engine_refuses_a_profile_that_cannot_fit(model_dir: ModelDirFactory) -> None:
    psutil = pytest.importorskip("psutil")
    from agent.engine import Engine

    profile = load_engine_profile("orin-nx-16gb").model_copy(
        update={"model": str(model_dir(QWEN3_4B))}
    )
    children_before = {p.pid for p in psutil.Process().children(recursive=True)}
    engine = Engine()
    with pytest.raises(EngineWontFit) as caught:
        await engine.start(profile)
    assert caught.value.verdict.startswith("does not fit: 9.7 GB of KV needed")
    assert "verdict" in caught.value.plan_text
    assert engine.state == "stopped"
    # refused before vLLM was asked for anything: no engine process was started
    children_after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert children_after <= children_before


def test_position_limit_without_rope_scaling(model_dir: ModelDirFactory) -> None:
    config = {**QWEN3_4B, "rope_scaling": None}
    plan = plan_memory(model_dir(config), kv_profile(20 * GiB))
    assert plan.position_limit == 40960
    assert "exceeds the model's 40,960 positions" in plan.verdict


# -- Qwen3-Next-style hybrid -----------------------------------------------------------------

# Per sequence, per Gated DeltaNet layer: the recurrent state (value heads x key dim x value
# dim) and the conv state ((2 x key heads x key dim + value heads x value dim) x (kernel - 1)).
GDN_STATE = 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3  # 548,864 elements


@pytest.mark.parametrize("layout", ["interval", "layer_types", "text_config"])
def test_hybrid_counts_only_full_attention_layers(model_dir: ModelDirFactory, layout: str) -> None:
    config = dict(QWEN3_NEXT)
    if layout != "interval":  # Qwen3.5 writes the layout out, VL wrappers nest it
        del config["full_attention_interval"]
        config["layer_types"] = [
            "full_attention" if (i + 1) % 4 == 0 else "linear_attention" for i in range(48)
        ]
    if layout == "text_config":
        config = {"architectures": ["Qwen3_5ForConditionalGeneration"], "text_config": config}
    plan = plan_memory(model_dir(config), kv_profile(4 * GiB, kv_cache_dtype="auto"))
    shape = plan.shape
    assert (shape.full_attention_layers, shape.linear_layers) == (12, 36)
    assert plan.kv_bytes_per_token == 2 * 12 * 2 * 256 * 2 == 24_576
    assert plan.fixed_bytes_per_seq == 36 * GDN_STATE * 2 == 39_518_208
    # (4 GiB - one sequence's state) // (24,576 x 16) = 10822 blocks
    assert plan.kv_capacity_tokens == 10822 * 16 == 173_152
    assert plan.kv_needed_bytes == K128 * 24_576 + 39_518_208  # 3.26 GB < 4 GiB
    assert plan.verdict == "fits 128K with bf16 KV"


def test_hybrid_fp8_halves_kv_but_not_the_recurrent_state(model_dir: ModelDirFactory) -> None:
    plan = plan_memory(model_dir(QWEN3_NEXT), kv_profile(2 * GiB, kv_cache_dtype="fp8"))
    assert plan.kv_bytes_per_token == 12_288
    assert plan.fixed_bytes_per_seq == 39_518_208
    assert plan.verdict == "fits 128K with fp8 KV"


def test_sliding_window_layers_are_capped_at_the_window(model_dir: ModelDirFactory) -> None:
    # Gemma-3-like: five sliding layers (window 1024) per full one.
    config = {
        **SMOLLM2,
        "num_hidden_layers": 12,
        "sliding_window": 1024,
        "layer_types": [
            "full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(12)
        ],
    }
    plan = plan_memory(model_dir(config), kv_profile(GiB, max_model_len=8192))
    per_layer = 2 * 3 * 64 * 2
    assert plan.kv_bytes_per_token == 2 * per_layer
    assert plan.fixed_bytes_per_seq == 10 * 1024 * per_layer


def test_mla_stores_one_latent_per_token(model_dir: ModelDirFactory) -> None:
    # DeepSeek-V2-Lite-like: kv_lora_rank 512 + qk_rope_head_dim 64 per layer, not K and V.
    config = {
        "architectures": ["DeepseekV2ForCausalLM"],
        "model_type": "deepseek_v2",
        "vocab_size": 102400,
        "hidden_size": 2048,
        "intermediate_size": 10944,
        "num_hidden_layers": 27,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "kv_lora_rank": 512,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "max_position_embeddings": 163840,
    }
    plan = plan_memory(model_dir(config), kv_profile(8 * GiB))
    assert plan.kv_bytes_per_token == 27 * (512 + 64) * 2 == 31_104


# -- SmolLM2 (the default model) -------------------------------------------------------------

SMOLLM2_PARAMS = (
    49152 * 576  # embeddings (tied)
    + 30 * (576 * 576 * 2 + 192 * 576 * 2 + 3 * 576 * 1536 + 2 * 576)
    + 576
)


def test_smollm2_from_safetensors_headers_on_cpu_dev(model_dir: ModelDirFactory) -> None:
    folder = model_dir(SMOLLM2, tensors=smollm2_tensor_shapes())
    profile = load_engine_profile("cpu-dev")
    plan = plan_memory(folder, profile)
    assert SMOLLM2_PARAMS == 134_515_008
    assert plan.weight_bytes == SMOLLM2_PARAMS * 2 == 269_030_016
    assert plan.weights_source == "1 safetensors file"
    assert plan.kv_bytes_per_token == 2 * 30 * 3 * 64 * 2 == 23_040
    # 256 MiB // (23,040 B x 128-token CPU blocks) = 91 blocks; vLLM logs the same 11,648
    assert plan.kv_capacity_tokens == 91 * 128 == 11_648
    assert plan.verdict == "fits 8K with bf16 KV"


def test_smollm2_real_converted_checkpoint(default_model: Path) -> None:
    plan = plan_memory(default_model, load_engine_profile("cpu-dev"))
    assert plan.weight_bytes == 269_030_016
    assert plan.kv_capacity_tokens == 11_648


def test_plan_render_prints_the_numbers_and_the_verdict(model_dir: ModelDirFactory) -> None:
    folder = model_dir(SMOLLM2, tensors=smollm2_tensor_shapes())
    text = plan_memory(folder, load_engine_profile("cpu-dev")).render("cpu-dev")
    lines = text.splitlines()
    assert lines[0].split() == ["profile", "cpu-dev"]
    assert lines[-1].split(None, 1) == ["verdict", "fits 8K with bf16 KV"]
    assert "23.0 KB bf16 (30 full-attention layers" in text
    assert "11,648 tokens" in text
    assert "0.3 GB bfloat16 (1 safetensors file)" in text
