"""The watchdog's pure parts: levels with hysteresis, the leak slope, the ladder of every
shipped profile, and the persisted rung."""

from __future__ import annotations

import hashlib
import json
import mmap
from pathlib import Path

import pytest

from agent.engine import load_engine_profile
from agent.engine.profile import EngineProfile
from agent.supervision.ladder import MIN_CONTEXT_TOKENS, KvRates, build_ladder, ladder_fingerprint
from agent.supervision.store import RungRecord, RungStore
from agent.watchdog.leak import LeakDetector
from agent.watchdog.policy import HeadroomPolicy, Level
from agent.watchdog.probes import MemorySample, process_rss
from agent.watchdog.settings import WatchdogSettings

GIB = 1 << 30
MIB = 1 << 20


def sample(avail_mib: int, *, some: float | None = None, full: float | None = None) -> MemorySample:
    return MemorySample(
        mem_total=8 * GIB, mem_available=avail_mib * MIB, psi_some_avg10=some, psi_full_avg10=full
    )


def test_levels_enter_at_thresholds_and_leave_only_past_the_hysteresis() -> None:
    policy = HeadroomPolicy(
        WatchdogSettings(host_warn_bytes=1024 * MIB, host_critical_bytes=512 * MIB, hysteresis=0.2)
    )
    seq = [2000, 1100, 1000, 1100, 1200, 1300, 500, 600, 615, 700, 1300]
    levels = [policy.assess(sample(m)).level for m in seq]
    assert levels == [
        Level.ok,
        Level.ok,
        Level.warn,  # under 1024
        Level.warn,  # 1100 < 1024 x 1.2: held
        Level.warn,  # 1200 < 1228.8: held
        Level.ok,  # clear of the margin
        Level.critical,
        Level.critical,  # 600 < 614.4: held
        Level.warn,  # 615 clears critical's margin, still under warn
        Level.warn,
        Level.ok,
    ]


def test_pressure_stalls_warn_and_go_critical_with_memory_left() -> None:
    policy = HeadroomPolicy(WatchdogSettings(psi_warn_some_avg10=20, psi_critical_full_avg10=30))
    first = policy.assess(sample(6000, some=25.0, full=1.0))
    assert first.level is Level.warn and first.changed
    assert first.reasons == ("memory pressure some 25.0% >= 20.0%",)
    crit = policy.assess(sample(6000, some=60.0, full=35.0))
    assert crit.level is Level.critical and "memory pressure full" in crit.reasons[0]
    assert policy.assess(sample(6000, some=0.0, full=0.0)).level is Level.ok


def test_discrete_gpu_free_memory_counts_when_configured() -> None:
    cfg = WatchdogSettings(gpu_warn_bytes=512 * MIB, gpu_critical_bytes=256 * MIB)
    policy = HeadroomPolicy(cfg)
    low = MemorySample(mem_total=32 * GIB, mem_available=20 * GIB, gpu_free=200 * MIB)
    a = policy.assess(low)
    assert a.level is Level.critical and a.reasons[0].startswith("GPU free")


def test_settings_refuse_inverted_thresholds() -> None:
    with pytest.raises(ValueError, match="host_critical_bytes"):
        WatchdogSettings(host_warn_bytes=GIB, host_critical_bytes=2 * GIB)
    with pytest.raises(ValueError, match="go together"):
        WatchdogSettings(gpu_warn_bytes=GIB)


def test_leak_slope_needs_history_then_flags_a_steady_climb() -> None:
    leak = LeakDetector(window_s=6 * 3600, min_span_s=3600, threshold_bytes_per_hour=32 * MIB)
    base = 300 * MIB
    for minute in range(0, 50):
        leak.add(minute * 60.0, base + minute * MIB)  # 60 MiB/h, but under an hour of data
    assert leak.verdict().slope_bytes_per_hour is None
    for minute in range(50, 120):
        leak.add(minute * 60.0, base + minute * MIB)
    verdict = leak.verdict()
    assert verdict.suspected
    assert verdict.slope_bytes_per_hour == pytest.approx(60 * MIB, rel=0.01)


