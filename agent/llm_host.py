"""Hosts the embedded engine inside the daemon: start it beside the pipeline, report it.

The keyword tier never waits for the engine: the engine starts in its own task after MQTT
and the pipeline are up (a CPU start takes 10-30 s, a cold GPU start minutes). A profile
the memory planner says cannot fit is refused before vLLM is touched, with the planner's
verdict in the log and in the status; the service then runs keyword-only instead of
dying in vLLM's startup. `ready` is set while the engine serves: the slow tier
(pipelines.analysis, through agent.analysis_link) waits on it, and clears it through
`mark_down` when a request finds the engine gone. The OOM watchdog (issue 5) builds on
this host.
"""

from __future__ import annotations

import asyncio
from typing import Any

import structlog

from agent.engine import Engine, EngineProfile, EngineWontFit

__all__ = ["LlmHost"]

log = structlog.get_logger(__name__)


class LlmHost:
    def __init__(self, profile: EngineProfile) -> None:
        self.profile = profile
        self.engine = Engine()
        self.state = "stopped"  # stopped, starting, running, refused, failed
        self.detail: str | None = None
        self.ready = asyncio.Event()  # set while the engine serves requests

    async def run(self) -> None:
        """Start the engine once; a refusal or failure leaves the service keyword-only."""
        self.state = "starting"
        try:
            info = await self.engine.start(self.profile)
        except EngineWontFit as exc:
            self.state, self.detail = "refused", exc.verdict
            log.error("engine.refused", verdict=exc.verdict, plan=exc.plan_text)
            return
        except Exception as exc:  # any failure (an unwritable cache too) leaves keyword-only
            self.state, self.detail = "failed", f"{type(exc).__name__}: {exc}"
            log.error("engine.failed", error=self.detail)
            return
        self.state, self.detail = "running", info.plan_verdict
        self.ready.set()
        log.info(
            "engine.ready",
            vllm_version=info.vllm_version,
            backend=info.backend,
            model=str(info.model_dir),
            start_s=round(info.start_seconds, 1),
            spec=f"{info.spec_method} k={info.spec_k}",
            plan=info.plan_verdict,
        )

    def mark_down(self, exc: BaseException) -> None:
        """A request found the engine not serving (its core died): stop sending requests.
        Nothing starts it again yet: the slow tier stays off (keyword alerts go on) until
        the service restarts; the engine supervisor (issue 5) is what will restart it."""
        if self.ready.is_set():
            self.ready.clear()
            self.state, self.detail = "failed", f"{type(exc).__name__}: {exc}"
            log.error("engine.down", error=self.detail)

    async def stop(self) -> None:
        self.ready.clear()
        if self.engine.state != "stopped":
            await self.engine.shutdown()
        self.state = "stopped"

    def snapshot(self) -> dict[str, Any]:
        info = self.engine.info
        return {
            "state": self.state,
            "detail": self.detail,
            "vllm_version": info.vllm_version if info else None,
            "backend": info.backend if info else None,
            "spec": f"{info.spec_method} k={info.spec_k}" if info else None,
        }
