"""Where vLLM's own memory goes under orin-nx-8gb's caps, and what each trim saves (issue 33).

Each variant runs in a fresh child process that is exactly a service's frontend: it imports
what edge-agent imports (agent.engine, vLLM) and starts the in-process AsyncLLM as the
service would for `orin-nx-8gb` (bench_profiles.build: the profile's kwargs, capped to the
device's bytes, random GPTQ-int4 weights of the shape), so the frontend's memory is the
service's and the variant's environment reaches both the frontend and vLLM's engine core.
In the child: the process tree's memory per process and per kind (agent/footprint.py,
the probe behind `agentctl doctor --memory`: smaps Rss, Pss, anonymous; NVML per process),
torch's allocator inside the worker, the engine start, batch-1 decode, TTFT of a 4.5K
segment alone and appended to a cached 16K prefix. The parent also measures a bare CUDA
context (torch initialised, one cuBLAS matmul) so the GPU memory outside torch splits into
the context and the rest.

Variants (VARIANTS below): `base` (the profile as shipped), `arena` (MALLOC_ARENA_MAX=2),
`threads` (one OpenMP thread, one Inductor compile worker, no tokenizer thread pool),
`nocompile` (compilation mode 0: CUDA graphs without torch.compile), `all` (the three),
`again` (the profile once more: after `base`, a start on warm caches),
`inproc` (the engine core in the frontend's process: vLLM's synchronous LLMEngine with
`VLLM_ENABLE_V1_MULTIPROCESSING=0`, stepped from a thread, bench/engine/inproc.py). An
item is VARIANT[@SHAPE], SHAPE hybrid-4b (the class the profile is sized for) or hybrid-2b.

    python3 bench/engine/bench_runtime.py --out $OUT --items base,arena,threads,nocompile,all
    python3 bench/engine/bench_runtime.py --out /tmp/rt --items base,arena   # CPU: code paths
    python3 bench/engine/bench_runtime.py --report a/results.json b/results.json  # the tables

Ratios ("/ ref") are against `again` of the item's shape where it ran (warm with warm), else
`base`. `--soak S` then appends to a rolling window for S seconds (bench/engine/soak_appends.py).

Writes OUT/results.json after every item (provenance first), OUT/<item>-log.txt (the child's
output, vLLM's included) and OUT/table.md.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")  # collective_rpc(callable)
os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")

from agent.footprint import KINDS, footprint  # noqa: E402
from bench._common import md_table, provenance, write_result  # noqa: E402

PROFILE = "orin-nx-8gb"
SEGMENT, PREFIX = 4500, 16384
GIB = 1 << 30


@dataclass(frozen=True)
class Trim:
    env: dict[str, str] = field(default_factory=dict)
    compile: dict[str, Any] = field(default_factory=dict)  # merged into compilation_config
    inproc: bool = False  # the engine core in this process (bench/engine/inproc.py)


_ARENA = {"MALLOC_ARENA_MAX": "2"}
_THREADS = {
    "OMP_NUM_THREADS": "1",
    "TORCHINDUCTOR_COMPILE_THREADS": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "RAYON_NUM_THREADS": "1",
}
_NOCOMPILE = {"mode": 0}
VARIANTS: dict[str, Trim] = {
    "base": Trim(),
    "arena": Trim(env=_ARENA),
    "threads": Trim(env=_THREADS),
    "nocompile": Trim(compile=_NOCOMPILE),
    "all": Trim(env={**_ARENA, **_THREADS}, compile=_NOCOMPILE),
    "again": Trim(),  # base once more: the profile as shipped, a start that finds caches warm
    "inproc": Trim(env={"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}, inproc=True),
}


# -- the child: one engine, one variant ------------------------------------------------------


def _file_name(item: str) -> str:
    """An item as a file name the device's return path takes (letters, digits, . _ -)."""
    return item.replace("@", "-")


def _model(work: Path, shape: str, on_gpu: bool) -> tuple[Path, dict[str, Any]]:
    from bench.engine.bench_profiles import GPTQ_INT4
    from bench.shapes import HYBRID_2B, HYBRID_4B, TINY

    cfg = dict({"hybrid-4b": HYBRID_4B, "hybrid-2b": HYBRID_2B}[shape] if on_gpu else TINY)
    if on_gpu:
        cfg["quantization_config"] = GPTQ_INT4
    folder = work / "models" / f"{shape}-int4" if on_gpu else work / "models" / "tiny"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder, cfg


