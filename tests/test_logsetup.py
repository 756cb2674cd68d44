"""Log output: JSON lines on stdout, journal fields under systemd (agent/logsetup.py)."""

from __future__ import annotations

import json
import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import structlog

from agent.logsetup import configure_logging, journal_fields


@pytest.fixture(autouse=True)
def reset_structlog(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("JOURNAL_STREAM", raising=False)
    yield
    structlog.reset_defaults()
    structlog.contextvars.clear_contextvars()


class FakeJournal:
    def __init__(self) -> None:
        self.sent: list[tuple[str, dict[str, Any]]] = []

    def send(self, message: str, **fields: Any) -> None:
        self.sent.append((message, fields))


def install_fake_systemd(monkeypatch: pytest.MonkeyPatch) -> FakeJournal:
    journal = FakeJournal()
    module = types.ModuleType("systemd.journal")
    module.send = journal.send  # type: ignore[attr-defined]
    package = types.ModuleType("systemd")
    package.journal = module  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "systemd", package)
    monkeypatch.setitem(sys.modules, "systemd.journal", module)
    return journal


# -- journal_fields -----------------------------------------------------------------------


def test_keys_become_upper_case_journal_fields() -> None:
    """Event keys become upper-case journal field names, so journalctl can filter on them."""
    fields = journal_fields(
        {"event": "alert.event", "level": "info", "stream_id": "line3-mic1", "alert_id": "a:1"}
    )
    assert fields["STREAM_ID"] == "line3-mic1"
    assert fields["ALERT_ID"] == "a:1"
    assert fields["MESSAGE"] == "alert.event"


def test_non_strings_are_json_encoded() -> None:
    """Numbers, lists and dicts are JSON text; strings are passed as they are."""
    fields = journal_fields(
        {"event": "e", "count": 3, "ok": True, "codes": ["a", "b"], "note": "plain", "none": None}
    )
    assert fields["COUNT"] == "3"
    assert fields["OK"] == "true"
    assert fields["CODES"] == '["a", "b"]'
    assert fields["NOTE"] == "plain"
    assert fields["NONE"] == "null"


class _Opaque:
    def __str__(self) -> str:
        return "opaque!"


def test_unserialisable_values_fall_back_to_str() -> None:
    """A value JSON cannot encode is logged as its string form instead of failing."""
    assert journal_fields({"event": "e", "obj": _Opaque()})["OBJ"] == '"opaque!"'


def test_awkward_key_names_are_made_valid() -> None:
    """Dots, dashes and leading underscores become valid field names; an empty one is FIELD."""
    fields = journal_fields({"event": "e", "mqtt.rc": 5, "queue-depth": 1, "_private": "p", "_": 0})
    assert fields["MQTT_RC"] == "5"
    assert fields["QUEUE_DEPTH"] == "1"
    assert fields["PRIVATE"] == "p"
    assert fields["FIELD"] == "0"


@pytest.mark.parametrize(
    ("level", "priority"),
    [
        ("debug", "7"),
        ("info", "6"),
        ("warning", "4"),
        ("error", "3"),
        ("critical", "2"),
        ("unheard-of", "6"),
    ],
)
def test_level_maps_to_syslog_priority(level: str, priority: str) -> None:
    """The structlog level becomes the journal PRIORITY (syslog numbers; unknown = info)."""
    assert journal_fields({"event": "e", "level": level})["PRIORITY"] == priority


def test_identifier_set_and_bookkeeping_keys_dropped() -> None:
    """Every entry is tagged edge-agent; event, level and timestamp are not duplicated."""
    fields = journal_fields({"event": "e", "level": "info", "timestamp": "2024-01-01T00:00:00Z"})
    assert fields == {"MESSAGE": "e", "PRIORITY": "6", "SYSLOG_IDENTIFIER": "edge-agent"}


# -- configure_logging --------------------------------------------------------------------


