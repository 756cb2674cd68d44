"""`status.llm.model` and `status.llm.engine`: what the engine serves and its own figures
(agent.engine: ModelChoice.as_dict, and the supervisor's pick of EngineStats)."""

from __future__ import annotations

from pydantic import Field

from agent.status.base import StatusModel

__all__ = ["EngineFigures", "ModelStatus"]


class ModelStatus(StatusModel):
    """What the last start chose to serve (kept while restarting)."""

    path: str = Field(title="Path", description="The served model folder.")
    name: str = Field(
        title="Name", description="The served folder's name: `<base>` or `<base>+<adapter>`."
    )
    weights_sha256: str | None = Field(
        title="Weights digest", description="Digest of its tensors; null for dummy weights."
    )
    base: str = Field(title="Base", description="The base model's name.")
    adapter: str | None = Field(
        title="Adapter",
        description="Our LoRA merged in (`engine.adapter`); null when the base serves.",
    )
    adapter_sha256: str | None = Field(
        title="Adapter digest", description="The merged adapter's digest; null without one."
    )
    adapter_error: str | None = Field(
        title="Adapter error",
        description="Why the configured adapter is not in use (missing, damaged, "
        "mismatched); the base serves meanwhile.",
    )
    warning: str | None = Field(title="Warning", description="A caveat about the choice.")
    licence: str | None = Field(
        title="Licence",
        description="A bundled base's licence (`Apache-2.0` for SmolLM2, `Gemma Terms of Use` "
        "for Gemma 3); null for a model folder of your own.",
    )
    line: str = Field(title="Line", description="The one line `agentctl status` shows.")


class EngineFigures(StatusModel):
    """The engine's own view: this run's counters (reset at each start), latencies over
    every run."""

    requests: int = Field(title="Requests", description="Requests this run.")
    generated_tokens: int = Field(title="Generated tokens", description="Tokens this run.")
    num_waiting_reqs: int = Field(
        title="Waiting requests", description="Requests queued in the engine."
    )
    kv_cache_usage: float = Field(title="KV cache usage", description="KV cache in use (0-1).")
    prefix_cache_hit_rate: float | None = Field(
        title="Prefix-cache hit rate", description="Hits / queries; null before a query."
    )
    spec_method: str = Field(
        title="Speculative method", description="`mtp`, `draft`, `ngram` or `off`."
    )
    spec_k: int = Field(title="Speculative k", description="Speculative tokens per step run.")
    spec_acceptance_rate: float | None = Field(
        title="Acceptance rate",
        description="Speculative tokens accepted / drafted; null before a draft.",
    )
    spec_mean_accepted_length: float | None = Field(
        title="Mean accepted length",
        description="Tokens one verify step yields (1 + accepted / drafts); null before one.",
    )
    preemptions: int = Field(title="Preemptions", description="Requests preempted this run.")
    ttft_p50_s: float | None = Field(title="TTFT p50 (s)", description="Time to first token.")
    ttft_p95_s: float | None = Field(title="TTFT p95 (s)", description="Time to first token.")
    per_token_p50_s: float | None = Field(
        title="Per token p50 (s)", description="Time per output token after the first."
    )
    per_token_p95_s: float | None = Field(
        title="Per token p95 (s)", description="Time per output token after the first."
    )
