"""Our LoRA adapter merged into its base once, merged again when either changes, and never
fatal: a missing or damaged adapter leaves the base in service with the reason.

Real parts: safetensors files written and read by the real library, torch for the
arithmetic, the shipped adapters (models/gemma3-270m-edge, the default, and
models/smollm2-135m-edge) merged into the real converted bases by the same call setup and
the engine's start make."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from agent.engine.adapters import ensure_merged, find_adapter, model_digest
from agent.engine.lora import AdapterInvalid, lora_scale, merge_lora, weights_digest
from agent.engine.model_prep import resolve_model
from agent.engine.profile import EngineProfile, load_engine_profile

torch = pytest.importorskip("torch")
safetensors_torch = pytest.importorskip("safetensors.torch")

REPO = Path(__file__).resolve().parents[2]
SHIPPED = REPO / "models" / "smollm2-135m-edge"
DEFAULT = REPO / "models" / "gemma3-270m-edge"
MODULES = ["model.layers.0.self_attn.q_proj", "model.layers.0.mlp.down_proj"]
SHAPES = {"model.layers.0.self_attn.q_proj": (8, 6), "model.layers.0.mlp.down_proj": (6, 10)}


def _base(folder: Path, seed: int = 0) -> Path:
    g = torch.Generator().manual_seed(seed)
    tensors = {
        f"{m}.weight": torch.randn(*SHAPES[m], generator=g).to(torch.bfloat16) for m in MODULES
    }
    tensors["model.norm.weight"] = torch.ones(6, dtype=torch.bfloat16)
    folder.mkdir(parents=True)
    safetensors_torch.save_file(
        tensors, str(folder / "model.safetensors"), metadata={"format": "pt"}
    )
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / "tokenizer.json").write_text("{}")
    return folder


def _adapter(folder: Path, rank: int = 2, alpha: float = 4.0, seed: int = 1) -> Path:
    g = torch.Generator().manual_seed(seed)
    tensors = {}
    for m in MODULES:
        out, inp = SHAPES[m]
        tensors[f"base_model.model.{m}.lora_A.weight"] = torch.randn(rank, inp, generator=g).to(
            torch.bfloat16
        )
        tensors[f"base_model.model.{m}.lora_B.weight"] = torch.randn(out, rank, generator=g).to(
            torch.bfloat16
        )
    folder.mkdir(parents=True, exist_ok=True)
    safetensors_torch.save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(
        json.dumps(
            {"peft_type": "LORA", "r": rank, "lora_alpha": alpha, "target_modules": ["q_proj"]}
        )
    )
    return folder


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("EDGE_AGENT_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_merge_is_w_plus_scaled_b_times_a() -> None:
    """peft's formula: W + (alpha / r) * B @ A, in float32, stored in the base's dtype."""
    w = torch.randn(4, 3)
    a, b = torch.randn(2, 3), torch.randn(4, 2)
    lora = {"base_model.model.m.lora_A.weight": a, "base_model.model.m.lora_B.weight": b}
    merged = merge_lora({"m.weight": w}, lora, {"r": 2, "lora_alpha": 8})
    assert torch.allclose(merged["m.weight"], w + 4.0 * b @ a)
    assert lora_scale({"r": 16, "lora_alpha": 32, "use_rslora": True}) == 8.0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"peft_type": "IA3"}, "not LORA"),
        ({"use_dora": True}, "use_dora"),
        ({"r": 3}, "rank"),
    ],
)
def test_a_merge_that_does_not_fit_is_refused(change: dict[str, object], reason: str) -> None:
    w = torch.randn(4, 3)
    lora = {"base_model.model.m.lora_A.weight": torch.randn(2, 3),
            "base_model.model.m.lora_B.weight": torch.randn(4, 2)}  # fmt: skip
    with pytest.raises(AdapterInvalid, match=reason):
        merge_lora({"m.weight": w}, lora, {"r": 2, "lora_alpha": 4, **change})
    with pytest.raises(AdapterInvalid, match="does not fit"):
        merge_lora({"m.weight": torch.randn(5, 3)}, lora, {"r": 2})
    with pytest.raises(AdapterInvalid, match=r"no m\.weight"):
        merge_lora({"x.weight": w}, lora, {"r": 2})


def test_the_weights_digest_ignores_the_file_layout(tmp_path: Path) -> None:
    t = {"b": torch.arange(6, dtype=torch.float32), "a": torch.ones(2, 2)}
    safetensors_torch.save_file(t, str(tmp_path / "one.safetensors"), metadata={"x": "1"})
    safetensors_torch.save_file(dict(reversed(t.items())), str(tmp_path / "two.safetensors"))
    assert weights_digest(tmp_path / "one.safetensors") == weights_digest(
        tmp_path / "two.safetensors"
    )
    t["a"][0, 0] = 2.0
    safetensors_torch.save_file(t, str(tmp_path / "three.safetensors"))
    assert weights_digest(tmp_path / "three.safetensors") != weights_digest(
        tmp_path / "one.safetensors"
    )


def test_merged_once_then_reused_and_merged_again_when_either_changes(
    tmp_path: Path, cache: Path
) -> None:
    base, adapter = _base(tmp_path / "base"), _adapter(tmp_path / "edge")
    first = ensure_merged(base, adapter)
    assert first.path == cache / "models" / "base+edge"
    assert (first.path / "config.json").is_file() and (first.path / "tokenizer.json").is_file()
    merged = safetensors_torch.load_file(str(first.path / "model.safetensors"))
    expected = merge_lora(
        safetensors_torch.load_file(str(base / "model.safetensors")),
        safetensors_torch.load_file(str(adapter / "adapter_model.safetensors")),
        json.loads((adapter / "adapter_config.json").read_text()),
    )
    assert all(torch.equal(merged[k], expected[k]) for k in expected)
    assert first.weights_sha256 == weights_digest(first.path / "model.safetensors")
    stamp = (first.path / "model.safetensors").stat().st_mtime_ns

    again = ensure_merged(base, adapter)  # unchanged: the same folder, not rewritten
    assert again == first and (again.path / "model.safetensors").stat().st_mtime_ns == stamp

    _adapter(adapter, seed=2)  # a retrained adapter
    retrained = ensure_merged(base, adapter)
    assert retrained.adapter_sha256 != first.adapter_sha256
    assert retrained.weights_sha256 != first.weights_sha256

    shutil.rmtree(base)
    _base(base, seed=5)  # a new base (another conversion)
    rebased = ensure_merged(base, adapter)
    assert rebased.base_sha256 == model_digest(base) != retrained.base_sha256
    assert rebased.weights_sha256 != retrained.weights_sha256


def _profile_with(adapter: str, base: Path) -> EngineProfile:
    return load_engine_profile("cpu-dev").model_copy(
        update={"model": str(base), "adapter": adapter}
    )


@pytest.mark.parametrize("damage", ["missing", "truncated", "not_json", "wrong_shape"])
def test_a_missing_or_damaged_adapter_serves_the_base_and_says_why(
    tmp_path: Path, cache: Path, damage: str
) -> None:
    base = _base(tmp_path / "base")
    adapter = tmp_path / "edge"
    if damage != "missing":
        _adapter(adapter)
    if damage == "truncated":
        data = (adapter / "adapter_model.safetensors").read_bytes()
        (adapter / "adapter_model.safetensors").write_bytes(data[: len(data) // 2])
    elif damage == "not_json":
        (adapter / "adapter_config.json").write_text("{not json")
    elif damage == "wrong_shape":  # trained for another model: B does not fit the base
        t = safetensors_torch.load_file(str(adapter / "adapter_model.safetensors"))
        t[f"base_model.model.{MODULES[0]}.lora_B.weight"] = torch.zeros(9, 2, dtype=torch.bfloat16)
        safetensors_torch.save_file(t, str(adapter / "adapter_model.safetensors"))
    choice = resolve_model(_profile_with(str(adapter), base))
    assert choice.path == base and choice.adapter is None
    assert choice.adapter_error is not None and "invalid" in choice.adapter_error
    assert choice.line().startswith("base base") and "invalid" in choice.line()
    assert choice.weights_sha256 == model_digest(base)


def test_the_default_adapter_merges_into_the_converted_base() -> None:
    """What setup does (python -m agent.engine.model_prep): the cpu-dev profile's adapter,
    found in models/, merged into the real base; the model card's base digest is it, and the
    choice names the base's licence."""
    from agent.engine.model_prep import ModelPrepError, ensure_base

    try:
        ensure_base("gemma3-270m")
    except ModelPrepError as exc:  # a venv without the llm extra (the Python 3.10 job)
        pytest.skip(f"Gemma 3 270M unavailable: {exc}")
    profile = load_engine_profile("cpu-dev")
    assert profile.adapter == "gemma3-270m-edge" and find_adapter(profile.adapter) == DEFAULT
    choice = resolve_model(profile)
    assert choice.adapter == "gemma3-270m-edge" and choice.adapter_error is None
    assert choice.path.name == "gemma3-270m+gemma3-270m-edge"
    assert choice.licence == "Gemma Terms of Use" and "Gemma Terms of Use" in choice.line()
    meta = json.loads((DEFAULT / "adapter_meta.json").read_text())
    assert meta["base_weights_sha256"] == model_digest(ensure_base("gemma3-270m"))
    assert choice.warning is None
    base = resolve_model(profile.model_copy(update={"adapter": None}))
    assert base.path == ensure_base("gemma3-270m") and base.adapter is None
    assert base.weights_sha256 != choice.weights_sha256
    # a derivative of Gemma carries its terms (the .deb installs both files beside it)
    assert "Gemma Terms of Use" in (DEFAULT / "NOTICE").read_text()
    assert "Section 1: DEFINITIONS" in (DEFAULT / "GEMMA_TERMS.txt").read_text()


