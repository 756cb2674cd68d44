"""A damaged outbox at start (agent/salvage.py), on real SQLite files: moved aside, the
readable rows carried into a fresh file, the service's store usable; a file that is not
ours is never written."""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
from pathlib import Path

from agent.outbox import Outbox, PendingEvent


def event(n: int) -> PendingEvent:
    return PendingEvent("t/alerts", json.dumps({"seq": n, "pad": "x" * 300}).encode(), "new")


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


async def fresh_after(path: Path) -> Outbox:
    box = Outbox(path, 10_000)
    await box.open()
    return box


async def test_a_file_that_is_not_a_database_is_moved_aside_and_a_fresh_one_starts(
    tmp_path: Path,
) -> None:
    path = tmp_path / "outbox.sqlite"
    path.write_bytes(b"this is not SQLite at all\n" * 200)
    before = digest(path)
    box = await fresh_after(path)
    try:
        assert box.salvage is not None
        assert box.salvage.moved_to.name.startswith("outbox.sqlite.damaged-")
        assert digest(box.salvage.moved_to) == before  # kept as it was, for a person to read
        assert "outbox.sqlite" in box.salvage.line() and box.salvage.saved() == 0
        await box.append([event(1)])
        assert [json.loads(r.payload)["seq"] for r in await box.peek()] == [1]
    finally:
        await box.close()


async def test_the_rows_a_damaged_file_still_gives_are_saved_in_order(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    box = await fresh_after(path)
    await box.append([event(n) for n in range(400)])
    await box.close()
    size = path.stat().st_size
    with path.open("r+b") as fh:  # a page in the middle overwritten, as a bad card does
        fh.seek((size // 4096 // 2) * 4096)
        fh.write(b"\xde\xad\xbe\xef" * 1024)
    box = await fresh_after(path)
    try:
        assert box.salvage is not None, "quick_check must see the damage"
        seqs = [json.loads(r.payload)["seq"] for r in await box.peek(limit=1000)]
        assert 0 < len(seqs) < 400
        assert seqs == sorted(seqs)  # in their order, nothing invented
        assert box.salvage.saved() >= len(seqs)
        assert box.depth == len(seqs)
    finally:
        await box.close()


async def test_a_database_that_is_not_ours_is_never_written(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL)")
    db.execute("INSERT INTO invoices (total) VALUES (12.5)")
    db.commit()
    db.close()
    before = digest(path)
    box = await fresh_after(path)
    try:
        assert box.salvage is not None and "not ours" in box.salvage.reason
        assert digest(box.salvage.moved_to) == before
        assert box.depth == 0
    finally:
        await box.close()


async def test_a_sound_file_is_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "outbox.sqlite"
    box = await fresh_after(path)
    await box.append([event(1), event(2)])
    await box.close()
    box = await fresh_after(path)
    try:
        assert box.salvage is None and box.depth == 2
    finally:
        await box.close()
    assert not await asyncio.to_thread(lambda: list(tmp_path.glob("*.damaged-*")))
