"""The memory planner against numbers computed by hand (no vLLM needed).

KV bytes per token = 2 (K and V) x full-attention layers x KV heads x head dim x bytes,
and vLLM's pool holds floor(budget / (bytes per token x block size)) blocks.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from agent.engine import (
    EngineProfile,
    EngineWontFit,
    load_engine_profile,
    plan_memory,
)
from agent.engine.profile import DeviceSettings, MemorySettings
from bench.shapes import QWEN3_4B, QWEN3_NEXT, SMOLLM2, smollm2_tensor_shapes
from tests.engine.conftest import ModelDirFactory

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
    assert plan.outcome == "fits 128K with bf16 KV"


def test_dense_qwen3_4b_does_not_fit_a_4_gb_kv_budget(model_dir: ModelDirFactory) -> None:
    plan = plan_memory(model_dir(QWEN3_4B), kv_profile(4_100_000_000))
    assert not plan.fits
    assert plan.outcome == "does not fit: 19.3 GB of KV needed, 4.1 GB available"
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
    assert plan.outcome.startswith("does not fit: 9.7 GB of KV needed, 2.1 GB available")
    # 2 GiB // (73,728 x 16) = 1820 blocks
    assert plan.max_context_tokens == 1820 * 16 == 29_120
    # and the bf16 weights alone (8.04 GB) exceed what the profile leaves the engine
    assert "the engine needs" in plan.outcome


@pytest.mark.slow  # the real Engine: imports vLLM, watches for child processes
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
    assert caught.value.outcome.startswith("does not fit: 9.7 GB of KV needed")
    assert "outcome" in caught.value.plan_text
    assert engine.state == "stopped"
    # refused before vLLM was asked for anything: no engine process was started
    children_after = {p.pid for p in psutil.Process().children(recursive=True)}
    assert children_after <= children_before


def test_position_limit_without_rope_scaling(model_dir: ModelDirFactory) -> None:
    config = {**QWEN3_4B, "rope_scaling": None}
    plan = plan_memory(model_dir(config), kv_profile(20 * GiB))
    assert plan.position_limit == 40960
    assert "exceeds the model's 40,960 positions" in plan.outcome


# -- Qwen3-Next-style hybrid -----------------------------------------------------------------

# Per sequence, per Gated DeltaNet layer: the recurrent state (value heads x key dim x value
# dim) and the conv state ((2 x key heads x key dim + value heads x value dim) x (kernel - 1
# + k), k the speculative tokens), in the model dtype.
GDN_STATE = 32 * 128 * 128 + (2 * 16 * 128 + 32 * 128) * 3  # 548,864 elements at k = 0

# On a GPU vLLM gives every layer the same page: the attention block is the number of
# tokens whose K and V fill one GDN layer's state, in multiples of 16. The 12 attention and
# 36 GDN layers form 4 groups of 12 (one attention, three GDN); one block id takes a page in
# each of the 12 tensors. With prefix caching (mamba align mode) a sequence holds 2 + k
# blocks in each GDN group, and one more in each while a prefill chunk crosses a block (its
# peak, measured: test_the_peak_is_where_vllm_stalled); the attention group ceil(tokens /
# block).


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
    # bf16 KV: 2 x 2 x 256 x 2 B = 2,048 B a token a layer; 1,097,728 B of state a layer
    # -> blocks of 16 x ceil(1,097,728 / (16 x 2,048)) = 544 tokens, pages of 1,114,112 B
    lo = plan.layout
    assert lo is not None
    assert GDN_STATE * 2 == 1_097_728
    assert (lo.block_size, lo.page_bytes, lo.group_size) == (544, 544 * 2048, 12)
    assert plan.kv_bytes_per_token == 2 * 12 * 2 * 256 * 2 == 24_576
    block_bytes = 12 * 544 * 2048  # 13,369,344
    assert plan.fixed_bytes_per_seq == 3 * (2 + 1) * block_bytes == 120_324_096
    # 4 GiB // 13,369,344 = 321 blocks, one of them vLLM's null block, 9 one sequence's state
    # at its peak
    assert plan.kv_capacity_tokens == (321 - 1 - 9) * 544 == 169_184
    assert plan.kv_needed_bytes == (-(-K128 // 544) + 9 + 1) * block_bytes  # 3.35 GB < 4 GiB
    assert plan.outcome == "fits 128K with bf16 KV"


def test_hybrid_fp8_halves_kv_but_not_the_recurrent_state(model_dir: ModelDirFactory) -> None:
    plan = plan_memory(model_dir(QWEN3_NEXT), kv_profile(2 * GiB, kv_cache_dtype="fp8"))
    lo = plan.layout
    assert lo is not None
    # the same 1,097,728 B state page holds twice the fp8 tokens: 16 x 67 = 1,072
    assert (lo.block_size, lo.page_bytes) == (1072, 1072 * 1024)
    assert lo.page_bytes == GDN_STATE * 2
    assert plan.kv_bytes_per_token == 12_288
    assert plan.fixed_bytes_per_seq == 9 * 12 * GDN_STATE * 2 == 118_554_624
    assert plan.outcome == "fits 128K with fp8 KV"


MEASURED_INT4 = Path(__file__).parents[2] / "bench/engine/results/h200-2026-12-01-int4"
MEASURED = Path(__file__).parents[2] / "bench/engine/results/h200-2026-12-01-profiles"


def _measured_run() -> dict[str, Any]:
    data = json.loads((MEASURED / "a-results.json").read_text())
    run: dict[str, Any] = data["runs"]["orin-nx-16gb:full"]
    return run


def _as_run(profile: EngineProfile, run: dict[str, Any], folder: Path) -> EngineProfile:
    """`profile` as the run started it (its token budget and fixed KV pool)."""
    kw = run["kwargs"]
    memory = profile.memory
    if kw.get("kv_cache_memory_bytes"):
        memory = memory.model_copy(update={"kv_cache_memory_bytes": kw["kv_cache_memory_bytes"]})
    return profile.model_copy(
        update={"model": str(folder), "load_format": kw["load_format"],
                "max_num_batched_tokens": kw["max_num_batched_tokens"], "memory": memory}
    )  # fmt: skip


def test_hybrid_4b_layout_is_the_one_vllm_built_on_the_h200(model_dir: ModelDirFactory) -> None:
    """The orin-nx-16gb run of issue 20 (vLLM 0.26, H200, random GPTQ weights, MTP k=3)."""
    run = _measured_run()
    folder = model_dir(run["config"])
    profile = _as_run(load_engine_profile("orin-nx-16gb"), run, folder)
    plan = plan_memory(folder, profile)
    kv, attn = run["kv"], run["kv"]["groups"][-1]
    lo = plan.layout
    assert lo is not None
    # the MTP layer has KV too: 13 attention layers; conv state with k = 3 extra rows
    assert attn["type"] == "FullAttentionSpec" and attn["layers"] == lo.attention_layers == 13
    assert (lo.block_size, lo.page_bytes) == (kv["cache_block_size"], attn["page_size_bytes"])
    assert lo.group_size == kv["num_tensors"] == 13
    assert lo.blocks(plan.kv_budget_bytes) == kv["num_blocks"] == 144
    assert lo.state_blocks == kv["state_pages_per_seq"] == 15
    assert lo.state_bytes_per_seq == kv["state_bytes_per_seq"]
    # the planner plans the peak: one more block in each of the 3 GDN groups
    assert plan.fixed_bytes_per_seq == kv["state_bytes_per_seq"] + 3 * lo.block_bytes
    assert plan.kv_bytes_per_token == kv["attn_bytes_per_token"] == 13_312
    # vLLM's count (the probe's one_seq_tokens) less the 3 transient blocks and the null one
    assert plan.kv_capacity_tokens == kv["one_seq_tokens"] - 4 * 1120 == 140_000
    # vLLM's start check adds up layers (padding not counted); the pool needs whole blocks
    check = sum(g["max_memory_usage_bytes"] * g["layers"] for g in kv["groups"])
    assert plan.kv_needed_bytes == (lo.blocks_per_seq(K128) + 1) * lo.block_bytes
    held = lo.blocks_per_seq(K128) - 3
    assert held == run["changes"]["kv_need_predicted"]["blocks_per_seq"]
    assert check <= held * lo.block_bytes <= 1.01 * check
    # a dummy load left the GPTQ projections in bf16: the planner plans what vLLM loaded
    measured = run["after_load"]["worker"]["model_memory_usage"]
    assert "not applied by a dummy load" in plan.weights_source
    assert abs(plan.weight_bytes / measured - 1) < 0.01
    assert plan.activation_bytes == pytest.approx(
        run["at_window"]["worker"]["max_allocated"] - run["at_window"]["allocated_before"],
        rel=0.10,
    )
    # the KV holds 128K; what does not fit on the 16 GB module is the bf16 weights
    assert plan.outcome.startswith("does not fit: the engine needs 15.3 GB (weights 8.1 GB")


def _runtime(run: dict[str, Any]) -> int:
    """vLLM's processes (RSS) + their GPU memory beyond torch's, after load."""
    proc, worker = run["after_load"]["proc"], run["after_load"]["worker"]
    return int(proc["host_rss_total"] + proc["gpu_ours"] - worker["reserved"])


@pytest.mark.parametrize(
    ("results", "name", "cold"),
    [
        ("c2-results.json", "orin-nx-8gb", MEASURED_INT4 / "c1-results.json"),
        ("c3-results.json", "orin-nx-16gb", MEASURED / "a-results.json"),
    ],
)
def test_dummy_load_of_a_config_naming_its_gptq_layers_plans_what_vllm_loaded(
    model_dir: ModelDirFactory, results: str, name: str, cold: Path
) -> None:
    """The second issue-20 lease: the config names `modules_in_block_to_quantize`, and vLLM's
    dummy load made the projections int4 (3.13 GB instead of the 8.08 GB without the list)."""
    data = json.loads((MEASURED_INT4 / results).read_text())
    run: dict[str, Any] = data["runs"][f"{name}:full"]
    folder = model_dir(run["config"])
    profile = _as_run(load_engine_profile(name), run, folder)
    plan = plan_memory(folder, profile)
    assert plan.weights_source.endswith("gptq 4-bit projections")
    measured = run["after_load"]["worker"]["model_memory_usage"]
    assert abs(plan.weight_bytes / measured - 1) < 0.05
    kv = run["kv"]
    assert plan.layout is not None
    assert plan.layout.blocks(plan.kv_budget_bytes) == kv["num_blocks"]
    assert plan.kv_capacity_tokens == kv["one_seq_tokens"] - 4 * 1120
    assert plan.layout.state_bytes_per_seq == kv["state_bytes_per_seq"]
    # the profile's runtime is the one measured at a machine's first start (the engine core
    # JIT-compiles its kernels: 0.4-0.8 GB more than a restart with warm caches)
    first = json.loads(cold.read_text())["runs"][f"{name}:full"]
    assert plan.runtime_bytes == pytest.approx(_runtime(first), rel=0.02)
    assert plan.runtime_bytes > _runtime(run)
    # with int4 weights the 16 GB module holds the engine; the 8 GB module does not
    assert plan.fits == (name == "orin-nx-16gb"), plan.outcome


def test_int4_config_without_weight_files_is_planned_at_int4(model_dir: ModelDirFactory) -> None:
    run = _measured_run()
    folder = model_dir(run["config"])
    profile = load_engine_profile("orin-nx-16gb").model_copy(update={"model": str(folder)})
    plan = plan_memory(folder, profile)
    bf16 = plan_memory(folder, profile.model_copy(update={"load_format": "dummy"}))
    assert plan.weights_source.endswith("gptq 4-bit projections")
    embed = 2 * 151936 * 2048 * 2  # untied embeddings and LM head stay bf16
    projections = (bf16.weight_bytes - embed) // 2
    assert plan.weight_bytes == pytest.approx(embed + projections * (0.5 + 2.5 / 128), abs=8)
    assert plan.int4_weight_bytes is None  # already int4: no int4 option line
    assert plan.fits, plan.outcome


def test_token_budget_below_the_hybrid_block_cannot_start(model_dir: ModelDirFactory) -> None:
    folder = model_dir(_measured_run()["config"])
    profile = load_engine_profile("orin-nx-16gb").model_copy(
        update={"model": str(folder), "max_num_batched_tokens": 512}
    )
    plan = plan_memory(folder, profile)
    # one 1,120-token block + 2 streams x (1 + 3) decode tokens, to a multiple of 128
    assert (
        "max_num_batched_tokens 512 is below the hybrid's attention block of 1,120 tokens"
        in plan.outcome
    )
    assert "use 1,152" in plan.outcome
    no_cache = plan_memory(folder, profile.model_copy(update={"enable_prefix_caching": False}))
    assert "max_num_batched_tokens" not in no_cache.outcome


async def test_the_supervisors_ladder_has_no_token_budget_rung_vllm_refuses(
    model_dir: ModelDirFactory,
) -> None:
    """The planner's block reaches the ladder: orin-nx-16gb's 1,152 tokens cannot halve (576
    is under the 1,120-token block, which vLLM refuses with prefix caching), so its ladder
    has no such rung, and every rung it has is one the planner accepts on that count."""
    from agent.supervision.rungs import Rungs
    from agent.watchdog.events import EventLog

    folder = model_dir(_measured_run()["config"])
    for budget, expected in ((1152, []), (4608, [2304, 1152])):
        profile = load_engine_profile("orin-nx-16gb").model_copy(
            update={"model": str(folder), "max_num_batched_tokens": budget}
        )
        rungs = Rungs(profile, store=None, events=EventLog(), context_tokens=None,
                      answer_tokens=256, on_window=None)  # fmt: skip
        await rungs.prepare()
        halved = [r.profile for r in rungs.ladder if r.knob == "batched_tokens"]
        assert [p.max_num_batched_tokens for p in halved] == expected
        for p in halved:
            assert "max_num_batched_tokens" not in plan_memory(folder, p).outcome


def test_orin_8gb_kv_budget_holds_64k_of_the_hybrid(model_dir: ModelDirFactory) -> None:
    folder = model_dir(_measured_run()["config"])
    profile = load_engine_profile("orin-nx-8gb").model_copy(update={"model": str(folder)})
    plan = plan_memory(folder, profile)
    lo = plan.layout
    assert lo is not None
    # 64K: ceil(65,536 / 1,120) = 59 attention blocks + 15 state blocks of 14,909,440 B,
    # + 3 while a prefill crosses a block; 1088 MiB (76 blocks) was one short (measured)
    assert lo.blocks_per_seq(65536) == 59 + 15 + 3 == 77
    assert lo.blocks(plan.kv_budget_bytes) == 1152 * 2**20 // lo.block_bytes == 81
    assert "of KV needed" not in plan.outcome
    short = profile.model_copy(update={"memory": profile.memory.model_copy(
        update={"kv_cache_memory_bytes": 1088 * 2**20})})  # fmt: skip
    assert (
        "1.16 GB of KV needed (77 blocks + vLLM's null block), 1.14 GB available (76 blocks)"
        in plan_memory(folder, short).outcome
    )
    one_gib = profile.model_copy(
        update={"memory": profile.memory.model_copy(update={"kv_cache_memory_bytes": GiB})}
    )
    old = plan_memory(folder, one_gib)
    assert "1.16 GB of KV needed (77 blocks + vLLM's null block), 1.07 GB available" in old.outcome
    assert old.kv_capacity_tokens == (72 - 1 - 18) * 1120 == 59_360


LEASE3 = Path(__file__).parents[2] / "bench/engine/results/h200-2026-12-01-lease3"


def test_the_peak_is_where_vllm_stalled(model_dir: ModelDirFactory) -> None:
    """The third issue-20 lease: a request vLLM 0.26 neither finished nor refused (its
    scheduler trace: running with nearly all of the pool, then waiting with none, over and
    over) and one that finished, against the planner's peak count of blocks. The trace's
    usage is held blocks over the pool less vLLM's null block."""
    eight = json.loads((LEASE3 / "b-results.json").read_text())["runs"]["orin-nx-8gb:full"]
    folder = model_dir(eight["config"])
    lo = plan_memory(folder, _as_run(load_engine_profile("orin-nx-8gb"), eight, folder)).layout
    assert lo is not None
    pool = eight["kv"]["num_blocks"]
    usable = lo.usable_blocks(eight["kwargs"]["kv_cache_memory_bytes"])
    assert (pool, usable, lo.block_size) == (76, 75, 1120)
    window, stalled = eight["window_tokens"], eight["window_tokens"] + 4500
    # the 60,780-token window finished; the window + its 4,500-token segment never did
    assert eight["ttft_window_s"] > 0 and eight["stall"]["step"] == "append"
    assert lo.blocks_per_seq(window) == 73 <= usable
    assert lo.blocks_per_seq(stalled) == 77 > usable
    # what vLLM counts (held: no transient blocks) fits, so it took the request
    held = lo.blocks_per_seq(stalled) - 3
    assert held <= usable
    # the trace: at most exactly the held blocks, then none while waiting, alternating
    steps = eight["stall"]["scheduler"]["steps"]
    assert max(round(r[3] * usable) for r in steps) == held == 74
    assert {(r[1], r[2]) for r in steps} >= {(1, 0), (0, 1)}
    assert min(r[3] for r in steps if r[2] == 1) == 0.0


