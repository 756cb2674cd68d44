"""The durable SQLite outbox (agent/outbox.py), on real files in tmp_path."""

from __future__ import annotations

import asyncio
import json
import signal
import sqlite3
import sys
import textwrap
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agent.outbox import Outbox, PendingEvent
from pipelines.alerts import Alert, Evidence

REPO = Path(__file__).resolve().parents[1]
TOPIC = "factory/line3/alerts"


def event(n: int, kind: str = "new") -> PendingEvent:
    body = {"type": kind, "seq": n, "alert": {"id": f"a{n}"}}
    return PendingEvent(TOPIC, json.dumps(body).encode(), kind)


def alert(stream: str = "mic1", fault: str = "bearing_noise", event_seq: int = 1) -> Alert:
    return Alert(
        id=f"{stream}:{fault}:1700000000000",
        stream_id=stream,
        fault=fault,
        label="bearing abnormal noise",
        severity="warning",
        source="keyword",
        evidence=[Evidence(text="bearing noise", start=1.0, end=2.0, seq=3)],
        first_seen=1.0,
        last_seen=2.0,
        count=1,
        event_seq=event_seq,
    )


def seqs(rows: list) -> list[int]:  # type: ignore[type-arg]
    return [json.loads(r.payload)["seq"] for r in rows]


@asynccontextmanager
async def opened(path: Path, max_events: int = 100) -> AsyncIterator[Outbox]:
    box = Outbox(path, max_events)
    await box.open()
    try:
        yield box
    finally:
        await box.close()


async def test_events_come_out_in_order(tmp_path: Path) -> None:
    """Appended events are peeked in the order they were written, payload intact."""
    async with opened(tmp_path / "outbox.sqlite") as box:
        await box.append([event(1), event(2)])
        await box.append([event(3)])
        rows = await box.peek()
        assert seqs(rows) == [1, 2, 3]
        assert all(r.topic == TOPIC for r in rows)
        assert box.depth == 3
        assert seqs(await box.peek(limit=2)) == [1, 2]


async def test_ack_removes_only_that_event(tmp_path: Path) -> None:
    """An acknowledged event leaves the outbox; the others stay, still in order."""
    async with opened(tmp_path / "outbox.sqlite") as box:
        await box.append([event(1), event(2), event(3)])
        first, second, _ = await box.peek()
        await box.ack(second.id)
        assert seqs(await box.peek()) == [1, 3]
        assert box.depth == 2
        await box.ack(first.id)
        assert seqs(await box.peek()) == [3]
        assert box.depth == 1


async def test_database_uses_wal_and_creates_parent_dirs(tmp_path: Path) -> None:
    """The outbox creates missing folders and puts the database in WAL mode."""
    path = tmp_path / "var" / "lib" / "edge-agent" / "outbox.sqlite"
    async with opened(path) as box:
        await box.append([event(1)])
        with sqlite3.connect(path) as db:
            assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_unacked_events_survive_restart(tmp_path: Path) -> None:
    """Events not yet acknowledged are there again, in order, after a close and reopen."""
    path = tmp_path / "outbox.sqlite"
    async with opened(path) as box:
        await box.append([event(1), event(2), event(3)])
        rows = await box.peek()
        await box.ack(rows[0].id)
    reopened = Outbox(path, 100)
    await reopened.open()
    try:
        assert reopened.depth == 2
        assert reopened.changed.is_set()  # the publisher is woken for the backlog
        assert seqs(await reopened.peek()) == [2, 3]
    finally:
        await reopened.close()


async def test_empty_outbox_does_not_wake_publisher(tmp_path: Path) -> None:
    """Opening an empty outbox reports depth 0 and does not signal pending work."""
    async with opened(tmp_path / "outbox.sqlite") as box:
        assert box.depth == 0
        assert not box.changed.is_set()
        assert await box.peek() == []


async def test_append_signals_changed(tmp_path: Path) -> None:
    """Appending wakes a publisher waiting on `changed`."""
    async with opened(tmp_path / "outbox.sqlite") as box:
        waiter = asyncio.create_task(box.changed.wait())
        await asyncio.sleep(0)
        assert not waiter.done()
        await box.append([event(1)])
        await asyncio.wait_for(waiter, 1)


async def test_sigkill_before_ack_redelivers_after_restart(tmp_path: Path) -> None:
    """A process SIGKILLed after writing events leaves them, and its active alerts, on disk."""
    path = tmp_path / "outbox.sqlite"
    script = textwrap.dedent(
        f"""
        import asyncio, json, os, signal
        from pathlib import Path
        from agent.outbox import Outbox, PendingEvent
        from pipelines.alerts import Alert, Evidence

        async def main():
            box = Outbox(Path({str(path)!r}), 100)
            await box.open()
            a = Alert(id="mic1:bearing_noise:1", stream_id="mic1", fault="bearing_noise",
                      label="b", severity="warning", source="keyword",
                      evidence=[Evidence("bearing noise", 1.0, 2.0, 1)],
                      first_seen=1.0, last_seen=2.0, count=1, event_seq=2)
            events = [PendingEvent("t", json.dumps({{"seq": n}}).encode(), "new")
                      for n in (1, 2, 3)]
            await box.append(events, upserts=[a])
            rows = await box.peek()
            await box.ack(rows[0].id)
            os.kill(os.getpid(), signal.SIGKILL)

        asyncio.run(main())
        """
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", script, cwd=REPO, stderr=asyncio.subprocess.PIPE
    )
    _, stderr = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == -signal.SIGKILL, stderr.decode()
    async with opened(path) as box:
        assert seqs(await box.peek()) == [2, 3]
        [restored] = await box.active_alerts()
        assert (restored.id, restored.event_seq) == ("mic1:bearing_noise:1", 2)


