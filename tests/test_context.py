"""The rolling window: budget, large drops, stable prefix (pure, no engine)."""

from __future__ import annotations

import random

import pytest

from pipelines.context import ContextError, ContextLine, ContextWindow


def line(seq: int, n_tokens: int, base: int = 1000) -> ContextLine:
    return ContextLine(
        seq=seq,
        start=seq * 5.0,
        end=seq * 5.0 + 5,
        text=f"segment {seq}",
        ids=tuple(range(base + seq * 100, base + seq * 100 + n_tokens)),
    )


def test_never_exceeds_budget_and_drops_in_quarter_steps() -> None:
    """Over thousands of random appends the prompt stays within the budget, and every drop
    removes at least a quarter of it (never one line at a time)."""
    rng = random.Random(7)
    window = ContextWindow(4096, tail_reserve=64, head=list(range(300)))
    tail = list(range(64))
    drops = 0
    for seq in range(3000):
        drop = window.append([line(seq, rng.randint(5, 120))])
        assert len(window.prompt(tail)) <= 4096
        if drop is not None:
            drops += 1
            assert drop.tokens >= 4096 // 4
            assert drop.lines[0].seq < drop.lines[-1].seq
    assert drops == window.drops
    assert drops < 3000 * 62 // 1024  # about one drop per quarter budget of speech


def test_naive_policy_drops_line_by_line() -> None:
    """drop_fraction 0 (the benchmark's naive policy) drops only what must go: a drop on
    nearly every append once full."""
    window = ContextWindow(2048, tail_reserve=32, drop_fraction=0.0)
    for seq in range(400):
        window.append([line(seq, 40)])
    assert window.drops > 300
    assert window.dropped_lines == window.drops


def test_prompt_is_head_then_lines_then_tail_and_grows_only_at_the_end() -> None:
    """Appending keeps every earlier token where it was: the cached prefix stays valid."""
    window = ContextWindow(4096, tail_reserve=8, head=[1, 2, 3])
    window.append([line(1, 10), line(2, 10)])
    before = window.prompt([9, 9])
    window.append([line(3, 10)])
    after = window.prompt([9, 9])
    assert before[:-2] == after[: len(before) - 2]
    assert after[:3] == [1, 2, 3]
    assert after[-2:] == [9, 9]
    assert window.tokens == 3 + 30


def test_planned_drop_is_what_append_drops() -> None:
    """The caller asks what will go (to summarize it while cached); append drops exactly it."""
    window = ContextWindow(2048, tail_reserve=48)
    for seq in range(66):  # 1980 of 2000 transcript tokens
        window.append([line(seq, 30)])
    incoming = [line(100, 30), line(101, 30)]
    planned = window.planned_drop(incoming)
    assert planned
    drop = window.append(incoming)
    assert drop is not None
    assert drop.lines == planned


def test_backlog_longer_than_the_window_keeps_its_newest_part() -> None:
    """A burst bigger than the window (the engine was down for long) keeps the newest lines."""
    window = ContextWindow(1024, tail_reserve=24)
    window.append([line(seq, 50) for seq in range(100)])
    assert window.transcript_tokens <= window.capacity
    assert window.lines[-1].seq == 99


def test_a_longer_head_pushes_old_lines_out() -> None:
    """A summary added to the head takes room from the transcript, within the budget."""
    window = ContextWindow(2048, tail_reserve=48, head=[0] * 100)
    for seq in range(40):
        window.append([line(seq, 45)])
    window.set_head([0] * 400)
    assert len(window.prompt([])) + 48 <= 2048


def test_refuses_what_cannot_work() -> None:
    """A head that leaves less than a quarter, a line over its cap, a tail over its reserve."""
    with pytest.raises(ContextError, match="quarter"):
        ContextWindow(1024, tail_reserve=24, head=[0] * 800)
    window = ContextWindow(1024, tail_reserve=24)
    with pytest.raises(ContextError, match="tokens >"):
        window.append([line(1, window.max_line_tokens + 1)])
    with pytest.raises(ContextError, match="reserve"):
        window.prompt([0] * 25)


def test_resize_smaller_drops_the_oldest_once_and_larger_only_grows() -> None:
    """The watchdog's context rung: a smaller budget drops what no longer fits, oldest
    first, in one step (and a quarter of the new budget at least); its climb back only
    makes room."""
    window = ContextWindow(4096, tail_reserve=64, head=list(range(200)))
    for seq in range(60):
        window.append([line(seq, 60)])
    assert window.transcript_tokens > 2048
    oldest = window.lines[0].seq
    drops = window.drops
    drop = window.resize(2048)
    assert drop is not None and drop.lines[0].seq == oldest
    assert window.drops == drops + 1
    assert len(window.prompt(list(range(64)))) <= 2048
    assert drop.tokens >= 2048 // 4
    assert [x.seq for x in window.lines] == sorted(x.seq for x in window.lines)
    assert window.lines[-1].seq == 59  # the newest lines stay
    before = window.lines
    assert window.resize(4096) is None and window.lines == before and window.budget == 4096


def test_resize_refuses_a_budget_the_head_would_fill() -> None:
    window = ContextWindow(4096, tail_reserve=64, head=list(range(1500)))
    with pytest.raises(ContextError, match="leaves"):
        window.resize(2048)
    assert window.budget == 4096
