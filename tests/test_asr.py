"""Audio in, with real faster-whisper and the bundled models: speech made at test time
(espeak-ng, sox, PyAV for Opus), decoded and transcribed, its fault phrase alerting through
the same path as published transcripts; silence, garbage and bursts handled."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import math
import re
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiomqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from agent.devbroker import DevBroker
from pipelines.asr.buffer import AudioBuffer
from pipelines.asr.decode import AudioReason, AudioRejected, decode_clip
from pipelines.asr.models import WhisperModelError, resolve_model
from pipelines.asr.prompt import catalogue_prompt
from pipelines.asr.stage import collapse_repeats
from tests.helpers import MqttWatcher, sample, scrape
from tests.speech import missing_tools, silence, speak, to_flac, to_opus, to_vorbis

_why_not = missing_tools() or (
    None
    if importlib.util.find_spec("faster_whisper") is not None
    else "faster-whisper is not installed (the asr extra)"
)
pytestmark = [
    pytest.mark.asr,
    pytest.mark.skipif(_why_not is not None, reason=f"ASR: {_why_not}"),
]

FAULT_EN = "Warning, the temperature is over limit on oven two"
LIMITS = {"max_bytes": 4 << 20, "max_seconds": 30.0}


@pytest.fixture(scope="module")
def fault_wav() -> bytes:
    return speak(FAULT_EN, rate=44100, channels=2)  # any rate and channel count


# -- decode -------------------------------------------------------------------------------


def test_every_container_decodes_to_16k_mono(fault_wav: bytes) -> None:
    for data, codec in (
        (fault_wav, "pcm_s16le"),
        (to_flac(fault_wav), "flac"),
        (to_opus(fault_wav), "opus"),
        (to_vorbis(fault_wav), "vorbis"),
    ):
        clip = decode_clip(data, **LIMITS)
        assert clip.codec == codec
        assert clip.samples.ndim == 1 and clip.samples.dtype.name == "float32"
        assert 3.0 < clip.seconds < 4.5, (codec, clip.seconds)
        assert 0.05 < float(abs(clip.samples).max()) <= 1.0


def test_bad_payloads_are_refused_with_their_reason(fault_wav: bytes) -> None:
    flac = to_flac(fault_wav)
    unknown_codec = bytearray(fault_wav)
    unknown_codec[20:22] = struct.pack("<H", 0x7777)  # a WAV format tag no decoder knows
    cases = [
        (b"", AudioReason.empty),
        (b'{"text": "not audio"}' * 10, AudioReason.not_audio),
        (fault_wav[: len(fault_wav) // 2], AudioReason.truncated),
        (fault_wav[:44], AudioReason.truncated),
        (flac[: len(flac) // 2], AudioReason.truncated),
        (bytes(unknown_codec), AudioReason.unsupported_codec),
    ]
    for data, reason in cases:
        with pytest.raises(AudioRejected) as info:
            decode_clip(data, **LIMITS)
        assert info.value.reason is reason, (reason, info.value)
    with pytest.raises(AudioRejected) as info:
        decode_clip(fault_wav, max_bytes=1000, max_seconds=30)
    assert info.value.reason is AudioReason.too_large
    with pytest.raises(AudioRejected) as info:
        decode_clip(fault_wav, max_bytes=4 << 20, max_seconds=2.0)
    assert info.value.reason is AudioReason.too_long


_FUZZ = """
import json, random, sys
from pipelines.asr.decode import AudioRejected, decode_clip
rng = random.Random(4)
seeds = [open(p, "rb").read() for p in sys.argv[1:]]
outcomes = {"decoded": 0, "refused": 0}
for i in range(400):
    data = bytearray(rng.choice(seeds))
    for _ in range(rng.randint(1, 12)):  # flip bytes, mostly in the headers
        at = rng.randrange(min(len(data), 256) if rng.random() < 0.7 else len(data))
        data[at] = rng.randrange(256)
    if rng.random() < 0.3:
        data = data[: rng.randrange(1, len(data))]
    try:
        decode_clip(bytes(data), max_bytes=4 << 20, max_seconds=30)
        outcomes["decoded"] += 1
    except AudioRejected:
        outcomes["refused"] += 1
