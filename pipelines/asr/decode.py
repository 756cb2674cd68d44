"""One audio payload -> 16 kHz mono float32 samples, or the reason it is refused.

PyAV (FFmpeg, bundled with faster-whisper) reads the container: WAV PCM at any rate and
channel count, FLAC, Ogg/Opus, Ogg/Vorbis, MP3 and the rest FFmpeg knows. Each refusal has
its own reason, so an operator reading `<prefix>/errors` knows what the microphone sent:

- `too_large`: over `asr.max_payload_bytes` (checked before anything is parsed);
- `empty`: no bytes, or a valid container with no samples;
- `not_audio`: FFmpeg finds no container it knows, or one without an audio stream;
- `unsupported_codec`: a container whose audio codec this FFmpeg cannot decode;
- `truncated`: the data ends before the container says it does (a WAV whose RIFF size is
  larger than the payload; a stream that breaks after its first frames);
- `too_long`: over `asr.max_clip_s`, from the container's declared length when it has one,
  so a long clip is refused before it is decoded, else while decoding.

The stage adds two of its own: `unavailable` (the model could not be loaded: audio is
refused, transcripts still work) and `failed` (the recogniser raised on this clip).

Blocking (decoding takes milliseconds to tens of milliseconds): the stage calls it in its
own thread.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = ["SAMPLE_RATE", "AudioReason", "AudioRejected", "Clip", "decode_clip"]

SAMPLE_RATE = 16_000  # what Whisper reads


class AudioReason(str, Enum):
    too_large = "too_large"
    empty = "empty"
    not_audio = "not_audio"
    unsupported_codec = "unsupported_codec"
    truncated = "truncated"
    too_long = "too_long"
    unavailable = "unavailable"
    failed = "failed"


class AudioRejected(Exception):
    def __init__(self, reason: AudioReason, detail: str) -> None:
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True)
class Clip:
    samples: npt.NDArray[np.float32]  # mono, SAMPLE_RATE
    codec: str

    @property
    def seconds(self) -> float:
        return len(self.samples) / SAMPLE_RATE


def decode_clip(data: bytes, *, max_bytes: int, max_seconds: float) -> Clip:
    """Decode one payload; raises AudioRejected with the reason."""
    import av  # faster-whisper's dependency: imported only where audio is used
    import numpy as np

    if len(data) > max_bytes:
        raise AudioRejected(AudioReason.too_large, f"{len(data)} bytes (max {max_bytes})")
    if not data:
        raise AudioRejected(AudioReason.empty, "no bytes")
    _check_riff_size(data)
    got = _Decoded()
    try:
        with av.open(io.BytesIO(data), mode="r", metadata_errors="ignore") as container:
            _decode(container, max_seconds, got)
    except AudioRejected:
        raise
    except av.error.DecoderNotFoundError as exc:
        raise AudioRejected(AudioReason.unsupported_codec, f"no decoder: {exc}") from exc
    except av.error.FFmpegError as exc:
        if got.samples:  # it started well and then broke off
            raise AudioRejected(
                AudioReason.truncated,
                f"{got.codec} broke after {got.samples / SAMPLE_RATE:.2f} s: {exc}",
            ) from exc
        raise AudioRejected(AudioReason.not_audio, f"unreadable: {exc}") from exc
    if got.samples == 0:
        raise AudioRejected(AudioReason.empty, f"{got.codec} stream without samples")
    pcm = np.concatenate(got.chunks).astype(np.float32) / 32768.0
    return Clip(pcm, got.codec)


@dataclass
class _Decoded:
    """What decoding produced so far: kept when it breaks off, to tell a cut stream (some
    samples) from data that never was audio (none)."""

    codec: str = "?"
    samples: int = 0
    chunks: list[Any] = field(default_factory=list)


def _decode(container: Any, max_seconds: float, got: _Decoded) -> None:
    import av

    if not container.streams.audio:
        raise AudioRejected(AudioReason.not_audio, "no audio stream in the container")
    stream = container.streams.audio[0]
    if stream.codec_context is None:
        # No decoder for this codec. Checked here, not left to decode(): PyAV 17 (the
        # newest for Python 3.10) crashes the process decoding such a stream.
        raise AudioRejected(AudioReason.unsupported_codec, "no decoder for the audio codec")
    got.codec = stream.codec_context.name
    declared = _declared_seconds(stream, container)
    if declared is not None and declared > max_seconds + 0.05:
        raise AudioRejected(
            AudioReason.too_long, f"{declared:.1f} s declared (max {max_seconds:g} s)"
        )
    limit = int(max_seconds * SAMPLE_RATE)
    resampler = av.AudioResampler(format="s16", layout="mono", rate=SAMPLE_RATE)
    for out in _resampled(container, stream, resampler):  # lazily: stop at the limit
        arr = out.to_ndarray().reshape(-1)
        got.chunks.append(arr)
        got.samples += len(arr)
        if got.samples > limit:
            raise AudioRejected(AudioReason.too_long, f"over {max_seconds:g} s while decoding")


def _resampled(container: Any, stream: Any, resampler: Any) -> Iterator[Any]:
    for frame in container.decode(stream):
        yield from resampler.resample(frame)
    yield from resampler.resample(None)  # what the resampler still holds


def _declared_seconds(stream: Any, container: Any) -> float | None:
    if stream.duration is not None and stream.time_base is not None:
        return float(stream.duration * stream.time_base)
    if container.duration is not None:
        return float(container.duration) / 1_000_000  # AV_TIME_BASE
    return None


def _check_riff_size(data: bytes) -> None:
    """A WAV's RIFF header states its size; FFmpeg happily decodes what is there, so a cut
    WAV would pass as a shorter clip. Streaming writers put 0 or 0xFFFFFFFF: unknown."""
    if len(data) < 12 or data[:4] != b"RIFF" or data[8:12] != b"WAVE":
        return
    (riff,) = struct.unpack("<I", data[4:8])
    if riff in (0, 0xFFFFFFFF):
        return
    if len(data) < riff + 8:
        raise AudioRejected(
            AudioReason.truncated, f"WAV of {len(data)} bytes, its header says {riff + 8}"
        )
