"""The ladder's rung on disk, so that a reboot starts from the settings that were safe.

One small JSON file in the state directory, replaced atomically (temp file, fsync, rename,
fsync of the folder): a power cut leaves the old rung or the new one, never half a file.
A file that does not parse, or that belongs to another profile (fingerprint), is set
aside and the service starts on rung 0, saying so.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

__all__ = ["RungRecord", "RungStore"]

log = structlog.get_logger(__name__)

_HISTORY = 20


@dataclass
class RungRecord:
    rung: int = 0
    name: str = "as configured"
    reason: str | None = None
    at: float | None = None  # epoch seconds of the last change
    quiet_since: float | None = None  # epoch seconds memory was last tight (or `at`)
    fingerprint: str | None = None
    history: list[dict[str, Any]] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "rung": self.rung,
            "name": self.name,
            "reason": self.reason,
            "at": self.at,
            "quiet_since": self.quiet_since,
            "fingerprint": self.fingerprint,
            "history": self.history[-_HISTORY:],
        }


class RungStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.notice: str | None = None  # why the last load did not use the file, if it did not

    def load(self, fingerprint: str) -> RungRecord:
        """The persisted record for this ladder; rung 0 when none fits (`notice` says why)."""
        self.notice = None
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return RungRecord(fingerprint=fingerprint)
        except OSError as exc:
            self.notice = f"unreadable ({exc}): rung 0"
            log.error("watchdog.state_unreadable", path=str(self.path), error=str(exc))
            return RungRecord(fingerprint=fingerprint)
        try:
            data = json.loads(raw)
            record = RungRecord(
                rung=max(0, int(data["rung"])),
                name=str(data["name"]),
                reason=data.get("reason"),
                at=data.get("at"),
                quiet_since=data.get("quiet_since"),
                fingerprint=data.get("fingerprint"),
                history=list(data.get("history", [])),
            )
        except (ValueError, KeyError, TypeError) as exc:
            aside = self.path.with_suffix(f".bad-{int(time.time())}")
            try:
                self.path.replace(aside)
            except OSError as move:  # a read-only state directory: leave it, start on 0
                aside = self.path
                log.error("watchdog.state_not_moved", path=str(self.path), error=str(move))
            self.notice = f"damaged ({exc}), kept as {aside.name}: rung 0"
            log.error(
                "watchdog.state_corrupt", path=str(self.path), kept_as=str(aside), error=str(exc)
            )
            return RungRecord(fingerprint=fingerprint)
        if record.fingerprint != fingerprint:
            self.notice = f"rung {record.rung} was taken on another profile or model: rung 0"
            log.warning(
                "watchdog.state_other_profile",
                path=str(self.path),
                rung=record.rung,
                detail="the profile or window changed since this rung was taken: rung 0",
            )
            return RungRecord(fingerprint=fingerprint, history=record.history)
        return record

    @staticmethod
    def encode(record: RungRecord) -> bytes:
        """The file's bytes for `record`: a snapshot, safe to write from another thread."""
        return json.dumps(record.as_dict(), indent=2, ensure_ascii=False).encode()

    def save(self, record: RungRecord | bytes) -> None:
        """Write atomically. Blocking (fsync): call it off the event loop, with the record
        already serialised (`encode`) on the loop so the loop may go on changing it."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        data = record if isinstance(record, bytes) else self.encode(record)
        # A temporary file of its own: a save whose awaiting task was cancelled still runs
        # in its thread, and must not write into the next save's file.
        fd, name = tempfile.mkstemp(
            dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".tmp"
        )
        tmp = Path(name)
        try:
            try:
                os.fchmod(fd, 0o640)
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            tmp.replace(self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        dir_fd = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