print(json.dumps(outcomes))
"""


def test_damaged_payloads_never_crash_the_process(fault_wav: bytes, tmp_path: Path) -> None:
    """400 payloads with bytes flipped and cut, in a child process: a crash inside FFmpeg
    (a PyAV version segfaulted on an unknown codec) would kill the service, not raise."""
    seeds = []
    for name, data in (("w.wav", fault_wav), ("f.flac", to_flac(fault_wav)),
                       ("o.ogg", to_opus(fault_wav)), ("v.ogg", to_vorbis(fault_wav))):  # fmt: skip
        (tmp_path / name).write_bytes(data)
        seeds.append(str(tmp_path / name))
    done = subprocess.run(
        [sys.executable, "-c", _FUZZ, *seeds],
        capture_output=True, text=True, timeout=300, check=False, cwd=Path(__file__).parents[1],
    )  # fmt: skip
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    outcomes = json.loads(done.stdout)
    assert outcomes["decoded"] + outcomes["refused"] == 400 and outcomes["refused"] > 0


# -- the bounded queue ---------------------------------------------------------------------


async def test_the_buffer_sheds_the_oldest_per_stream_and_in_total() -> None:
    buf: AudioBuffer[str] = AudioBuffer(per_stream_s=10, total_s=15)
    assert buf.put("a", "a1", 4) == [] and buf.put("a", "a2", 4) == []
    [shed] = buf.put("a", "a3", 4)  # 12 s of a: over its 10 s share
    assert (shed.stream_id, shed.item, shed.seconds) == ("a", "a1", 4)
    assert buf.put("a", "a4", 2) == []  # a: 10 s, its share
    [shed] = buf.put("b", "b1", 6)  # 16 s in total: the stream furthest behind gives
    assert shed.item == "a2"
    assert buf.shed_clips == 2 and buf.shed_seconds == 8
    assert math.isclose(buf.seconds, 12) and buf.stream_seconds() == {"a": 6, "b": 6}
    # round robin: one chatty stream does not starve the other
    assert [(await buf.get())[1] for _ in range(3)] == ["a3", "b1", "a4"]
    assert buf.seconds == 0 and len(buf) == 0


# -- models and prompt ---------------------------------------------------------------------


def test_the_bundled_models_resolve_without_a_hub(tmp_path: Path) -> None:
    cache = Path.home() / ".cache" / "edge-agent"
    base = resolve_model("base", cache)
    assert (base / "model.bin").stat().st_size == 145_217_532
    assert (resolve_model("tiny.en", cache) / "model.bin").is_file()
    with pytest.raises(WhisperModelError, match="not a CTranslate2 Whisper folder"):
        resolve_model(str(tmp_path), cache)


def test_the_prompt_names_the_faults_in_the_clip_language() -> None:
    from agent.config.loader import load_config

    faults = load_config(Path(__file__).parents[1] / "configs" / "agent.yaml").config.faults
    en = catalogue_prompt(faults, "en", "Line three.")
    assert en is not None and "temperature over limit" in en and en.endswith("Line three.")
    zh = catalogue_prompt(faults, "zh", None)
    assert zh is not None and "温度超过上限" in zh and "temperature" not in zh
    assert catalogue_prompt(faults, "de", None) is None
    assert collapse_repeats("over limit, over limit, over limit,") == "over limit"


# -- the running service -------------------------------------------------------------------


def _props(**values: Any) -> Properties:
    props = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]
    props.UserProperty = [(k, str(v)) for k, v in values.items()]
    return props


async def publish_audio(port: int, items: list[tuple[str, bytes, dict[str, Any]]]) -> None:
    """Publish clips at QoS 1 as a microphone would, MQTT v5 user properties when given."""
    async with aiomqtt.Client(
        "127.0.0.1", port, protocol=aiomqtt.ProtocolVersion.V5, identifier=f"mic-{time.time_ns()}"
    ) as client:
        for topic, payload, props in items:
            await client.publish(
                topic, payload, qos=1, properties=_props(**props) if props else None
            )


def _asr(w: MqttWatcher) -> dict[str, Any]:
    st = w.on("status")
    return st[-1].json().get("asr", {}) if st else {}


def _transcripts(w: MqttWatcher) -> list[dict[str, Any]]:
    """Our segments, from every stream's `<prefix>/streams/<id>/transcript/asr`."""
    return [m.json() for m in w.messages if m.topic.endswith("/transcript/asr")]


def _errors(w: MqttWatcher) -> list[dict[str, Any]]:
    return [m.json() for m in w.on("errors")]