def test_plan_render_shows_the_hybrid_layout(model_dir: ModelDirFactory) -> None:
    folder = model_dir(_measured_run()["config"])
    profile = load_engine_profile("orin-nx-16gb").model_copy(update={"model": str(folder)})
    text = plan_memory(folder, profile).render("orin-nx-16gb")
    assert "13.3 KB fp8 (13 full-attention layers (1 MTP) x 2 x 2 KV heads x 256 x 1 B)" in text
    assert "blocks of 1,120 tokens, 13 pages of 1.15 MB (14.9 MB a block)" in text
    assert "+ 3 while a prefill crosses a block; pool 144 blocks, 143 usable" in text
    # 144 blocks hold one 128K sequence at its peak (136), not the profile's two streams
    assert "full windows     1 of max_num_seqs 2 at once: a long prefill beside them stalls" in text


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
    assert plan.outcome == "fits 8K with bf16 KV"


def test_smollm2_real_converted_checkpoint(smollm2_model: Path) -> None:
    plan = plan_memory(smollm2_model, load_engine_profile("cpu-dev"))
    assert plan.weight_bytes == 269_030_016
    assert plan.kv_capacity_tokens == 11_648


def test_plan_render_prints_the_numbers_and_the_outcome(model_dir: ModelDirFactory) -> None:
    folder = model_dir(SMOLLM2, tensors=smollm2_tensor_shapes())
    text = plan_memory(folder, load_engine_profile("cpu-dev")).render("cpu-dev")
    lines = text.splitlines()
    assert lines[0].split() == ["profile", "cpu-dev"]
    assert lines[-1].split(None, 1) == ["outcome", "fits 8K with bf16 KV"]
    assert "23.0 KB bf16 (30 full-attention layers" in text
    assert "11,648 tokens" in text
    assert "0.3 GB bfloat16 (1 safetensors file)" in text


