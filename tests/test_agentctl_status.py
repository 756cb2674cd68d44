"""`agentctl status` against a service of another version (an upgrade under way): the table
needs a document our status model reads, `--json` prints the service's document as it is.
The "other version" is a socket that answers one status line with a key ours does not
know: no running service of another version can be had on demand."""

from __future__ import annotations

import json
import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from agent.cli.agentctl import app


@pytest.fixture
def other_version() -> Iterator[tuple[Path, dict[str, Any]]]:
    doc = {"uptime_s": 1.0, "state": "degraded", "a_field_from_the_future": {"x": 1}}
    path = Path(f"/tmp/ea-{uuid.uuid4().hex[:10]}.sock")  # AF_UNIX holds 107 bytes
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen()

    def serve() -> None:
        while True:
            try:
                conn, _ = server.accept()
            except OSError:  # closed: the test is over
                return
            with conn:
                conn.recv(65536)
                conn.sendall(json.dumps({"ok": True, "status": doc}).encode() + b"\n")

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield path, doc
    finally:
        server.close()
        path.unlink(missing_ok=True)
        thread.join(5)


def test_json_prints_the_services_own_document(other_version: tuple[Path, dict[str, Any]]) -> None:
    path, doc = other_version
    result = CliRunner().invoke(app, ["status", "--json", "--socket", str(path)])
    assert json.loads(result.stdout) == doc
    assert result.exit_code == 2  # its state is degraded, whatever else it says


def test_a_table_of_another_versions_status_exits_4_and_prints_it_raw(
    other_version: tuple[Path, dict[str, Any]],
) -> None:
    path, doc = other_version
    result = CliRunner().invoke(app, ["status", "--socket", str(path)])
    assert result.exit_code == 4
    assert "another version" in result.stderr
    assert json.loads(result.stdout) == doc
