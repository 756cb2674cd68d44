"""Decoded clips waiting for the recogniser, bounded in seconds of audio, per stream and in
total. The most reported failure of streaming ASR servers is a backlog that grows without
end when audio arrives faster than it is transcribed: here a full buffer sheds its oldest
clip (of the same stream when that stream is over its share, else the oldest of all), counts
it and hands it back for reporting. The newest audio is what an alerting line needs.

Clips are served round robin across streams, so one chatty microphone cannot starve the
others.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from dataclasses import dataclass
from typing import Generic, TypeVar

__all__ = ["AudioBuffer", "Shed"]

T = TypeVar("T")


@dataclass(frozen=True)
class Shed(Generic[T]):
    stream_id: str
    item: T
    seconds: float


class AudioBuffer(Generic[T]):
    def __init__(self, per_stream_s: float, total_s: float) -> None:
        self.per_stream_s = per_stream_s
        self.total_s = total_s
        self._streams: OrderedDict[str, deque[tuple[T, float]]] = OrderedDict()
        self._seconds: dict[str, float] = {}
        self._ready = asyncio.Event()
        self.shed_clips = 0
        self.shed_seconds = 0.0

    @property
    def seconds(self) -> float:
        return sum(self._seconds.values())

    def stream_seconds(self) -> dict[str, float]:
        return {sid: round(s, 2) for sid, s in self._seconds.items() if s > 0}

    def __len__(self) -> int:
        return sum(len(q) for q in self._streams.values())

    def put(self, stream_id: str, item: T, seconds: float) -> list[Shed[T]]:
        """Queue a clip; returns what was shed to make room (possibly nothing)."""
        queue = self._streams.setdefault(stream_id, deque())
        queue.append((item, seconds))
        self._seconds[stream_id] = self._seconds.get(stream_id, 0.0) + seconds
        shed: list[Shed[T]] = []
        # The new clip itself fits the bounds (max_clip_s <= per-stream <= total), so
        # shedding stops before it is reached.
        while self._seconds[stream_id] > self.per_stream_s + 1e-9 and len(queue) > 1:
            shed.append(self._pop(stream_id))
        while self.seconds > self.total_s + 1e-9:
            oldest = self._oldest_stream(exclude_last_of=stream_id)
            if oldest is None:
                break
            shed.append(self._pop(oldest))
        for s in shed:
            self.shed_clips += 1
            self.shed_seconds += s.seconds
        self._ready.set()
        return shed

    async def get(self) -> tuple[str, T, float]:
        """The next clip, round robin across streams."""
        while True:
            for sid in list(self._streams):
                queue = self._streams[sid]
                if queue:
                    self._streams.move_to_end(sid)  # this stream waits for the others now
                    item, seconds = queue.popleft()
                    self._seconds[sid] -= seconds
                    if not queue:  # a stream that went quiet holds no entry
                        del self._streams[sid]
                        del self._seconds[sid]
                    return sid, item, seconds
            self._ready.clear()
            await self._ready.wait()

    def _pop(self, stream_id: str) -> Shed[T]:
        queue = self._streams[stream_id]
        item, seconds = queue.popleft()
        self._seconds[stream_id] -= seconds
        if not queue:
            del self._streams[stream_id]
            del self._seconds[stream_id]
        return Shed(stream_id, item, seconds)

    def _oldest_stream(self, exclude_last_of: str) -> str | None:
        """The stream to shed from: the one with the most queued audio (it is the furthest
        behind), never the clip just added."""
        candidates = [
            (self._seconds[sid], sid)
            for sid, q in self._streams.items()
            if q and not (sid == exclude_last_of and len(q) == 1)
        ]
        return max(candidates)[1] if candidates else None
