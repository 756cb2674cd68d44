"""ASR benchmark: accuracy and speed of the Whisper configurations on CPU, and the service's
end-to-end time from audio published to alert received.

1. Accuracy and speed, in this process, with the service's own recogniser
   (pipelines.asr.stage.WhisperRecognizer: VAD, language choice among asr.languages, the
   catalogue prompt, the loop guard), per model x compute type x beam size, on the fixed
   spoken set of bench/asr/sentences.py (espeak-ng, synthesised once): WER (English), CER
   (Mandarin), language identification, fault recall and false alarms of the keyword tier
   on the transcripts, real-time factor. Mandarin is also transcribed with the language
   forced to zh (the same loaded model), to tell language identification from recognition.
2. End to end: mosquitto and `edge-agent run` (configs/agent.yaml, the cpu-dev profile's
   ASR settings, keyword tier only) as subprocesses; fault clips published one at a time,
   each on its own stream, timed from publish to the alert at a subscriber.

Prints tables, writes `<out>/<name>.md` and `.json`. Never asserts a timing.

    .venv/bin/python bench/asr/bench_asr.py [--models base,tiny.en] [--compute int8,float32]
        [--beams 1,5] [--repeat 3] [--e2e-clips 20] [--out bench/asr/results]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import datetime as dt
import gc
import importlib.metadata
import json
import os
import platform
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import jiwer

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from agent.config.loader import load_config  # noqa: E402
from agent.engine.paths import cache_dir  # noqa: E402
from agent.reader import keyword_detector  # noqa: E402
from bench._common import machine, md_table, percentile  # noqa: E402
from bench.asr.sentences import SENTENCES, Sentence  # noqa: E402
from pipelines.asr.decode import decode_clip  # noqa: E402
from pipelines.asr.settings import AsrSettings  # noqa: E402
from pipelines.detect import KeywordDetector  # noqa: E402
from tests.speech import missing_tools, speak  # noqa: E402

AGENT_YAML = ROOT / "configs" / "agent.yaml"

# -- scoring ------------------------------------------------------------------------------

_ONES = [
    "zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
    "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen", "seventeen", "eighteen",
    "nineteen",
]  # fmt: skip
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
_ORDINALS = {
    "one": "first", "two": "second", "three": "third", "five": "fifth", "eight": "eighth",
    "nine": "ninth", "twelve": "twelfth",
}  # fmt: skip
_CONTRACTIONS = {
    "there's": "there is", "it's": "it is", "that's": "that is", "we've": "we have",
    "we're": "we are", "i'm": "i am", "don't": "do not", "isn't": "is not",
    "doesn't": "does not", "can't": "cannot", "won't": "will not", "let's": "let us",
}  # fmt: skip


def number_words(n: int) -> str:
    """0-999 as spoken ("412" -> "four hundred twelve"); four digits in pairs, as times and
    years are read ("1030" -> "ten thirty"); anything else digit by digit."""
    if n < 20:
        return _ONES[n]
    if n < 100:
        tens, ones = divmod(n, 10)
        return _TENS[tens] + (f" {_ONES[ones]}" if ones else "")
    if n < 1000:
        hundreds, rest = divmod(n, 100)
        return f"{_ONES[hundreds]} hundred" + (f" {number_words(rest)}" if rest else "")
    if n < 10000 and n // 100 >= 10 and n % 100 >= 10:
        return f"{number_words(n // 100)} {number_words(n % 100)}"
    return " ".join(_ONES[int(d)] for d in str(n))


def _ordinal(words: str) -> str:
    *head, last = words.split()
    last = _ORDINALS.get(last, (last[:-1] + "ieth") if last.endswith("y") else last + "th")
    return " ".join([*head, last])


def normalize_en(text: str) -> str:
    """Lowercase, contractions expanded, numbers as words, punctuation and hyphens out.

    Numbers go digits -> words because the references are written as spoken and Whisper
    writes either ("line 3", "ten thirty" as "10.30"); a time or decimal's parts are read
    as two numbers, an ordinal ("5th") as its word."""
    t = text.lower().replace("\u2019", "'")
    for short, long in _CONTRACTIONS.items():
        t = re.sub(rf"\b{re.escape(short)}\b", long, t)
    t = re.sub(r"(?<=\d),(?=\d{3}\b)", "", t)  # 1,000
    t = re.sub(r"(\d+)(st|nd|rd|th)\b", lambda m: _ordinal(number_words(int(m[1]))), t)
    t = re.sub(r"\d+", lambda m: f" {number_words(int(m[0]))} ", t)  # 10.30 -> ten thirty
    t = re.sub(r"[^a-z' ]+", " ", t).replace("'", "")
    return " ".join(t.split())


_ZH_UNIT = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]|[a-z0-9]+")


def zh_units(text: str) -> list[str]:
    """Mandarin scoring units: each hanzi, and each Latin or digit run as one unit (an
    English mishearing of a Chinese clip then costs per word, not per letter, as in a
    mixed error rate); punctuation and spaces dropped."""
    return _ZH_UNIT.findall(text.lower())


def looped(ref_units: Sequence[str], hyp_units: Sequence[str]) -> bool:
    """A decoder loop that got through the service's guard: one unit (word, or character
    for Mandarin) four times in a row, or far more units than were spoken."""
    run = best = 0
    prev = None
    for u in hyp_units:
        run = run + 1 if u == prev else 1
        best, prev = max(best, run), u
    return best >= 4 or len(hyp_units) > 2 * len(ref_units) + 4


# -- part 1: accuracy and speed -----------------------------------------------------------


@dataclass
class Audio:
    sentence: Sentence
    wav: bytes
    samples: Any  # float32, 16 kHz mono
    seconds: float
    decode_ms: float


@dataclass
class Heard:
    id: str
    lang: str
    expected_lang: str
    text: str
    faults: list[str]
    loop: bool
    ms: list[float] = field(default_factory=list)  # every repeat
    stable: bool = True  # every repeat gave the same text


@dataclass
class ConfigResult:
    model: str
    compute: str
    beam: int
    threads: int
    load_s: float
    first_clip_s: float
    heard: list[Heard]
    forced_zh: list[Heard]
    forced_zh_no_prompt: list[Heard]
    lang_id_ms: list[float]  # language identification alone, English clips (multilingual)
    rtf_en: list[float]
    rtf_zh: list[float]
    summary: dict[str, Any] = field(default_factory=dict)


def synthesize(sentences: Sequence[Sentence]) -> list[Audio]:
    out = []
    for s in sentences:
        wav = speak(s.speak, voice=s.voice)
        t0 = time.perf_counter()
        clip = decode_clip(
            wav, max_bytes=4 << 20, max_seconds=30.0
        )  # the service's decoder, timed once
        out.append(Audio(s, wav, clip.samples, clip.seconds, (time.perf_counter() - t0) * 1e3))
    return out


def _units(s: Sentence, text: str) -> list[str]:
    return zh_units(text) if s.lang == "zh" else normalize_en(text).split()


def _transcribe(recognizer: Any, audio: Audio, detector: KeywordDetector) -> tuple[Heard, float]:
    t0 = time.perf_counter()
    tr = recognizer.transcribe(audio.samples)
    took = time.perf_counter() - t0
    text = " ".join(seg[2] for seg in tr.segments)
    s = audio.sentence
    # The daemon passes the segment's language to the detector; so do we.
    found = sorted({m.code for m in detector.detect(text, lang=tr.lang)}) if text else []
    heard = Heard(
        id=s.id,
        lang=tr.lang or "-",
        expected_lang=s.lang,
        text=text,
        faults=found,
        loop=looped(_units(s, s.reference), _units(s, text)),
        ms=[took * 1e3],
    )
    return heard, took


def run_config(
    base: AsrSettings,
    model: str,
    compute: str,
    beam: int,
    audios: Sequence[Audio],
    detector: KeywordDetector,
    faults: Any,
    repeat: int,
) -> ConfigResult:
    from pipelines.asr.models import resolve_model
    from pipelines.asr.stage import WhisperRecognizer

    settings = base.model_copy(update={"model": model, "compute_type": compute, "beam_size": beam})
    folder = resolve_model(model, cache_dir())
    t0 = time.perf_counter()
    rec = WhisperRecognizer(settings, folder, faults)
    load_s = time.perf_counter() - t0
    usable = [a for a in audios if a.sentence.lang in rec.languages]
    # The first call pays one-off costs (Silero VAD's ONNX session, allocator warm-up): timed
    # and reported apart, not in the RTF.
    t0 = time.perf_counter()
    rec.transcribe(usable[0].samples)
    first_clip_s = time.perf_counter() - t0
    heard: dict[str, Heard] = {}
    rtf: dict[str, list[float]] = {"en": [], "zh": []}
    for r in range(repeat):
        for a in usable:
            h, took = _transcribe(rec, a, detector)
            rtf[a.sentence.lang].append(took / a.seconds)
            if r == 0:
                heard[a.sentence.id] = h
            else:
                heard[a.sentence.id].ms += h.ms
                heard[a.sentence.id].stable &= h.text == heard[a.sentence.id].text
    forced: list[Heard] = []
    no_prompt: list[Heard] = []
    lang_id_ms: list[float] = []
    if "zh" in rec.languages:
        # Same model, language fixed: recognition without language identification; and
        # again without the catalogue prompt, to see what the prompt adds (and invents).
        zh = copy.copy(rec)
        zh.languages = ["zh"]
        bare = copy.copy(zh)
        bare.prompts = {"zh": None}
        for a in usable:
            if a.sentence.lang == "zh":
                forced.append(_transcribe(zh, a, detector)[0])
                no_prompt.append(_transcribe(bare, a, detector)[0])
        # What `auto` costs per clip: the service's detect_language call, timed alone.
        for a in usable:
            if a.sentence.lang == "en":
                t0 = time.perf_counter()
                rec.model.detect_language(
                    a.samples, vad_filter=settings.vad, vad_parameters=rec.vad_options
                )
                lang_id_ms.append((time.perf_counter() - t0) * 1e3)
    del rec
    gc.collect()
    result = ConfigResult(
        model,
        compute,
        beam,
        settings.cpu_threads,
        load_s,
        first_clip_s,
        list(heard.values()),
        forced,
        no_prompt,
        lang_id_ms,
        rtf["en"],
        rtf["zh"],
    )
    result.summary = summarize(result, {s.id: s for s in SENTENCES})
    return result


def _accuracy(heard: Sequence[Heard], by_id: dict[str, Sentence], lang: str) -> dict[str, Any]:
    rows = [h for h in heard if by_id[h.id].lang == lang]
    if not rows:
        return {}
    refs = [by_id[h.id].reference for h in rows]
    if lang == "en":
        error = jiwer.wer([normalize_en(r) for r in refs], [normalize_en(h.text) for h in rows])
    else:
        error = jiwer.wer(
            [" ".join(zh_units(r)) for r in refs], [" ".join(zh_units(h.text)) for h in rows]
        )
    fault_rows = [h for h in rows if by_id[h.id].fault]
    calm_rows = [h for h in rows if not by_id[h.id].fault]
    return {
        "error_rate": error,
        "lang_ok": sum(h.lang == lang for h in rows),
        "clips": len(rows),
        "recalled": sum(by_id[h.id].fault in h.faults for h in fault_rows),
        "fault_clips": len(fault_rows),
        # an alert where there was no fault, or a different fault than was spoken
        "false_alarms": sum(bool(h.faults) for h in calm_rows),
        "calm_clips": len(calm_rows),
        "wrong_fault": sum(any(f != by_id[h.id].fault for f in h.faults) for h in fault_rows),
        "loops": sum(h.loop for h in rows),
        "unstable": sum(not h.stable for h in rows),
    }


def summarize(r: ConfigResult, by_id: dict[str, Sentence]) -> dict[str, Any]:
    ms_en = [m for h in r.heard if h.expected_lang == "en" for m in h.ms]
    return {
        "en": _accuracy(r.heard, by_id, "en"),
        "zh": _accuracy(r.heard, by_id, "zh"),
        "zh_forced": _accuracy(r.forced_zh, by_id, "zh"),
        "zh_forced_no_prompt": _accuracy(r.forced_zh_no_prompt, by_id, "zh"),
        "lang_id_ms_median": statistics.median(r.lang_id_ms) if r.lang_id_ms else None,
        "rtf_en_median": statistics.median(r.rtf_en),
        "rtf_en_p95": percentile(r.rtf_en, 0.95),
        "ms_en_median": statistics.median(ms_en),
        "rtf_zh_median": statistics.median(r.rtf_zh) if r.rtf_zh else None,
        "timed_clips_en": len(r.rtf_en),
    }


def _frac(d: dict[str, Any], num: str, den: str) -> str:
    return f"{d[num]}/{d[den]}" if d else "n/a"


def _pct(d: dict[str, Any]) -> str:
    return f"{d['error_rate'] * 100:.1f}%" if d else "n/a"


def accuracy_table(results: Sequence[ConfigResult]) -> list[str]:
    headers = [
        "model", "compute", "beam", "load s", "WER en", "CER zh", "lang ok", "fault recall en",
        "fault recall zh", "false alarms", "loops", "RTF median", "RTF p95",
        "ms per clip median", "of which lang id ms",
    ]  # fmt: skip
    rows: list[list[object]] = []
    for r in results:
        s = r.summary
        en, zh = s["en"], s["zh"]
        lang_ok = en["lang_ok"] + (zh["lang_ok"] if zh else 0)
        clips = en["clips"] + (zh["clips"] if zh else 0)
        false = en["false_alarms"] + (zh["false_alarms"] if zh else 0)
        calm = en["calm_clips"] + (zh["calm_clips"] if zh else 0)
        wrong = en["wrong_fault"] + (zh["wrong_fault"] if zh else 0)
        loops = en["loops"] + (zh["loops"] if zh else 0)
        lid = "n/a" if s["lang_id_ms_median"] is None else f"{s['lang_id_ms_median']:.0f}"
        rows.append([
            r.model, r.compute, r.beam, f"{r.load_s:.2f}", _pct(en), _pct(zh),
            f"{lang_ok}/{clips}", _frac(en, "recalled", "fault_clips"),
            _frac(zh, "recalled", "fault_clips"),
            f"{false}/{calm}" + (f" (+{wrong} wrong fault)" if wrong else ""), loops,
            f"{s['rtf_en_median']:.3f}", f"{s['rtf_en_p95']:.3f}", f"{s['ms_en_median']:.0f}", lid,
        ])  # fmt: skip
    return md_table(headers, rows).splitlines()


def forced_table(results: Sequence[ConfigResult]) -> list[str]:
    headers = [
        "model", "compute", "beam", "language", "catalogue prompt", "CER zh", "fault recall zh",
        "false alarms zh", "loops",
    ]  # fmt: skip
    rows: list[list[object]] = []
    for r in results:
        for key, lang, prompt in (
            ("zh", "auto", "yes"),
            ("zh_forced", "zh", "yes"),
            ("zh_forced_no_prompt", "zh", "no"),
        ):
            d = r.summary[key]
            if not d or not r.forced_zh:
                continue
            rows.append([
                r.model, r.compute, r.beam, lang, prompt, _pct(d),
                _frac(d, "recalled", "fault_clips"), _frac(d, "false_alarms", "calm_clips"),
                d["loops"],
            ])  # fmt: skip
    return md_table(headers, rows).splitlines()


def transcripts_table(r: ConfigResult) -> list[str]:
    forced = {h.id: h for h in r.forced_zh}
    bare = {h.id: h for h in r.forced_zh_no_prompt}
    rows: list[list[object]] = []
    by_id = {s.id: s for s in SENTENCES}
    for h in r.heard:
        s = by_id[h.id]
        text = h.text.replace("|", "/")[:110] + (" [loop]" if h.loop else "")
        if h.id in forced:
            f = forced[h.id]
            text += f" / language=zh: {f.text[:60]} {f.faults or ''}"
        if h.id in bare:
            f = bare[h.id]
            text += f" / no prompt: {f.text[:60]} {f.faults or ''}"
        rows.append([h.id, s.fault or "-", h.lang, ",".join(h.faults) or "-", text])
    return md_table(["id", "expected", "heard (lang)", "faults", "transcript"], rows).splitlines()


# -- part 2: end to end -------------------------------------------------------------------


@dataclass
class E2eClip:
    stream: str
    sentence: str
    expected: str
    audio_s: float
    alert_s: float | None  # publish -> `new` alert at the subscriber
    transcript_s: float | None  # publish -> our transcript at the subscriber
    fault: str | None
    transcript: str | None


async def _e2e_clips(
    port: int, prefix: str, audios: Sequence[Audio], count: int, timeout: float
) -> tuple[list[E2eClip], dict[str, Any], float]:
    import aiomqtt

    alerts: dict[str, tuple[float, str]] = {}
    transcripts: dict[str, tuple[float, str]] = {}
    status: dict[str, Any] = {}
    ready = asyncio.Event()
    changed = asyncio.Event()
    async with aiomqtt.Client(
        "127.0.0.1",
        port,
        protocol=aiomqtt.ProtocolVersion.V5,
        identifier=f"bench-asr-{uuid.uuid4().hex[:8]}",
    ) as client:
        await client.subscribe(f"{prefix}/alerts", qos=1)
        await client.subscribe(f"{prefix}/status", qos=1)
        await client.subscribe(f"{prefix}/streams/+/transcript/asr", qos=1)

        async def receive() -> None:
            async for msg in client.messages:
                now = time.perf_counter()
                body = json.loads(bytes(msg.payload))
                topic = msg.topic.value
                if topic.endswith("/alerts") and body["type"] == "new":
                    alerts.setdefault(body["alert"]["stream_id"], (now, body["alert"]["fault"]))
                elif topic.endswith("/transcript/asr"):
                    transcripts.setdefault(body["stream_id"], (now, body["text"]))
                elif topic.endswith("/status"):
                    status.clear()
                    status.update(body)
                    if (body.get("asr") or {}).get("state") == "ready":
                        ready.set()
                changed.set()

        receiver = asyncio.create_task(receive())
        t_wait = time.perf_counter()
        await asyncio.wait_for(ready.wait(), 180)
        ready_s = time.perf_counter() - t_wait
        clips: list[E2eClip] = []
        run_id = uuid.uuid4().hex[:6]
        for i in range(count):
            a = audios[i % len(audios)]
            sid = f"bench-{run_id}-{i:03d}"  # a stream each: every clip raises a `new` alert
            t0 = time.perf_counter()
            await client.publish(f"{prefix}/streams/{sid}/audio", a.wav, qos=1)
            deadline = t0 + timeout
            # Wait for the alert; a clip whose transcript came without one (misheard) is
            # given 3 s more (the alert path is milliseconds), not the full timeout.
            while sid not in alerts and time.perf_counter() < deadline:
                if sid in transcripts and time.perf_counter() > transcripts[sid][0] + 3.0:
                    break
                changed.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(changed.wait(), 0.25)
            al, tr = alerts.get(sid), transcripts.get(sid)
            clips.append(
                E2eClip(
                    stream=sid,
                    sentence=a.sentence.id,
                    expected=a.sentence.fault or "-",
                    audio_s=round(a.seconds, 2),
                    alert_s=None if al is None else al[0] - t0,
                    transcript_s=None if tr is None else tr[0] - t0,
                    fault=None if al is None else al[1],
                    transcript=None if tr is None else tr[1],
                )
            )
        # The service's own view: wait for a status that counts every clip.
        end = time.perf_counter() + 15
        while (status.get("asr") or {}).get("clips", 0) < count and time.perf_counter() < end:
            await asyncio.sleep(0.25)
        receiver.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await receiver
    return clips, dict(status), ready_s


def run_e2e(audios: Sequence[Audio], count: int, timeout: float) -> dict[str, Any]:
    from agent.demo import run_argv
    from agent.devbroker import DevBroker

    work = Path(tempfile.mkdtemp(prefix="edge-agent-bench-asr-"))
    prefix = f"bench/asr-{uuid.uuid4().hex[:6]}"
    fault_audio = [a for a in audios if a.sentence.fault]
    with DevBroker(workdir=work) as broker:
        overrides = [
            f"mqtt.port={broker.port}",
            f"mqtt.topic_prefix={prefix}",
            f"mqtt.client_id=bench-asr-{uuid.uuid4().hex[:6]}",
            f"outbox.path={work / 'outbox.sqlite'}",
            "mqtt.status_interval_s=1",
            "llm.enabled=false",  # the keyword tier alone: the engine would share the 2 cores
            "asr.enabled=true",
            "streams.defaults.alerts.debounce_s=0",
            "metrics.port=0",  # a CI run may hold 9464
            f"control.socket_path=/tmp/ea-bench-{uuid.uuid4().hex[:8]}.sock",
            "logging.level=warning",
        ]
        argv = run_argv(AGENT_YAML, overrides)
        log_path = work / "agent.log"
        with log_path.open("wb") as log:
            agent = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
        try:
            clips, status, ready_s = asyncio.run(
                _e2e_clips(broker.port, prefix, fault_audio, count, timeout)
            )
        except Exception:
            print(log_path.read_text(errors="replace")[-4000:], file=sys.stderr)
            raise
        finally:
            agent.send_signal(signal.SIGTERM)
            try:
                agent.wait(30)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait(10)
    asr = status.get("asr") or {}
    seg = ((status.get("alerts") or {}).get("segment_to_alert") or {}).get("keyword") or {}
    return {
        "overrides": overrides,
        "settings": {k: asr.get(k) for k in ("model", "device", "compute_type")},
        "ready_s": ready_s,
        "clips": [asdict(c) for c in clips],
        "service": {
            "segment_to_alert_keyword": seg,
            "asr_latency_p95_s": asr.get("latency_p95_s"),
            "asr_rtf": asr.get("rtf"),
            "asr_rtf_p50": asr.get("rtf_p50"),
            "asr_clips": asr.get("clips"),
            "asr_languages": asr.get("languages"),
            "asr_rejected": asr.get("rejected"),
        },
    }


def e2e_lines(e2e: dict[str, Any], base: AsrSettings) -> list[str]:
    clips = e2e["clips"]
    ok = [c for c in clips if c["alert_s"] is not None and c["fault"] == c["expected"]]
    wrong = [c for c in clips if c["alert_s"] is not None and c["fault"] != c["expected"]]
    lat = [c["alert_s"] * 1e3 for c in clips if c["alert_s"] is not None]
    tr = [c["transcript_s"] * 1e3 for c in clips if c["transcript_s"] is not None]
    audio = [c["audio_s"] for c in clips]
    svc = e2e["service"]
    seg = svc["segment_to_alert_keyword"]

    def ms(v: float | None) -> str:
        return "n/a" if v is None else f"{v * 1e3:.0f}"

    lines = [
        f"ASR settings of the service: model {base.model}, {base.compute_type}, beam "
        f"{base.beam_size}, {base.cpu_threads} threads, language {base.language} among "
        f"{','.join(base.languages)} (cpu-dev profile); keyword tier only (llm.enabled=false). "
        f"Service start to ASR ready: {e2e['ready_s']:.1f} s.",
        "",
    ]
    headers = [
        "clips", "alerted (right fault)", "wrong fault", "no alert", "clip s median",
        "publish -> alert p50 ms", "p95 ms", "max ms", "publish -> transcript p50 ms",
    ]  # fmt: skip
    row: list[object] = [len(clips), 0, 0, len(clips), "", "", "", "", ""]
    if lat:
        tr_p50 = f"{statistics.median(tr):.0f}" if tr else "n/a"
        row = [
            len(clips), len(ok), len(wrong), len(clips) - len(ok) - len(wrong),
            f"{statistics.median(audio):.2f}", f"{statistics.median(lat):.0f}",
            f"{percentile(lat, 0.95):.0f}", f"{max(lat):.0f}", tr_p50,
        ]  # fmt: skip
    lines += md_table(headers, [row]).splitlines()
    lines += [
        "",
        f"The service's own view (status): segment -> alert (keyword) p50 {ms(seg.get('p50_s'))}"
        f" ms, p95 {ms(seg.get('p95_s'))} ms over {seg.get('count')} alerts (from the audio's "
        f"arrival); ASR arrival -> transcribed p95 {ms(svc['asr_latency_p95_s'])} ms; RTF "
        f"{svc['asr_rtf']} overall, p50 {svc['asr_rtf_p50']}; languages {svc['asr_languages']}.",
    ]
    return lines


# -- the run ------------------------------------------------------------------------------


def environment() -> dict[str, Any]:
    """What an ASR result depends on beyond the machine (bench/_common.machine()): the CPU
    vendor, the CT2_*/OMP_* variables, Python and the decoding packages' versions."""
    vendor = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("vendor_id"):
                vendor = line.split(":", 1)[1].strip()
                break
    versions: dict[str, str | None] = {}
    for pkg in ("faster-whisper", "ctranslate2", "av", "onnxruntime", "jiwer"):
        try:
            versions[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            versions[pkg] = None
    for tool in ("espeak-ng", "sox"):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            out = subprocess.run(
                [tool, "--version"], check=False, capture_output=True, text=True, timeout=10
            )
            versions[tool] = (out.stdout or out.stderr).strip().splitlines()[0]
    return {
        # CTranslate2 picks its GEMM library by vendor (Intel MKL only on GenuineIntel,
        # unless CT2_USE_MKL says otherwise), so the vendor and CT2_* belong to the result.
        "vendor": vendor,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("CT2_", "OMP_"))},
        "python": platform.python_version(),
        "versions": versions,
    }


