"""What a document does to the configuration.

Each target (a group, or this device) holds one cumulative layer: a new document first
drops the keys its `reset` pointers name (they fall back to the local file), then merges its
`patch` over what is left (mappings key by key, lists replaced whole: a `faults` patch is
the whole catalogue). The effective configuration is the device profile, the local file,
the groups' layers in the order the local file lists them, this device's layer, then the
command line's `--set`.

Only some top-level keys may come from the fleet (LIVE_KEYS, ENGINE_KEYS). The rest are
refused whole (NEVER_REMOTE), so a careless document cannot take the device off its broker,
open its control socket, change whom it trusts or silence its alerts by moving their
topics; and since a document must be signed, neither can a forged one.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

from agent.config.merge import deep_merge
from agent.config.models import AgentConfig
from agent.fleet.document import DocumentError

__all__ = [
    "ENGINE_KEYS",
    "LIVE_KEYS",
    "NEVER_REMOTE",
    "check_remote",
    "effective_hash",
    "local_changed",
    "next_layer",
    "parse_pointer",
    "restarts_engine",
]

# Applied live, no restart: the catalogue, keyword matching, per-stream alert timing and
# disabled faults, the watchdog's memory thresholds (the rest of `watchdog` is the engine
# supervisor's: restart limits, hang time, backoff; those rebuild the slow tier).
LIVE_KEYS = frozenset({"alarms", "faults", "keywords", "streams", "watchdog"})
LIVE_WATCHDOG = frozenset(
    {"host_warn_bytes", "host_critical_bytes", "gpu_warn_bytes", "gpu_critical_bytes",
     "psi_warn_some_avg10", "psi_critical_full_avg10", "hysteresis"}
)  # fmt: skip
# Applied by restarting the engine (its profile, the analysis settings over it).
ENGINE_KEYS = frozenset({"profile", "engine", "llm"})
# Never from the fleet: identity, the broker link and its credentials, the control socket,
# whom the device trusts, where its state lives, its endpoints. `ingest` and `asr` are local
# for now (they would need their stages rebuilt).
NEVER_REMOTE = frozenset(
    {"device_id", "mqtt", "control", "fleet", "outbox", "metrics", "logging", "ingest", "asr"}
)
# Built once at start (the probe, the GPU handle, where the rung is kept; the command
# subscriptions and their queue).
_NEVER_NESTED = frozenset(
    {("watchdog", "state_path"), ("watchdog", "enabled"), ("alarms", "commands"),
     ("alarms", "max_pending_commands")}
)  # fmt: skip


def parse_pointer(pointer: str) -> tuple[str, ...]:
    """RFC 6901: "/streams/defaults/alerts" -> ("streams", "defaults", "alerts")."""
    if not pointer.startswith("/") or pointer == "/":
        raise DocumentError("invalid_document", f"reset pointer {pointer!r} is not /a/b")
    return tuple(p.replace("~1", "/").replace("~0", "~") for p in pointer[1:].split("/"))


def _paths(data: Mapping[str, Any], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out = []
    for key, value in data.items():
        path = (*prefix, str(key))
        out.append(path)
        if isinstance(value, Mapping):
            out += _paths(value, path)
    return out


def check_remote(patch: Mapping[str, Any], reset: Sequence[str]) -> None:
    """Raises DocumentError(not_remotely_settable) naming every key the fleet may not set."""
    bad: set[str] = set()
    for path in _paths(patch) + [parse_pointer(p) for p in reset]:
        if path[:2] in _NEVER_NESTED:
            bad.add(".".join(path[:2]))
        elif path[0] not in LIVE_KEYS | ENGINE_KEYS:
            bad.add(path[0])
    if bad:
        raise DocumentError("not_remotely_settable", ", ".join(sorted(bad)))


def next_layer(
    layer: Mapping[str, Any], patch: Mapping[str, Any], reset: Sequence[str]
) -> dict[str, Any]:
    """The target's layer after a document: reset pointers dropped, then the patch merged."""
    out = copy.deepcopy(dict(layer))
    for pointer in reset:
        *parents, leaf = parse_pointer(pointer)
        node: Any = out
        for part in parents:
            node = node.get(part) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return deep_merge(out, patch)


def restarts_engine(old: AgentConfig, new: AgentConfig) -> bool:
    """Does going from `old` to `new` need the slow tier rebuilt (engine, supervisor)?"""
    keys = set(ENGINE_KEYS)
    if old.model_dump(include=keys, mode="json") != new.model_dump(include=keys, mode="json"):
        return True
    supervisor = set(type(old.watchdog).model_fields) - LIVE_WATCHDOG
    return old.watchdog.model_dump(include=supervisor) != new.watchdog.model_dump(
        include=supervisor
    )


def local_changed(running: AgentConfig, candidate: AgentConfig) -> list[str]:
    """Keys the fleet may not set that differ between the running configuration and a
    candidate: the local file was edited since the start (a restart applies that, not a
    fleet document)."""
    keys = set(NEVER_REMOTE)
    old = running.model_dump(include=keys, mode="json")
    new = candidate.model_dump(include=keys, mode="json")
    return sorted(k for k in keys if old.get(k) != new.get(k))


def effective_hash(config: AgentConfig) -> str:
    """A short hash of the whole effective configuration (the acknowledgement carries it,
    so a fleet tool sees at a glance which devices run the same thing)."""
    body = json.dumps(config.model_dump(mode="json"), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(body.encode()).hexdigest()[:16]
