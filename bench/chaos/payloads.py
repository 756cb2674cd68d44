"""Hostile input for every boundary the service reads from, as hypothesis strategies:
the fuzz test (tests/test_fuzz_input.py, a bounded count in CI) and the long fuzz run of
bench/chaos (`--fuzz N`) draw from the same ones.

A payload is (channel, bytes, user properties): channel `transcript`, `audio`, `fleet`
(published on those topics) or `control` (one request line on the control socket).
"""

from __future__ import annotations

import asyncio
import io
import json
import struct
import wave
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiomqtt
from hypothesis import strategies as st
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

__all__ = ["CHANNELS", "Target", "counted", "payloads", "send"]

CHANNELS = ("transcript", "audio", "fleet", "control")

_json_leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**40), max_value=10**40),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=200),  # any code point, NUL and lone surrogates' neighbours included
)
_json = st.recursive(
    _json_leaf,
    lambda inner: (
        st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=12), inner, max_size=5)
    ),
    max_leaves=40,
)


def _dump(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, allow_nan=True).encode("utf-8", "surrogatepass")


@st.composite
def _segment_like(draw: st.DrawFn) -> bytes:
    """A transcript segment with any field of any type, or missing, or extra."""
    fields = {
        "stream_id": draw(st.one_of(st.just("fz1"), st.text(max_size=70), _json_leaf)),
        "seq": draw(st.one_of(st.integers(min_value=-5, max_value=10**30), _json_leaf)),
        "start": draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True), _json_leaf)),
        "end": draw(st.one_of(st.floats(allow_nan=True, allow_infinity=True), _json_leaf)),
        "text": draw(st.one_of(st.text(max_size=9000), _json)),
        "lang": draw(st.one_of(st.none(), st.text(max_size=12), _json_leaf)),
    }
    keep = draw(st.lists(st.sampled_from(sorted(fields)), unique=True, max_size=len(fields)))
    body = {k: fields[k] for k in keep}
    if draw(st.booleans()):
        body[draw(st.text(max_size=8))] = draw(_json)
    return _dump(body)


@st.composite
def _nested(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(min_value=1, max_value=20000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    tail = closer * depth if draw(st.booleans()) else ""
    return (opener * depth + "1" + tail).encode()


@st.composite
def _truncated(draw: st.DrawFn, inner: st.SearchStrategy[bytes]) -> bytes:
    data = draw(inner)
    return data[: draw(st.integers(min_value=0, max_value=max(0, len(data) - 1)))]


@st.composite
def _wav(draw: st.DrawFn) -> bytes:
    """A WAV header with odd parameters, and samples or garbage after it."""
    rate = draw(st.sampled_from([1, 8000, 16000, 44100, 192000, 2**31 - 1]))
    channels = draw(st.integers(min_value=1, max_value=8))
    buf = io.BytesIO()
    try:
        with wave.open(buf, "wb") as w:
            w.setnchannels(channels)
            w.setsampwidth(draw(st.sampled_from([1, 2, 4])))
            w.setframerate(rate)
            w.writeframes(draw(st.binary(max_size=4000)))
    except (wave.Error, struct.error, OverflowError):
        return b"RIFF" + draw(st.binary(max_size=200))
    return buf.getvalue()


_text_payload = st.one_of(
    _segment_like(),
    _nested(),
    _truncated(_segment_like()),
    _json.map(_dump),
    st.binary(max_size=2000),
    st.binary(min_size=60000, max_size=70000),  # around ingest.max_payload_bytes
    st.just(b""),
    st.text(max_size=500).map(lambda t: t.encode("utf-8", "surrogatepass")),
)
_audio_payload = st.one_of(
    _wav(),
    _truncated(_wav()),
    st.binary(max_size=5000),
    st.sampled_from([b"OggS", b"fLaC", b"ID3", b"RIFF\x00\x00\x00\x00WAVE"]).flatmap(
        lambda magic: st.binary(max_size=3000).map(lambda b: magic + b)
    ),
)
# MQTT strings are UTF-8 without control characters (mosquitto drops a client that sends
# one, which would test the broker, not us): the properties stay within that, their values
# do not stay sensible.
_mqtt_text = st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=30)
_properties = st.lists(
    st.tuples(
        st.sampled_from(["seq", "start", "x"]) | _mqtt_text,
        _mqtt_text | st.sampled_from(["1e999999", "nan", "-1", "9" * 5000, "inf", ""]),
    ),
    max_size=4,
)
_control_line = st.one_of(
    _text_payload.map(lambda b: b.replace(b"\n", b" ") + b"\n"),
    st.fixed_dictionaries(
        {"cmd": st.text(max_size=30) | _json_leaf}, optional={"follow": _json}
    ).map(lambda d: _dump(d) + b"\n"),
    st.just(b'{"cmd": "status"}\n'),
)


def payloads() -> st.SearchStrategy[tuple[str, bytes, list[tuple[str, str]]]]:
    """One hostile payload for one channel, with MQTT 5 user properties for audio."""
    return st.one_of(
        st.tuples(st.just("transcript"), _text_payload, st.just([])),
        st.tuples(st.just("audio"), _audio_payload, _properties),
        st.tuples(st.just("fleet"), _text_payload, st.just([])),
        st.tuples(st.just("control"), _control_line, st.just([])),
    )


Payload = tuple[str, bytes, list[tuple[str, str]]]


@dataclass(frozen=True)
class Target:
    """Where the payloads go: the broker's port, the service's prefix and socket, the fleet
    group it takes documents from."""

    port: int
    prefix: str
    socket: Path
    group: str = "fz"


async def send(target: Target, batch: Sequence[Payload], sent: Counter[str]) -> None:
    """Publish (QoS 1: returns after the broker's PUBACK) or send each payload; every
    control request must be answered with one JSON line."""
    async with aiomqtt.Client(
        "127.0.0.1", target.port, protocol=aiomqtt.ProtocolVersion.V5
    ) as client:
        for channel, payload, props in batch:
            if channel == "control":
                reader, writer = await asyncio.open_unix_connection(
                    str(target.socket), limit=1 << 20
                )
                writer.write(payload)
                await writer.drain()
                writer.write_eof()
                answer = await asyncio.wait_for(reader.readline(), 30)
                writer.close()
                if not answer.endswith(b"\n") or json.loads(answer)["ok"] not in (True, False):
                    raise AssertionError(f"control answered {answer[:200]!r}")
            else:
                topic = {
                    "transcript": f"{target.prefix}/streams/fz1/transcript",
                    "audio": f"{target.prefix}/streams/fz1/audio",
                    "fleet": f"fleet/{target.group}/config",
                }[channel]
                properties = None
                if props:
                    properties = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
                    properties.UserProperty = props
                await client.publish(topic, payload, qos=1, properties=properties)
            sent[channel] += 1


def counted(status: dict[str, Any], sent: Counter[str], extra_transcripts: int = 0) -> bool:
    """Whether the service's status counts every payload sent: transcripts received, audio
    received by the ASR stage or refused before it (its properties), fleet documents, and
    control requests answered or refused."""
    ingest = status.get("ingest") or {}
    asr = status.get("asr") or {}
    fleet = status.get("fleet") or {}
    control = status.get("control") or {}
    refused = int((asr.get("rejected") or {}).get("invalid_properties", 0))
    return (
        ingest.get("received", 0) == sent["transcript"] + extra_transcripts
        and asr.get("received", 0) + refused == sent["audio"]
        and fleet.get("documents", 0) == sent["fleet"]
        and control.get("requests", 0) + control.get("bad_requests", 0) == sent["control"]
    )
