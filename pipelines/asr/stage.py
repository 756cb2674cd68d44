"""The ASR stage: audio payloads in, transcript segments out, never on the event loop.

    MQTT callback --submit()--> inbox (bounded, payloads) --decode thread--> AudioBuffer
    (bounded in seconds per stream and total) --recogniser thread--> on_segments()

- `submit` runs on the event loop inside the MQTT callback: it only checks the size and
  queues the bytes. Decoding (PyAV) and recognition (faster-whisper, one model loaded once)
  each run in a thread this stage owns, so neither blocks MQTT, alerts or each other.
- Both queues are bounded and shed their oldest: an undecoded payload by count (its length
  is not known yet), a decoded clip by seconds of audio. Every shed and every refused payload
  goes to `on_error` (the daemon reports it on `<prefix>/errors`) and into the snapshot.
- Settling: a clip's `done` (the daemon's MQTT acknowledgement) is called exactly once:
  when the clip is refused, shed, or heard to hold no speech, here; else it travels with the
  clip's last segment, which the daemon settles once processed. A clip still queued when
  the service stops is not settled, so the broker sends it again.
- Timing: a clip's `start` is its MQTT v5 user property `start` (epoch seconds), else its
  arrival time minus its length (the microphone publishes a clip when it ends). Its `seq`
  is the user property `seq`, else the next number in arrival order for that stream. Each
  Whisper segment of clip `seq` becomes transcript segment `seq * 1000 + i`, timed from the
  clip's start, so the daemon's overlap merge (by timestamps) applies to audio as it does
  to published transcripts.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from pipelines.asr.buffer import AudioBuffer
from pipelines.asr.decode import AudioReason, AudioRejected, Clip, decode_clip
from pipelines.asr.prompt import catalogue_prompt
from pipelines.asr.settings import AsrSettings
from pipelines.compat import TaskGroup
from pipelines.detect import FaultRule
from pipelines.latency import LatencyWindow
from pipelines.queues import SheddingQueue

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

__all__ = [
    "SEGMENTS_PER_CLIP",
    "AsrStage",
    "AudioIn",
    "Heard",
    "Recognizer",
    "WhisperRecognizer",
    "collapse_repeats",
]

log = structlog.get_logger(__name__)

SEGMENTS_PER_CLIP = 1000  # transcript seq = clip seq * 1000 + segment index
_RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 4.0)


@dataclass(frozen=True)
class AudioIn:
    """One payload as it arrived."""

    stream_id: str
    payload: bytes
    topic: str
    seq: int | None = None  # MQTT v5 user property, if sent
    start: float | None = None  # epoch seconds, MQTT v5 user property, if sent
    language: str | None = None  # the stream's configured language; None: detect it
    arrived: float = field(default_factory=time.time)
    arrived_mono: float = field(default_factory=time.monotonic)
    done: Callable[[], None] | None = field(default=None, compare=False, repr=False)

    def settle(self) -> None:
        if self.done is not None:
            self.done()


@dataclass(frozen=True)
class _Decoded:
    audio: AudioIn
    clip: Clip
    seq: int
    start: float


@dataclass(frozen=True)
class Heard:
    """One transcribed segment, shaped like a published transcript segment."""

    stream_id: str
    seq: int
    start: float
    end: float
    text: str
    lang: str | None
    arrived_mono: float  # of the audio it came from: the alert latency starts there
    # The clip's settling, carried by its last segment only (see the module docstring).
    done: Callable[[], None] | None = field(default=None, compare=False, repr=False)


@dataclass(frozen=True)
class Transcript:
    lang: str | None
    segments: list[tuple[float, float, str]]  # (start, end) seconds into the clip, text
    speech: bool  # False: VAD found no speech, the recogniser did not run


class Recognizer(Protocol):
    """`transcribe` is blocking, called only from the stage's recogniser thread."""

    def set_catalogue(self, faults: Sequence[FaultRule]) -> None: ...

    def transcribe(
        self, samples: npt.NDArray[np.float32], language: str | None = None
    ) -> Transcript: ...


