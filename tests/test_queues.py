"""The bounded, shedding queue between pipeline stages (pipelines/queues.py)."""

from __future__ import annotations

import asyncio

import pytest

from pipelines.queues import SheddingQueue


def test_items_come_out_in_order() -> None:
    """Items are delivered first in, first out."""
    q: SheddingQueue[int] = SheddingQueue(4)
    for i in range(3):
        assert q.put(i) is None
    assert len(q) == 3
    assert [q.get_nowait() for _ in range(3)] == [0, 1, 2]
    assert q.get_nowait() is None


def test_full_queue_sheds_oldest_and_counts() -> None:
    """When full, a put drops the oldest item, returns it and counts it as shed."""
    q: SheddingQueue[str] = SheddingQueue(2)
    q.put("a")
    q.put("b")
    assert q.put("c") == "a"
    assert q.put("d") == "b"
    assert len(q) == 2
    assert (q.shed, q.put_total) == (2, 4)
    assert [q.get_nowait(), q.get_nowait()] == ["c", "d"]


def test_size_must_be_positive() -> None:
    """A queue that could hold nothing is refused at construction."""
    with pytest.raises(ValueError, match="at least 1"):
        SheddingQueue(0)


async def test_get_waits_for_a_put() -> None:
    """An awaiting consumer is woken by the next put and receives that item."""
    q: SheddingQueue[str] = SheddingQueue(2)
    getter = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    assert not getter.done()
    q.put("segment")
    assert await asyncio.wait_for(getter, 1) == "segment"


async def test_get_returns_queued_item_without_waiting() -> None:
    """get() returns at once when an item is already queued."""
    q: SheddingQueue[int] = SheddingQueue(2)
    q.put(1)
    assert await asyncio.wait_for(q.get(), 1) == 1


async def test_two_consumers_each_get_one_item() -> None:
    """Two waiting consumers receive one item each, none is lost or duplicated."""
    q: SheddingQueue[int] = SheddingQueue(4)
    first = asyncio.create_task(q.get())
    second = asyncio.create_task(q.get())
    await asyncio.sleep(0)
    q.put(1)
    await asyncio.sleep(0)
    q.put(2)
    got = await asyncio.wait_for(asyncio.gather(first, second), 1)
    assert sorted(got) == [1, 2]
    assert len(q) == 0


async def test_producer_never_blocks_when_consumer_is_slow() -> None:
    """A producer far ahead of the consumer never waits; the freshest items survive."""
    q: SheddingQueue[int] = SheddingQueue(3)
    for i in range(100):
        q.put(i)
    assert q.shed == 97
    assert [await q.get() for _ in range(3)] == [97, 98, 99]
