"""What a transcript line costs in tokens: the line prefix before and after, per tokenizer.

    .venv/bin/python -m bench.context.line_cost            # prints, writes results/line-cost.md

Every segment of the hand-written quality set (bench/quality/set/), rendered as the window
renders it, counted with each bundled base's own tokenizer (converted at setup): the
prefix the service used until 2026-12-02 (`[#12 08:03:05] `, the segment's clock time) and
the one it uses now (`[#12] `, pipelines.analysis_prompt.render_line; the times that
matter are in the notes on dropped history), with segment numbers as the bench streams
have them and as a long-running stream has them (five digits). Also: how many segments a
4,096-token window (cpu-dev's budget, less a 700-token head) then holds.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from bench._common import machine, md_table
from pipelines.analysis_prompt import encode_texts, render_line

REPO = Path(__file__).resolve().parents[2]
SET = REPO / "bench" / "quality" / "set"
RESULTS = Path(__file__).resolve().parent / "results"
WINDOW, HEAD = 4096, 700


def old_line(seq: int, start: float, text: str) -> str:
    """The prefix before 2026-12-02 (kept here to measure it)."""
    clock = time.strftime("%H:%M:%S", time.gmtime(start))
    return f"[#{seq} {clock}] {' '.join(text.split())}\n"


def segments() -> dict[str, list[str]]:
    out: dict[str, list[str]] = {"en": [], "zh": []}
    for path in sorted(SET.glob("*.yaml")):
        for row in yaml.safe_load(path.read_text(encoding="utf-8")):
            out[row["lang"]].extend(row["segments"])
    return out


def measure(tokenizer: Any, texts: list[str], seq: int) -> tuple[float, float]:
    old = encode_texts(tokenizer, [old_line(seq, 1_790_000_000 + i, t)
                                   for i, t in enumerate(texts)], trusted=False)  # fmt: skip
    new = encode_texts(tokenizer, [render_line(seq, t) for t in texts], trusted=False)
    return sum(map(len, old)) / len(texts), sum(map(len, new)) / len(texts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.context.line_cost", description=__doc__)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    from agent.engine.model_prep import ensure_base

    rows = []
    texts = segments()
    for base in ("smollm2-135m-instruct", "gemma3-270m"):
        tok = AutoTokenizer.from_pretrained(str(ensure_base(base)), local_files_only=True)
        for lang, items in texts.items():
            chars = sum(len(t) for t in items) / len(items)
            for seq in (12, 48_213):
                old, new = measure(tok, items, seq)
                rows.append([base, lang, len(items), f"{chars:.1f}", seq, f"{old:.1f}",
                             f"{new:.1f}", f"{old - new:.1f}", f"{new / chars:.2f}",
                             int((WINDOW - HEAD) / old), int((WINDOW - HEAD) / new)])  # fmt: skip
    headers = ["tokenizer", "lang", "segments", "chars / segment", "segment number",
               "tokens / line, old prefix", "new prefix", "saved", "tokens / char (new)",
               "lines in a 4K window, old", "new"]  # fmt: skip
    rev = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                         capture_output=True, text=True, check=False).stdout.strip()  # fmt: skip
    command = shlex.join(["python", "-m", "bench.context.line_cost", *(argv or sys.argv[1:])])
    text = (f"# What a transcript line costs\n\nRevision {rev}; {machine()}; `{command}`\n\n"
            + md_table(headers, rows) + "\n")  # fmt: skip
    print(text)
    if not args.no_write:
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / "line-cost.md").write_text(text, encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
