"""Operators' commands on alarms: `<prefix>/alerts/<id>/ack|shelve|unshelve` over MQTT, and
`agentctl alerts ack|shelve|unshelve` through the control socket (docs/alarms.md).

A command over MQTT is read within bounds (size, JSON depth, the body's schema), checked
against `alarms.operators`, queued (bounded: `alarms.max_pending_commands`) and applied one at
a time by `run` through the keyword stage, which commits its audit event to the outbox; only
then is the message acknowledged to the broker, like input (a crash before that: the broker
sends it again). A command that cannot be read, is not allowed, or names no alarm on the
list changes nothing: it is counted by reason (`status.alarms.refused`), reported on
`<prefix>/errors` and acknowledged.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import structlog
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from agent.config.alarms import AlarmsSettings
from agent.status.alarms import AlarmsStatus
from pipelines.alarm_list import AlarmList
from pipelines.alarms import LISTED, Action, AlarmCommand, AlarmRefused, AlarmState, RefusalReason
from pipelines.alerts import AlertEvent
from pipelines.bounded_json import parse_json
from pipelines.queues import SheddingQueue

__all__ = ["AlarmDesk", "AlarmInbox", "CommandBody", "operator_property"]

log = structlog.get_logger(__name__)

_MAX_BYTES = 4096
_BUSY = "busy"


class CommandBody(BaseModel):
    """A command's JSON body (all optional; an empty payload is `{}`)."""

    model_config = ConfigDict(extra="forbid")

    by: str | None = Field(
        None, min_length=1, max_length=64, pattern=r"^\S+$", description="Who commands."
    )
    note: str | None = Field(None, max_length=256, description="Why (shelve: the reason).")
    for_s: float | None = Field(None, gt=0, description="shelve: for how many seconds.")


class AlarmDesk(Protocol):
    """Where commands are applied (pipelines.keyword_stage.KeywordStage fits)."""

    @property
    def alarms(self) -> AlarmList: ...

    async def command(self, cmd: AlarmCommand) -> list[AlertEvent]: ...


class ErrorSink(Protocol):
    def report(self, topic: str, reason: str, size: int, detail: str) -> None: ...


@dataclass(frozen=True)
class _Pending:
    command: AlarmCommand
    topic: str
    size: int
    settle: Callable[[], None]