def _caches() -> dict[str, int]:
    """Files already in the compile caches a start reads (vLLM's torch.compile cache under
    VLLM_CACHE_ROOT, Triton's kernels): 0 for a cold start, which compiles in the engine core
    and keeps what compiling allocated for the engine's life."""
    roots = {
        "vllm": Path(os.environ.get("VLLM_CACHE_ROOT", "~/.cache/vllm")).expanduser(),
        "triton": Path(os.environ.get("TRITON_CACHE_DIR", "~/.triton/cache")).expanduser(),
    }
    return {k: sum(1 for p in v.rglob("*") if p.is_file()) if v.is_dir() else 0
            for k, v in roots.items()}  # fmt: skip


async def _probe(llm: Any, on_gpu: bool) -> dict[str, Any]:
    from bench.engine.profile_probe import worker_memory

    worker = await llm.collective_rpc(worker_memory)
    return {
        "tree": footprint(os.getpid(), gpu=on_gpu).model_dump(),
        "worker": worker[0] if worker else None,
    }


async def child(args: argparse.Namespace) -> None:
    import torch
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    from bench.engine.bench_engine import Prompts, decode_rate, generate
    from bench.engine.bench_profiles import Ctx, build

    on_gpu = torch.cuda.is_available()
    variant, _, shape = args.child.partition("@")
    trim = VARIANTS[variant]
    work = Path(args.work).expanduser()
    ns = argparse.Namespace(out=args.out, work=str(work), deadline=600.0)
    ctx = Ctx(ns, on_gpu)
    ctx.card_total = args.card_total or None
    folder, cfg = _model(work, shape or "hybrid-4b", on_gpu)
    _, kw, changes = build(ctx, PROFILE, "full", folder, cfg)
    if trim.compile and on_gpu:
        kw["compilation_config"] = {**kw.get("compilation_config", {}), **trim.compile}
    res: dict[str, Any] = {"item": args.child, "changes": changes, "env": trim.env}
    res["kwargs"] = {k: v for k, v in kw.items() if k != "model"}
    out = Path(args.out) / f"{_file_name(args.child)}.json"

    def save() -> None:
        out.write_text(json.dumps(res, indent=1, default=str))

    res["caches_at_start"] = _caches()
    res["before_start"] = footprint(os.getpid(), gpu=on_gpu).model_dump()
    t0 = time.perf_counter()
    if trim.inproc:
        from bench.engine.inproc import InprocLLM

        llm: Any = InprocLLM.from_engine_args(kw)
    else:
        llm = AsyncLLM.from_engine_args(AsyncEngineArgs(**kw))
    res["start_s"] = round(time.perf_counter() - t0, 1)
    try:
        res["after_load"] = await _probe(llm, on_gpu)
        save()
        p = Prompts(cfg["vocab_size"], seed=7)
        await generate(llm, p.fresh(256), 8)  # warm-up
        n = 256 if on_gpu else 32
        rates = [decode_rate(await generate(llm, p.fresh(64), n)) for _ in range(3)]
        res["decode_tok_s"] = round(sorted(rates)[1], 1)
        prefix = p.fresh(PREFIX if on_gpu else 1024)
        segment = p.fresh(SEGMENT if on_gpu else 256)
        res["ttft_prefix_s"] = round((await generate(llm, prefix, 1)).ttft, 3)
        appended = await generate(llm, prefix + segment, 1)
        res["ttft_append_s"], res["append_cached"] = round(appended.ttft, 3), appended.cached
        alone = await generate(llm, p.fresh(SEGMENT if on_gpu else 256), 1)
        res["ttft_segment_s"] = round(alone.ttft, 3)
        res["after_run"] = await _probe(llm, on_gpu)
        save()
        if args.soak > 0:
            from bench.engine.soak_appends import soak

            res["soak"] = await soak(llm, p.fresh, generate, seconds=args.soak,
                                     window_tokens=int(kw["max_model_len"]),
                                     segment=SEGMENT if on_gpu else 256, on_gpu=on_gpu)  # fmt: skip
            save()
    finally:
        llm.shutdown()
    save()


