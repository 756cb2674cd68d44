"""agentctl's requests to the running service (the control socket's handler, agent.control):
status, the alarm list and an operator's ack / shelve / unshelve on it (agent.alarm_inbox), the
effective configuration, an engine restart, the fleet's state;
and with `control.fault_injection` (tests only) the faults a test injects: hold the next
fleet apply, hold queued input unprocessed, block the event loop.

The status is the same snapshot MQTT's status topic carries (agent.snapshot).
"""

from __future__ import annotations

import asyncio
import pwd
import time
from typing import Any, Protocol

import structlog

from agent.alarm_inbox import AlarmInbox
from agent.config.models import AgentConfig
from agent.fleet.manager import FleetManager
from agent.intake import Intake
from agent.snapshot import StatusBuilder
from agent.supervision import EngineSupervisor
from pipelines.keyword_stage import KeywordStage

__all__ = ["Commands", "Service"]

log = structlog.get_logger(__name__)


class Service(Protocol):
    """The parts of the running service the commands use (agent.daemon.Daemon)."""

    @property
    def cfg(self) -> AgentConfig: ...
    @property
    def status(self) -> StatusBuilder: ...
    @property
    def keywords(self) -> KeywordStage: ...
    @property
    def alarm_inbox(self) -> AlarmInbox: ...
    @property
    def intake(self) -> Intake: ...
    @property
    def supervisor(self) -> EngineSupervisor | None: ...
    @property
    def fleet(self) -> FleetManager | None: ...


class Commands:
    def __init__(self, service: Service) -> None:
        self._s = service

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        s = self._s
        cmd = req["cmd"]
        if cmd == "status":
            return {"ok": True, "status": s.status.snapshot().document()}
        if cmd == "alerts":
            return {
                "ok": True,
                "active": [a.public() for a in s.keywords.tracker.active()],
                "standing": [a.public() for a in s.keywords.alarms.standing()],
            }
        if cmd == "alarm":
            body = {"note": req.get("note"), "for_s": req.get("for_s")}
            user = _user(req.get("peer_uid"))
            return await s.alarm_inbox.local(
                str(req.get("id", "")), str(req.get("action", "")), body, user
            )
        if cmd == "config":
            return {"ok": True, "config": s.cfg.model_dump(mode="json")}
        if cmd == "engine.restart":
            if s.supervisor is None:
                return {"ok": False, "error": "no engine here (llm.enabled is false)"}
            if not s.supervisor.request_restart("operator"):
                return {"ok": False, "error": f"engine is {s.supervisor.state}: nothing to restart"}
            log.warning("control.engine_restart", rung=s.supervisor.rung.index)
            return {"ok": True, "state": s.supervisor.state}
        if cmd == "fleet":
            fleet = s.fleet.snapshot() if s.fleet is not None else {"enabled": False}
            return {"ok": True, "fleet": fleet}
        if cmd.startswith("fault.") and s.cfg.control.fault_injection:
            return self._fault(cmd, req)
        return {"ok": False, "error": f"unknown command {cmd!r}"}

    def _fault(self, cmd: str, req: dict[str, Any]) -> dict[str, Any]:
        s = self._s
        if cmd == "fault.pause_fleet_apply":
            if s.fleet is None:
                return {"ok": False, "error": "fleet.enabled is false"}
            s.fleet.pause_before_apply_s = float(req.get("seconds", 0))
            return {"ok": True}
        if cmd == "fault.pause_detect":
            # Segments are taken in and queued, but not detected (nor acknowledged) for the
            # given seconds: the window a SIGKILL must not lose anything in.
            s.intake.pause(float(req.get("seconds", 0)))
            log.warning("control.fault_injection", detect_paused_s=req.get("seconds"))
            return {"ok": True}
        if cmd == "fault.block_loop":
            seconds = float(req.get("seconds", 0))
            log.warning("control.fault_injection", blocked_s=seconds)
            # After the answer is written: the loop then hangs for real (time.sleep on it).
            asyncio.get_running_loop().call_later(0.2, time.sleep, seconds)
            return {"ok": True, "blocked_s": seconds}
        return {"ok": False, "error": f"unknown command {cmd!r}"}


def _user(uid: object) -> str:
    """The control socket peer's user name (its uid if the system has no name for it)."""
    if not isinstance(uid, int):
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
