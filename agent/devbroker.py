"""A local broker on loopback for the demo and the tests.

mosquitto when it is installed (the real broker the field runs); otherwise amqtt in a
background thread, and the caller is told so. The broker can be stopped, frozen
(SIGSTOP: connections stay open, nothing is acknowledged) and started again on the same
port, which is how the tests take the network away from the daemon.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

__all__ = ["DevBroker", "free_port"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_port(port: int, up: bool, limit_s: float = 10.0) -> None:
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                if up:
                    return
        except OSError:
            if not up:
                return
        time.sleep(0.05)
    raise TimeoutError(f"broker on port {port} did not come {'up' if up else 'down'}")


class DevBroker:
    def __init__(
        self,
        port: int | None = None,
        workdir: Path | None = None,
        *,
        prefer: str = "mosquitto",
        acl: str | None = None,
    ) -> None:
        """`acl`: the text of a mosquitto ACL file (mosquitto only; anonymous clients get
        the lines before any `user` line). `reload()` reads it again after `set_acl`."""
        self.acl = acl
        self.port = port or free_port()
        self.workdir = workdir or Path(tempfile.mkdtemp(prefix="edge-agent-broker-"))
        self.kind = "mosquitto" if prefer == "mosquitto" and shutil.which("mosquitto") else "amqtt"
        self._proc: subprocess.Popen[bytes] | None = None
        self._amqtt_loop: asyncio.AbstractEventLoop | None = None
        self._amqtt_broker: Any = None
        self._thread: threading.Thread | None = None

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    def start(self) -> DevBroker:
        if self.kind == "mosquitto":
            self._start_mosquitto()
        else:
            self._start_amqtt()
        _wait_port(self.port, up=True)
        return self

    def _start_mosquitto(self) -> None:
        conf = self.workdir / "mosquitto.conf"
        # Persistence keeps client sessions (and their queued QoS 1 messages) across a
        # broker restart, as a production broker is configured to.
        conf.write_text(
            f"listener {self.port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "persistence true\n"
            f"persistence_location {self.workdir}/\n"
            "max_queued_messages 100000\n"
            "set_tcp_nodelay true\n"  # Nagle + delayed ACK add ~40 ms per hop to small messages
            + ("user root\n" if os.geteuid() == 0 else "")  # as root it would drop to `mosquitto`
            + (f"acl_file {self._acl_path()}\n" if self.acl is not None else "")
            + "log_dest stdout\n"
            "log_type error\nlog_type warning\nlog_type notice\n"
        )
        log = self.log_path.open("ab")
        self._proc = subprocess.Popen(
            ["mosquitto", "-c", str(conf)], stdout=log, stderr=subprocess.STDOUT
        )

    def _acl_path(self) -> Path:
        path = self.workdir / "acl"
        path.write_text(self.acl or "", encoding="utf-8")
        return path

    def set_acl(self, acl: str) -> None:
        """Replace the ACL and make mosquitto read it (SIGHUP reloads it, sessions stay)."""
        if self._proc is None or self.acl is None:
            raise RuntimeError("set_acl needs a running mosquitto started with an acl")
        self.acl = acl
        self._acl_path()
        self._proc.send_signal(signal.SIGHUP)

    def _start_amqtt(self) -> None:
        from amqtt.broker import Broker

        config = {
            "listeners": {"default": {"type": "tcp", "bind": f"127.0.0.1:{self.port}"}},
            "plugins": {
                "amqtt.plugins.authentication.AnonymousAuthPlugin": {"allow_anonymous": True}
            },
        }
        ready = threading.Event()
        failure: list[BaseException] = []

        def serve() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)

            async def boot() -> Any:
                broker = Broker(config)  # amqtt wants a running loop already here
                await broker.start()
                return broker

            try:
                broker = loop.run_until_complete(boot())
            except Exception as exc:  # surfaced to the caller below
                failure.append(exc)
                ready.set()
                return
            self._amqtt_loop = loop
            self._amqtt_broker = broker
            ready.set()
            loop.run_forever()
            loop.run_until_complete(broker.shutdown())
            loop.close()

        self._thread = threading.Thread(target=serve, name="amqtt-broker", daemon=True)
        self._thread.start()
        ready.wait(10)
        if failure:
            raise RuntimeError(f"amqtt broker failed to start: {failure[0]!r}") from failure[0]

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.send_signal(signal.SIGCONT)
            self._proc.terminate()
            self._proc.wait(10)
            self._proc = None
        elif self._amqtt_loop is not None and self._thread is not None:
            self._amqtt_loop.call_soon_threadsafe(self._amqtt_loop.stop)
            self._thread.join(10)
            self._amqtt_loop = None
            self._thread = None
        _wait_port(self.port, up=False)

    def freeze(self) -> None:
        """SIGSTOP mosquitto: sockets stay open, nothing is read or acknowledged."""
        if self._proc is None:
            raise RuntimeError("freeze needs a running mosquitto")
        self._proc.send_signal(signal.SIGSTOP)

    def thaw(self) -> None:
        if self._proc is None:
            raise RuntimeError("thaw needs a running mosquitto")
        self._proc.send_signal(signal.SIGCONT)

    def __enter__(self) -> DevBroker:
        return self.start()

    def __exit__(self, *_: object) -> None:
        if self._proc is not None or self._thread is not None:
            self.stop()
