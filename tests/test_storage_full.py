"""A full disk under the outbox, on a real tmpfs (root only): the delete after a PUBACK
waits for space instead of ending the publisher, and loses nothing."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from agent.outbox import Outbox, PendingEvent

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")


@contextlib.contextmanager
def small_disk(where: Path, size: str = "2m") -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path) -> Path:
    """A file that takes every byte left on the disk."""
    filler = disk / "filler"
    # Unbuffered: a buffered file keeps what the disk refused and raises again at close.
    with filler.open("wb", buffering=0) as fh:
        try:
            while True:
                fh.write(b"\0" * 65536)
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def event(n: int) -> PendingEvent:
    return PendingEvent("t/alerts", json.dumps({"seq": n, "pad": "x" * 2000}).encode(), "new")


async def wait_for(test: object, limit: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + limit
    while not test():  # type: ignore[operator]
        assert asyncio.get_running_loop().time() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


async def test_an_ack_on_a_full_disk_waits_and_then_deletes(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        box = Outbox(disk / "outbox.sqlite", 1000)
        await box.open()
        try:
            await box.append([event(n) for n in range(40)])
            rows = await box.peek(limit=100)
            filler = fill(disk)
            acks = asyncio.create_task(_ack_all(box, [r.id for r in rows]))
            await wait_for(lambda: box.write_errors >= 1)  # the disk refused a delete
            assert not acks.done()  # still trying, the publisher not ended
            filler.unlink()
            await asyncio.wait_for(acks, 30)
            assert box.depth == 0
        finally:
            await box.close()
        again = Outbox(disk / "outbox.sqlite", 1000)
        await again.open()
        try:
            assert await again.peek() == []  # the deletes are on disk
        finally:
            await again.close()


async def _ack_all(box: Outbox, ids: list[int]) -> None:
    for row_id in ids:
        await box.ack(row_id)
