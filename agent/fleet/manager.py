"""Verify, validate, stage, apply, prove, acknowledge: one fleet document at a time.

1. Verify: JSON shape, Ed25519 signature by a trusted key, target (the topic's, and one of
   this device's), version above every version this target has verified before (replays
   and downgrades refused), not expired, only keys the fleet may set. Any failure:
   acknowledged `rejected` with the reason; nothing else changes.
2. Validate: the target's next layer over the local file, loaded by the same loader and
   pydantic models as a local file (the same located messages as `agentctl config
   validate`), and the memory planner when the engine changes.
3. Stage: `pending` (with the candidate) written atomically before the service changes.
4. Apply live (catalogue, keywords, stream settings, watchdog thresholds) or, when the
   profile, engine or LLM settings change, rebuild the slow tier on the new profile. An
   engine change waits (acknowledged `deferred`, at most `fleet.defer_max_s`) while a
   critical alert's analysis is running.
5. Health gate: within `fleet.health_gate_s`, MQTT connected, the pipeline making progress
   and (with the LLM tier) the engine serving. Passed: `applied`, the candidate becomes the
   last known good. Failed: the last known good is applied again (the engine rebuilt on it
   when the change had rebuilt it), acknowledged `rolled_back` with the reason.

A service killed between 3 and 5 starts on the last known good (the store's layers) and
acknowledges the interrupted version `rolled_back`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import structlog

from agent.config.loader import ConfigError, LoadedConfig, load_config
from agent.config.models import AgentConfig, FleetSettings
from agent.fleet.document import (
    MAX_DOCUMENT_BYTES,
    DocumentError,
    load_trusted_keys,
    parse_document,
    verify_signature,
)
from agent.fleet.layers import (
    check_remote,
    effective_hash,
    local_changed,
    next_layer,
    restarts_engine,
)
from agent.fleet.store import FleetState, FleetStore, TargetState
from pipelines.bounded_json import JsonRejected, parse_json

__all__ = [
    "FleetManager",
    "FleetService",
    "Health",
    "effective_config",
    "fleet_filters",
    "fleet_targets",
]

log = structlog.get_logger(__name__)

_GATE_POLL_S = 0.25
_GATE_MIN_S = 1.0  # a gate watches at least this long: one lucky poll proves nothing
_DEFER_POLL_S = 1.0


@dataclass(frozen=True)
class Health:
    ok: bool  # every condition holds now
    failed: str | None = None  # a condition that will not recover by waiting (engine refused)
    waiting: str | None = None  # what is not there yet


class FleetService(Protocol):
    """What the manager needs of the running service (agent.daemon.Daemon)."""

    loaded: LoadedConfig

    async def apply_config(self, loaded: LoadedConfig, *, engine: bool) -> None: ...

    def health_begin(self) -> None:
        """Mark the start of a health gate (progress and errors are counted from here)."""

    def health(self, *, engine: bool) -> Health: ...

    def critical_analysis_running(self) -> bool: ...


AckSink = Callable[[dict[str, Any]], Awaitable[bool]]  # True: the broker took the answer


def fleet_targets(settings: FleetSettings, device_id: str) -> list[str]:
    """This device's targets, in the order their layers apply."""
    return [f"fleet/{g}" for g in settings.groups] + [f"fleet/device/{device_id}"]


def fleet_filters(settings: FleetSettings, device_id: str) -> list[str]:
    """The MQTT topics this device takes documents from (FleetManager.target_of reverses)."""
    return [f"{t}/config" for t in fleet_targets(settings, device_id)]


def _layers(state: FleetState, targets: list[str]) -> list[tuple[str, dict[str, Any]]]:
    return [
        (f"{t} v{state.layers[t].version}", state.layers[t].layer)
        for t in targets
        if t in state.layers
    ]


def effective_config(local: LoadedConfig, store: FleetStore) -> LoadedConfig:
    """The configuration to start with: the local file under the last known good layers
    (a pending apply is never in it). A store that no longer validates over the local
    file (the operator changed it) is ignored, loudly: the local file wins."""
    cfg = local.config
    if not cfg.fleet.enabled:
        return local
    state = store.load()
    layers = _layers(state, fleet_targets(cfg.fleet, cfg.device_id))
    if not layers:
        return local
    try:
        return _reload(local, layers)
    except ConfigError as exc:
        log.error("fleet.layers_invalid", error=str(exc), layers=[n for n, _ in layers])
        return local