def test_leak_flat_rss_with_noise_is_not_a_leak() -> None:
    leak = LeakDetector(window_s=6 * 3600, min_span_s=3600, threshold_bytes_per_hour=32 * MIB)
    for minute in range(0, 180):
        leak.add(minute * 60.0, 300 * MIB + (5 * MIB if minute % 2 else 0))
    verdict = leak.verdict()
    assert verdict.slope_bytes_per_hour is not None and not verdict.suspected


def test_leak_detector_sees_real_rss_growth() -> None:
    """Real resident memory of this process, growing by 16 MiB a 'minute' (time compressed)."""
    leak = LeakDetector(window_s=6 * 3600, min_span_s=3600, threshold_bytes_per_hour=32 * MIB)
    held: list[mmap.mmap] = []
    for minute in range(0, 80, 10):
        # New anonymous pages, each written: resident, and never pages the heap freed
        # earlier in the suite (a bytearray there can reuse them and leave RSS flat).
        block = mmap.mmap(-1, 16 * MIB)
        for offset in range(0, 16 * MIB, mmap.PAGESIZE):
            block[offset] = 1
        held.append(block)
        leak.add(minute * 60.0, process_rss()[0])
    verdict = leak.verdict()
    assert verdict.suspected, verdict
    assert verdict.slope_bytes_per_hour is not None and verdict.slope_bytes_per_hour > 64 * MIB
    for block in held:
        block.close()


def test_cpu_ladder_steps_cheapest_first_and_is_cumulative() -> None:
    profile = load_engine_profile("cpu-dev")
    rungs = build_ladder(profile, context_tokens=4096, answer_tokens=256, kv=KvRates(23040))
    knobs = [r.knob for r in rungs]
    assert (
        knobs
        == ["none"]
        + ["speculative"] * 3
        + ["kv_cache"] * 3
        + ["batched_tokens"] * 2
        + ["context"] * 2
    )
    assert [r.index for r in rungs] == list(range(len(rungs)))
    spec = [
        (r.profile.speculative.method, r.profile.speculative.num_speculative_tokens) for r in rungs
    ]
    method = profile.speculative.method  # cpu-dev: ngram (the rungs keep it, only k steps)
    assert method == "ngram"
    assert spec[:4] == [(method, 3), (method, 2), (method, 1), ("off", 1)]
    last = rungs[-1].profile
    # every change of the rungs above is still in the last one
    assert last.speculative.method == "off"
    assert last.max_num_batched_tokens == 512
    # the context rungs shrink the KV budget with the context (the memory they free), down
    # to what one full context of the new max_model_len needs
    kv = [r.profile.memory.kv_cache_memory_bytes or 0 for r in rungs]
    assert kv[-3] == int(256 * MIB * 0.75)
    assert kv[-3] > kv[-2] > kv[-1] >= KvRates(23040).needed(last)
    assert kv[-1] < 64 * MIB
    assert rungs[-1].context_tokens == MIN_CONTEXT_TOKENS
    assert last.max_model_len == MIN_CONTEXT_TOKENS + 256
    assert rungs[-1].loud and not rungs[-3].loud
    assert all(r.context_tokens == 4096 for r in rungs[:-2])


def test_kv_rungs_never_go_below_one_full_context() -> None:
    profile = load_engine_profile("cpu-dev")  # 256 MiB, max_model_len 8192
    # 8192 + 128 tokens at 30 KiB need 244 MiB: no KV rung fits
    rungs = build_ladder(profile, context_tokens=None, kv=KvRates(30 * 1024))
    assert not [r for r in rungs if r.knob == "kv_cache"]
    rungs = build_ladder(profile, context_tokens=None, kv=KvRates(26 * 1024))
    assert [r.name for r in rungs if r.knob == "kv_cache"] == ["KV cache 218 MiB (85%)"]
    # a hybrid model's fixed recurrent state counts too
    rungs = build_ladder(profile, context_tokens=None, kv=KvRates(23 * 1024, 20 * MIB))
    assert [r.name for r in rungs if r.knob == "kv_cache"] == ["KV cache 218 MiB (85%)"]


