"""Exceptions the engine raises; callers never need to import vLLM's."""

from __future__ import annotations

__all__ = ["EngineDead", "EngineError", "EngineNotRunning", "EngineStartError", "EngineWontFit"]


class EngineError(Exception):
    """Base of every engine failure."""


class EngineNotRunning(EngineError):
    """generate/abort called while the engine is stopped or starting."""


class EngineWontFit(EngineError):
    """The planner says this model and profile cannot fit; `outcome` says why."""

    def __init__(self, outcome: str, plan_text: str) -> None:
        super().__init__(outcome)
        self.outcome = outcome
        self.plan_text = plan_text


class EngineStartError(EngineError):
    """vLLM failed to start (bad model folder, out of memory at start, ...)."""


class EngineDead(EngineError):
    """The engine-core process died (OOM kill, crash); restart to recover."""
