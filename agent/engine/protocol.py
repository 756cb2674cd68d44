"""What the rest of the service needs from an engine: the surface the supervisor
(agent.supervision), the analysis adapter (agent.analysis_link) and the daemon's
/metrics use. `agent.engine.Engine` is the one implementation; tests drive stand-ins
that satisfy it structurally (tests/watchdog/test_supervisor_faults.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from agent.engine.model_prep import ModelChoice
from agent.engine.profile import EngineProfile
from agent.engine.results import (
    ChatMessage,
    EngineHealth,
    EngineInfo,
    EngineState,
    GenerationResult,
)
from agent.engine.stats import EngineStats
from pipelines.latency import LatencyWindow

__all__ = ["EngineProtocol"]


class EngineProtocol(Protocol):
    @property
    def state(self) -> EngineState: ...

    @property
    def profile(self) -> EngineProfile | None:
        """The profile of the current (or last) start; None before the first."""

    @property
    def info(self) -> EngineInfo | None:
        """What the running engine serves; None when it is not running."""

    @property
    def model(self) -> ModelChoice | None:
        """What the last start chose to serve (kept after it stops)."""

    @property
    def ttft(self) -> LatencyWindow:
        """Request to first token, over the engine's life (every run)."""

    @property
    def per_token(self) -> LatencyWindow:
        """Time per generated token after the first, over the engine's life."""

    async def start(self, profile: EngineProfile) -> EngineInfo:
        """Raises EngineWontFit (the planner refuses the profile) or another error."""

    async def restart(self, profile: EngineProfile) -> EngineInfo:
        """Shut down and start again with `profile`."""

    async def shutdown(self) -> None:
        """Stop it (requests in flight end with finish_reason "abort")."""

    async def health(self, timeout: float = 5.0) -> EngineHealth: ...

    async def complete(
        self, prompt: Sequence[int] | Sequence[ChatMessage], **kwargs: Any
    ) -> GenerationResult:
        """One request, whole. Raises EngineDead, EngineNotRunning or EngineError."""

    def core_pids(self) -> list[int]:
        """The engine core processes' ids (empty when none)."""

    def stats(self) -> EngineStats: ...