class AlarmInbox:
    def __init__(
        self,
        prefix: str,
        settings: Callable[[], AlarmsSettings],
        desk: AlarmDesk,
        errors: ErrorSink,
        *,
        wall: Callable[[], float] = time.time,
    ) -> None:
        """`prefix`: the topic prefix; the commands are `<prefix>/alerts/<id>/<action>`."""
        self._head = f"{prefix}/alerts/"
        self.filters = [f"{self._head}+/{a.value}" for a in Action]
        self._settings = settings
        self._desk = desk
        self._errors = errors
        self._wall = wall
        self._queue: SheddingQueue[_Pending] = SheddingQueue(settings().max_pending_commands)
        self.applied: Counter[str] = Counter({a.value: 0 for a in Action})
        self.refused: Counter[str] = Counter({r.value: 0 for r in RefusalReason})
        self.refused[_BUSY] = 0

    # -- MQTT -----------------------------------------------------------------------------

    def target_of(self, topic: str) -> tuple[str, str] | None:
        """(alert id, action) of a command topic, or None for any other topic."""
        if not topic.startswith(self._head):
            return None
        alert_id, _, action = topic[len(self._head) :].rpartition("/")
        if not alert_id or "/" in alert_id or action not in _ACTIONS:
            return None
        return alert_id, action

    def submit(
        self, topic: str, payload: bytes, operator: str | None, settle: Callable[[], None]
    ) -> None:
        """One command message (`target_of(topic)` is not None; never raises for its
        content). `operator`: the MQTT 5 user property `operator`, if the publisher set
        one; it wins over the body's `by`."""
        target = self.target_of(topic)
        assert target is not None
        alert_id, action = target
        try:
            cmd = self.read(alert_id, action, payload, operator)
        except AlarmRefused as exc:
            settle()
            self._refuse(topic, len(payload), exc.reason.value, exc.detail)
            return
        if self._queue.full():
            settle()
            self._refuse(topic, len(payload), _BUSY, f"{self._queue.maxsize} commands pending")
            return
        self._queue.put(_Pending(cmd, topic, len(payload), settle))

    def read(
        self, alert_id: str, action: str, payload: bytes, operator: str | None = None
    ) -> AlarmCommand:
        """The command a message carries, authorised.

        Raises:
            AlarmRefused: `invalid` (unreadable, no operator named) or `forbidden`.
        """
        try:
            verb = Action(action)
            raw: Any = parse_json(payload or b"{}", max_bytes=_MAX_BYTES)
            body = CommandBody.model_validate(raw)
        except (ValueError, ValidationError) as exc:  # JsonRejected is a ValueError
            raise AlarmRefused(RefusalReason.invalid, _short(exc)) from exc
        by = operator or body.by
        if not by:
            raise AlarmRefused(
                RefusalReason.invalid,
                'name the operator: "by" in the body or the user property "operator"',
            )
        allowed = self._settings().operators
        if allowed is not None and by not in allowed:
            raise AlarmRefused(RefusalReason.forbidden, f"{by!r} is not in alarms.operators")
        return AlarmCommand(verb, alert_id, by, round(self._wall(), 3), body.note, body.for_s)

    async def run(self) -> None:
        """Apply queued commands, one at a time, each acknowledged once durable."""
        while True:
            item = await self._queue.get()
            try:
                await self._desk.command(item.command)
                self.applied[item.command.action.value] += 1
                self._log(item.command)
            except AlarmRefused as exc:
                self._refuse(item.topic, item.size, exc.reason.value, exc.detail)
            finally:
                item.settle()

    # -- the control socket ---------------------------------------------------------------

    async def local(
        self, alert_id: str, action: str, body: dict[str, Any], user: str
    ) -> dict[str, Any]:
        """`agentctl alerts ack|shelve|unshelve`: applied now, the answer for the socket."""
        try:
            parsed = CommandBody.model_validate({k: v for k, v in body.items() if v is not None})
            at = round(self._wall(), 3)
            who = f"local:{user}"
            cmd = AlarmCommand(Action(action), alert_id, who, at, parsed.note, parsed.for_s)
            events = await self._desk.command(cmd)
        except (ValueError, ValidationError) as exc:
            self.refused[RefusalReason.invalid.value] += 1
            return {"ok": False, "reason": RefusalReason.invalid.value, "error": _short(exc)}
        except AlarmRefused as exc:
            self.refused[exc.reason.value] += 1
            return {"ok": False, "reason": exc.reason.value, "error": exc.detail}
        self.applied[action] += 1
        self._log(cmd)
        return {"ok": True, "events": [e.payload() for e in events]}

    # -- status ---------------------------------------------------------------------------

    def snapshot(self) -> AlarmsStatus:
        alarms = self._desk.alarms
        states = Counter({s.value: 0 for s in AlarmState if s in LISTED})
        states.update(a.alarm.state.value for a in alarms.listed())
        return AlarmsStatus(
            by_state=dict(states),
            standing=len(alarms.standing()),
            dropped=alarms.dropped,
            applied=dict(self.applied),
            refused=dict(self.refused),
            pending=len(self._queue),
        )

    def _refuse(self, topic: str, size: int, reason: str, detail: str) -> None:
        self.refused[reason] += 1
        self._errors.report(topic, f"alarm_{reason}", size, detail)

    def _log(self, cmd: AlarmCommand) -> None:
        log.info(
            "alarm.command",
            action=cmd.action.value,
            alert_id=cmd.alert_id,
            by=cmd.by,
            note=cmd.note,
            for_s=cmd.for_s,
        )


_ACTIONS = frozenset(a.value for a in Action)


def operator_property(properties: Any) -> str | None:
    """The MQTT 5 user property `operator` of a message, if it has one (a str)."""
    pairs = getattr(properties, "UserProperty", None) or ()
    for item in pairs:
        if isinstance(item, tuple) and len(item) == 2 and item[0] == "operator":
            value = item[1]
            return value if isinstance(value, str) and value else None
    return None


def _short(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "body"
        return f"{where}: {first['msg']}"
    return str(exc)[:200]
