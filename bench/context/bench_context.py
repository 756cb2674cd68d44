"""Rolling-context benchmark: our quarter-drop policy against a naive one, on the real engine.

A long synthetic shift (bench/context/synth.py: hours of 5 s segments, faults that develop
slowly) is replayed through `pipelines.analysis.Analyzer` on one embedded engine, twice,
in one process: once per policy, each on its own Analyzer and stream id (so the two share
no cached prefix beyond the common start of the head). By default (`--order alternate`)
the policies fill one after the other, then take their steady analyses round-robin, one
request at a time: a slow patch of a shared machine falls on both alike (the first full
CPU run, sequential, lost 9 of naive's 40 analyses to a neighbour's job). `--order
naive,quarter` runs each policy's whole replay in turn instead.

    quarter  the service's policy: a full window drops `llm.drop_fraction` (a quarter) of
             the budget at once, so a full re-prefill happens once per quarter-window
    naive    drops only what must go (drop_fraction 0): one cadence's segments at a time,
             so every analysis of a full window re-prefills it

Both see the same text at the same cadence: an analysis after every `--every` segments
(6 = 30 s of speech). Per policy:

    fill     segments until the window cannot take one more without a drop; the first
             analysis is the cold prefill ("cold"), top-ups follow (prefix-cached appends;
             the Analyzer sheds pending text past 4 characters a budget token, so a large
             window is filled in chunks)
    steady   at least `--analyses` analyses, the first of which drops; then, with
             `--whole-cycles` (default), on until the next analysis would drop, so the
             phase holds whole drop cycles and re-prefills per hour is not extrapolated
             from a piece of one (on a 128K window a quarter cycle is ~2.4 stream hours)

Per analysis: stream time, prompt/cached tokens, TTFT, latency (the analysis request),
wall time (tokenizing + the summary request at a drop + the analysis), dropped tokens,
whether a summary was requested, answer validity. A re-prefill is a steady analysis with
cached < 50% of its prompt. Prints a markdown table; writes DIR/results.json and
DIR/table.md (also when a policy finishes, so a run cut short keeps what it measured).

CPU (default): configs/agent.yaml on cpu-dev, the real SmolLM2-135M, its tokenizer, the
analysis JSON schema; budget llm.context_budget (4096).

    .venv/bin/python bench/context/bench_context.py --out bench/context/results/cpu-DATE

H200: `--profile h200-bench`: random weights of the Qwen3-4B shape (config-only folder,
as bench/engine), no tokenizer: `WordHashCodec` (a word -> a stable id) and `PlainLlm`
(no schema, no stop strings, 16 answer tokens). Answers are not JSON; cache behaviour is
the point. `--codec hash` runs that path on the CPU too (a check of the GPU code path).
`--dry-run` prepares everything (config, model folder, memory plan, codec) and stops.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from functools import lru_cache
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")

from agent.analysis_link import EngineCodec, EngineLlm  # noqa: E402
from agent.config.loader import load_config  # noqa: E402
from agent.engine import EngineProfile, plan_memory  # noqa: E402
from agent.engine.model_prep import model_dir_for  # noqa: E402
from agent.engine.results import GenerationResult  # noqa: E402
from agent.logsetup import configure_logging  # noqa: E402
from agent.supervision import EngineSupervisor, supervised  # noqa: E402
from bench._common import machine, md_table, percentile  # noqa: E402
from bench.context.synth import SynthSegment, generate_shift  # noqa: E402
from bench.shapes import QWEN3_4B  # noqa: E402
from pipelines.analysis import (  # noqa: E402
    AnalysisLlm,
    AnalysisReport,
    AnalysisSettings,
    Analyzer,
    TokenCodec,
)
from pipelines.analysis_prompt import ChatFrame, render_line  # noqa: E402
from pipelines.context import ContextWindow  # noqa: E402
from pipelines.evidence import AcceptedFault  # noqa: E402

POLICIES = ("naive", "quarter")
RE_PREFILL_BELOW = 0.5  # cached / prompt under this: the window was prefilled again
FIRST_FILL = 0.5  # share of the budget added before the window exists (its size unknown)
FILL_CHARS_PER_TOKEN = 3  # a fill chunk's characters per budget token (the Analyzer sheds at 4)
GPU_ANSWER_TOKENS = 16  # decode must not dominate a random-weight run
PLAIN_SETTINGS_TOKENS = 32  # AnalysisSettings' floor of max_output_tokens


# -- the tokenizer-less path (random weights on the H200) ----------------------------------


@lru_cache(maxsize=1 << 16)
def _word_id(word: str, low: int, high: int) -> int:
    digest = hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest()
    return low + int.from_bytes(digest, "big") % (high - low)


class WordHashCodec:
    """TokenCodec without a tokenizer: each whitespace-separated word -> a stable id in
    [low, high) (blake2b, not hash(): stable across processes), a newline -> its own id.
    About 5 characters a token on this text (a real tokenizer: about 4)."""

    NEWLINE = 999

    def __init__(self, low: int = 1000, high: int = 150_000) -> None:
        if not self.NEWLINE < low < high:
            raise ValueError(f"bad id range [{low}, {high})")
        self.low, self.high = low, high

    def encode_text(self, text: str) -> list[int]:
        ids: list[int] = []
        for i, line in enumerate(text.split("\n")):
            if i:
                ids.append(self.NEWLINE)
            ids.extend(_word_id(w, self.low, self.high) for w in line.split())
        return ids

    async def encode(self, texts: Sequence[str], *, trusted: bool = False) -> list[list[int]]:
        return [self.encode_text(t) for t in texts]

    async def chat_frame(self) -> ChatFrame:
        return ChatFrame.plain()


class PlainLlm:
    """AnalysisLlm for an engine without a tokenizer: no JSON schema (structured outputs
    need one), no stop strings (they need detokenizing), at most `max_tokens` answer
    tokens. Errors map to LlmUnavailable as in the service (EngineLlm underneath)."""

    def __init__(self, supervisor: EngineSupervisor, max_tokens: int) -> None:
        self.inner = EngineLlm(supervisor)
        self.max_tokens = max_tokens
        self.requests = 0

    async def wait_ready(self) -> None:
        await self.inner.wait_ready()

    async def complete(
        self,
        prompt: list[int],
        *,
        max_tokens: int,
        json_schema: Mapping[str, Any] | None,
        stop: Sequence[str] = (),
        logprobs: bool = False,
    ) -> GenerationResult:
        """Free text with random weights: no schema, so no confidence either."""
        self.requests += 1
        return await self.inner.complete(
            prompt, max_tokens=min(max_tokens, self.max_tokens), json_schema=None, stop=()
        )


def prepare_bench_model(profile: EngineProfile) -> Path:
    """The profile's config-only model folder (random weights): config.json of the
    Qwen3-4B shape, written once at a stable path so vLLM's compile cache finds it again."""
    model_dir = profile.model_path()
    config = dict(QWEN3_4B)
    path = model_dir / "config.json"
    if not path.exists() or json.loads(path.read_text()) != config:
        model_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(config, indent=2))
    return model_dir


