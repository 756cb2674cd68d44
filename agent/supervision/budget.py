"""The supervisor's restart budget: how often the engine may be restarted before the
service stops trying for a while (degraded mode), and how long it waits in between.

- Start retries: a failed start is retried `watchdog.restart_limit` times with jittered
  exponential backoff (`start_attempts`).
- The rate limit: restarts for trouble (not a climb, not an operator's) are counted over
  `watchdog.restart_window_s`; more than `watchdog.restart_limit` in the window means
  degraded mode; the second and later ones within it back off first (`backoff_s`).
- Degraded mode's clock (`DegradedRetry`): another try after `watchdog.degraded_retry_s`,
  or at once when an operator asks.

The settings keep their operator-facing names under `watchdog:` in the configuration
(agent.watchdog.settings).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections import deque
from collections.abc import Callable

from tenacity import (
    AsyncRetrying,
    RetryCallState,
    retry_if_exception_type,
    stop_after_attempt,
    wait_random_exponential,
)

from agent.watchdog.settings import WatchdogSettings

__all__ = ["DegradedRetry", "RestartBudget", "StartFailed"]


class StartFailed(Exception):
    """One failed engine start (retried within the budget)."""


class RestartBudget:
    def __init__(self, settings: WatchdogSettings) -> None:
        self.settings = settings
        self._times: deque[float] = deque()  # monotonic times of counted restarts

    def start_attempts(self, before_sleep: Callable[[RetryCallState], None]) -> AsyncRetrying:
        """Attempts at one start: StartFailed is retried up to restart_limit times."""
        cfg = self.settings
        return AsyncRetrying(
            retry=retry_if_exception_type(StartFailed),
            stop=stop_after_attempt(cfg.restart_limit),
            # full jitter, as for the broker: devices restarted together by one power cut
            # do not retry their engines in lockstep
            wait=wait_random_exponential(multiplier=cfg.backoff_initial_s, max=cfg.backoff_max_s),
            before_sleep=before_sleep,
            reraise=True,
        )

    def charge(self, now: float) -> None:
        """A restart that counts toward the limit, at monotonic `now`."""
        self._times.append(now)
        window = self.settings.restart_window_s
        while self._times and now - self._times[0] > window:
            self._times.popleft()

    @property
    def spent(self) -> int:
        """Counted restarts within the window (as of the last charge)."""
        return len(self._times)

    @property
    def exhausted(self) -> bool:
        return self.spent > self.settings.restart_limit

    def exhausted_detail(self) -> str:
        cfg = self.settings
        return (
            f"{self.spent} restarts within {cfg.restart_window_s:.0f} s (limit {cfg.restart_limit})"
        )

    def backoff_s(self) -> float:
        """The wait before a repeated restart within the window (the first is at once):
        full jitter, like failed starts."""
        cfg = self.settings
        return random.uniform(  # noqa: S311 (jitter, not a secret)
            0, min(cfg.backoff_max_s, cfg.backoff_initial_s * 2 ** (self.spent - 2))
        )


class DegradedRetry:
    """When degraded mode tries again: after degraded_retry_s, or at once on request."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._now = asyncio.Event()
        self.at: float | None = None  # monotonic time of the next try, while degraded

    def arm(self, retry_s: float) -> None:
        self.at = self._clock() + retry_s

    def request(self) -> None:
        """Try again now (an operator's restart)."""
        self._now.set()

    async def wait(self, retry_s: float) -> None:
        """Until the retry is due or requested (a request before this call is dropped)."""
        self._now.clear()
        try:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._now.wait(), retry_s)
        finally:
            self.at = None
