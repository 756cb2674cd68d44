"""The fleet state on disk: what is applied (the last known good), what is being applied,
and what each target last heard. One JSON file, replaced atomically (temp file, fsync,
rename, fsync of the folder), so a kill at any instant leaves the old state or the new one.

An apply writes `pending` (with the candidate layer) before it changes anything in the
running service and clears it once the health gate decided. A service that starts and finds
`pending` was killed mid-apply: the candidate is dropped, the layers (the last known good)
are what it runs, and the target is acknowledged `rolled_back`.

`good.yaml` and `candidate.yaml` beside it are the merged configurations, for an operator to
read; the service itself reads only `state.json`.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog
import yaml

from agent.status.fleet import FleetAnswer

__all__ = ["FleetState", "FleetStore", "TargetState"]

log = structlog.get_logger(__name__)


@dataclass
class TargetState:
    version: int
    layer: dict[str, Any]  # cumulative: every document of this target so far
    applied_at: float
    signature: str = ""  # of the document applied last: its redelivery is no news


@dataclass
class FleetState:
    layers: dict[str, TargetState] = field(default_factory=dict)
    seen: dict[str, int] = field(default_factory=dict)  # highest verified version per target
    # The signature of the last verified document per target: its redelivery (a retained
    # message, at every reconnect) is no news, whatever became of it.
    signatures: dict[str, str] = field(default_factory=dict)
    last: dict[str, dict[str, Any]] = field(default_factory=dict)  # the last ack per target
    pending: dict[str, Any] | None = None  # {"target", "version", "layer", "started_at"}


def _answer(saved: Any) -> dict[str, Any]:
    """A saved last answer, as it was written, once the status model reads it: the status
    shows these as they are, and one its model refused would stop every status (a
    ValidationError is a ValueError: the file is unreadable)."""
    FleetAnswer.model_validate(saved)
    return dict(saved)


class FleetStore:
    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.path = folder / "state.json"

    def load(self) -> FleetState:
        """The saved state; a file that cannot be read as one (a manual edit, a newer
        version's format, a last answer the status model refuses) is set aside as
        state.json.corrupt-<time> and the service starts on the local file alone: a broken
        fleet state must not keep the device down."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
            return FleetState(
                layers={t: TargetState(**v) for t, v in raw.get("layers", {}).items()},
                seen={t: int(v) for t, v in raw.get("seen", {}).items()},
                signatures={t: str(v) for t, v in raw.get("signatures", {}).items()},
                last={t: _answer(v) for t, v in raw.get("last", {}).items()},
                pending=raw.get("pending"),
            )
        except FileNotFoundError:
            return FleetState()
        except (OSError, ValueError, TypeError, AttributeError) as exc:
            aside = self.path.with_name(f"state.json.corrupt-{int(time.time())}")
            with contextlib.suppress(OSError):
                self.path.replace(aside)
            log.error("fleet.state_unreadable", path=str(self.path), moved_to=str(aside),
                      error=str(exc))  # fmt: skip
            return FleetState()

    def save(self, state: FleetState) -> None:
        body = {
            "layers": {
                t: {
                    "version": s.version,
                    "layer": s.layer,
                    "applied_at": s.applied_at,
                    "signature": s.signature,
                }
                for t, s in state.layers.items()
            },
            "seen": state.seen,
            "signatures": state.signatures,
            "last": state.last,
            "pending": state.pending,
            "saved_at": time.time(),
        }
        self._write(self.path, json.dumps(body, ensure_ascii=False, indent=1).encode())

    def write_view(self, name: str, config: dict[str, Any]) -> None:
        """good.yaml / candidate.yaml: the merged configuration, for people."""
        text = yaml.safe_dump(config, allow_unicode=True, sort_keys=False)
        self._write(self.folder / name, text.encode())

    def _write(self, path: Path, data: bytes) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        with tmp.open("wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(path)
        fd = os.open(self.folder, os.O_RDONLY)
        try:
            os.fsync(fd)  # the rename itself survives a power cut
        finally:
            os.close(fd)
