"""Python 3.10 support: JetPack 6 and NVIDIA's vLLM builds for it are Python 3.10.

Also `cancel_until_done`: before Python 3.12, `asyncio.wait_for` can swallow a cancellation
that arrives as its awaitable completes (CPython gh-86296), so one `cancel()` may not end a
task awaiting such a call (aiomqtt awaits every PUBACK with it). A CI run on 3.10 saw the
service not exit after a SIGTERM that came as the link's `online` publish was acknowledged
(its log: `agent.stopping`, then `mqtt.connected`); this race fits it.
"""

from __future__ import annotations

import asyncio
import sys

if sys.version_info >= (3, 11):
    from asyncio import TaskGroup, timeout
else:  # pragma: no cover - exercised by the 3.10 CI job
    from taskgroup import TaskGroup, timeout

__all__ = ["TaskGroup", "cancel_until_done", "timeout"]


async def cancel_until_done(task: asyncio.Task[object], every_s: float = 0.5) -> None:
    """Cancel `task` and wait for its end, cancelling it again every `every_s` seconds
    while it runs (a swallowed cancellation is sent again). Does not raise the task's
    CancelledError or exception; the caller's own cancellation still propagates."""
    while not task.done():
        task.cancel()
        await asyncio.wait([task], timeout=every_s)