def test_json_lines_on_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """By default each event is one JSON object per line on stdout, with level and time."""
    assert configure_logging("info", "json") == "json"
    log = structlog.get_logger("t")
    log.info("segment.accepted", stream_id="line3-mic1", seq=7, text="轴承异响")
    log.warning("outbox.shed", shed=2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    first, second = (json.loads(line) for line in lines)
    assert first["event"] == "segment.accepted"
    assert first["level"] == "info"
    assert (first["stream_id"], first["seq"], first["text"]) == ("line3-mic1", 7, "轴承异响")
    assert first["timestamp"].endswith("Z")
    assert '"轴承异响"' in lines[0]  # readable, not \\u escapes
    assert (second["event"], second["level"], second["shed"]) == ("outbox.shed", "warning", 2)


def test_level_filters_lower_events(capsys: pytest.CaptureFixture[str]) -> None:
    """At level warning, info and debug events are not written."""
    configure_logging("warning", "json")
    log = structlog.get_logger("t")
    log.debug("d")
    log.info("i")
    log.error("e")
    events = [json.loads(line)["event"] for line in capsys.readouterr().out.splitlines()]
    assert events == ["e"]


def test_debug_level_shows_debug(capsys: pytest.CaptureFixture[str]) -> None:
    """At level debug, debug events are written."""
    configure_logging("debug", "json")
    structlog.get_logger("t").debug("d", x=1)
    assert json.loads(capsys.readouterr().out)["event"] == "d"


def test_context_variables_are_included(capsys: pytest.CaptureFixture[str]) -> None:
    """Values bound with structlog.contextvars appear on every event."""
    configure_logging("info", "json")
    structlog.contextvars.bind_contextvars(device_id="line3-edge-01")
    structlog.get_logger("t").info("hello")
    assert json.loads(capsys.readouterr().out)["device_id"] == "line3-edge-01"


def test_console_format_is_human_readable(capsys: pytest.CaptureFixture[str]) -> None:
    """The console format writes readable text, not JSON."""
    assert configure_logging("info", "console") == "console"
    structlog.get_logger("t").info("agent.started", stream_id="mic1")
    out = capsys.readouterr().out
    assert "agent.started" in out
    assert "stream_id" in out
    with pytest.raises(json.JSONDecodeError):
        json.loads(out)


def test_journal_used_under_systemd(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With JOURNAL_STREAM set and systemd-python present, events go to the journal as fields."""
    journal = install_fake_systemd(monkeypatch)
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    assert configure_logging("info", "json") == "journal"
    structlog.get_logger("t").warning("alert.event", stream_id="line3-mic1", count=3)
    assert capsys.readouterr().out == ""  # not also on stdout
    [(message, fields)] = journal.sent
    assert message == "alert.event"
    assert fields["STREAM_ID"] == "line3-mic1"
    assert fields["COUNT"] == "3"
    assert fields["PRIORITY"] == "4"
    assert fields["SYSLOG_IDENTIFIER"] == "edge-agent"


def test_journal_respects_level(monkeypatch: pytest.MonkeyPatch) -> None:
    """Events below the configured level are not sent to the journal either."""
    journal = install_fake_systemd(monkeypatch)
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    configure_logging("warning", "json")
    structlog.get_logger("t").info("quiet")
    assert journal.sent == []


def test_without_systemd_python_falls_back_to_json(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Under systemd but without systemd-python, JSON lines on stdout are used."""
    monkeypatch.setitem(sys.modules, "systemd", None)  # import fails
    monkeypatch.setenv("JOURNAL_STREAM", "8:12345")
    assert configure_logging("info", "json") == "json"
    structlog.get_logger("t").info("hello")
    assert json.loads(capsys.readouterr().out)["event"] == "hello"


def test_journal_not_used_outside_systemd(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without JOURNAL_STREAM, stdout JSON is used even if systemd-python is installed."""
    journal = install_fake_systemd(monkeypatch)
    assert configure_logging("info", "json") == "json"
    structlog.get_logger("t").info("hello")
    assert journal.sent == []
    assert json.loads(capsys.readouterr().out)["event"] == "hello"
