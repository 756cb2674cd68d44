"""A damaged SQLite store found at start: moved aside, what can be read salvaged.

The outbox (and the ingest spool) is one SQLite file. A power cut on a bad SD card, a
disk that filled mid-checkpoint or a stray file at the configured path must not keep the
service from starting, nor make it retry its first write for ever. At open, `inspect`
checks the file (a read-only open, `PRAGMA quick_check`, and that its tables are ours);
a file that fails is never written to: `set_aside` renames it (with its -wal and -shm) to
`<name>.damaged-<UTC time>` and reads, row by row, whatever rows of our tables it still
gives; the caller starts a fresh file and puts them back. The result (`Salvage`) says
where the file went, why, and how many rows were saved; the store reports it as an error
event, a status line and a metric.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import structlog

__all__ = ["Salvage", "inspect", "set_aside"]

log = structlog.get_logger(__name__)
_SIDE_FILES = ("-wal", "-shm")


@dataclass(frozen=True)
class Salvage:
    path: Path
    moved_to: Path
    reason: str
    rows: Mapping[str, list[tuple[Any, ...]]] = field(default_factory=dict)  # table -> rows
    unreadable: int = 0  # rows (or row ranges) that could not be read

    def saved(self) -> int:
        return sum(len(r) for r in self.rows.values())

    def line(self) -> str:
        return (
            f"{self.path} was damaged ({self.reason}): moved to {self.moved_to.name}, "
            f"{self.saved()} rows saved, {self.unreadable} unreadable"
        )


def inspect(path: Path, tables: Sequence[str]) -> str | None:
    """Why `path` cannot be used as our store, or None if it can (or does not exist).
    Opened read-only: a damaged or foreign file is not touched."""
    if not path.exists():
        return None
    if path.stat().st_size == 0:
        return None  # an empty file: SQLite makes it a database
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error as exc:
        return f"cannot open: {exc}"
    try:
        check = db.execute("PRAGMA quick_check").fetchone()
        if check is None or check[0] != "ok":
            return f"quick_check: {check[0] if check else 'no answer'}"
        present = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")}
    except sqlite3.Error as exc:
        return f"not a readable database: {exc}"
    finally:
        db.close()
    ours = present & set(tables)
    if present - {"sqlite_sequence"} and not ours:
        return f"not ours: its tables are {sorted(present)}"
    return None


def set_aside(path: Path, reason: str, tables: Mapping[str, Sequence[str]]) -> Salvage:
    """Rename the file (and its -wal/-shm) out of the way, then read the rows of `tables`
    (table -> columns) from the renamed copy, row by row, skipping what cannot be read."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    moved = path.with_name(f"{path.name}.damaged-{stamp}")
    n = 1
    while moved.exists():
        n += 1
        moved = path.with_name(f"{path.name}.damaged-{stamp}-{n}")
    for suffix in _SIDE_FILES:
        side = path.with_name(path.name + suffix)
        if side.exists():
            side.rename(moved.with_name(moved.name + suffix))
    path.rename(moved)
    rows: dict[str, list[tuple[Any, ...]]] = {}
    unreadable = 0
    try:
        db = sqlite3.connect(f"file:{moved}?mode=ro", uri=True, timeout=5)
    except sqlite3.Error:
        return Salvage(path, moved, reason)
    try:
        for table, columns in tables.items():
            got, lost = _read(db, table, columns)
            rows[table] = got
            unreadable += lost
    finally:
        db.close()
    salvage = Salvage(path, moved, reason, rows, unreadable)
    log.error("storage.damaged", detail=salvage.line(), saved=salvage.saved(),
              unreadable=unreadable, moved_to=str(moved))  # fmt: skip
    return salvage


_CHUNK = 256


def _read(db: sqlite3.Connection, table: str, columns: Sequence[str]) -> tuple[list[Any], int]:
    """The readable rows of `table`, in rowid order, and how many rows could not be read:
    ranges of rowids at a time, one by one inside a range that fails."""
    cols = ", ".join(columns)
    lo = _scalar(db, f"SELECT MIN(rowid) FROM {table}")  # noqa: S608
    hi = _scalar(db, f"SELECT MAX(rowid) FROM {table}")  # noqa: S608
    if hi is None:  # the b-tree's right edge is damaged: AUTOINCREMENT's record of it
        hi = _scalar(db, "SELECT seq FROM sqlite_sequence WHERE name = ?", (table,))
    if hi is None:
        try:  # no bound to walk to: a plain scan may still read the rows
            return [tuple(r) for r in db.execute(f"SELECT {cols} FROM {table}")], 0  # noqa: S608
        except sqlite3.Error:
            return [], 1
    lo = 1 if lo is None else lo
    out: list[Any] = []
    lost = 0
    one = f"SELECT {cols} FROM {table} WHERE rowid = ?"  # noqa: S608
    many = f"SELECT {cols} FROM {table} WHERE rowid BETWEEN ? AND ? ORDER BY rowid"  # noqa: S608
    for start in range(int(lo), int(hi) + 1, _CHUNK):
        end = min(start + _CHUNK - 1, int(hi))
        try:
            chunk = db.execute(many, (start, end)).fetchall()
        except sqlite3.Error:
            chunk = None
        if chunk is not None:
            out.extend(tuple(r) for r in chunk)
            continue
        for rowid in range(start, end + 1):
            try:
                row = db.execute(one, (rowid,)).fetchone()
            except sqlite3.Error:
                lost += 1
                continue
            if row is not None:
                out.append(tuple(row))
    return out, lost


def _scalar(db: sqlite3.Connection, sql: str, args: tuple[Any, ...] = ()) -> int | None:
    try:
        row = db.execute(sql, args).fetchone()
    except sqlite3.Error:
        return None
    return None if row is None or row[0] is None else int(row[0])
