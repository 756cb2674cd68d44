"""The durable outbox: alert events live in SQLite until the broker acknowledged them.

One database (WAL) holds two tables written in the same transaction: the events still to
publish, in order, and the alerts still active (so ids and sequence numbers survive a
restart), each with whether it has a debounced update not yet emitted (so a match that was
only counted is not lost by a crash: it is emitted after the restart), and a third the
alarms that ended unacknowledged (`unack_cleared`, pipelines/alarm_list.py), which stand
until an operator acknowledges them. A row leaves
`outbox` only after PUBACK; a SIGKILL between publish and delete means the event goes out
again after restart, which is why consumers dedupe by (alert id, seq). `synchronous=FULL`:
an alert that was accepted survives a power cut too, at one fsync per event, which alert
rates afford.

All SQLite work runs on one dedicated thread: the event loop never waits on the disk.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import structlog

from agent.salvage import Salvage, inspect, set_aside
from agent.storage import WriteRetry
from pipelines.alerts import Alert

__all__ = ["Outbox", "OutboxRow", "PendingEvent"]

log = structlog.get_logger(__name__)

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outbox (
    id      INTEGER PRIMARY KEY AUTOINCREMENT,
    topic   TEXT NOT NULL,
    payload BLOB NOT NULL,
    kind    TEXT NOT NULL,      -- new / update / end: updates are shed first when full
    created REAL NOT NULL
);
CREATE TABLE IF NOT EXISTS active_alerts (
    stream_id TEXT NOT NULL,
    fault     TEXT NOT NULL,
    event_seq INTEGER NOT NULL,
    alert     TEXT NOT NULL,
    PRIMARY KEY (stream_id, fault)
);
CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL);
CREATE TABLE IF NOT EXISTS standing_alarms (
    id        TEXT PRIMARY KEY,
    event_seq INTEGER NOT NULL,
    alert     TEXT NOT NULL
);
"""


_PENDING = "pending_update"  # stored beside the public alert, never published
# What a damaged file's rows are read back as (agent/salvage.py), table by table.
_TABLES = {
    "outbox": ("topic", "payload", "kind", "created"),
    "active_alerts": ("stream_id", "fault", "event_seq", "alert"),
    "counters": ("name", "value"),
    "standing_alarms": ("id", "event_seq", "alert"),
}


def _stored(alert: Alert) -> str:
    return json.dumps({**alert.public(), _PENDING: alert.dirty})


@dataclass(frozen=True)
class PendingEvent:
    topic: str
    payload: bytes
    kind: str


@dataclass(frozen=True)
class OutboxRow:
    id: int
    topic: str
    payload: bytes


class _Store:
    """Synchronous core; only ever called from the outbox thread."""

    def __init__(self, path: Path, max_events: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.db = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute("PRAGMA synchronous=FULL")
        self.db.executescript(_SCHEMA)
        self.max_events = max_events

    def append(
        self,
        events: Sequence[PendingEvent],
        upserts: Sequence[Alert],
        deletes: Sequence[tuple[str, str]],
        standing_upserts: Sequence[Alert] = (),
        standing_deletes: Sequence[str] = (),
    ) -> tuple[int, int]:
        """Returns (rows shed to stay in bound, depth after the append)."""
        now = time.time()
        with self._tx():
            self.db.executemany(
                "INSERT INTO outbox (topic, payload, kind, created) VALUES (?, ?, ?, ?)",
                [(e.topic, e.payload, e.kind, now) for e in events],
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO active_alerts (stream_id, fault, event_seq, alert) "
                "VALUES (?, ?, ?, ?)",
                [(a.stream_id, a.fault, a.event_seq, _stored(a)) for a in upserts],
            )
            self.db.executemany(
                "DELETE FROM active_alerts WHERE stream_id = ? AND fault = ?", deletes
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO standing_alarms (id, event_seq, alert) VALUES (?, ?, ?)",
                [(a.id, a.event_seq, json.dumps(a.public())) for a in standing_upserts],
            )
            self.db.executemany(
                "DELETE FROM standing_alarms WHERE id = ?", [(i,) for i in standing_deletes]
            )
            return self._enforce_bound()

    def _enforce_bound(self) -> tuple[int, int]:
        (depth,) = self.db.execute("SELECT COUNT(*) FROM outbox").fetchone()
        excess = depth - self.max_events
        if excess <= 0:
            return 0, int(depth)
        # Updates are superseded by the alert's later events; shed them before new/end.
        shed = self.db.execute(
            "DELETE FROM outbox WHERE id IN "
            "(SELECT id FROM outbox WHERE kind = 'update' ORDER BY id LIMIT ?)",
            (excess,),
        ).rowcount
        if shed < excess:
            shed += self.db.execute(
                "DELETE FROM outbox WHERE id IN (SELECT id FROM outbox ORDER BY id LIMIT ?)",
                (excess - shed,),
            ).rowcount
        self.db.execute(
            "INSERT INTO counters (name, value) VALUES ('shed', ?) "
            "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
            (shed,),
        )
        return int(shed), int(depth) - int(shed)

    def peek(self, limit: int) -> list[OutboxRow]:
        rows = self.db.execute(
            "SELECT id, topic, payload FROM outbox ORDER BY id LIMIT ?", (limit,)
        ).fetchall()
        return [OutboxRow(int(r[0]), str(r[1]), bytes(r[2])) for r in rows]

    def ack(self, row_id: int) -> int:
        return int(self.db.execute("DELETE FROM outbox WHERE id = ?", (row_id,)).rowcount)

    def depth(self) -> int:
        return int(self.db.execute("SELECT COUNT(*) FROM outbox").fetchone()[0])

    def shed_total(self) -> int:
        row = self.db.execute("SELECT value FROM counters WHERE name = 'shed'").fetchone()
        return int(row[0]) if row else 0

    def active(self) -> list[Alert]:
        rows = self.db.execute("SELECT event_seq, alert FROM active_alerts").fetchall()
        out = []
        for event_seq, text in rows:
            data = json.loads(text)
            alert = Alert.from_public(data, int(event_seq))
            alert.dirty = bool(data.get(_PENDING))
            out.append(alert)
        return out

    def standing(self) -> list[Alert]:
        rows = self.db.execute("SELECT event_seq, alert FROM standing_alarms").fetchall()
        return [Alert.from_public(json.loads(text), int(seq)) for seq, text in rows]

    def restore(self, salvage: Salvage) -> None:
        """Put a damaged file's readable rows into this fresh store, in their order."""
        rows = salvage.rows
        with self._tx():
            self.db.executemany(
                "INSERT INTO outbox (topic, payload, kind, created) VALUES (?, ?, ?, ?)",
                rows.get("outbox", []),
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO active_alerts (stream_id, fault, event_seq, alert) "
                "VALUES (?, ?, ?, ?)",
                rows.get("active_alerts", []),
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO counters (name, value) VALUES (?, ?)",
                rows.get("counters", []),
            )
            self.db.executemany(
                "INSERT OR REPLACE INTO standing_alarms (id, event_seq, alert) VALUES (?, ?, ?)",
                rows.get("standing_alarms", []),
            )

    def close(self) -> None:
        self.db.close()

    def _tx(self) -> _Transaction:
        return _Transaction(self.db)


class _Transaction:
    def __init__(self, db: sqlite3.Connection) -> None:
        self.db = db

    def __enter__(self) -> None:
        self.db.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, *_: object) -> None:
        self.db.execute("ROLLBACK" if exc_type else "COMMIT")