# -- the parent: items in turn, the bare context, the tables ---------------------------------


def bare_context() -> dict[str, Any]:
    """NVML's figure for a process that initialised CUDA and cuBLAS and nothing else."""
    code = (
        "import json, os, torch; a = torch.ones(256, 256, device='cuda'); (a @ a).sum().item(); "
        "from agent.footprint import nvml_by_pid, footprint; "
        "g, src = nvml_by_pid(); f = footprint(os.getpid(), gpu=False); "
        "print(json.dumps({'gpu': g.get(os.getpid()), 'source': src, 'rss': f.processes[0].rss, "
        "'torch_reserved': torch.cuda.memory_reserved()}))"
    )
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120, check=False)  # fmt: skip
    lines = [ln for ln in run.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1]) if lines else {"error": run.stderr[-600:]}


def _card_total() -> int:
    """The first GPU's bytes from NVML (this process must not initialise CUDA: the children
    do), 0 without one."""
    from agent.footprint import load_nvml

    nv = load_nvml()
    if nv is None:
        return 0
    try:
        nv.nvmlInit()
        return int(nv.nvmlDeviceGetMemoryInfo(nv.nvmlDeviceGetHandleByIndex(0)).total)
    except Exception:  # NVMLError: no driver, no GPU
        return 0


def _run_child(cmd: list[str], env: dict[str, str], log: Any, timeout_s: float) -> int | str:
    """The child's return code, or "timeout". The child leads its own process group, so a
    timeout ends vLLM's engine core with it (a grandchild left holding GPU memory would
    skew every later item)."""
    proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return "timeout"


def parent(args: argparse.Namespace) -> None:
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    prov = provenance("bench.engine.bench_runtime")
    t0 = time.monotonic()
    card = _card_total()
    results: dict[str, Any] = {"card_total_bytes": card, "items": {}}
    results["bare_context"] = bare_context() if card else {"device": "cpu"}
    write_result(out, "results", prov, data=results)
    soaks = set(args.soak_items.split(",")) if args.soak_items else set(args.items.split(","))
    for item in args.items.split(","):
        variant = item.partition("@")[0]
        if variant not in VARIANTS:
            raise SystemExit(f"item {item!r}: VARIANT[@hybrid-4b|@hybrid-2b], VARIANT in "
                             f"{', '.join(VARIANTS)}")  # fmt: skip
        left = args.deadline - (time.monotonic() - t0)
        if left < 60:
            results["items"][item] = {"skipped": f"deadline: {left:.0f} s left"}
            continue
        env = {**os.environ, **VARIANTS[variant].env}
        cmd = [sys.executable, __file__, "--child", item, "--out", str(out), "--work", args.work,
               "--card-total", str(card),
               "--soak", str(args.soak if item in soaks else 0)]  # fmt: skip
        began = time.monotonic()
        got = out / f"{_file_name(item)}.json"
        got.unlink(missing_ok=True)  # a reused --out: never report an earlier run's figures
        with (out / f"{_file_name(item)}-log.txt").open("wb") as log:
            rc = _run_child(cmd, env, log, left - 20)
        entry = json.loads(got.read_text()) if got.exists() else {}
        entry |= {"rc": rc, "wall_s": round(time.monotonic() - began, 1)}
        results["items"][item] = entry
        write_result(out, "results", prov, data=results)
        print(f"[{item}] rc={rc} {json.dumps(brief(entry))}", flush=True)
    text = report(results)
    write_result(out, "table", prov, text=text)
    print(text)


# -- reading the results ---------------------------------------------------------------------