class WhisperRecognizer:
    """faster-whisper with the settings' guards; the model is loaded once, here."""

    def __init__(self, settings: AsrSettings, model_dir: Path, faults: Sequence[FaultRule]):
        from faster_whisper import WhisperModel
        from faster_whisper.vad import VadOptions

        self.s = settings
        self.model = WhisperModel(
            str(model_dir),
            device=settings.device,
            compute_type=settings.compute_type,
            cpu_threads=settings.cpu_threads,
            local_files_only=True,  # a folder; never the hub
        )
        self.multilingual = bool(self.model.model.is_multilingual)
        langs = settings.languages if settings.language == "auto" else [settings.language]
        if not self.multilingual:
            langs = ["en"]
        self.languages = langs
        self.faults = list(faults)
        self.prompts = {lang: self._prompt(lang) for lang in langs}
        # An options object, not a dict: detect_language() does not convert one.
        self.vad_options = VadOptions(min_silence_duration_ms=settings.vad_min_silence_ms)

    def transcribe(
        self, samples: npt.NDArray[np.float32], language: str | None = None
    ) -> Transcript:
        """`language`: the stream's own (streams.<id>.language), used when this model
        speaks it; else detected among asr.languages. A stream with a known language should
        say so: detection on a short, noisy clip can flip between close candidates."""
        from faster_whisper.vad import get_speech_timestamps

        s = self.s
        if s.vad and not get_speech_timestamps(samples, self.vad_options):
            return Transcript(None, [], speech=False)  # silence: skip the decoder entirely
        known = _whisper_language(language)
        if known is not None and not (self.multilingual or known == "en"):
            known = None
        lang = known or self._language(samples)
        if lang not in self.prompts:
            self.prompts[lang] = self._prompt(lang)
        segments, _info = self.model.transcribe(
            samples,
            language=lang,
            beam_size=s.beam_size,
            temperature=s.temperature,
            vad_filter=s.vad,
            vad_parameters=self.vad_options if s.vad else None,
            no_speech_threshold=s.no_speech_threshold,
            compression_ratio_threshold=s.compression_ratio_threshold,
            log_prob_threshold=s.log_prob_threshold,
            hallucination_silence_threshold=s.hallucination_silence_threshold,
            word_timestamps=s.hallucination_silence_threshold is not None,
            initial_prompt=self.prompts.get(lang),
            condition_on_previous_text=False,  # clips are independent; no error carry-over
        )
        out = []
        for seg in segments:  # the generator decodes here, in this thread
            text = seg.text.strip()
            limit = s.compression_ratio_threshold
            if limit is not None and seg.compression_ratio > limit:
                # A loop ("over limit, over limit, ..."): with one temperature there is no
                # fallback to retry with, so keep each clause once rather than lose the
                # words that were heard.
                text = collapse_repeats(text)
                log.info("asr.repetition_collapsed", ratio=round(seg.compression_ratio, 2))
            if text:
                out.append((seg.start, seg.end, text))
        return Transcript(lang, out, speech=True)

    def set_catalogue(self, faults: Sequence[FaultRule]) -> None:
        """A new catalogue (a fleet change): the next clip's prompt names its faults. The
        dict is replaced whole, so the recogniser thread sees the old or the new one."""
        self.faults = list(faults)
        self.prompts = {lang: self._prompt(lang) for lang in self.languages}

    def _prompt(self, lang: str) -> str | None:
        if not self.s.prompt_from_catalogue:
            return self.s.initial_prompt
        return catalogue_prompt(self.faults, lang, self.s.initial_prompt)

    def _language(self, samples: npt.NDArray[np.float32]) -> str:
        if len(self.languages) == 1:
            return self.languages[0]
        _, _, probs = self.model.detect_language(
            samples, vad_filter=self.s.vad, vad_parameters=self.vad_options
        )
        allowed = [(p, lang) for lang, p in probs if lang in self.languages]
        return max(allowed)[1] if allowed else self.languages[0]