class Outbox:
    """Async face of the store; every call hops to the outbox's own thread."""

    def __init__(self, path: Path, max_events: int, writes: WriteRetry | None = None) -> None:
        self._path = path
        self._max_events = max_events
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outbox")
        self._store: _Store | None = None
        self._writes = writes or WriteRetry()
        self.changed = asyncio.Event()  # set whenever rows were added
        self.depth = 0
        self.shed = 0
        self.salvage: Salvage | None = None  # the damaged file found at open, if any

    @property
    def write_errors(self) -> int:
        """Failed commits (inserts and deletes), each retried (status.outbox.write_errors)."""
        return self._writes.errors("outbox")

    async def open(self) -> None:
        """Open (create) the store. A file that is damaged, or not ours, is moved aside and
        its readable rows carried into a fresh one (agent/salvage.py): the service starts."""
        self._store = await self._call(self._open_store)
        self.depth = await self._run(lambda s: s.depth())
        self.shed = await self._run(lambda s: s.shed_total())
        if self.depth:
            self.changed.set()
            log.info("outbox.resume", pending=self.depth, path=str(self._path))

    def _open_store(self) -> _Store:
        why = inspect(self._path, tuple(_TABLES))
        if why is None:
            try:
                return _Store(self._path, self._max_events)
            except sqlite3.DatabaseError as exc:  # read-only checks passed, writing did not
                if isinstance(exc, sqlite3.OperationalError):
                    raise  # a disk that refuses (full, read-only): not the file's fault
                why = f"cannot be written: {exc}"
        self.salvage = set_aside(self._path, why, _TABLES)
        store = _Store(self._path, self._max_events)
        store.restore(self.salvage)
        return store

    async def close(self) -> None:
        if self._store is not None:
            await self._run(lambda s: s.close())
            self._store = None
        self._pool.shutdown(wait=True)

    async def append(
        self,
        events: Sequence[PendingEvent],
        upserts: Sequence[Alert] = (),
        deletes: Sequence[tuple[str, str]] = (),
        standing_upserts: Sequence[Alert] = (),
        standing_deletes: Sequence[str] = (),
    ) -> None:
        """Commit, retrying a failed write (disk full, I/O error, a busy database) until it
        holds (agent/storage.py): the caller acknowledges its input only after this returns,
        so giving up would lose it."""
        shed, self.depth = await self._writes.until_written(
            "outbox",
            self._path,
            lambda: self._run(
                lambda s: s.append(events, upserts, deletes, standing_upserts, standing_deletes)
            ),
        )
        if shed:
            self.shed += shed
            log.warning("outbox.shed", shed=shed, total=self.shed, bound=self._max_events)
        self.changed.set()

    async def peek(self, limit: int = 64) -> list[OutboxRow]:
        return await self._run(lambda s: s.peek(limit))

    async def ack(self, row_id: int) -> None:
        """Delete a row the broker acknowledged, retried like a commit: a full disk delays
        the delete (the row would go out again after a crash, which consumers dedupe),
        it never ends the publisher."""
        removed = await self._writes.until_written(
            "outbox", self._path, lambda: self._run(lambda s: s.ack(row_id))
        )  # 0 if shed while in flight
        self.depth = max(0, self.depth - removed)

    async def active_alerts(self) -> list[Alert]:
        return await self._run(lambda s: s.active())

    async def standing_alarms(self) -> list[Alert]:
        """Alarms that ended unacknowledged and stand until acknowledged."""
        return await self._run(lambda s: s.standing())

    async def _run(self, fn: Callable[[_Store], T]) -> T:
        store = self._store
        if store is None:
            raise RuntimeError("outbox is not open")
        return await self._call(lambda: fn(store))

    async def _call(self, fn: Callable[[], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn)
