"""`llm:`: the slow tier's settings on top of the analyzer's own."""

from __future__ import annotations

from pydantic import ConfigDict, Field

from agent.engine.profile import EngineProfile
from pipelines.analysis import AnalysisSettings

__all__ = ["LlmSettings"]


class LlmSettings(AnalysisSettings):
    """The slow tier: the embedded engine reads each stream's rolling context."""

    model_config = ConfigDict(extra="forbid", frozen=True, protected_namespaces=())

    enabled: bool = Field(
        False, title="LLM analysis", description="Run the embedded engine's slow-tier analysis."
    )

    def context_budget(self, engine: EngineProfile) -> int:
        """Tokens of one stream's prompt: the configured window, else what the engine's
        context length leaves after the answer."""
        if self.context_tokens is not None:
            return self.context_tokens
        return engine.max_model_len - self.max_output_tokens
