"""The ingest spool: accepted segments that do not fit the in-memory queue wait on disk.

A burst larger than `ingest.queue_size` (a publisher catching up after an outage, a
broker that delivers more than Receive Maximum allows) used to be shed after the broker
was told we had it. Now, once the queue is full, every new segment goes to this SQLite
file first and its MQTT acknowledgement is sent only when the row is committed; the
intake (agent/intake.py) takes spooled segments in order once the queue has drained, and
deletes each batch only after the keyword stage has committed its alert events. Segments
are shed (counted, reported, named) only when the spool holds `ingest.spool_max_segments`.

One database (WAL, `synchronous=FULL`), all work on one thread, writes batched (every
segment waiting when the writer runs goes in one transaction) and retried by the
service's write policy (agent/storage.py). A damaged file at start is moved aside and its
readable rows saved (agent/salvage.py), like the outbox.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from agent.salvage import Salvage, inspect, set_aside
from agent.storage import WriteRetry
from pipelines.ingest import Segment

__all__ = ["Spool", "Spooled"]

log = structlog.get_logger(__name__)
T = TypeVar("T")
_TABLES = {"spool": ("segment",)}
_SCHEMA = """
CREATE TABLE IF NOT EXISTS spool (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    segment TEXT NOT NULL          -- the Segment as JSON
);
"""


@dataclass(frozen=True)
class Spooled:
    id: int
    segment: Segment


class _Db:
    """Synchronous core; only ever called from the spool's thread."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)

    def add(self, texts: Sequence[str]) -> int:
        """Insert in one transaction; returns the rows held after it."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            self.db.executemany("INSERT INTO spool (segment) VALUES (?)", [(t,) for t in texts])
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")
        return self.depth()

    def restore(self, salvage: Salvage) -> None:
        self.add([row[0] for row in salvage.rows.get("spool", [])])

    def peek(self, limit: int) -> list[tuple[int, str]]:
        rows = self.db.execute(
            "SELECT id, segment FROM spool ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        return [(int(r[0]), str(r[1])) for r in rows]

    def delete_through(self, last_id: int) -> tuple[int, int]:
        """Delete up to `last_id`; returns (rows deleted, rows left)."""
        gone = self.db.execute("DELETE FROM spool WHERE id <= ?", (last_id,)).rowcount
        return int(gone), self.depth()

    def depth(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM spool").fetchone()[0])

    def close(self) -> None:
        self.db.close()


class Spool:
    """Async face of the spool; `depth` counts what is on disk and on its way there."""

    def __init__(self, path: Path, max_segments: int, writes: WriteRetry | None = None) -> None:
        self.path = path
        self.max_segments = max_segments
        self._writes = writes or WriteRetry()
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="spool")
        self._db: _Db | None = None
        self._waiting: list[tuple[Segment, Callable[[], None] | None]] = []
        self._wake = asyncio.Event()
        self.stored = 0  # rows on disk
        self.written = 0  # segments ever spooled
        self.taken = 0  # segments ever taken back
        self.salvage: Salvage | None = None
        self.ready = asyncio.Event()  # rows on disk to take

    @property
    def depth(self) -> int:
        return self.stored + len(self._waiting)

    @property
    def write_errors(self) -> int:
        return self._writes.errors("spool")

    def full(self) -> bool:
        return self.depth >= self.max_segments

    async def open(self) -> None:
        self._db = await self._call(self._open_db)
        self.stored = await self._run(lambda d: d.depth())
        if self.stored:
            self.ready.set()
            log.info("spool.resume", pending=self.stored, path=str(self.path))

    def _open_db(self) -> _Db:
        why = inspect(self.path, tuple(_TABLES))
        if why is None:
            try:
                return _Db(self.path)
            except sqlite3.DatabaseError as exc:
                if isinstance(exc, sqlite3.OperationalError):
                    raise
                why = f"cannot be written: {exc}"
        self.salvage = set_aside(self.path, why, _TABLES)
        db = _Db(self.path)
        db.restore(self.salvage)
        return db

    async def close(self) -> None:
        if self._db is not None:
            await self._run(lambda d: d.close())
            self._db = None
        self._pool.shutdown(wait=True)

    def put(self, segment: Segment, settle: Callable[[], None] | None) -> None:
        """Queue `segment` for the disk; `settle` (its MQTT acknowledgement) runs once it is
        committed. The caller checks `full()` first."""
        self._waiting.append((segment, settle))
        self._wake.set()

    async def run_writer(self) -> None:
        """Commit what waits, in batches, and acknowledge each segment once it is on disk."""
        while True:
            if not self._waiting:
                self._wake.clear()
                await self._wake.wait()
                continue
            batch, self._waiting = self._waiting, []
            texts = [s.model_dump_json() for s, _ in batch]

            async def write(texts: list[str] = texts) -> int:
                return await self._run(lambda d: d.add(texts))

            # Both writes and deletes run on the spool's one thread, in order, and each
            # returns the count it left: the last to finish sets `stored`.
            self.stored = await self._writes.until_written("spool", self.path, write)
            self.written += len(batch)
            self.ready.set()
            for _, settle in batch:
                if settle is not None:
                    settle()

    async def peek(self, limit: int) -> list[Spooled]:
        rows = await self._run(lambda d: d.peek(limit))
        out = []
        for row_id, text in rows:
            try:
                out.append(Spooled(row_id, Segment.model_validate_json(text)))
            except ValueError:  # written by us, so only a damaged row: logged, skipped
                log.error("spool.unreadable_row", id=row_id, path=str(self.path))
        if not out and rows:
            await self.done_through(rows[-1][0])
        return out

    async def done_through(self, last_id: int) -> None:
        """Rows up to `last_id` were processed (their alert events committed)."""
        gone, self.stored = await self._writes.until_written(
            "spool", self.path, lambda: self._run(lambda d: d.delete_through(last_id))
        )
        self.taken += gone
        if not self.stored:
            self.ready.clear()

    async def _run(self, fn: Callable[[_Db], T]) -> T:
        db = self._db
        if db is None:
            raise RuntimeError("spool is not open")
        return await self._call(lambda: fn(db))

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