def _whisper_language(language: str | None) -> str | None:
    """A stream's language as Whisper names it ("zh-CN", "ZH" -> "zh"); None for one it
    does not know, so the clip's language is detected instead of the clip failing."""
    if not language:
        return None
    from faster_whisper.tokenizer import _LANGUAGE_CODES

    code = language.split("-")[0].split("_")[0].lower()
    return code if code in _LANGUAGE_CODES else None


_CLAUSE = re.compile(r"[^,.!?;，。！？；、]+[,.!?;，。！？；、]*")


def collapse_repeats(text: str) -> str:
    """Each clause once, in order (compared without case, spaces and punctuation)."""
    seen: set[str] = set()
    kept: list[str] = []
    for clause in _CLAUSE.findall(text):
        key = re.sub(r"[\W_]+", "", clause).lower()
        if key and key not in seen:
            seen.add(key)
            kept.append(clause.strip())
    joined = " ".join(kept)
    return joined.rstrip(",，、;；") if kept else ""


RecognizerFactory = Callable[[], Recognizer]
SegmentSink = Callable[[list[Heard]], None]
ErrorSink = Callable[[str, str, int, str], None]  # topic, reason, size, detail


class AsrStage:
    def __init__(
        self,
        settings: AsrSettings,
        recognizer: RecognizerFactory,
        on_segments: SegmentSink,
        on_error: ErrorSink,
    ) -> None:
        self.settings = settings
        self._make_recognizer = recognizer
        self._on_segments = on_segments
        self._on_error = on_error
        self._inbox: SheddingQueue[AudioIn] = SheddingQueue(settings.inbox_payloads)
        self.buffer: AudioBuffer[_Decoded] = AudioBuffer(
            settings.queue_seconds_per_stream, settings.queue_seconds_total
        )
        self._decoder = ThreadPoolExecutor(1, thread_name_prefix="asr-decode")
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="asr")
        self._recognizer: Recognizer | None = None
        self.state = "loading"  # loading -> ready | unavailable
        self.error: str | None = None
        self.loaded = asyncio.Event()
        self._next_seq: dict[str, int] = {}  # per stream (bounded by ingest.max_streams)
        self._clip_end: dict[str, float] = {}
        self._busy = 0  # payloads taken off a queue and not yet finished
        # counters
        self.received = 0
        self.rejected: Counter[str] = Counter()
        self.inbox_shed = 0
        self.clips = 0
        self.silent_clips = 0
        self.segments = 0
        self.audio_s = 0.0
        self.busy_s = 0.0
        self.languages: Counter[str] = Counter()
        self.latency = LatencyWindow()  # arrival -> transcribed (queueing included)
        self.rtf = LatencyWindow(buckets=_RTF_BUCKETS)  # recognition time / audio time

    # -- in (event loop, from the MQTT callback) ----------------------------------------

    def submit(self, audio: AudioIn) -> None:
        self.received += 1
        size = len(audio.payload)
        if self.state == "unavailable":
            self._reject(audio, AudioReason.unavailable, f"ASR unavailable: {self.error}")
            return
        if size > self.settings.max_payload_bytes:
            self._reject(
                audio,
                AudioReason.too_large,
                f"{size} bytes (asr.max_payload_bytes {self.settings.max_payload_bytes})",
            )
            return
        shed = self._inbox.put(audio)
        if shed is not None:
            shed.settle()  # dropped on purpose (counted, reported)
            self.inbox_shed += 1
            self._on_error(
                shed.topic,
                "asr_queue_full",
                len(shed.payload),
                f"undecoded audio queue full ({self._inbox.maxsize} payloads); shed the oldest",
            )

    def set_catalogue(self, faults: Sequence[FaultRule]) -> None:
        if self._recognizer is not None:
            self._recognizer.set_catalogue(faults)

    @property
    def idle(self) -> bool:
        """Nothing queued or in progress (the daemon's drain waits for it)."""
        return not len(self._inbox) and not len(self.buffer) and not self._busy

    # -- running ------------------------------------------------------------------------

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            self._recognizer = await loop.run_in_executor(self._worker, self._make_recognizer)
            self.state = "ready"
            log.info("asr.ready", model=self.settings.model, device=self.settings.device)
        except Exception as exc:  # no package, a broken folder, no CUDA: text still works
            self.state, self.error = "unavailable", f"{type(exc).__name__}: {exc}"
            log.error("asr.unavailable", error=self.error)
            self._reject_queued()
            return
        finally:
            self.loaded.set()
        try:
            async with TaskGroup() as tg:
                tg.create_task(self._decode_loop(), name="asr.decode")
                tg.create_task(self._recognize_loop(), name="asr.recognize")
        finally:
            self._decoder.shutdown(wait=False, cancel_futures=True)
            self._worker.shutdown(wait=False, cancel_futures=True)

    async def _decode_loop(self) -> None:
        loop = asyncio.get_running_loop()
        s = self.settings
        while True:
            audio = await self._inbox.get()
            self._busy += 1
            try:
                decode = functools.partial(
                    decode_clip,
                    audio.payload,
                    max_bytes=s.max_payload_bytes,
                    max_seconds=s.max_clip_s,
                )
                clip = await loop.run_in_executor(self._decoder, decode)
            except AudioRejected as exc:
                self._reject(audio, exc.reason, exc.detail)
                continue
            except Exception as exc:  # anything else PyAV or numpy raise: this clip only
                log.exception("asr.decode_failed", stream_id=audio.stream_id)
                self._reject(audio, AudioReason.failed, f"{type(exc).__name__}: {exc}")
                continue
            finally:
                self._busy -= 1
            seq = self._clip_seq(audio)
            start = self._clip_start(audio, clip.seconds)
            for shed in self.buffer.put(
                audio.stream_id, _Decoded(audio, clip, seq, start), clip.seconds
            ):
                shed.item.audio.settle()
                self._on_error(
                    shed.item.audio.topic,
                    "asr_queue_full",
                    len(shed.item.audio.payload),
                    f"ASR queue over {s.queue_seconds_per_stream:g} s per stream or "
                    f"{s.queue_seconds_total:g} s in total: shed {shed.seconds:.1f} s "
                    f"of {shed.stream_id} (clip seq {shed.item.seq})",
                )

    async def _recognize_loop(self) -> None:
        loop = asyncio.get_running_loop()
        recognizer = self._recognizer
        assert recognizer is not None
        while True:
            stream_id, item, seconds = await self.buffer.get()
            self._busy += 1
            try:
                t0 = time.perf_counter()
                result = await loop.run_in_executor(
                    self._worker, recognizer.transcribe, item.clip.samples, item.audio.language
                )
                took = time.perf_counter() - t0
            except Exception as exc:  # one bad clip must not stop the stage
                self._reject(item.audio, AudioReason.failed, f"{type(exc).__name__}: {exc}")
                log.exception("asr.failed", stream_id=stream_id, seq=item.seq)
                continue
            finally:
                self._busy -= 1
            self._account(item, seconds, took, result)
            heard = [
                Heard(
                    stream_id=stream_id,
                    seq=item.seq * SEGMENTS_PER_CLIP + i,
                    start=item.start + a,
                    end=item.start + max(a, b),
                    text=text,
                    lang=result.lang,
                    arrived_mono=item.audio.arrived_mono,
                )
                for i, (a, b, text) in enumerate(result.segments[:SEGMENTS_PER_CLIP])
            ]
            if not heard:
                item.audio.settle()  # nothing in it to process
                continue
            heard[-1] = dataclasses.replace(heard[-1], done=item.audio.done)
            try:
                self._on_segments(heard)
            except Exception:  # the sink's bug must not stop the stage
                item.audio.settle()
                log.exception("asr.sink_failed", stream_id=stream_id, seq=item.seq)

    def _account(self, item: _Decoded, seconds: float, took: float, result: Transcript) -> None:
        self.clips += 1
        self.audio_s += seconds
        self.busy_s += took
        if seconds > 0:
            self.rtf.add(took / seconds)
        self.latency.add(time.monotonic() - item.audio.arrived_mono)
        if not result.speech:
            self.silent_clips += 1
        if result.lang:
            self.languages[result.lang] += 1
        self.segments += len(result.segments)
        log.info(
            "asr.clip",
            stream_id=item.audio.stream_id,
            seq=item.seq,
            audio_s=round(seconds, 2),
            took_s=round(took, 3),
            lang=result.lang,
            segments=len(result.segments),
            speech=result.speech,
        )

    # -- helpers ------------------------------------------------------------------------

    def _clip_start(self, audio: AudioIn, seconds: float) -> float:
        """The clip's `start` property, else its arrival minus its length, but never
        before the stream's previous clip ended: clips that arrive together (a backlog
        after a reconnect, a batching gateway) would otherwise overlap and the overlap
        merge would drop them as repeats."""
        if audio.start is not None:
            start = audio.start
        else:
            start = max(audio.arrived - seconds, self._clip_end.get(audio.stream_id, 0.0))
        self._clip_end[audio.stream_id] = max(
            self._clip_end.get(audio.stream_id, 0.0), start + seconds
        )
        return start

    def _clip_seq(self, audio: AudioIn) -> int:
        nxt = self._next_seq.get(audio.stream_id, 0)
        seq = audio.seq if audio.seq is not None else nxt
        self._next_seq[audio.stream_id] = max(nxt, seq + 1)
        return seq

    def _reject(self, audio: AudioIn, reason: AudioReason, detail: str) -> None:
        audio.settle()
        self.rejected[reason.value] += 1
        self._on_error(audio.topic, reason.value, len(audio.payload), detail)

    def _reject_queued(self) -> None:
        while (audio := self._inbox.get_nowait()) is not None:
            self._reject(audio, AudioReason.unavailable, f"ASR unavailable: {self.error}")

    def close(self) -> None:
        for name, pool in (("decoder", self._decoder), ("recognizer", self._worker)):
            try:
                pool.shutdown(wait=False, cancel_futures=True)
            except Exception:  # one pool failing to stop must not keep the other running
                log.exception("asr.executor_shutdown_failed", executor=name)

    def snapshot(self) -> dict[str, Any]:
        p50, p95 = self.rtf.percentile(0.5), self.latency.percentile(0.95)
        return {
            "state": self.state,
            "error": self.error,
            "model": self.settings.model,
            "device": self.settings.device,
            "compute_type": self.settings.compute_type,
            "received": self.received,
            "rejected": dict(self.rejected),
            "clips": self.clips,
            "silent_clips": self.silent_clips,
            "segments": self.segments,
            "languages": dict(self.languages),
            "audio_s": round(self.audio_s, 1),
            "rtf": round(self.busy_s / self.audio_s, 3) if self.audio_s else None,
            "rtf_p50": None if p50 is None else round(p50, 3),
            "latency_p95_s": None if p95 is None else round(p95, 3),
            "queue": {
                "inbox": len(self._inbox),
                "inbox_max": self._inbox.maxsize,
                "inbox_shed": self.inbox_shed,
                "seconds": round(self.buffer.seconds, 2),
                "per_stream_s": self.buffer.stream_seconds(),
                "max_per_stream_s": self.settings.queue_seconds_per_stream,
                "max_total_s": self.settings.queue_seconds_total,
                "shed_clips": self.buffer.shed_clips,
                "shed_s": round(self.buffer.shed_seconds, 1),
            },
        }
