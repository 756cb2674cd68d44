"""What the keyword tier's detector costs per segment, one tree against another, in one run.

    .venv/bin/python bench/detect_cost.py --baseline /tmp/old [--passes 5]

For each tree (the baseline first, then this one), a child interpreter with that tree on
PYTHONPATH builds the detector from the tree's own configs/agent.yaml (with the reader
where the tree's daemon has one) and times `detect()` on every segment of
bench/quality/set/dev.yaml and on the sentences
bench/alert_latency.py sends, each with a few words of context as the daemon passes them.
A segment's time is the fastest of `--passes` passes (on a shared host the slower ones
measure the neighbours). Prints a markdown table: p50, p95 and max in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench._common import md_table  # noqa: E402

SET = REPO / "bench" / "quality" / "set" / "dev.yaml"
LATENCY_PHRASES = [
    "bearing abnormal noise on roller {n}",
    "temperature over limit at zone {n}",
    "motor overload alarm on press {n}",
    "轴承异响，{n}号工位",
    "belt slipping on conveyor {n}",
]

_CHILD = """
import json, statistics, sys, time, yaml
from pathlib import Path
from agent.config import load_config
from pipelines.detect import KeywordDetector
tree, set_path, passes = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
phrases = json.loads(sys.argv[4])
cfg = load_config(tree / "configs" / "agent.yaml", overrides=["llm.enabled=false"]).config
try:  # the detector as the tree's daemon builds it (with its reader, where it has one)
    from agent.reader import keyword_detector
    det = keyword_detector(cfg.faults, cfg.keywords)
except ImportError:
    det = KeywordDetector(cfg.faults, cfg.keywords)
sets = {
    "dev segments": [t for s in yaml.safe_load(open(set_path)) for t in s["segments"]],
    "alert_latency sentences": [p.format(n=n) for n in range(20) for p in phrases],
}
out = {}
for name, texts in sets.items():
    best = [float("inf")] * len(texts)
    for _ in range(passes):
        for i, t in enumerate(texts):
            t0 = time.perf_counter()
            det.detect(t, context="the line is running ok now")
            best[i] = min(best[i], (time.perf_counter() - t0) * 1000)
    ms = sorted(best)
    out[name] = [len(ms), statistics.median(ms), ms[int(len(ms) * 0.95)], ms[-1]]
print(json.dumps(out))
"""


def measure(tree: Path, passes: int) -> dict[str, list[float]]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, str(tree), str(SET), str(passes),
         json.dumps(LATENCY_PHRASES)],
        env=env, cwd=tree, capture_output=True, text=True, check=True,
    )  # fmt: skip
    result: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="a checkout of another commit, measured first")
    ap.add_argument("--passes", type=int, default=5)
    args = ap.parse_args()
    trees = [("old", args.baseline.resolve())] if args.baseline else []
    trees.append(("new", REPO))
    rows = [
        [label, name, f"{n:.0f}", f"{p50:.2f}", f"{p95:.2f}", f"{top:.2f}"]
        for label, tree in trees
        for name, (n, p50, p95, top) in measure(tree, args.passes).items()
    ]
    print(md_table(["tree", "segments", "n", "p50 ms", "p95 ms", "max ms"], rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
