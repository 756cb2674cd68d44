"""Speculative decoding: which method a model gets, and stepping k down when drafts miss.

MTP heads are trained with the model and usually accept well; a trained draft (an EAGLE-3
head shipped beside a tuned model, agent/engine/draft.py) is the next best; prompt lookup
(ngram) costs nothing to draft and suits answers that repeat what the prompt holds (the
catalogue's codes, line numbers). A draft that is
rejected still
costs verify compute, so when acceptance stays low the controller steps k down
(3, 2, 1, off). vLLM fixes k when the engine starts, so a step is a *target* that the
engine applies at its next (re)start; until then further windows are ignored, because they
still measure the old k.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

from agent.engine.draft import DraftInfo
from agent.engine.model_config import read_config, tensor_infos, text_config
from agent.engine.profile import EngineProfile, SpeculativeSettings

__all__ = [
    "AcceptanceController",
    "MtpInfo",
    "SpeculationPlan",
    "StepDown",
    "choose_speculation",
    "detect_mtp",
    "mtp_layers_declared",
]

log = structlog.get_logger(__name__)

# Fields that declare MTP layers, in the order vLLM's hf_config_override reads them.
_MTP_FIELDS = ("mtp_num_hidden_layers", "num_nextn_predict_layers", "num_mtp_modules")
_LADDER = (3, 2, 1, 0)


@dataclass(frozen=True)
class MtpInfo:
    layers: int
    field: str
    weights_present: bool | None  # None: no weight files to look at (config-only folder)


def mtp_layers_declared(config: Mapping[str, Any]) -> tuple[int, str] | None:
    """(layer count, field name) if the config declares MTP layers, also under text_config."""
    cfg = text_config(config)
    for name in _MTP_FIELDS:
        value = cfg.get(name)
        if isinstance(value, int) and value > 0:
            return value, name
    nested = cfg.get("mtp_config")
    if isinstance(nested, Mapping):
        value = nested.get("num_nextn_predict_layers")
        if isinstance(value, int) and value > 0:
            return value, "mtp_config.num_nextn_predict_layers"
    return None


def _weight_names(model_dir: Path) -> list[str]:
    index = model_dir / "model.safetensors.index.json"
    if index.is_file():
        data = json.loads(index.read_text(encoding="utf-8"))
        weight_map = data.get("weight_map", {})
        if isinstance(weight_map, dict):
            return list(weight_map)
    return [t.name for t in tensor_infos(model_dir)]


def _has_mtp_weights(names: list[str], num_hidden_layers: int | None) -> bool:
    # Qwen3-Next / Qwen3.5 keep them under `mtp.`; DeepSeek-style checkpoints append the
    # MTP block(s) as decoder layers numbered from num_hidden_layers on.
    if any(n.startswith("mtp.") or ".mtp." in n for n in names):
        return True
    if num_hidden_layers is None:
        return False
    pattern = re.compile(r"(?:^|\.)layers\.(\d+)\.")
    for name in names:
        match = pattern.search(name)
        if match and int(match.group(1)) >= num_hidden_layers:
            return True
    return False


def detect_mtp(model_dir: Path) -> MtpInfo | None:
    """MTP layers the model declares and whether its weight files carry them."""
    config = read_config(model_dir)
    declared = mtp_layers_declared(config)
    if declared is None:
        return None
    layers, field_name = declared
    names = _weight_names(model_dir)
    if not names:
        return MtpInfo(layers, field_name, None)
    n_hidden = text_config(config).get("num_hidden_layers")
    present = _has_mtp_weights(names, n_hidden if isinstance(n_hidden, int) else None)
    return MtpInfo(layers, field_name, present)


@dataclass(frozen=True)
class SpeculationPlan:
    method: str  # "mtp", "draft", "ngram" or "off"
    k: int
    reason: str
    vllm_config: dict[str, Any] | None


def choose_speculation(
    profile: EngineProfile,
    model_dir: Path,
    k: int | None = None,
    draft: DraftInfo | None = None,
    draft_note: str | None = None,
) -> SpeculationPlan:
    """The speculative config for vLLM, from the profile, the model folder and k.

    The rule (method auto): MTP when the weights carry it, else the trained draft when the
    served model has one that fits (`draft`, validated by the caller; `draft_note` says why
    there is none), else prompt lookup.

    Raises:
        ValueError: the profile asks for MTP or the draft and the model cannot provide it.
    """
    spec = profile.speculative
    k = spec.num_speculative_tokens if k is None else k
    if spec.method == "off" or k <= 0:
        return SpeculationPlan("off", 0, "disabled", None)
    mtp = detect_mtp(model_dir)
    dummy = profile.load_format == "dummy"
    # Declared MTP layers without weights give vLLM a random draft head: acceptance near
    # zero, pure overhead. Random weights everywhere (dummy) make that moot.
    mtp_usable = mtp is not None and (mtp.weights_present is not False or dummy)
    if spec.method == "mtp" and not mtp_usable:
        why = (
            "declares no MTP layers" if mtp is None else "declares MTP layers but ships no weights"
        )
        raise ValueError(f"speculative.method is mtp but {model_dir} {why}")
    if mtp is not None and mtp_usable and spec.method in ("auto", "mtp"):
        if k > mtp.layers and k % mtp.layers:
            k -= k % mtp.layers  # vLLM needs k divisible by the MTP layer count above it
        reason = f"{mtp.field}={mtp.layers}"
        return SpeculationPlan("mtp", k, reason, {"method": "mtp", "num_speculative_tokens": k})
    if spec.method == "draft" and draft is None:
        raise ValueError(f"speculative.method is draft but {draft_note or 'no draft is shipped'}")
    if draft is not None and spec.method in ("auto", "draft"):
        return SpeculationPlan(
            "draft",
            k,
            f"trained draft {draft.name} (eagle3, draft vocabulary {draft.draft_vocab})",
            {"method": "eagle3", "model": str(draft.path), "num_speculative_tokens": k},
        )
    reason = "no MTP layers" if mtp is None else "MTP declared but weights missing"
    if draft_note:
        reason += f"; {draft_note}"
    if spec.method == "ngram":
        reason = "profile asks for ngram"
    return SpeculationPlan(
        "ngram",
        k,
        reason,
        {
            "method": "ngram",
            "num_speculative_tokens": k,
            "prompt_lookup_min": spec.prompt_lookup_min,
            "prompt_lookup_max": spec.prompt_lookup_max,
        },
    )


@dataclass(frozen=True)
class StepDown:
    from_k: int
    to_k: int
    acceptance: float
    draft_tokens: int


@dataclass
class AcceptanceController:
    """Windowed acceptance rate -> a lower k target when it stays under the floor."""

    settings: SpeculativeSettings
    running_k: int
    target_k: int = field(init=False)
    window_draft: int = field(default=0, init=False)
    window_accepted: int = field(default=0, init=False)
    last_window_acceptance: float | None = field(default=None, init=False)
    steps: list[StepDown] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        self.target_k = self.running_k

    @property
    def pending(self) -> bool:
        """A lower k is decided but the engine still runs the old one."""
        return self.target_k != self.running_k

    def observe(self, draft_tokens: int, accepted_tokens: int) -> StepDown | None:
        """Feed one stats interval's counts; returns the step taken, if any."""
        if self.running_k <= 0 or self.pending or draft_tokens <= 0:
            return None
        self.window_draft += draft_tokens
        self.window_accepted += accepted_tokens
        if self.window_draft < self.settings.window_draft_tokens:
            return None
        rate = self.window_accepted / self.window_draft
        drafted = self.window_draft
        self.last_window_acceptance = rate
        self.window_draft = self.window_accepted = 0
        if rate >= self.settings.min_acceptance or not self.settings.adaptive:
            return None
        self.target_k = next(v for v in _LADDER if v < self.running_k)
        step = StepDown(self.running_k, self.target_k, rate, drafted)
        self.steps.append(step)
        log.warning(
            "spec_decode_step_down",
            from_k=step.from_k,
            to_k=step.to_k,
            acceptance=round(rate, 3),
            window_draft_tokens=drafted,
            floor=self.settings.min_acceptance,
            applies="at next engine restart",
        )
        return step

    def applied(self, k: int) -> None:
        """The engine (re)started with this k; start a fresh window."""
        self.running_k = self.target_k = k
        self.window_draft = self.window_accepted = 0
