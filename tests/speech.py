"""Speech made at test time: espeak-ng speaks, sox converts (rate, channels, FLAC, Vorbis),
PyAV encodes Ogg/Opus (sox 14.4 cannot write Opus). Used by the ASR tests and bench/asr.

Mandarin: espeak-ng's hanzi dictionary is poor, so Chinese is fed as tone-numbered pinyin
to the `cmn-latn-pinyin` voice (audible, robotic Mandarin).
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tempfile
from pathlib import Path

__all__ = ["missing_tools", "silence", "speak", "to_flac", "to_opus", "to_vorbis", "wav_seconds"]


def missing_tools() -> str | None:
    for tool in ("espeak-ng", "sox"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (scripts/setup.sh installs it as root)"
    return None


def _sox(src: bytes, suffix_in: str, suffix_out: str, *args: str) -> bytes:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp) / f"in{suffix_in}", Path(tmp) / f"out{suffix_out}"
        a.write_bytes(src)
        subprocess.run(["sox", str(a), *args[:1], str(b), *args[1:]], check=True, timeout=60)
        return b.read_bytes()


def speak(text: str, *, voice: str = "en-us", rate: int = 16000, channels: int = 1,
          words_per_minute: int = 150) -> bytes:  # fmt: skip
    """WAV (16-bit PCM) of `text` at `rate` Hz and `channels`."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "raw.wav"
        subprocess.run(
            ["espeak-ng", "-v", voice, "-s", str(words_per_minute), "-w", str(raw), text],
            check=True,
            timeout=60,
        )
        out = Path(tmp) / "out.wav"
        subprocess.run(
            ["sox", str(raw), "-r", str(rate), "-c", str(channels), "-b", "16", str(out)],
            check=True,
            timeout=60,
        )
        return out.read_bytes()


def silence(seconds: float, rate: int = 16000) -> bytes:
    """A WAV of digital silence with a little noise floor (as a quiet room gives)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "s.wav"
        subprocess.run(
            ["sox", "-n", "-r", str(rate), "-c", "1", "-b", "16", str(out),
             "synth", str(seconds), "whitenoise", "vol", "0.002"],
            check=True, timeout=60,
        )  # fmt: skip
        return out.read_bytes()


def to_flac(wav: bytes) -> bytes:
    return _sox(wav, ".wav", ".flac")


def to_vorbis(wav: bytes) -> bytes:
    return _sox(wav, ".wav", ".ogg")


def to_opus(wav: bytes) -> bytes:
    """Ogg/Opus at 48 kHz (Opus' own rate), 32 kbit/s, encoded with PyAV's libopus."""
    import av

    out = io.BytesIO()
    with av.open(io.BytesIO(wav)) as src, av.open(out, "w", format="ogg") as dst:
        stream = dst.add_stream("libopus", rate=48000, layout="mono")
        stream.bit_rate = 32000
        resampler = av.AudioResampler(format="s16", layout="mono", rate=48000)
        for frame in src.decode(audio=0):
            for f in resampler.resample(frame):
                for packet in stream.encode(f):
                    dst.mux(packet)
        for packet in stream.encode(None):
            dst.mux(packet)
    return out.getvalue()


def wav_seconds(wav: bytes) -> float:
    import av

    with av.open(io.BytesIO(wav)) as c:
        s = c.streams.audio[0]
        return float(s.duration * s.time_base)