@pytest.mark.slow
@pytest.mark.broker
async def test_spoken_faults_alert_from_wav_flac_and_opus(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker, fault_wav: bytes
) -> None:
    agent_factory("asr.enabled=true").start()
    await watcher.wait_for(lambda w: _asr(w).get("state") == "ready", timeout=60, what="ASR ready")
    start = time.time() - 60
    clips = [
        ("mic-wav", fault_wav, {"seq": 7, "start": start}),
        ("mic-flac", to_flac(fault_wav), {}),
        ("mic-opus", to_opus(fault_wav), {}),
    ]
    await publish_audio(
        broker.port, [(f"{prefix}/streams/{sid}/audio", data, p) for sid, data, p in clips]
    )

    def alerted(w: MqttWatcher) -> bool:
        return {a["alert"]["stream_id"] for a in w.alerts()} >= {c[0] for c in clips}

    await watcher.wait_for(alerted, timeout=90, what="an alert per format")
    for event in watcher.alerts():
        assert event["alert"]["fault"] == "temperature_over_limit"
        assert "over limit" in event["alert"]["evidence"][-1]["text"].lower()

    # our transcripts are published, in the transcript shape, timed by the user properties
    await watcher.wait_for(lambda w: len(_transcripts(w)) >= 3, timeout=30, what="transcripts")
    by_stream = {t["stream_id"]: t for t in _transcripts(watcher)}
    wav_seg = by_stream["mic-wav"]
    assert wav_seg["seq"] == 7000 and wav_seg["lang"] == "en"
    assert start <= wav_seg["start"] < wav_seg["end"] <= start + 5
    assert by_stream["mic-flac"]["seq"] == 0  # no properties: arrival order

    def counted(w: MqttWatcher) -> bool:
        return _asr(w).get("clips") == 3

    await watcher.wait_for(counted, timeout=30, what="three clips in the status")
    asr = _asr(watcher)
    assert asr["rejected"] == {} and asr["segments"] >= 3 and asr["rtf"] > 0
    status = watcher.on("status")[-1].json()
    assert status["alerts"]["segment_to_alert"]["keyword"]["count"] == 3  # from the audio
    # the same numbers on /metrics and in agentctl status
    m = await scrape(status["metrics"]["address"])
    assert sample(m, "edge_agent_asr_state", state="ready") == 1
    assert sample(m, "edge_agent_asr_clips_total") == 3
    assert sample(m, "edge_agent_asr_seconds_count") == 3
    assert sample(m, "edge_agent_queue_shed_total", queue="asr_audio") == 0
    agentctl = [sys.executable, "-m", "agent.cli.agentctl", "status"]
    shown = await asyncio.to_thread(
        subprocess.run, [*agentctl, "--socket", status["control"]["socket"]],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "ready (base, cpu int8): 3 clips" in shown.stdout


@pytest.mark.slow
@pytest.mark.broker
async def test_silence_garbage_and_bad_properties_cost_nothing_else(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker, fault_wav: bytes
) -> None:
    agent = agent_factory("asr.enabled=true").start()
    await watcher.wait_for(lambda w: _asr(w).get("state") == "ready", timeout=60, what="ASR ready")
    topic = f"{prefix}/streams/mic1/audio"
    await publish_audio(
        broker.port,
        [
            (topic, silence(3.0), {}),
            (topic, b"\x00\x01garbage" * 100, {}),
            (topic, fault_wav, {"seq": "seven"}),
            (f"{prefix}/streams/mic2/audio", fault_wav, {}),  # still heard after all that
        ],
    )
    await watcher.wait_for(lambda w: len(w.alerts()) >= 1, timeout=90, what="the good clip's alert")
    assert {a["alert"]["stream_id"] for a in watcher.alerts()} == {"mic2"}
    await watcher.wait_for(lambda w: _asr(w).get("clips") == 2, timeout=30, what="clips counted")
    asr = _asr(watcher)
    assert asr["silent_clips"] == 1  # VAD: no speech, the decoder never ran
    assert asr["rejected"] == {"not_audio": 1, "invalid_properties": 1}
    reasons = sorted(e["reason"] for e in _errors(watcher))
    assert reasons == ["invalid_properties", "not_audio"]
    assert not [t for t in _transcripts(watcher) if t["stream_id"] == "mic1"]
    assert agent.alive


@pytest.mark.slow
@pytest.mark.broker
async def test_a_burst_over_the_queue_sheds_the_oldest_and_the_newest_still_alerts(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    agent_factory(
        "asr.enabled=true",
        "asr.max_clip_s=5",
        "asr.queue_seconds_per_stream=8",
        "asr.queue_seconds_total=8",
    ).start()
    await watcher.wait_for(lambda w: _asr(w).get("state") == "ready", timeout=60, what="ASR ready")
    chatter = speak("The conveyor is running at normal speed today")
    fault = speak("Emergency stop, emergency stop on line three")
    topic = f"{prefix}/streams/mic1/audio"
    burst = [(topic, chatter, {"seq": i}) for i in range(8)] + [(topic, fault, {"seq": 8})]
    await publish_audio(broker.port, burst)
    await watcher.wait_for(
        lambda w: any(a["alert"]["fault"] == "emergency_stop" for a in w.alerts()),
        timeout=120,
        what="the newest clip's alert",
    )

    def settled(w: MqttWatcher) -> bool:
        asr = _asr(w)
        q = asr.get("queue", {})
        return asr.get("clips", 0) + q.get("shed_clips", 0) == 9 and q.get("seconds") == 0

    await watcher.wait_for(settled, timeout=120, what="every clip transcribed or shed")
    q = _asr(watcher)["queue"]
    assert q["shed_clips"] >= 3 and q["shed_s"] > 0  # 9 clips x 3 s through an 8 s queue
    shed_reports = [e for e in _errors(watcher) if e["reason"] == "asr_queue_full"]
    assert len(shed_reports) == q["shed_clips"]
    shed = {int(re.search(r"clip seq (\d+)", e["detail"])[1]) for e in shed_reports}  # type: ignore[index]
    heard = {t["seq"] // 1000 for t in _transcripts(watcher)}
    # The first clip went straight to the recogniser; those queued behind it were shed
    # oldest first; the newest (the fault) was kept. Every clip is accounted for once.
    assert 8 in heard and not heard & shed and heard | shed == set(range(9))
    assert max(shed) < 8 and min(shed) >= 1


@pytest.mark.slow
@pytest.mark.broker
async def test_mandarin_from_pinyin_speech_alerts(
    agent_factory: Any, watcher: MqttWatcher, prefix: str, broker: DevBroker
) -> None:
    """espeak-ng's Mandarin from tone-numbered pinyin, on a stream configured as Chinese;
    the base model with the Chinese fault words as its prompt hears 温度超过上限 (measured:
    温度超过线 with the labels alone). Auto-detection on this robotic clip flipped between
    zh and en from run to run: a microphone's language belongs in its stream's settings."""
    agent_factory("asr.enabled=true", "streams.overrides.mic-zh.language=zh").start()
    await watcher.wait_for(lambda w: _asr(w).get("state") == "ready", timeout=60, what="ASR ready")
    zh = speak("wen1 du4 chao1 guo4 shang4 xian4", voice="cmn-latn-pinyin")
    await publish_audio(broker.port, [(f"{prefix}/streams/mic-zh/audio", zh, {})])
    await watcher.wait_for(lambda w: len(w.alerts()) >= 1, timeout=90, what="the alert")
    alert = watcher.alerts()[0]["alert"]
    assert alert["fault"] == "temperature_over_limit"
    [segment] = _transcripts(watcher)
    assert segment["lang"] == "zh" and "温度" in segment["text"]


def test_audio_is_refused_when_the_model_cannot_load(tmp_path: Path) -> None:
    """A missing model folder: the stage says `unavailable` and refuses audio with that
    reason, instead of the service failing (transcripts keep working)."""
    from pipelines.asr.settings import AsrSettings
    from pipelines.asr.stage import AsrStage, AudioIn

    errors: list[tuple[str, str]] = []

    def broken() -> Any:
        raise WhisperModelError("no model here")

    async def scenario() -> None:
        stage = AsrStage(
            AsrSettings(enabled=True),
            broken,
            lambda _: None,
            lambda t, r, n, d: errors.append((r, d)),
        )
        stage.submit(AudioIn("mic1", b"x" * 2000, "p/streams/mic1/audio"))  # queued at load
        await stage.run()  # returns: nothing to run without a model
        stage.submit(AudioIn("mic1", b"x" * 2000, "p/streams/mic1/audio"))
        assert stage.state == "unavailable" and "no model here" in (stage.error or "")
        assert stage.snapshot()["rejected"] == {"unavailable": 2}

    asyncio.run(scenario())
    assert [r for r, _ in errors] == ["unavailable", "unavailable"]
    assert json.dumps(errors)  # plain data, publishable


def test_clips_arriving_together_do_not_overlap_and_languages_are_normalised() -> None:
    """A backlog of clips without `start` (after a reconnect) gets consecutive times, not
    the same arrival time each (the overlap merge would drop all but one as repeats); a
    stream's "zh-CN" is Whisper's zh, an unknown code means detection."""
    from pipelines.asr.settings import AsrSettings
    from pipelines.asr.stage import AsrStage, AudioIn, _whisper_language

    stage = AsrStage(AsrSettings(), lambda: None, lambda _: None, lambda *_: None)  # type: ignore[arg-type,return-value]
    now = time.time()
    starts = [stage._clip_start(AudioIn("mic", b"", "t", arrived=now), 3.0) for _ in range(3)]
    assert starts == [now - 3.0, now, now + 3.0]
    given = stage._clip_start(AudioIn("mic", b"", "t", start=now - 100, arrived=now), 3.0)
    assert given == now - 100  # the microphone's own time wins
    stage.close()
    assert [_whisper_language(x) for x in ("zh-CN", "ZH", "en_US", "klingon", None)] == [
        "zh", "zh", "en", None, None,
    ]  # fmt: skip