def ci_running() -> bool:
    """A CI run of this repository shares the two cores (see bench/asr/README.md)."""
    out = subprocess.run(["pgrep", "-f", "bash .ci/run"], capture_output=True, check=False)
    return out.returncode == 0


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--models", default="base,tiny.en")
    ap.add_argument("--compute", default="int8,float32")
    ap.add_argument("--beams", default="1,5")
    ap.add_argument("--threads", type=int, help="CTranslate2 threads (default: the profile's)")
    ap.add_argument("--repeat", type=int, default=3, help="timed passes over the set")
    ap.add_argument("--e2e-clips", type=int, default=20, help="0 skips the end-to-end part")
    ap.add_argument("--e2e-timeout", type=float, default=30.0)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "asr" / "results")
    ap.add_argument("--name", help="result file name (default cpu-<date>)")
    ap.add_argument("--no-write", action="store_true", help="print only")
    args = ap.parse_args(argv)
    if why := missing_tools():
        print(f"error: {why}", file=sys.stderr)
        return 1

    started = time.perf_counter()
    ci_at_start = ci_running()
    cfg = load_config(AGENT_YAML, overrides=["llm.enabled=false", "asr.enabled=true"]).config
    base = cfg.asr
    if args.threads is not None:
        base = base.model_copy(update={"cpu_threads": args.threads})
    detector = keyword_detector(cfg.faults, cfg.keywords)  # as the service builds it
    t0 = time.perf_counter()
    audios = synthesize(SENTENCES)
    synth_s = time.perf_counter() - t0
    print(
        f"{len(audios)} clips synthesised in {synth_s:.1f} s "
        f"({sum(a.seconds for a in audios):.1f} s of audio)",
        flush=True,
    )

    results: list[ConfigResult] = []
    for model in filter(None, args.models.split(",")):
        for compute in filter(None, args.compute.split(",")):
            for beam in (int(b) for b in args.beams.split(",") if b):
                t0 = time.perf_counter()
                r = run_config(
                    base, model, compute, beam, audios, detector, cfg.faults, args.repeat
                )
                results.append(r)
                print(
                    f"  {model} {compute} beam {beam}: {time.perf_counter() - t0:.0f} s, "
                    f"WER en {_pct(r.summary['en'])}, RTF {r.summary['rtf_en_median']:.3f}",
                    flush=True,
                )
    e2e = run_e2e(audios, args.e2e_clips, args.e2e_timeout) if args.e2e_clips > 0 else None
    total_s = time.perf_counter() - started
    ci_at_end = ci_running()

    info = environment()
    command = shlex.join([".venv/bin/python", "bench/asr/bench_asr.py", *sys.argv[1:]])
    today = dt.date.today().isoformat()
    md = [
        f"# bench/asr on CPU, {today}",
        "",
        f"- Machine: {machine()}, vendor {info['vendor']}; "
        f"Python {info['python']}; environment: "
        + (" ".join(f"{k}={v}" for k, v in info["env"].items()) or "no CT2_*/OMP_* variables"),
        "- Versions: " + ", ".join(f"{k} {v}" for k, v in info["versions"].items()),
        f"- Command: `{command}`",
        f"- Total run time: {total_s:.0f} s; a CI run on the machine at start: "
        f"{'yes' if ci_at_start else 'no'}, at end: {'yes' if ci_at_end else 'no'}",
        f"- Set: {sum(s.lang == 'en' for s in SENTENCES)} English and "
        f"{sum(s.lang == 'zh' for s in SENTENCES)} Mandarin clips (bench/asr/sentences.py), "
        f"espeak-ng at 150 wpm, 16 kHz mono WAV; {args.repeat} timed passes per config",
        f"- Recogniser: the service's WhisperRecognizer with the cpu-dev profile's settings but "
        f"the model, compute type and beam of each row; {base.cpu_threads} threads, "
        f"language {base.language} among {','.join(base.languages)}, VAD, catalogue prompt, "
        f"temperature {base.temperature}",
        "",
        "## Accuracy and speed",
        "",
        "WER: English, lowercased, punctuation and hyphens removed, contractions expanded, "
        "digits mapped to words (`3` -> `three`, `10.30` -> `ten thirty`, `5th` -> `fifth`). "
        "CER: Mandarin characters, punctuation and spaces removed. Fault recall: the keyword "
        "tier (`KeywordDetector` with its reader, configs/agent.yaml) finds the expected fault "
        "in the "
        "transcript. False alarms: non-fault clips with any fault found. Loops: transcripts "
        "with one word (character) four times in a row or more than twice the words spoken. "
        "RTF and ms per clip: `WhisperRecognizer.transcribe` (VAD, language choice, decoding) "
        "over English clips only (the set every row has), all passes; load s: the model's "
        "construction. tiny.en is English only: no Mandarin clips for it.",
        "",
        *accuracy_table(results),
        "",
    ]
    if any(r.forced_zh for r in results):
        md += [
            "### Mandarin: language identification or recognition?",
            "",
            "The Mandarin clips again on the same loaded model (untimed): with the language "
            "forced to zh (`asr.language: zh`), and forced without the catalogue prompt "
            "(`asr.prompt_from_catalogue: false`):",
            "",
            *forced_table(results),
            "",
        ]
    if e2e is not None:
        md += [
            "## End to end: audio published -> alert received",
            "",
            f"`edge-agent run` on configs/agent.yaml with {' '.join(e2e['overrides'][4:])}; "
            f"mosquitto on loopback; {args.e2e_clips} fault clips of the set (English and "
            "Mandarin, in order), one at a time, each on its own stream (so each raises a `new` "
            "alert), the next after the alert (or its transcript plus 3 s without one). Timed "
            "on this machine's clock from just before the QoS 1 publish to the alert's arrival "
            "at a subscriber; the clip was complete when published (the time after speech "
            "ends).",
            "",
            *e2e_lines(e2e, base),
            "",
        ]
    md += ["## Transcripts", ""]
    for r in results:
        md += [
            f"<details><summary>{r.model} {r.compute} beam {r.beam}</summary>",
            "",
            *transcripts_table(r),
            "",
            "</details>",
            "",
        ]
    text = "\n".join(md)
    print()
    print(text)
    if not args.no_write:
        name = args.name or f"cpu-{today}"
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / f"{name}.md").write_text(text + "\n", encoding="utf-8")
        payload = {
            "date": today,
            "command": command,
            "machine": machine(),
            "environment": info,
            "total_s": total_s,
            "ci_running": {"start": ci_at_start, "end": ci_at_end},
            "settings": base.model_dump(mode="json"),
            "clips": [
                {**asdict(a.sentence), "audio_s": a.seconds, "decode_ms": a.decode_ms}
                for a in audios
            ],
            "configs": [asdict(r) for r in results],
            "e2e": e2e,
        }
        (args.out / f"{name}.json").write_text(
            json.dumps(payload, indent=1, ensure_ascii=False), encoding="utf-8"
        )
        print(f"\nwrote {args.out / name}.md and .json")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
