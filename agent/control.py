"""The control socket: `agentctl` talks to the running service over a Unix socket.

One JSON object per line each way. Requests: `{"cmd": "status"}`, `{"cmd": "alerts"}` (active
alerts; with `"follow": true` every alert event after them, one line each, until the client
hangs up), `{"cmd": "engine.restart"}`, `{"cmd": "config"}` (the effective configuration,
secrets never included); with `control.fault_injection` (tests only),
`{"cmd": "fault.block_loop", "seconds": N}` hangs the event loop for N seconds and
`{"cmd": "fault.pause_fleet_apply", "seconds": N}` holds the next fleet apply after it is
staged, `{"cmd": "fault.pause_detect", "seconds": N}` holds queued input unprocessed (and
unacknowledged); `{"cmd": "fleet"}` is the fleet's state (agentctl fleet status). Every
response has `"ok"`; errors carry `"error"`.

Access is checked twice. The socket file is mode 0660 with the service's group, so the
kernel refuses anyone else at connect(); and each connection's peer credentials
(SO_PEERCRED) must be root, the service's own user, or a member of the service's group, so a
socket made world-writable by mistake still refuses strangers (logged as
`control.refused`). Followers get a bounded queue each: a client that stops reading loses
events (counted) and never holds up the service.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import struct
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import structlog

from pipelines.bounded_json import parse_json

__all__ = ["ControlServer", "PeerCredentials", "peer_allowed", "request"]

log = structlog.get_logger(__name__)

_LINE_LIMIT = 64 * 1024
_REQUEST_S = 5.0  # a client has this long to send its request line
_FOLLOW_QUEUE = 256

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class PeerCredentials:
    def __init__(self, pid: int, uid: int, gid: int) -> None:
        self.pid, self.uid, self.gid = pid, uid, gid

    @classmethod
    def of(cls, sock: socket.socket) -> PeerCredentials:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", raw)
        return cls(pid, uid, gid)

    def groups(self) -> set[int]:
        """The peer's primary and supplementary groups (from /proc; empty if it is gone)."""
        found = {self.gid}
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
                if line.startswith("Groups:"):
                    found |= {int(g) for g in line.split()[1:]}
        return found


def peer_allowed(peer: PeerCredentials, uid: int | None = None, gid: int | None = None) -> bool:
    """Root, the service's own user, or a member of the service's group."""
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    return peer.uid in (0, uid) or gid in peer.groups()


class ControlServer:
    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self.handler = handler
        self.refused = 0
        self.requests = 0
        self.bad_requests = 0  # not JSON, too deep, too long, or no line in time
        self.follow_shed = 0
        self._followers: set[asyncio.Queue[dict[str, Any]]] = set()
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()  # a stale socket of a previous run
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=_LINE_LIMIT
        )
        self.path.chmod(0o660)
        log.info("control.listening", path=str(self.path))

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def publish(self, event: dict[str, Any]) -> None:
        """An alert event for every `alerts --follow` client (never blocks)."""
        for queue in self._followers:
            if queue.full():
                queue.get_nowait()
                self.follow_shed += 1
            queue.put_nowait(event)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        sock = writer.get_extra_info("socket")
        try:
            peer = PeerCredentials.of(sock)
            if not peer_allowed(peer):
                self.refused += 1
                log.warning("control.refused", pid=peer.pid, uid=peer.uid, gid=peer.gid)
                await _send(writer, {"ok": False, "error": "permission denied"})
                return
            try:
                line = await asyncio.wait_for(reader.readline(), _REQUEST_S)
            except asyncio.TimeoutError:
                self.bad_requests += 1
                await _send(writer, {"ok": False, "error": f"no request within {_REQUEST_S:g} s"})
                return
            except ValueError:  # readline past the stream limit (LimitOverrunError)
                self.bad_requests += 1
                await _send(writer, {"ok": False, "error": f"request over {_LINE_LIMIT} bytes"})
                return
            if not line:
                return
            try:
                req = parse_json(line, max_bytes=_LINE_LIMIT)
                if not isinstance(req, dict) or not isinstance(req.get("cmd"), str):
                    raise ValueError('expected {"cmd": ...}')
            except ValueError as exc:  # JsonRejected is one
                self.bad_requests += 1
                await _send(writer, {"ok": False, "error": f"bad request: {exc}"})
                return
            self.requests += 1
            if req["cmd"] == "alerts" and req.get("follow"):
                await self._follow(req, reader, writer)
                return
            # Who asks, as the kernel says (an alarm command records it): never the client's word.
            req["peer_uid"] = peer.uid
            await _send(writer, await self.handler(req))
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away
        except Exception:  # one bad request must not stop the server
            log.exception("control.failed")
            with contextlib.suppress(Exception):
                await _send(writer, {"ok": False, "error": "internal error (see the log)"})
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _follow(
        self, req: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue(_FOLLOW_QUEUE)
        self._followers.add(queue)
        gone: asyncio.Future[bytes] | None = None
        get: asyncio.Future[dict[str, Any]] | None = None
        try:
            await _send(writer, await self.handler({**req, "follow": False}))
            gone = asyncio.ensure_future(reader.read(1))  # EOF: the client hung up
            while True:
                get = asyncio.ensure_future(queue.get())
                done, _ = await asyncio.wait({get, gone}, return_when=asyncio.FIRST_COMPLETED)
                if gone in done:
                    return
                await _send(writer, {"ok": True, "event": get.result()})
        finally:
            # A send that failed (the client vanished) leaves both waits pending otherwise.
            for pending in (get, gone):
                if pending is not None and not pending.done():
                    pending.cancel()
            self._followers.discard(queue)


async def _send(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
    writer.write(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
    await writer.drain()


async def request(path: Path, req: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One request, one response (agentctl's side).

    Raises:
        OSError: no socket, or connect refused (permissions).
        ValueError: the response is not JSON.
    """
    reader, writer = await asyncio.wait_for(
        asyncio.open_unix_connection(str(path), limit=16 << 20), timeout
    )
    try:
        await _send(writer, req)
        line = await asyncio.wait_for(reader.readline(), timeout)
        if not line:
            raise ConnectionError("the service closed the connection")
        data = json.loads(line)
        if not isinstance(data, dict):
            raise ValueError("response is not an object")
        return data
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
