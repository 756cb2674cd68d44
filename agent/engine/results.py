"""What the engine hands back: its state, what a start chose, health, and generated text.

Plain frozen dataclasses, free of vLLM: the supervisor, the analysis link and the tests use
them without starting anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from agent.engine.model_prep import ModelChoice
from pipelines.analysis.protocols import TokenLogprob

__all__ = [
    "ChatMessage",
    "EngineHealth",
    "EngineInfo",
    "EngineState",
    "GenerationChunk",
    "GenerationResult",
]

ChatMessage = Mapping[str, str]  # {"role": ..., "content": ...}
EngineState = Literal["stopped", "starting", "running", "stopping", "dead"]


@dataclass(frozen=True)
class EngineInfo:
    vllm_version: str
    backend: str
    model_dir: Path
    model: ModelChoice
    start_seconds: float
    kv_capacity_tokens: int | None
    max_model_len: int
    spec_method: str
    spec_k: int
    plan_outcome: str
    spec_reason: str = ""  # why this method: MTP found, the draft used, or why not


@dataclass(frozen=True)
class EngineHealth:
    state: EngineState
    healthy: bool
    detail: str


@dataclass(frozen=True)
class GenerationChunk:
    """New output since the previous chunk of one request."""

    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finished: bool
    finish_reason: str | None  # stop, length, abort, repetition, error
    num_prompt_tokens: int
    num_cached_tokens: int | None  # prompt tokens served from the prefix cache
    token_logprobs: tuple[TokenLogprob, ...] | None = None  # asked for with logprobs=True


@dataclass(frozen=True)
class GenerationResult:
    request_id: str
    text: str
    token_ids: tuple[int, ...]
    finish_reason: str | None
    num_prompt_tokens: int
    num_cached_tokens: int | None
    ttft_s: float | None
    total_s: float
    tokens: tuple[TokenLogprob, ...] | None = None  # each token's log-probability, if asked

    @property
    def tokens_per_s(self) -> float | None:
        """Decode rate after the first token (None for fewer than two tokens)."""
        if self.ttft_s is None or len(self.token_ids) < 2 or self.total_s <= self.ttft_s:
            return None
        return (len(self.token_ids) - 1) / (self.total_s - self.ttft_s)
