"""Parsing and rejecting transcript payloads (pipelines/ingest.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from pipelines.ingest import (
    IngestLimits,
    InputRejected,
    RejectReason,
    Segment,
    parse_transcript,
)

NOW = 1_700_000_000.0
LIMITS = IngestLimits()


def payload(**changes: Any) -> bytes:
    body: dict[str, Any] = {
        "stream_id": "line3-mic1",
        "seq": 7,
        "start": NOW - 10,
        "end": NOW - 5,
        "text": "bearing noise on line three",
        "lang": "en",
    }
    body.update(changes)
    return json.dumps(body, ensure_ascii=False).encode()


def rejected(
    raw: bytes, *, stream: str = "line3-mic1", limits: IngestLimits = LIMITS
) -> InputRejected:
    with pytest.raises(InputRejected) as info:
        parse_transcript(stream, raw, limits, NOW)
    return info.value


def test_valid_segment_is_parsed() -> None:
    """A well-formed payload on its own stream's topic becomes a Segment."""
    seg = parse_transcript("line3-mic1", payload(), LIMITS, NOW)
    assert seg == Segment(
        stream_id="line3-mic1",
        seq=7,
        start=NOW - 10,
        end=NOW - 5,
        text="bearing noise on line three",
        lang="en",
    )


def test_lang_is_optional_and_chinese_text_is_kept() -> None:
    """A payload without lang is accepted and UTF-8 Chinese text arrives intact."""
    raw = json.dumps(
        {"stream_id": "line3-mic1", "seq": 0, "start": NOW, "end": NOW, "text": "轴承异响"},
        ensure_ascii=False,
    ).encode()
    seg = parse_transcript("line3-mic1", raw, LIMITS, NOW)
    assert seg.lang is None
    assert seg.text == "轴承异响"


def test_oversized_payload_is_rejected_unread() -> None:
    """A payload over max_payload_bytes is refused as too_large, before any parsing."""
    limits = IngestLimits(max_payload_bytes=100)
    err = rejected(b"\xff" * 101, limits=limits)  # not even UTF-8: size is checked first
    assert err.reason is RejectReason.too_large
    assert err.detail == "101 bytes > limit 100"


def test_payload_exactly_at_size_limit_is_accepted() -> None:
    """A payload of exactly max_payload_bytes is still accepted."""
    raw = payload()
    seg = parse_transcript("line3-mic1", raw, IngestLimits(max_payload_bytes=len(raw)), NOW)
    assert seg.seq == 7


def test_stream_outside_allow_list_is_rejected() -> None:
    """Under a strict allow-list, other streams are refused as stream_not_allowed."""
    limits = IngestLimits(allowed_streams=frozenset({"line3-mic2"}))
    err = rejected(payload(), limits=limits)
    assert err.reason is RejectReason.stream_not_allowed
    assert "line3-mic1" in err.detail
    allowed = IngestLimits(allowed_streams=frozenset({"line3-mic1"}))
    assert parse_transcript("line3-mic1", payload(), allowed, NOW).seq == 7


def test_non_utf8_payload_is_rejected_with_byte_position() -> None:
    """Bytes that are not UTF-8 are refused as not_utf8, naming the offending byte."""
    raw = b'{"text": "ok\xff"}'
    err = rejected(raw)
    assert err.reason is RejectReason.not_utf8
    assert err.detail == "byte 12 is not UTF-8"


@pytest.mark.parametrize("raw", [b"{not json", b"", b'{"seq": 1,}'])
def test_invalid_json_is_rejected(raw: bytes) -> None:
    """Text that is not JSON is refused as invalid_json."""
    assert rejected(raw).reason is RejectReason.invalid_json


@pytest.mark.parametrize(
    ("raw", "where"),
    [
        (payload(seq=-1), "seq"),
        (payload(seq="seven"), "seq"),
        (payload(start="yesterday"), "start"),
        (payload(extra="x"), "extra"),
        (payload(lang="English"), "lang"),
        (payload(stream_id="bad/id"), "stream_id"),
        (b"[1, 2, 3]", "(payload)"),
        (json.dumps({"stream_id": "line3-mic1", "seq": 1}).encode(), "start"),
    ],
)
def test_wrong_schema_is_rejected_naming_the_field(raw: bytes, where: str) -> None:
    """Wrong types, missing or extra fields are refused as invalid_schema, naming the field."""
    err = rejected(raw)
    assert err.reason is RejectReason.invalid_schema
    assert err.detail.startswith(f"{where}:")


def test_schema_error_counts_further_problems() -> None:
    """With several schema errors, the detail shows the first and how many more."""
    raw = json.dumps({"stream_id": "line3-mic1"}).encode()
    err = rejected(raw)
    assert err.reason is RejectReason.invalid_schema
    assert err.detail.endswith("(+3 more)")  # seq, start, end, text all missing


def test_end_before_start_is_rejected() -> None:
    """A segment ending before it starts is refused as invalid_schema."""
    err = rejected(payload(start=NOW, end=NOW - 1))
    assert err.reason is RejectReason.invalid_schema
    assert "end must not be before start" in err.detail


def test_non_finite_timestamps_are_rejected() -> None:
    """NaN or infinite timestamps (which Python's JSON accepts) are refused."""
    raw = payload().replace(str(NOW - 10).encode(), b"NaN")
    err = rejected(raw)
    assert err.reason is RejectReason.invalid_schema
    assert "finite" in err.detail


def test_stream_id_must_match_topic() -> None:
    """A payload naming another stream than its topic is refused as stream_mismatch."""
    err = rejected(payload(), stream="line3-mic2")
    assert err.reason is RejectReason.stream_mismatch
    assert err.detail == "payload stream_id 'line3-mic1' on topic of 'line3-mic2'"


def test_overlong_text_is_rejected() -> None:
    """Text longer than max_text_chars is refused as text_too_long (counted in characters)."""
    limits = IngestLimits(max_text_chars=4)
    assert parse_transcript("line3-mic1", payload(text="轴承异响"), limits, NOW).text == "轴承异响"
    err = rejected(payload(text="轴承异响了"), limits=limits)
    assert err.reason is RejectReason.text_too_long
    assert err.detail == "5 chars > 4"


def test_segment_from_the_future_is_rejected() -> None:
    """A segment starting beyond the allowed clock skew is refused as from_future."""
    ok = parse_transcript("line3-mic1", payload(start=NOW + 299, end=NOW + 300), LIMITS, NOW)
    assert ok.start == NOW + 299
    err = rejected(payload(start=NOW + 3600, end=NOW + 3605))
    assert err.reason is RejectReason.from_future
    assert err.detail == "starts 3600 s in the future"


def test_rejection_message_names_reason_and_detail() -> None:
    """str(InputRejected) is 'reason: detail', what the log and the errors topic show."""
    err = rejected(b"{oops")
    assert str(err).startswith("invalid_json: ")
    assert str(err) == f"{err.reason.value}: {err.detail}"
