"""One policy for the service's durable writes: what a disk error costs, and what is counted.

Two kinds of write, two rules:
- `until_written`: a write whose loss would lose input the broker was told we have (an
  outbox row, an acknowledgement's delete, a spooled segment). Retried with backoff (0.2 s
  doubling to 5 s) until it holds, every failure counted and logged as
  `storage.write_failed` with the store and path. Meanwhile the caller does not progress,
  so the pipeline's WATCHDOG pings stop and systemd restarts a service whose disk stays
  broken; the broker then redelivers what was not acknowledged.
- `best_effort`: state that is rebuilt or re-learnt (the supervision rung, the fleet
  state and views): one try; a failure is counted and logged, and the service goes on.
No storage error ends the process.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import structlog
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

__all__ = ["DISK_ERRORS", "WriteRetry"]

log = structlog.get_logger(__name__)
T = TypeVar("T")
DISK_ERRORS = (sqlite3.Error, OSError)
_RETRY_MAX_S = 5.0


class WriteRetry:
    """The counters of one service's durable writes (status.outbox.write_errors reads the
    outbox's; `by_store` holds every store's)."""

    def __init__(self) -> None:
        self.by_store: Counter[str] = Counter()

    def errors(self, store: str) -> int:
        return self.by_store[store]

    async def until_written(
        self, store: str, path: Path, op: Callable[[], Awaitable[T]], *, max_s: float = _RETRY_MAX_S
    ) -> T:
        def failed(state: RetryCallState) -> None:
            exc = state.outcome.exception() if state.outcome is not None else None
            self._count(store, path, exc, state.attempt_number, retrying=True)

        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type(DISK_ERRORS),
            wait=wait_exponential(multiplier=0.2, max=max_s),
            before_sleep=failed,
            reraise=True,
        ):
            with attempt:
                return await op()
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    async def best_effort(
        self, store: str, path: Path, op: Callable[[], Awaitable[object]]
    ) -> bool:
        """True if it was written; False (counted, logged) if the disk refused."""
        try:
            await op()
        except DISK_ERRORS as exc:
            self._count(store, path, exc, 1, retrying=False)
            return False
        return True

    def _count(
        self, store: str, path: Path, exc: BaseException | None, attempt: int, *, retrying: bool
    ) -> None:
        self.by_store[store] += 1
        log.error(
            "storage.write_failed",
            store=store,
            path=str(path),
            error=repr(exc),
            attempt=attempt,
            retrying=retrying,
        )