LEASE4 = Path(__file__).parents[2] / "bench/engine/results/h200-2026-12-02-lease4"


def test_a_discrete_gpu_plan_holds_both_starts_and_the_context(model_dir: ModelDirFactory) -> None:
    """The fourth issue-20 lease: rtx4070-laptop-8gb's share of the card (util 0.85) started
    twice on one H200. The start that compiled got a smaller KV pool than the warm one (its
    profiling run counted compile buffers), and the engine process held more than its share
    (the CUDA context, outside vLLM's baseline). The planner plans both."""
    runs = json.loads((LEASE4 / "a-results.json").read_text())["runs"]
    cold, warm = runs["rtx4070-laptop-8gb:full"], runs["rtx4070-laptop-8gb:warm"]
    folder = model_dir(cold["config"])
    profile = _as_run(load_engine_profile("rtx4070-laptop-8gb"), cold, folder)
    plan = plan_memory(folder, profile)
    assert plan.kv_first_start_bytes is not None and plan.layout is not None
    assert cold["kv"]["tensor_bytes"] < warm["kv"]["tensor_bytes"]  # 3.00 against 3.61 GB
    assert plan.kv_first_start_bytes == pytest.approx(cold["kv"]["tensor_bytes"], rel=0.10)
    assert plan.kv_budget_bytes == pytest.approx(warm["kv"]["tensor_bytes"], rel=0.10)
    assert plan.kv_worst_bytes == plan.kv_first_start_bytes
    # capacity and outcome hold for the smaller, first start: one 128K window at its peak
    assert plan.kv_capacity_tokens == pytest.approx(cold["kv"]["one_seq_tokens"], rel=0.10)
    assert plan.fits and plan.full_windows == 1
    # the warm engine's process held its share of the card and the context besides
    share = profile.memory.gpu_memory_utilization * profile.device.memory_bytes
    held = warm["after_load"]["proc"]["gpu_ours"]
    assert held > share * 1.05
    assert plan.engine_total_bytes == pytest.approx(held, rel=0.10)
    assert plan.engine_limit_bytes == profile.device.memory_bytes - profile.device.reserve_bytes
    assert "a start that compiles" in plan.render()
    # with a fixed pool there is no first-start shortfall to plan
    pool = MemorySettings(kv_cache_memory_bytes=3 << 30, gpu_memory_utilization=0.85)
    fixed = profile.model_copy(update={"memory": pool})
    assert plan_memory(folder, fixed).kv_first_start_bytes is None