def roles(tree: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The tree's processes as frontend (the root), engine core, and the rest."""
    out: dict[str, list[dict[str, Any]]] = {"frontend": [], "engine core": [], "other": []}
    for p in tree["processes"]:
        if p["pid"] == tree["root_pid"]:
            out["frontend"].append(p)
        elif p["name"].startswith("VLLM::") or p.get("gpu_bytes"):
            out["engine core"].append(p)
        else:
            out["other"].append(p)
    return out


def split(entry: dict[str, Any], at: str = "after_run") -> dict[str, Any] | None:
    snap = entry.get(at) or entry.get("after_load")
    if not snap:
        return None
    tree, worker = snap["tree"], snap.get("worker") or {}
    r = roles(tree)
    gpu = sum(p.get("gpu_bytes") or 0 for p in tree["processes"])
    reserved = worker.get("reserved") or 0
    host_rss = sum(p["rss"] for p in tree["processes"])
    host_pss = sum(p["pss"] for p in tree["processes"])
    non_torch = gpu - reserved if gpu and reserved else 0
    return {
        "frontend_rss": sum(p["rss"] for p in r["frontend"]),
        "frontend_pss": sum(p["pss"] for p in r["frontend"]),
        "core_rss": sum(p["rss"] for p in r["engine core"]),
        "core_pss": sum(p["pss"] for p in r["engine core"]),
        "anon": sum(p["anonymous"] for p in tree["processes"]),
        "other_n": len(r["other"]),
        "other_pss": sum(p["pss"] for p in r["other"]),
        "host_rss": host_rss,
        "host_pss": host_pss,
        "gpu": gpu,
        "reserved": reserved,
        "non_torch": non_torch,
        "runtime_rss": host_rss + non_torch,
        "runtime_pss": host_pss + non_torch,
    }


def brief(entry: dict[str, Any]) -> dict[str, Any]:
    s = split(entry) or {}
    keys = ("start_s", "decode_tok_s", "ttft_append_s", "ttft_segment_s")
    return {**{k: entry.get(k) for k in keys}, "runtime_pss_gib": _g(s.get("runtime_pss"))}


def _start(entry: dict[str, Any]) -> str | None:
    caches = entry.get("caches_at_start")
    if entry.get("start_s") is None:
        return None
    if caches is None:
        return f"{entry['start_s']}"
    return f"{entry['start_s']} ({'warm' if any(caches.values()) else 'cold'})"


def _g(value: int | None) -> str | None:
    return None if not value else f"{value / GIB:.2f}"


def _ratio(a: float | None, b: float | None) -> str | None:
    return None if not a or not b else f"{a / b:.2f}"


def merge(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """Several commands' results as one: their items in order, each command's provenance."""
    out: dict[str, Any] = {**parts[0], "items": {}, "runs": []}
    for part in parts:
        out["items"] |= part["items"]
        out["runs"].append(part.get("provenance"))
    return out


def report(results: dict[str, Any]) -> str:
    items = {k: v for k, v in results["items"].items() if split(v)}
    rows = []
    for label, e in items.items():
        s = split(e)
        assert s is not None
        ref = _reference(items, label)
        b = split(ref) if ref else None
        ref = ref or {}
        rows.append([
            label, _start(e),
            f"{_g(s['frontend_rss'])} / {_g(s['frontend_pss'])}",
            f"{_g(s['core_rss'])} / {_g(s['core_pss'])}",
            f"{s['other_n']}: {_g(s['other_pss']) or '0'}", _g(s["anon"]),
            _g(s["gpu"]), _g(s["reserved"]), _g(s["non_torch"]),
            _g(s["runtime_rss"]), _g(s["runtime_pss"]),
            _ratio(s["runtime_pss"], b["runtime_pss"]) if b else None,
            e.get("decode_tok_s"), _ratio(e.get("decode_tok_s"), ref.get("decode_tok_s")),
            e.get("ttft_append_s"), _ratio(e.get("ttft_append_s"), ref.get("ttft_append_s")),
            e.get("ttft_segment_s"),
        ])  # fmt: skip
    head = ["item", "start s (caches)", "frontend RSS / PSS GiB", "engine core RSS / PSS GiB",
            "other processes: PSS", "anonymous GiB", "GPU (NVML) GiB", "torch reserved GiB",
            "GPU outside torch GiB", "runtime, RSS sum GiB", "runtime, PSS GiB",
            "runtime / ref", "decode tok/s", "decode / ref", "TTFT 4.5K on 16K s",
            "TTFT / ref", "TTFT 4.5K alone s"]  # fmt: skip
    parts = ["# vLLM's runtime under orin-nx-8gb's caps", "", md_table(head, rows), ""]
    for prov in results.get("runs") or []:
        if prov:
            parts.append(f"Revision {prov['revision']}; `{prov['command']}`; {prov['machine']}; "
                         f"{prov['at']}.\n")  # fmt: skip
    ctx = results.get("bare_context") or {}
    if ctx.get("gpu"):
        parts.append(f"A bare CUDA context (torch, one cuBLAS matmul): {_g(ctx['gpu'])} GiB of "
                     f"GPU, {_g(ctx.get('rss'))} GiB RSS.\n")  # fmt: skip
    for label, e in items.items():
        snap = e.get("after_run") or e.get("after_load")
        r = roles(snap["tree"])
        kind_rows = []
        for kind in KINDS:
            cells: list[object] = [kind]
            for role in ("frontend", "engine core", "other"):
                procs = r[role]
                pss = sum((p["kinds"].get(kind) or {}).get("pss", 0) for p in procs)
                anon = sum((p["kinds"].get(kind) or {}).get("anonymous", 0) for p in procs)
                cells.append(f"{pss / 2**20:.0f} ({anon / 2**20:.0f} anon)")
            kind_rows.append(cells)
        table = md_table(["kind", "frontend", "engine core", "other"], kind_rows)
        parts += [f"**{label}**: host memory by kind, PSS MiB (anonymous)", "", table, ""]
    soaked = [(k, v["soak"]["summary"]) for k, v in results["items"].items() if v.get("soak")]
    if soaked:
        parts += [
            "**Appends to a rolling window** (bench/engine/soak_appends.py)",
            "",
            md_table(
                [
                    "item",
                    "span s",
                    "appends",
                    "append TTFT p50 / p95 s",
                    "slides",
                    "slide TTFT p50 s",
                    "RSS first -> last GiB",
                    "RSS MiB/h",
                    "GPU first -> last GiB",
                    "torch reserved first -> last GiB",
                ],
                [
                    [
                        k,
                        m["span_s"],
                        m["appends"],
                        f"{m['append_ttft_p50_s']} / {m['append_ttft_p95_s']}",
                        m["slides"],
                        m["slide_ttft_p50_s"],
                        f"{_g(m.get('rss_first'))} -> {_g(m.get('rss_last'))}",
                        m.get("rss_mib_per_h"),
                        f"{_g(m.get('gpu_first'))} -> {_g(m.get('gpu_last'))}",
                        f"{_g(m.get('torch_reserved_first'))} -> "
                        f"{_g(m.get('torch_reserved_last'))}",
                    ]
                    for k, m in soaked
                ],
            ),
            "",
        ]
    return "\n".join(parts)


def _reference(items: dict[str, Any], label: str) -> dict[str, Any] | None:
    """What an item's ratios are against: `again` of its shape (the profile on warm caches)
    where it ran, else `base` of its shape."""
    shape = label.partition("@")[2]
    for variant in ("again", "base"):
        found = items.get(f"{variant}@{shape}" if shape else variant)
        if found is not None:
            return dict(found)
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out")
    ap.add_argument("--items", default="base,arena,threads,nocompile,all")
    ap.add_argument("--deadline", type=float, default=560, help="seconds for the whole command")
    ap.add_argument("--work", default="~/ea-bench", help="stable folder: models, compile cache")
    ap.add_argument(
        "--report",
        type=Path,
        nargs="+",
        help="print the tables of these results.json (one run in several commands)",
    )
    ap.add_argument("--soak", type=float, default=0.0,
                    help="then append 4.5K segments to a rolling window for this many seconds "
                    "(bench/engine/soak_appends.py), each item")  # fmt: skip
    ap.add_argument("--soak-items", default="", help="the items that soak (default: all)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--card-total", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.report:
        print(report(merge([json.loads(path.read_text()) for path in args.report])))
        return
    if not args.out:
        ap.error("--out is required")
    os.environ.setdefault("EDGE_AGENT_CACHE_DIR", str(Path(args.work).expanduser() / "cache"))
    if args.child:
        asyncio.run(child(args))
    else:
        parent(args)


if __name__ == "__main__":
    main()
