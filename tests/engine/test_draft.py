"""The trained draft (EAGLE-3 head): finding it beside its adapter, checking it against the
served model, and the speculation rule (MTP, then the draft, then prompt lookup).

The draft folders here are written by our own trainer's checkpoint code
(training/draft/eagle3.py, random weights: the check reads shapes, not quality), so what
the tests accept is what the trainer produces on the device.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from agent.engine.adapters import MODELS_ENV
from agent.engine.draft import DraftInvalid, find_draft, resolve_draft, validate_draft
from agent.engine.profile import EngineProfile, load_engine_profile
from agent.engine.speculative import choose_speculation
from bench.shapes import QWEN3_NEXT, SMOLLM2
from tests.engine.conftest import ModelDirFactory

torch = pytest.importorskip("torch")
eagle3 = pytest.importorskip("training.draft.eagle3")

SHIPPED = Path(__file__).resolve().parents[2] / "models" / "smollm2-135m-edge-eagle3"


def write_draft(folder: Path, target_cfg: dict[str, object], draft_vocab: int = 512) -> Path:
    shape = eagle3.DraftShape.from_target(dict(target_cfg), draft_vocab)
    model = eagle3.Eagle3Draft(shape)
    ids = torch.arange(0, 2 * draft_vocab, 2)
    model.set_vocab(ids, torch.zeros(shape.vocab, shape.hidden))
    eagle3.save_draft(model, dict(target_cfg), folder)
    return folder


def _with(profile: EngineProfile, **spec: object) -> EngineProfile:
    return profile.model_copy(update={"speculative": profile.speculative.model_copy(update=spec)})


def test_trainer_checkpoint_validates_against_its_target(
    model_dir: ModelDirFactory, tmp_path: Path
) -> None:
    target = model_dir(SMOLLM2)
    draft = write_draft(tmp_path / "d-eagle3", SMOLLM2)
    info = validate_draft(draft, target)
    assert (info.draft_vocab, info.aux_layers) == (512, (2, 15, 27))
    # every shard under the 16 MB a device result file may hold
    assert all(f.stat().st_size < 16_000_000 for f in draft.glob("*.safetensors"))
    cfg = json.loads((draft / "config.json").read_text())
    assert cfg["architectures"] == ["Eagle3LlamaForCausalLM"] and cfg["num_hidden_layers"] == 1


def test_draft_for_another_shape_is_refused(model_dir: ModelDirFactory, tmp_path: Path) -> None:
    target = model_dir(SMOLLM2)
    wider = {**SMOLLM2, "hidden_size": 640, "num_attention_heads": 10, "head_dim": 64}
    draft = write_draft(tmp_path / "wide", wider)
    with pytest.raises(DraftInvalid, match="target hidden size 640"):
        validate_draft(draft, target)
    fewer = model_dir({**SMOLLM2, "num_hidden_layers": 12}, name="shallow")
    ok = write_draft(tmp_path / "ok", SMOLLM2)
    with pytest.raises(DraftInvalid, match="aux layers"):
        validate_draft(ok, fewer)


def test_damaged_draft_is_refused(model_dir: ModelDirFactory, tmp_path: Path) -> None:
    target = model_dir(SMOLLM2)
    draft = write_draft(tmp_path / "d", SMOLLM2)
    for shard in draft.glob("*.safetensors"):
        shard.write_bytes(b"\x01\x02")
    with pytest.raises(DraftInvalid, match="unreadable safetensors header"):
        validate_draft(draft, target)
    (draft / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(DraftInvalid, match="not an EAGLE-3"):
        validate_draft(draft, target)


def test_found_beside_its_adapter_or_by_the_adapter_meta(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    adapter = models / "tuned"
    adapter.mkdir(parents=True)
    monkeypatch.setenv(MODELS_ENV, str(models))
    assert find_draft("auto", adapter) is None
    assert find_draft("auto", None) is None and find_draft(None, adapter) is None
    (models / "tuned-eagle3").mkdir()
    assert find_draft("auto", adapter) == models / "tuned-eagle3"
    (models / "head-v2").mkdir()
    (adapter / "adapter_meta.json").write_text(json.dumps({"draft": "head-v2"}))
    assert find_draft("auto", adapter) == models / "head-v2"
    (adapter / "adapter_meta.json").write_text(json.dumps({"draft": "gone"}))
    with pytest.raises(DraftInvalid, match="names draft 'gone'"):
        find_draft("auto", adapter)
    assert find_draft(str(models / "head-v2"), None) == models / "head-v2"
    with pytest.raises(DraftInvalid, match="no draft folder"):
        find_draft("missing", adapter)


def test_resolve_serves_no_draft_with_the_base(
    model_dir: ModelDirFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    models = tmp_path / "models"
    (models / "tuned").mkdir(parents=True)
    write_draft(models / "tuned-eagle3", SMOLLM2)
    monkeypatch.setenv(MODELS_ENV, str(models))
    target = model_dir(SMOLLM2)
    info, note = resolve_draft("auto", "tuned", target)
    assert info is not None and note is None and info.path == models / "tuned-eagle3"
    info, note = resolve_draft("auto", None, target)  # the adapter failed: the base serves
    assert info is None and note is not None and "no tuned adapter" in note
    wrong = model_dir({**SMOLLM2, "vocab_size": 32000}, name="other")
    info, note = resolve_draft("auto", "tuned", wrong)
    assert info is None and note is not None and "vocabulary 49152" in note


def test_selection_rule_mtp_then_draft_then_ngram(
    model_dir: ModelDirFactory, tmp_path: Path
) -> None:
    target = model_dir(SMOLLM2)
    draft = validate_draft(write_draft(tmp_path / "d-eagle3", SMOLLM2), target)
    gpu = load_engine_profile("orin-nx-16gb")
    plan = choose_speculation(gpu, target, draft=draft)
    assert plan.method == "draft"
    assert plan.vllm_config == {
        "method": "eagle3",
        "model": str(draft.path),
        "num_speculative_tokens": gpu.speculative.num_speculative_tokens,
    }
    none = choose_speculation(gpu, target, draft=None, draft_note="no trained draft shipped")
    assert none.method == "ngram" and "no trained draft shipped" in none.reason
    with pytest.raises(ValueError, match="method is draft but no trained draft shipped"):
        choose_speculation(
            _with(gpu, method="draft"), target, draft=None, draft_note="no trained draft shipped"
        )
    assert choose_speculation(_with(gpu, method="ngram"), target, draft=draft).method == "ngram"
    assert choose_speculation(_with(gpu, method="off"), target, draft=draft).method == "off"
    # weights that carry MTP win over a shipped draft
    mtp = model_dir(QWEN3_NEXT, name="mtp", index_names=["mtp.fc.weight"])
    assert choose_speculation(gpu, mtp, draft=draft).method == "mtp"


def test_shipped_draft_fits_the_shipped_tuned_model(model_dir: ModelDirFactory) -> None:
    """The head from the device run, as shipped: found for the tuned adapter by name, its
    shapes those of the served SmolLM2, its shards the ones the model card's digests name."""
    target = model_dir(SMOLLM2)
    info = validate_draft(SHIPPED, target)
    assert (info.name, info.draft_vocab, info.aux_layers) == (SHIPPED.name, 8192, (2, 15, 27))
    assert find_draft("auto", SHIPPED.parent / "smollm2-135m-edge") == SHIPPED
    found, note = resolve_draft("auto", "smollm2-135m-edge", target)
    assert note is None and found is not None and found.path == SHIPPED
    card = (SHIPPED / "MODEL_CARD.md").read_text(encoding="utf-8")
    for shard in sorted(SHIPPED.glob("*.safetensors")):
        digest = hashlib.sha256(shard.read_bytes()).hexdigest()
        assert f"`{shard.name}` `{digest}`" in card, shard.name
    # a GPU profile on auto serving the tuned adapter speculates with it
    plan = choose_speculation(load_engine_profile("orin-nx-16gb"), target, draft=found)
    assert plan.method == "draft" and plan.vllm_config is not None
    assert plan.vllm_config["model"] == str(SHIPPED)
    # cpu-dev names prompt lookup: the draft does not pay on two CPU cores
    # (configs/profiles/cpu-dev.yaml, bench/engine/README.md), with SmolLM2 served or not
    cpu = load_engine_profile("cpu-dev")
    assert choose_speculation(cpu, target, draft=found).method == "ngram"
    # the default (Gemma) adapter ships no draft: vLLM has no EAGLE-3 for Gemma 3
    assert cpu.adapter == "gemma3-270m-edge"
    assert find_draft("auto", SHIPPED.parent / "gemma3-270m-edge") is None
