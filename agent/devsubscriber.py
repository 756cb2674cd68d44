"""A subscriber on loopback for the demo's neighbours: the tests and the benchmarks.

It holds a persistent session (clean_session=False) on `<prefix>/#` and reconnects by
itself, so it keeps receiving, queued QoS 1 messages included, across the broker restarts
that agent.devbroker.DevBroker makes. Each message goes to `take`, which a subclass
defines (tests/helpers.py keeps every message, bench/chaos counts alert events).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid

import aiomqtt

__all__ = ["PersistentSubscriber"]


class PersistentSubscriber:
    """`start()` returns once subscribed (nothing published after it is missed);
    `connected` is set while subscribed."""

    def __init__(self, port: int, prefix: str, *, name: str = "sub") -> None:
        self.port = port
        self.prefix = prefix
        self.connected = asyncio.Event()
        self._client_id = f"{name}-{uuid.uuid4().hex[:8]}"
        self._task: asyncio.Task[None] | None = None

    def take(self, msg: aiomqtt.Message) -> None:
        """One message as it arrives (on the event loop: keep it short)."""
        raise NotImplementedError

    async def start(self, timeout: float = 10) -> None:
        self._task = asyncio.create_task(self._run())
        await asyncio.wait_for(self.connected.wait(), timeout)

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                async with aiomqtt.Client(
                    "127.0.0.1", self.port, identifier=self._client_id, clean_session=False
                ) as client:
                    await client.subscribe(f"{self.prefix}/#", qos=1)
                    self.connected.set()
                    async for msg in client.messages:
                        self.take(msg)
            except aiomqtt.MqttError:
                self.connected.clear()
                await asyncio.sleep(0.2)