def test_the_smollm2_adapter_merges_into_its_base(smollm2_model: Path) -> None:
    """The other bundled base stays selectable with its own adapter."""
    profile = load_engine_profile("cpu-dev").model_copy(
        update={"model": str(smollm2_model), "adapter": "smollm2-135m-edge"}
    )
    choice = resolve_model(profile)
    assert find_adapter("smollm2-135m-edge") == SHIPPED
    assert choice.adapter == "smollm2-135m-edge" and choice.adapter_error is None
    assert choice.path.name == "smollm2-135m-instruct+smollm2-135m-edge"
    meta = json.loads((SHIPPED / "adapter_meta.json").read_text())
    assert meta["base_weights_sha256"] == model_digest(smollm2_model)
    assert choice.warning is None and choice.licence == "Apache-2.0"


def test_a_base_without_weights_to_merge_into_is_served_as_it_is(
    tmp_path: Path, cache: Path
) -> None:
    """A folder vLLM may still load (no safetensors: .bin weights, or none for a test)."""
    base = tmp_path / "base"
    base.mkdir()
    (base / "config.json").write_text('{"model_type": "llama"}')
    choice = resolve_model(_profile_with(str(_adapter(tmp_path / "edge")), base))
    assert choice.path == base and choice.weights_sha256 is None
    assert choice.adapter_error is not None and "cannot merge into" in choice.adapter_error