async def test_active_alerts_are_upserted_and_deleted(tmp_path: Path) -> None:
    """Active alerts are stored with their event seq, replaced on update, removed on end."""
    path = tmp_path / "outbox.sqlite"
    async with opened(path) as box:
        await box.append([event(1)], upserts=[alert("mic1"), alert("mic2")])
        await box.append([event(2, "update")], upserts=[alert("mic1", event_seq=2)])
        await box.append([event(3, "end")], deletes=[("mic2", "bearing_noise")])
    async with opened(path) as box:
        [kept] = await box.active_alerts()
        assert kept.stream_id == "mic1"
        assert kept.event_seq == 2
        assert kept.public() == alert("mic1").public()


async def test_events_and_alerts_are_written_atomically(tmp_path: Path) -> None:
    """If the alert row cannot be written, the events of the same append are not kept."""
    broken = alert()
    broken.evidence = [Evidence(text=b"not json", start=1.0, end=2.0, seq=1)]  # type: ignore[arg-type]
    async with opened(tmp_path / "outbox.sqlite") as box:
        with pytest.raises(TypeError):
            await box.append([event(1)], upserts=[broken])
        assert await box.peek() == []
        assert await box.active_alerts() == []
        await box.append([event(2)])  # the outbox is still usable afterwards
        assert seqs(await box.peek()) == [2]


async def test_bound_sheds_updates_before_new_and_end(tmp_path: Path) -> None:
    """Over the bound, the oldest updates are shed first; new and end events are kept."""
    async with opened(tmp_path / "outbox.sqlite", max_events=10) as box:
        kinds = [
            "new",
            "update",
            "update",
            "end",
            "new",
            "update",
            "update",
            "update",
            "end",
            "new",
        ]
        await box.append([event(i, k) for i, k in enumerate(kinds, 1)])
        assert box.shed == 0
        await box.append([event(11, "new"), event(12, "end"), event(13, "new")])
        rows = await box.peek(limit=100)
        assert box.depth == len(rows) == 10
        assert box.shed == 3
        assert seqs(rows) == [1, 4, 5, 7, 8, 9, 10, 11, 12, 13]  # updates 2, 3 and 6 shed


async def test_bound_sheds_oldest_when_no_updates_left(tmp_path: Path) -> None:
    """With only new/end events queued, the oldest go first and are counted."""
    async with opened(tmp_path / "outbox.sqlite", max_events=10) as box:
        await box.append([event(i) for i in range(1, 14)])
        assert seqs(await box.peek(limit=100)) == list(range(4, 14))
        assert (box.depth, box.shed) == (10, 3)


async def test_shed_count_survives_restart(tmp_path: Path) -> None:
    """The number of shed events is persisted and reported again after a restart."""
    path = tmp_path / "outbox.sqlite"
    async with opened(path, max_events=10) as box:
        await box.append([event(i, "update") for i in range(1, 16)])
        assert box.shed == 5
    async with opened(path, max_events=10) as box:
        assert box.shed == 5
        await box.append([event(16, "update")])
        assert box.shed == 6


async def test_use_before_open_is_an_error(tmp_path: Path) -> None:
    """Calling the outbox before open() fails loudly instead of losing events."""
    box = Outbox(tmp_path / "outbox.sqlite", 10)
    try:
        with pytest.raises(RuntimeError, match="not open"):
            await box.append([event(1)])
    finally:
        await box.close()


async def test_ack_of_shed_row_keeps_depth_true(tmp_path: Path) -> None:
    """Acking a row shed while it was being published does not under-count the depth."""
    async with opened(tmp_path / "outbox.sqlite", max_events=10) as box:
        await box.append([event(i, "update") for i in range(1, 11)])
        in_flight = await box.peek()  # the publisher holds these rows
        await box.append([event(11, "new")])  # over the bound: update 1 is shed
        assert box.shed == 1
        await box.ack(in_flight[0].id)  # its PUBACK arrives after it was shed
        assert box.depth == len(await box.peek(limit=100)) == 10


async def test_a_failed_commit_is_retried_until_it_holds(tmp_path: Path) -> None:
    """A write the disk refuses (injected: a real disk cannot be made to fail on cue) is
    not given up: append returns only once the events are committed, and counts each
    failure, because its caller acknowledges the input to the broker only then."""
    async with opened(tmp_path / "outbox.sqlite") as box:
        store = box._store
        assert store is not None
        real = store.append
        failures = [sqlite3.OperationalError("disk I/O error"), OSError(28, "No space left")]

        def flaky(*args: object) -> tuple[int, int]:
            if failures:
                raise failures.pop(0)
            return real(*args)  # type: ignore[arg-type]

        store.append = flaky  # type: ignore[method-assign]
        await box.append([event(1)])
        assert box.write_errors == 2
        assert seqs(await box.peek()) == [1]
    async with opened(tmp_path / "outbox.sqlite") as box:  # and it is on disk
        assert seqs(await box.peek()) == [1]