def test_batched_token_rungs_stay_above_the_engines_floor() -> None:
    """A hybrid with prefix caching cannot start under its attention block: no rung there."""
    profile = load_engine_profile("orin-nx-16gb")  # 1152 tokens, the 4B hybrid's block 1120
    kv = KvRates(13312, 224 * MIB)

    def halvings(p: EngineProfile, rates: KvRates) -> list[int]:
        rungs = build_ladder(p, context_tokens=None, kv=rates)
        return [r.profile.max_num_batched_tokens for r in rungs if r.knob == "batched_tokens"]

    assert halvings(profile, kv) == [576, 288]  # no floor known: the dead rungs of before
    assert halvings(profile, KvRates(13312, 224 * MIB, min_batched_tokens=1120)) == []
    wide = profile.model_copy(update={"max_num_batched_tokens": 4096})
    assert halvings(wide, KvRates(13312, 224 * MIB, min_batched_tokens=1120)) == [2048]
    # the floor moves the fingerprint only where there is one: without it, the digest is the
    # one of before (the format persisted rungs were written with), so they still apply
    # (and the device fields the planner gained later, unset here, are not in that format)
    dumped = profile.model_dump(mode="json")
    assert dumped["device"].pop("context_bytes") == 0
    assert dumped["device"].pop("compile_transient_bytes") == 0
    before = {"profile": dumped, "context": None, "answer": 0,
              "kv": [13312, 224 * MIB]}  # fmt: skip
    digest = hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()[:16]
    assert ladder_fingerprint(profile, None, kv=kv) == digest
    assert ladder_fingerprint(profile, None, kv=KvRates(13312, 224 * MIB, 1120)) != digest


@pytest.mark.parametrize(
    ("name", "knobs"),
    [
        ("orin-nx-8gb", {"speculative", "cuda_graphs", "kv_cache", "batched_tokens", "context"}),
        (
            "rtx4070-laptop-8gb",
            {"speculative", "cuda_graphs", "kv_cache", "batched_tokens", "context"},
        ),
        ("h200-bench", {"speculative", "cuda_graphs", "kv_cache", "batched_tokens"}),
    ],
)
def test_gpu_ladders_cover_every_knob(name: str, knobs: set[str]) -> None:
    profile = load_engine_profile(name)
    context = None if profile.skip_tokenizer_init else profile.max_model_len - 512
    rungs = build_ladder(profile, context_tokens=context, answer_tokens=256)
    assert {r.knob for r in rungs[1:]} == knobs
    graphs = next(r for r in rungs if r.knob == "cuda_graphs").profile.cuda_graphs
    assert graphs.mode == "FULL_DECODE_ONLY"
    # graphs still cover the widest decode batch once speculation is off
    assert max(graphs.capture_sizes or [0]) >= profile.max_num_seqs
    if profile.memory.kv_cache_memory_bytes is None:
        utils = [r.profile.memory.gpu_memory_utilization for r in rungs if r.knob == "kv_cache"]
        assert utils == [
            u for u in (0.85, 0.80, 0.75) if u < (profile.memory.gpu_memory_utilization or 1)
        ]


def test_fingerprint_follows_profile_and_window() -> None:
    profile = load_engine_profile("cpu-dev")
    fp = ladder_fingerprint(profile, 4096)
    assert fp == ladder_fingerprint(load_engine_profile("cpu-dev"), 4096)
    assert fp != ladder_fingerprint(profile, 3072)
    assert fp != ladder_fingerprint(profile.model_copy(update={"max_num_seqs": 1}), 4096)


def test_store_round_trip_is_atomic_and_tolerates_damage(tmp_path: Path) -> None:
    store = RungStore(tmp_path / "state" / "watchdog.json")
    assert store.load("abc").rung == 0  # nothing yet
    record = RungRecord(
        rung=3, name="speculative off", reason="engine_dead", at=1.0, fingerprint="abc"
    )
    record.history.append({"from": 2, "to": 3})
    store.save(record)
    assert sorted(p.name for p in store.path.parent.iterdir()) == ["watchdog.json"]  # no temp left
    again = store.load("abc")
    assert (again.rung, again.name, again.reason, again.history) == (
        3,
        "speculative off",
        "engine_dead",
        [{"from": 2, "to": 3}],
    )
    # another profile's rung does not apply
    other = store.load("other")
    assert other.rung == 0 and other.history == [{"from": 2, "to": 3}]
    # a damaged file is kept aside, the service starts on rung 0
    store.path.write_text("{not json")
    assert store.load("abc").rung == 0
    assert [p.name for p in store.path.parent.iterdir() if ".bad-" in p.name]
    assert not store.path.exists()
    store.save(record)
    assert json.loads(store.path.read_text())["rung"] == 3
