"""Sparkplug's two counters: the message `seq` and the session's `bdSeq`.

- `seq` numbers every message of the node after its NBIRTH: the NBIRTH carries 0, each
  DBIRTH, DDATA, DDEATH (and NDATA) after it the previous value plus one, wrapping from 255
  to 0. A rebirth (a host's `Node Control/Rebirth`) starts again at 0 with the new NBIRTH.
  The NDEATH carries no `seq`.
- `bdSeq` (birth/death sequence) numbers the node's MQTT sessions, 0 to 255 wrapping: one
  more at every CONNECT, written to disk before that CONNECT, so that a restart never reuses
  the number of the session before it. The will (NDEATH) registered with the CONNECT and the
  NBIRTH after it carry the same bdSeq, which is how a host pairs a death with its birth.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from pathlib import Path

import structlog

__all__ = ["BdSeqStore", "SeqCounter"]

log = structlog.get_logger(__name__)

_WRAP = 256


class SeqCounter:
    """`seq`: `birth()` for an NBIRTH (0), `next()` for every message after it."""

    def __init__(self) -> None:
        self._last: int | None = None  # None: no NBIRTH in this session yet

    def birth(self) -> int:
        self._last = 0
        return 0

    def next(self) -> int:
        if self._last is None:
            raise RuntimeError("a Sparkplug message before the node's NBIRTH")
        self._last = (self._last + 1) % _WRAP
        return self._last

    @property
    def last(self) -> int | None:
        return self._last


class BdSeqStore:
    """The last bdSeq used, in a small JSON file (`{"bdseq": n}`) beside the outbox."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.current: int | None = None  # the bdSeq of the session being (or last) connected

    async def advance(self) -> int:
        """The bdSeq of the next session (0 on a fresh device), stored before it is used.
        The file is read and written in a worker thread (nothing blocks the loop)."""
        value = await asyncio.to_thread(self._advance)
        self.current = value
        return value

    def _advance(self) -> int:
        last = self._read()
        value = 0 if last is None else (last + 1) % _WRAP
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(self.path.suffix + ".tmp")
        with tmp.open("w", encoding="utf-8") as f:
            json.dump({"bdseq": value}, f)
            f.flush()
            os.fsync(f.fileno())
        tmp.replace(self.path)
        return value

    def _read(self) -> int | None:
        """The stored value; a missing file is a fresh device, a damaged one is logged and
        read as missing (the hosts see bdSeq 0 again, which they take as a new session)."""
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("sparkplug.bdseq_unreadable", path=str(self.path), error=str(exc))
            return None
        value = data.get("bdseq") if isinstance(data, dict) else None
        if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < _WRAP:
            return value
        log.warning("sparkplug.bdseq_unreadable", path=str(self.path), error=f"value {value!r}")
        with contextlib.suppress(OSError):
            self.path.unlink()
        return None
