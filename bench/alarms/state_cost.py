"""What the alarm states cost per alert: segment -> alert p50/p95 at a base revision and here.

The same benchmark (bench/alert_latency.py: real mosquitto, `edge-agent run` with the keyword
tier alone, paced and burst phases) run alternately from a git worktree of `--base` (by
default the commit before the alarm states landed) and from this checkout, `--rounds` times
each (base, here, base, here, ...), so that both see the same machine state. Both run with
this checkout's virtual environment. The table quotes, per phase, the median over rounds of
each round's p50 and p95, and the ratio here / base (issue 32's target: p95 within 10 %).

    .venv/bin/python -m bench.alarms.state_cost --base 5a87e53 --rounds 3 --out bench/alarms/results

Writes OUT/state_cost.md (the table, with revision, command and machine) and
OUT/state_cost.json (every round's figures).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench._common import md_table, provenance, write_result  # noqa: E402

BASE = "5a87e53"  # main before issue 32's alarm states
PHASES = ("paced", "burst")


def run_once(root: Path, work: Path, tag: str, segments: int) -> dict[str, Any]:
    """One bench/alert_latency.py run from `root`; its JSON."""
    out = work / f"{tag}.json"
    cmd = [sys.executable, str(root / "bench" / "alert_latency.py"), "--segments",
           str(segments), "--json", str(out)]  # fmt: skip
    done = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=900, check=False)
    if done.returncode != 0 or not out.exists():
        raise SystemExit(f"{tag}: rc {done.returncode}\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
    data: dict[str, Any] = json.loads(out.read_text())
    return data


def summary(rounds: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per phase: the median over rounds of p50 and p95 (ms)."""
    return {
        phase: {
            key: statistics.median(r["phases"][phase][key] for r in rounds)
            for key in ("p50_ms", "p95_ms")
        }
        for phase in PHASES
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=BASE, help="the revision to compare against")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--segments", type=int, default=300)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "alarms" / "results")
    args = ap.parse_args()
    prov = provenance("bench.alarms.state_cost")
    work = Path(tempfile.mkdtemp(prefix="edge-agent-statecost-"))
    tree = work / "base"
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", str(tree), args.base],
                   check=True, capture_output=True)  # fmt: skip
    runs: dict[str, list[dict[str, Any]]] = {"base": [], "here": []}
    try:
        for i in range(args.rounds):
            for tag, root in (("base", tree), ("here", REPO)):
                got = run_once(root, work, f"{tag}-{i}", args.segments)
                runs[tag].append(got)
                brief = {p: round(got["phases"][p]["p95_ms"], 1) for p in PHASES}
                print(f"round {i} {tag}: p95 ms {brief}", flush=True)
    finally:
        subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                       check=False, capture_output=True)  # fmt: skip
    base, here = summary(runs["base"]), summary(runs["here"])
    rows = [
        [phase, f"{base[phase]['p50_ms']:.1f}", f"{here[phase]['p50_ms']:.1f}",
         f"{base[phase]['p95_ms']:.1f}", f"{here[phase]['p95_ms']:.1f}",
         f"{here[phase]['p95_ms'] / base[phase]['p95_ms']:.2f}"]
        for phase in PHASES
    ]  # fmt: skip
    headers = ["phase", "base p50 ms", "here p50 ms", "base p95 ms", "here p95 ms",
               "p95 here / base"]  # fmt: skip
    text = (
        "# What the alarm states cost per alert (segment -> alert, keyword tier)\n\n"
        f"Base {args.base} (before the alarm states) against this checkout, "
        f"{args.rounds} alternating rounds of bench/alert_latency.py ({args.segments} "
        "segments a phase, 10 streams); medians over rounds of each round's p50 and p95.\n\n"
        + md_table(headers, rows)
    )
    write_result(args.out, "state_cost", prov, text=text,
                 data={"base": args.base, "rounds": runs})  # fmt: skip
    print(text)


if __name__ == "__main__":
    main()