# -- records and statistics ----------------------------------------------------------------


@dataclass
class Record:
    phase: str  # fill or steady
    index: int  # within the phase
    seq_last: int  # last segment analysed
    segments_added: int
    stream_h: float  # hours since the shift started (end of the last segment)
    prompt_tokens: int
    cached_tokens: int
    ttft_s: float | None
    latency_s: float  # the analysis request
    wall_s: float  # analyze(): tokenizing, the summary request at a drop, the analysis
    dropped_lines: int
    dropped_tokens: int
    summary: bool  # a note on dropped lines was written (report.summary is not None)
    valid: bool
    finish_reason: str | None
    window_tokens: int  # head + transcript after the analysis
    loadavg_1m: float  # this machine's load: a neighbour's job shows here
    cold: bool = False
    re_prefill: bool = False


@dataclass
class PolicyRun:
    policy: str
    stream_id: str
    drop_fraction: float
    fill: list[Record] = field(default_factory=list)
    steady: list[Record] = field(default_factory=list)
    capacity: int | None = None  # transcript tokens the window holds
    head_tokens: int | None = None
    fill_end_h: float = 0.0
    stop_reason: str = ""
    wall_s: float = 0.0


def _r(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


def summarize(run: PolicyRun) -> dict[str, Any]:
    s = run.steady
    hours = (s[-1].stream_h - run.fill_end_h) if s else 0.0
    prompt = sum(r.prompt_tokens for r in s)
    cached = sum(r.cached_tokens for r in s)
    ttfts = [r.ttft_s for r in s if r.ttft_s is not None]
    lat = [r.latency_s for r in s]
    wall = [r.wall_s for r in s]
    re_prefills = sum(r.re_prefill for r in s)
    drops = [r for r in s if r.dropped_tokens]
    cold = run.fill[0] if run.fill else None
    return {
        "policy": run.policy,
        "drop_fraction": run.drop_fraction,
        "analyses": len(s),
        "stream_h": _r(hours, 3),
        "latency_p50_s": _r(percentile(lat, 0.5)),
        "latency_p95_s": _r(percentile(lat, 0.95)),
        "ttft_p50_s": _r(percentile(ttfts, 0.5)),
        "ttft_p95_s": _r(percentile(ttfts, 0.95)),
        "wall_p50_s": _r(percentile(wall, 0.5)),
        "wall_p95_s": _r(percentile(wall, 0.95)),
        "prefix_hit_rate": _r(cached / prompt if prompt else None),
        "re_prefills": re_prefills,
        "re_prefills_per_h": _r(re_prefills / hours if hours else None, 2),
        "drops": len(drops),
        "dropped_tokens": sum(r.dropped_tokens for r in s),
        "summaries": sum(r.summary for r in s),
        "mean_prompt_tokens": round(prompt / len(s)) if s else None,
        "invalid_answers": sum(not r.valid for r in s),
        "cold_prompt_tokens": cold.prompt_tokens if cold else None,
        "cold_cached_tokens": cold.cached_tokens if cold else None,
        "cold_ttft_s": _r(cold.ttft_s) if cold else None,
        "fill_analyses": len(run.fill),
        "capacity_tokens": run.capacity,
        "head_tokens": run.head_tokens,
        "stop_reason": run.stop_reason,
        "wall_total_s": round(run.wall_s, 1),
    }


def ratios(summaries: Mapping[str, Mapping[str, Any]]) -> dict[str, float | None]:
    q, n = summaries.get("quarter"), summaries.get("naive")
    if not q or not n:
        return {}

    def div(a: Any, b: Any) -> float | None:
        return round(a / b, 2) if a is not None and b else None

    return {
        "hit_rate_quarter_over_naive": div(q["prefix_hit_rate"], n["prefix_hit_rate"]),
        "ttft_p50_naive_over_quarter": div(n["ttft_p50_s"], q["ttft_p50_s"]),
        "latency_p50_naive_over_quarter": div(n["latency_p50_s"], q["latency_p50_s"]),
        "re_prefills_per_h_naive_over_quarter": div(n["re_prefills_per_h"], q["re_prefills_per_h"]),
    }


COLUMNS = (
    ("analyses", "analyses"),
    ("stream_h", "stream h"),
    ("latency_p50_s", "latency p50 s"),
    ("latency_p95_s", "latency p95 s"),
    ("ttft_p50_s", "TTFT p50 s"),
    ("ttft_p95_s", "TTFT p95 s"),
    ("wall_p95_s", "wall p95 s"),
    ("prefix_hit_rate", "prefix hit rate"),
    ("re_prefills", "re-prefills"),
    ("re_prefills_per_h", "re-prefills / h"),
    ("drops", "drops"),
    ("mean_prompt_tokens", "mean prompt tok"),
    ("cold_ttft_s", "cold TTFT s"),
)


def render_table(meta: Mapping[str, Any], summaries: Mapping[str, Mapping[str, Any]]) -> str:
    lines = [
        f"{meta['date']}, {meta['machine']}; vLLM {meta.get('vllm_version')} on "
        f"{meta.get('backend')}; model {meta['model']}; profile {meta['profile']}; "
        f"codec {meta['codec']}; budget {meta['budget']} tokens; an analysis every "
        f"{meta['every']} segments ({meta['every'] * meta['seg_s']:g} s of speech); "
        f"answers up to {meta['answer_tokens']} tokens",
        "",
        md_table(
            ["policy", *(c[1] for c in COLUMNS)],
            [
                [name, *("" if s.get(key) is None else str(s[key]) for key, _ in COLUMNS)]
                for name, s in summaries.items()
            ],
        ),
        "",
    ]
    for key, value in ratios(summaries).items():
        lines.append(f"- {key.replace('_', ' ')}: {value}")
    for name, s in summaries.items():
        lines.append(
            f"- {name}: window {s['capacity_tokens']} transcript tokens + a "
            f"{s['head_tokens']}-token head; fill {s['fill_analyses']} analyses (cold "
            f"{s['cold_prompt_tokens']} prompt tokens, {s['cold_cached_tokens']} cached); "
            f"{s['summaries']} summary requests; {s['invalid_answers']} invalid answers; "
            f"stopped: {s['stop_reason']}; {s['wall_total_s']} s in its analyses"
        )
    return "\n".join(lines)


# -- the replay ------------------------------------------------------------------------------


def window_of(a: Analyzer, stream_id: str) -> ContextWindow:
    """The stream's window (its capacity and held tokens: the fill and the whole-cycle
    rule need them)."""
    window = a.window(stream_id)
    assert window is not None, "the window exists after the stream's first analysis"
    return window


@dataclass
class Lane:
    """One policy's replay: its Analyzer, where it is in the shift, when it stops."""

    run: PolicyRun
    analyzer: Analyzer
    target: int  # steady analyses at least
    pos: int = 0  # next segment
    t_steady: float = 0.0
    done: bool = False


class Replay:
    def __init__(
        self,
        args: argparse.Namespace,
        segments: Sequence[SynthSegment],
        tokens: Sequence[int],
        budget: int,
        shift_start: float,
        t_process: float,
    ) -> None:
        self.args = args
        self.segments = segments
        self.tokens = tokens
        self.budget = budget
        self.shift_start = shift_start
        self.t_process = t_process

    async def run(self, lanes: Sequence[Lane], alternate: bool, on_done: Any) -> None:
        """Sequential: each lane fills and runs its steady phase in turn. Alternate: the
        lanes fill in turn, then take steady analyses round-robin, so a slow patch of the
        machine (a neighbour's job) falls on both policies alike."""
        for lane in lanes:
            await self.fill(lane)
            if not alternate:
                while not await self.step(lane):
                    pass
                on_done(lane)
        while alternate and not all(lane.done for lane in lanes):
            for lane in lanes:
                if not lane.done and await self.step(lane):
                    on_done(lane)

    def _add(self, lane: Lane, seg: SynthSegment) -> None:
        lane.analyzer.add(
            lane.run.stream_id, seq=seg.seq, start=seg.start, end=seg.end, text=seg.text
        )

    async def _analyze(self, lane: Lane, phase: str, index: int, added: int) -> Record:
        run = lane.run
        last = self.segments[lane.pos - 1]
        t0 = time.perf_counter()
        report: AnalysisReport = await lane.analyzer.analyze(run.stream_id)
        wall = time.perf_counter() - t0
        window = window_of(lane.analyzer, run.stream_id)
        rec = Record(
            phase=phase,
            index=index,
            seq_last=last.seq,
            segments_added=added,
            stream_h=round((last.end - self.shift_start) / 3600, 4),
            prompt_tokens=report.prompt_tokens,
            cached_tokens=report.cached_tokens,
            ttft_s=_r(report.ttft_s, 4),
            latency_s=round(report.latency_s, 4),
            wall_s=round(wall, 4),
            dropped_lines=report.dropped_lines,
            dropped_tokens=report.dropped_tokens,
            summary=report.summary is not None,
            valid=report.valid,
            finish_reason=report.finish_reason,
            window_tokens=window.tokens,
            loadavg_1m=round(os.getloadavg()[0], 2),
        )
        rec.re_prefill = rec.cached_tokens < RE_PREFILL_BELOW * rec.prompt_tokens
        run.wall_s += wall
        every = self.args.progress
        if every and (phase == "fill" or rec.dropped_tokens or index % every == 0):
            print(
                f"[{run.policy}] {phase} {index}: t={rec.stream_h:.2f}h prompt "
                f"{rec.prompt_tokens} cached {rec.cached_tokens} ttft {rec.ttft_s}s "
                f"latency {rec.latency_s:.2f}s wall {rec.wall_s:.2f}s"
                + (f" dropped {rec.dropped_tokens}" if rec.dropped_tokens else ""),
                file=sys.stderr,
                flush=True,
            )
        return rec

    async def fill(self, lane: Lane) -> None:
        """Segments up to the last one that fits without a drop, in chunks the Analyzer's
        pending buffer keeps whole, one analysis after each chunk."""
        run, n = lane.run, len(self.segments)
        window: ContextWindow | None = None
        while True:
            room = (
                int(self.budget * FIRST_FILL)
                if window is None
                else window.capacity - window.transcript_tokens
            )
            chars = used = added = 0
            while (
                lane.pos < n
                and used + self.tokens[lane.pos] <= room
                and chars + len(self.segments[lane.pos].text) <= self.budget * FILL_CHARS_PER_TOKEN
            ):
                self._add(lane, self.segments[lane.pos])
                used += self.tokens[lane.pos]
                chars += len(self.segments[lane.pos].text)
                lane.pos += 1
                added += 1
            if added == 0:
                break
            rec = await self._analyze(lane, "fill", len(run.fill), added)
            rec.cold = not run.fill
            run.fill.append(rec)
            if rec.dropped_tokens:
                print(f"[{run.policy}] warning: the fill dropped {rec.dropped_tokens} tokens")
            window = window_of(lane.analyzer, run.stream_id)
        if window is None:
            raise RuntimeError("the first segment does not fit half the budget")
        run.capacity = window.capacity
        run.head_tokens = len(window.head)
        run.fill_end_h = (self.segments[lane.pos - 1].end - self.shift_start) / 3600
        lane.t_steady = time.perf_counter()

    async def step(self, lane: Lane) -> bool:
        """One steady analysis after `every` segments (the first batch overflows the full
        window, so the phase starts with a drop); True (and lane.done) when the phase ends."""
        args, run, every = self.args, lane.run, self.args.every
        if lane.pos + every > len(self.segments):
            run.stop_reason, lane.done = "out of synthetic text (raise --hours)", True
            return True
        for seg in self.segments[lane.pos : lane.pos + every]:
            self._add(lane, seg)
        lane.pos += every
        run.steady.append(await self._analyze(lane, "steady", len(run.steady), every))
        done = len(run.steady)
        now = time.perf_counter()
        if done >= lane.target:
            if not args.whole_cycles:
                run.stop_reason = f"{lane.target} analyses"
            else:
                window = window_of(lane.analyzer, run.stream_id)
                upcoming = sum(self.tokens[lane.pos : lane.pos + every])
                if window.transcript_tokens + upcoming > window.capacity:
                    run.stop_reason = f"{done} analyses, whole drop cycles"
        if run.stop_reason:
            pass
        elif done >= args.max_analyses:
            run.stop_reason = f"--max-analyses {args.max_analyses} (cycle not complete)"
        elif args.max_phase_s and now - lane.t_steady > args.max_phase_s:
            run.stop_reason = f"--max-phase-s {args.max_phase_s} (cut short)"
        elif args.deadline_s and now - self.t_process > args.deadline_s:
            run.stop_reason = f"--deadline-s {args.deadline_s} (cut short)"
        lane.done = bool(run.stop_reason)
        return lane.done


async def _no_faults(_stream_id: str, _faults: Sequence[AcceptedFault]) -> None:
    return None


def estimate_hours(
    args: argparse.Namespace, budget: int, tokens_per_segment: float, drop_fraction: float
) -> float:
    """Shift length that covers a policy's fill and its steady phase (with whole quarter
    cycles), with a margin: generate_shift spreads its faults over the length asked, so
    the text is generated once, long enough, never extended."""
    fill = budget / tokens_per_segment
    per_analysis = args.every * tokens_per_segment
    cycle = math.ceil(drop_fraction * budget / per_analysis) + 1 if args.whole_cycles else 0
    steady = (max(args.analyses_naive, args.analyses_quarter, cycle) + 2) * args.every
    hours: float = (fill + steady) * args.seg_s / 3600 * 1.25 + 0.25
    return round(hours, 2)


def write(out: Path, meta: Mapping[str, Any], runs: Sequence[PolicyRun]) -> str:
    summaries = {r.policy: summarize(r) for r in runs}
    table = render_table(meta, summaries)
    data = {
        "meta": meta,
        "summary": summaries,
        "ratios": ratios(summaries),
        "records": {r.policy: [asdict(x) for x in r.fill + r.steady] for r in runs},
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(data, indent=1, default=str) + "\n")
    (out / "table.md").write_text(table + "\n")
    return table


@dataclass
class Setup:
    engine: EngineProfile
    settings: AnalysisSettings
    faults: list[Any]
    plain: bool  # WordHashCodec + PlainLlm instead of the tokenizer and the schema
    spec_off: bool
    budget: int
    model_dir: Path
    vocab: int


async def prepare(args: argparse.Namespace) -> Setup:
    """Config, profile, model folder and memory plan; nothing started. Fills in the
    per-mode defaults of `args`."""
    cfg = load_config(Path(args.config), profile=args.profile).config
    if cfg.engine is None:
        raise SystemExit("the config has no engine section")
    engine = cfg.engine
    plain = args.codec == "hash" or (args.codec == "auto" and engine.skip_tokenizer_init)
    # Without a schema every answer is invalid and logged as such: only errors then.
    configure_logging(args.log_level or ("error" if plain else "warning"), "console")
    if engine.skip_tokenizer_init and not plain:
        raise SystemExit("this profile has no tokenizer: only --codec hash works")
    default_n = 24 if engine.device.kind == "cuda" else 40
    args.analyses_naive = args.analyses_naive or args.analyses or default_n
    args.analyses_quarter = args.analyses_quarter or args.analyses or default_n
    spec_off = args.spec == "off" or (args.spec == "auto" and engine.load_format == "dummy")
    if spec_off:  # as bench/engine's `tuned`: random weights make speculation meaningless
        engine = engine.model_copy(
            update={"speculative": engine.speculative.model_copy(update={"method": "off"})}
        )
    budget = args.budget or cfg.llm.context_budget(engine)
    settings: AnalysisSettings = cfg.llm
    if plain:
        settings = settings.model_copy(update={"max_output_tokens": PLAIN_SETTINGS_TOKENS})
    if engine.load_format == "dummy":
        model_dir = prepare_bench_model(engine)
    else:
        model_dir = model_dir_for(engine)  # the default one converted at first use
    engine = engine.model_copy(update={"model": str(model_dir)})
    plan = plan_memory(model_dir, engine)
    vocab = int(json.loads((model_dir / "config.json").read_text())["vocab_size"])
    print(
        f"profile {args.profile}: model {model_dir}, budget {budget}, codec "
        f"{'hash' if plain else 'engine'}, spec {'off' if spec_off else 'profile'}, plan: "
        f"{plan.outcome}",
        flush=True,
    )
    if plain:  # the tokenizer-less codec, checked before a device minute is spent
        check = WordHashCodec(high=min(150_000, vocab))
        sample = generate_shift(0.01, seed=args.seed)[0]
        line = render_line(sample.seq, sample.text)
        (ids,) = await check.encode([line])
        assert ids == check.encode_text(line), "unstable"
        assert all(check.low <= t < check.high for t in ids if t != check.NEWLINE), ids
        assert ids[-1] == check.NEWLINE and len(ids) == len(line.split()) + 1, ids
        print(f"codec check: {line!r} -> {ids[:6]}... ({len(ids)} ids)", flush=True)
    return Setup(engine, settings, list(cfg.faults), plain, spec_off, budget, model_dir, vocab)


async def replay_all(
    args: argparse.Namespace,
    setup: Setup,
    supervisor: EngineSupervisor,
    codec: TokenCodec,
    t_process: float,
) -> None:
    info = supervisor.engine.info
    assert info is not None
    llm: AnalysisLlm = (
        PlainLlm(supervisor, args.max_tokens) if setup.plain else EngineLlm(supervisor)
    )
    settings, budget = setup.settings, setup.budget
    # Text: one shift long enough for both policies, generated once.
    probe = generate_shift(1.0, seed=args.seed, seg_s=args.seg_s)[:200]
    probe_ids = await codec.encode([render_line(s.seq, s.text) for s in probe])
    per_segment = statistics.mean(len(x) for x in probe_ids)
    hours = args.hours or estimate_hours(args, budget, per_segment, settings.drop_fraction)
    segments = generate_shift(hours, seed=args.seed, seg_s=args.seg_s)
    encoded = await codec.encode([render_line(s.seq, s.text) for s in segments])
    tokens = [len(x) if s.text.strip() else 0 for s, x in zip(segments, encoded, strict=True)]
    print(
        f"shift: {hours} h, {len(segments)} segments, {statistics.mean(tokens):.1f} tokens a "
        "segment",
        flush=True,
    )
    answer_tokens = settings.max_output_tokens
    if setup.plain:
        answer_tokens = min(args.max_tokens, answer_tokens)
    meta: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d"),
        "machine": machine(),
        "python": platform.python_version(),
        "loadavg_start": [round(x, 2) for x in os.getloadavg()],  # others on the machine?
        "vllm_version": info.vllm_version,
        "backend": info.backend,
        "engine_start_s": info.start_seconds,
        "kv_capacity_tokens": info.kv_capacity_tokens,
        "spec": f"{info.spec_method} k={info.spec_k}",
        "plan": info.plan_outcome,
        "profile": args.profile,
        "model": setup.model_dir.name,
        "codec": "hash, no schema" if setup.plain else "tokenizer + schema",
        "budget": budget,
        "every": args.every,
        "seg_s": args.seg_s,
        "seed": args.seed,
        "hours": hours,
        "segments": len(segments),
        "tokens_per_segment": round(statistics.mean(tokens), 2),
        "answer_tokens": answer_tokens,
        "order": args.order,
        "re_prefill_below": RE_PREFILL_BELOW,
        "settings": settings.model_dump(mode="json"),
        "args": {k: v for k, v in vars(args).items() if k != "out"},
    }
    replay = Replay(args, segments, tokens, budget, segments[0].start, t_process)
    out = Path(args.out)
    alternate = args.order == "alternate"
    lanes: list[Lane] = []
    for policy in POLICIES if alternate else args.order.split(","):
        naive = policy == "naive"
        analyzer = Analyzer(
            llm,
            codec,
            settings,
            setup.faults,
            budget=budget,
            on_faults=_no_faults,
            drop_fraction=0.0 if naive else None,  # None: settings.drop_fraction
        )
        run = PolicyRun(policy, f"line3-mic1-{policy}", 0.0 if naive else settings.drop_fraction)
        target = args.analyses_naive if naive else args.analyses_quarter
        lanes.append(Lane(run, analyzer, target))

    def done(lane: Lane) -> None:
        write(out, meta, [x.run for x in lanes if x.run.fill])
        print(f"[{lane.run.policy}] done: {lane.run.stop_reason}", flush=True)

    await replay.run(lanes, alternate, done)
    runs = [lane.run for lane in lanes]
    meta["total_s"] = round(time.perf_counter() - t_process, 1)
    meta["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    print(write(out, meta, runs), flush=True)


async def main_async(args: argparse.Namespace) -> int:
    t_process = time.perf_counter()
    if args.order != "alternate" and not set(args.order.split(",")) <= set(POLICIES):
        raise SystemExit(f"--order: alternate, or policies among {', '.join(POLICIES)}")
    setup = await prepare(args)
    if args.dry_run:
        return 0
    supervisor = EngineSupervisor(setup.engine)
    t0 = time.perf_counter()
    async with supervised(supervisor):
        if not await supervisor.wait_serving():
            print(f"engine {supervisor.state}: {supervisor.detail}", file=sys.stderr)
            return 1
        print(f"engine started in {time.perf_counter() - t0:.1f}s", flush=True)
        engine_codec = None if setup.plain else EngineCodec(supervisor)
        codec: TokenCodec = engine_codec or WordHashCodec(high=min(150_000, setup.vocab))
        try:
            await replay_all(args, setup, supervisor, codec, t_process)
        finally:
            if engine_codec is not None:
                engine_codec.close()
    return 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="folder for results.json and table.md")
    ap.add_argument("--config", default=str(REPO / "configs" / "agent.yaml"))
    ap.add_argument("--profile", default="cpu-dev", help="cpu-dev, or h200-bench on the H200")
    ap.add_argument(
        "--codec",
        choices=["auto", "engine", "hash"],
        default="auto",
        help="engine: the model's tokenizer and the JSON schema; hash: WordHashCodec and no "
        "schema (what a profile without a tokenizer needs); auto: by the profile",
    )
    ap.add_argument("--every", type=int, default=6, help="segments per analysis (6 = 30 s)")
    ap.add_argument(
        "--analyses", type=int, default=None, help="steady analyses per policy (CPU 40, GPU 24)"
    )
    ap.add_argument("--analyses-naive", type=int, default=None, help="overrides --analyses")
    ap.add_argument("--analyses-quarter", type=int, default=None, help="overrides --analyses")
    ap.add_argument(
        "--whole-cycles",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="continue each steady phase until the next analysis would drop",
    )
    ap.add_argument("--max-analyses", type=int, default=2000, help="cap of one steady phase")
    ap.add_argument("--max-phase-s", type=float, default=None, help="cap of one steady phase")
    ap.add_argument(
        "--deadline-s",
        type=float,
        default=None,
        help="seconds since start after which phases stop (results are kept)",
    )
    ap.add_argument(
        "--order",
        default="alternate",
        help="alternate (steady analyses round-robin), or policies in running order "
        "(naive,quarter: each policy's whole replay in turn)",
    )
    ap.add_argument("--hours", type=float, default=None, help="shift length (default: enough)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seg-s", type=float, default=5.0)
    ap.add_argument("--budget", type=int, default=None, help="default llm.context_budget")
    ap.add_argument(
        "--max-tokens",
        type=int,
        default=GPU_ANSWER_TOKENS,
        help="answer tokens of the hash path (no schema)",
    )
    ap.add_argument(
        "--spec",
        choices=["auto", "profile", "off"],
        default="auto",
        help="speculative decoding: auto is off for random weights, the profile's otherwise",
    )
    ap.add_argument("--progress", type=int, default=10, help="print every Nth analysis (0: none)")
    ap.add_argument("--log-level", default=None, help="structlog level (warning; hash: error)")
    ap.add_argument("--dry-run", action="store_true", help="prepare and check, start nothing")
    args = ap.parse_args()
    sys.exit(asyncio.run(main_async(args)))


if __name__ == "__main__":
    main()