def _reload(local: LoadedConfig, layers: list[tuple[str, dict[str, Any]]]) -> LoadedConfig:
    return load_config(
        local.config_path,
        overrides=local.overrides,
        profile=local.profile_option,
        layers=layers,
    )


class FleetManager:
    def __init__(
        self,
        service: FleetService,
        local: LoadedConfig,
        store: FleetStore,
        publish_ack: AckSink,
        *,
        plan_check: Callable[[AgentConfig], str | None] | None = None,
    ) -> None:
        """`local`: the configuration without any fleet layer (what `reset` returns to).
        `plan_check`: the memory planner's refusal of a config (None: it fits); blocking."""
        self.service = service
        self.local = local
        self.store = store
        self.settings = local.config.fleet
        self.device_id = local.config.device_id
        self.targets = fleet_targets(self.settings, self.device_id)
        self._publish_ack = publish_ack
        self._plan_check = plan_check
        self._inbox: dict[str, bytes] = {}  # target -> the latest document: desired state
        self._wake = asyncio.Event()
        self.state = store.load()
        self.phase = "idle"  # idle | verifying | deferred | applying | gating
        # control.fault_injection only: hold an apply after staging it, so a test can kill
        # the service in the middle of one.
        self.pause_before_apply_s = 0.0
        self.documents = 0  # received
        self.handled = 0  # taken from the inbox and answered (or found already answered)
        self.answers_unpublished = 0  # answers the broker never took (in fleet.last only)
        self.superseded = 0

    # -- in (event loop, from the MQTT callback) ----------------------------------------

    def target_of(self, topic: str) -> str | None:
        target = topic.removesuffix("/config")
        return target if topic.endswith("/config") and target in self.targets else None

    def submit(self, topic: str, payload: bytes) -> None:
        target = self.target_of(topic)
        if target is None:
            return
        self.documents += 1
        if target in self._inbox:
            self.superseded += 1  # an older desired state nobody needs any more
        self._inbox[target] = payload
        self._wake.set()

    # -- running ------------------------------------------------------------------------

    async def run(self) -> None:
        await self._recover()
        while True:
            while not self._inbox:
                self._wake.clear()
                await self._wake.wait()
            target = next(iter(self._inbox))
            payload = self._inbox.pop(target)
            try:
                await self._handle(target, payload)
            except Exception as exc:  # a bug here must not stop the service
                log.exception("fleet.failed", target=target)
                try:
                    await self._ack(target, None, "rejected", f"internal error: {exc}")
                except Exception:  # the answer to a bug failed too: said and counted
                    self.answers_unpublished += 1
                    log.exception("fleet.answer_failed", target=target)
            finally:
                self.phase = "idle"
                self.handled += 1

    async def _recover(self) -> None:
        """At start: a pending apply from a run that was killed never became the last known
        good (the service started without it): say so. Layers that no longer validate over
        the local file (the service started on the local file alone): drop them, say so.
        Otherwise repeat the last answer (a kill may have come before it was published)."""
        pending = self.state.pending
        in_force = {name for name, _ in self.service.loaded.layers}
        stale = [t for t, s in self.state.layers.items() if f"{t} v{s.version}" not in in_force]
        for target in stale:
            dropped = self.state.layers.pop(target)
            await self._ack(
                target,
                dropped.version,
                "rolled_back",
                "invalid over the local file as it is now; running without this target's layer",
            )
        if pending is not None:
            self.state.pending = None
            log.warning("fleet.interrupted", target=pending["target"], version=pending["version"])
            await self._ack(
                pending["target"],
                pending["version"],
                "rolled_back",
                f"interrupted: the service stopped while {pending.get('phase', 'applying')}; "
                "the last known good is in force",
            )
        elif not stale and self.state.last:
            target, last = max(self.state.last.items(), key=lambda kv: kv[1].get("at", 0))
            await self._ack(target, last.get("version"), last["status"], last["reason"])

    async def _handle(self, target: str, payload: bytes) -> None:
        self.phase = "verifying"
        try:
            if len(payload) > MAX_DOCUMENT_BYTES:
                raise DocumentError(
                    "invalid_document", f"{len(payload)} bytes (at most {MAX_DOCUMENT_BYTES})"
                )
            doc, raw = await asyncio.to_thread(parse_document, payload)  # off the loop
            if raw.get("signature") == self.state.signatures.get(target):
                return  # the retained document, redelivered at a reconnect: already answered
            keys = await asyncio.to_thread(load_trusted_keys, self._keys_dir())
            verify_signature(raw, keys)
            if doc.target != target:
                raise DocumentError("wrong_target", f"signed for {doc.target}, sent to {target}")
            seen = self.state.seen.get(target, 0)
            if doc.version <= seen:
                kind = "replay" if doc.version == seen else "downgrade"
                raise DocumentError(kind, f"version {doc.version}; this target is at {seen}")
            if doc.expires_at is not None and doc.expires_at < time.time():
                raise DocumentError("expired", f"expired at {doc.expires_at:.0f}")
            check_remote(doc.patch, doc.reset)
        except DocumentError as exc:
            version = _version_of(payload)
            log.warning("fleet.rejected", target=target, reason=exc.reason, detail=exc.detail)
            await self._ack(target, version, "rejected", f"{exc.reason}: {exc.detail}")
            return
        # Verified: from the next save on (with its answer, or the staging) a replay of it
        # is refused and its redelivery ignored. Not saved alone: a kill before its answer
        # leaves the retained document to be handled again at the next start.
        self.state.seen[target] = doc.version
        self.state.signatures[target] = str(raw["signature"])

        layer = next_layer(
            self.state.layers[target].layer if target in self.state.layers else {},
            doc.patch,
            doc.reset,
        )
        signature = str(raw["signature"])
        candidate_layers = dict(self.state.layers)
        candidate_layers[target] = TargetState(doc.version, layer, time.time(), signature)
        try:
            candidate = await asyncio.to_thread(self._validate, candidate_layers)
        except ConfigError as exc:
            detail = "; ".join(str(i) for i in exc.issues)
            await self._ack(target, doc.version, "rejected", f"invalid_config: {detail}")
            return
        old = self.service.loaded
        changed = local_changed(old.config, candidate.config)
        if changed:
            await self._ack(
                target,
                doc.version,
                "rejected",
                f"local_changed: the local file changed since the start ({', '.join(changed)});"
                " restart the service to apply it, then send the document again",
            )
            return
        engine = restarts_engine(old.config, candidate.config)
        if engine and self._plan_check is not None:
            refusal = await asyncio.to_thread(self._plan_check, candidate.config)
            if refusal is not None:
                await self._ack(target, doc.version, "rejected", f"invalid_config: {refusal}")
                return
        applying = TargetState(doc.version, layer, time.time(), signature)
        if engine and not await self._defer_while_critical(target, doc.version):
            return
        await self._apply(target, applying, candidate, engine)

    def _validate(self, layers: dict[str, TargetState]) -> LoadedConfig:
        state = FleetState(layers=layers)
        return _reload(self.local, _layers(state, self.targets))

    async def _defer_while_critical(self, target: str, version: int) -> bool:
        """Wait (bounded) while a critical alert's analysis runs. False: a newer document
        for the target arrived meanwhile, this one is dropped (answered `rejected`)."""
        if not self.service.critical_analysis_running():
            return True
        self.phase = "deferred"
        self.state.pending = {"target": target, "version": version, "phase": "deferred",
                              "started_at": time.time()}  # fmt: skip
        await self._ack(target, version, "deferred", "a critical alert's analysis is running")
        deadline = time.monotonic() + self.settings.defer_max_s
        while self.service.critical_analysis_running() and time.monotonic() < deadline:
            if target in self._inbox:
                break
            await asyncio.sleep(_DEFER_POLL_S)
        if target in self._inbox:
            self.state.pending = None
            await self._ack(target, version, "rejected", "superseded by a newer document")
            return False
        return True

    async def _apply(
        self, target: str, new: TargetState, candidate: LoadedConfig, engine: bool
    ) -> None:
        version = new.version
        self.phase = "applying"
        self.state.pending = {
            "target": target,
            "version": version,
            "phase": "applying",
            "layer": new.layer,
            "engine": engine,
            "started_at": time.time(),
        }
        try:  # the pending record is what a restart mid-apply rolls back by
            await asyncio.to_thread(self.store.save, self.state)
            await asyncio.to_thread(
                self.store.write_view, "candidate.yaml", candidate.config.model_dump(mode="json")
            )
        except OSError as exc:  # a full disk: refuse the apply, the running config stays
            self.state.pending = None
            self.phase = "idle"
            log.error("fleet.state_not_saved", error=str(exc), target=target, version=version)
            await self._ack(target, version, "rejected", f"state not saved: {exc}")
            return
        log.info("fleet.applying", target=target, version=version, engine_restart=engine)
        if self.pause_before_apply_s:
            await asyncio.sleep(self.pause_before_apply_s)
        began = time.monotonic()
        try:
            await self.service.apply_config(candidate, engine=engine)
            self.phase = "gating"
            failure = await self._gate(engine)
        except Exception as exc:  # half applied: the last known good goes back in
            log.exception("fleet.apply_failed", target=target, version=version)
            failure = f"the apply failed: {type(exc).__name__}: {exc}"
        if failure is None:
            new.applied_at = time.time()
            self.state.layers[target] = new
            self.state.pending = None
            try:
                await asyncio.to_thread(self.store.save, self.state)
                await asyncio.to_thread(
                    self.store.write_view, "good.yaml", candidate.config.model_dump(mode="json")
                )
            except OSError as exc:  # applied and healthy; a restart re-learns it from the broker
                log.error("fleet.state_not_saved", error=str(exc), target=target, status="applied")
            took = round(time.monotonic() - began, 2)
            log.info("fleet.applied", target=target, version=version, seconds=took)
            await self._ack(target, version, "applied", f"healthy after {took} s", candidate)
            return
        log.error("fleet.rolling_back", target=target, version=version, reason=failure)
        good = await asyncio.to_thread(self._last_known_good)
        try:
            await self.service.apply_config(good, engine=engine)
        except Exception:  # keyword alerts still run; the next start uses the good layers
            log.exception("fleet.rollback_failed", target=target, version=version)
        self.state.pending = None
        reason = failure if failure.startswith("the apply") else f"health gate: {failure}"
        await self._ack(target, version, "rolled_back", reason, good)

    def _last_known_good(self) -> LoadedConfig:
        """The store's layers over the local file (what a restart would run now)."""
        try:
            return _reload(self.local, _layers(self.state, self.targets))
        except ConfigError:
            return self.local

    async def _gate(self, engine: bool) -> str | None:
        """None when healthy within the deadline (watched for at least _GATE_MIN_S);
        else why not."""
        began = time.monotonic()
        deadline = began + self.settings.health_gate_s
        self.service.health_begin()
        why = "no health report"
        while time.monotonic() < deadline:
            health = self.service.health(engine=engine)
            if health.ok and time.monotonic() - began >= _GATE_MIN_S:
                return None
            if health.failed is not None:
                return health.failed
            why = health.waiting or why
            await asyncio.sleep(_GATE_POLL_S)
        return f"not healthy within {self.settings.health_gate_s:g} s: {why}"

    async def _ack(
        self,
        target: str,
        version: int | None,
        status: str,
        reason: str,
        loaded: LoadedConfig | None = None,
    ) -> None:
        config = (loaded or self.service.loaded).config
        body = {
            "target": target,
            "version": version,
            "status": status,
            "reason": reason,
            "applied_at": time.time() if status == "applied" else None,
            "effective_hash": effective_hash(config),
            "device_id": self.device_id,
        }
        self.state.last[target] = {k: body[k] for k in ("version", "status", "reason")} | {
            "at": time.time()
        }
        try:
            await asyncio.to_thread(self.store.save, self.state)
        except OSError as exc:  # a full disk must not stop the service; said loudly
            log.error("fleet.state_not_saved", error=str(exc), target=target, status=status)
        try:
            published = await self._publish_ack(body)
        except Exception:
            published = False
            log.exception("fleet.ack_not_published", target=target, status=status)
        else:
            if not published:
                reason = "broker not reached"
                log.warning("fleet.ack_not_published", target=target, status=status, reason=reason)
        if not published:
            self.answers_unpublished += 1

    def _keys_dir(self) -> Path:
        folder = self.settings.trusted_keys_dir
        return folder if folder.is_absolute() else self.local.config_path.parent / folder

    def snapshot(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "phase": self.phase,
            "targets": self.targets,
            "applied": {t: s.version for t, s in self.state.layers.items()},
            "last": self.state.last,
            "documents": self.documents,
            "handled": self.handled,
            "superseded": self.superseded,
            "answers_unpublished": self.answers_unpublished,
        }


def _version_of(payload: bytes) -> int | None:
    """The version a rejected document claims, for its acknowledgement (None if unknown)."""
    try:
        doc = parse_json(payload, max_bytes=MAX_DOCUMENT_BYTES)
    except JsonRejected:
        return None
    version = doc.get("version") if isinstance(doc, dict) else None
    return version if isinstance(version, int) else None
