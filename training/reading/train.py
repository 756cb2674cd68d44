"""Train the instant tier's reader (pipelines.reading) on hand-written sentences.

    .venv/bin/python -m training.reading.train                       # models/instant-reader/
    .venv/bin/python -m training.reading.train --parts dev,holdout --eval blind,blind2
                                   # another split, and a table on the parts held out

Data: training/reading/corpus/*.yaml (segments written by hand for this, each labelled
report or not and with its kind: corpus/README.md), and with `--parts` the streams of
bench/quality/set parts already used as development data (a keyword stream's evidence
segments are reports; a negative stream's segments are not). Every candidate match the
keyword tier finds in a segment (pipelines.detect.KeywordDetector.spans: phrases and
concepts, before any cue) is one example, its features those the service computes.

The model: logistic regression, class-balanced, L2, full-batch gradient descent with a
fixed number of steps from zero weights, so one command gives the same weights (to their
4th decimal, which is what the file keeps; numpy only here, the service reads the weights
with no numerical library). `trained_on` names every input file by its digest.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

REPO = Path(__file__).resolve().parents[2]
CORPUS = REPO / "training/reading/corpus"
SET_DIR = REPO / "bench/quality/set"
OUT = REPO / "models/instant-reader"
# The quality set's parts already read to develop the keyword tier (bench/quality/set/README.md);
# blind3 and later parts are kept for measuring.
DEV_PARTS = ("dev", "holdout", "blind", "blind2")
CONTEXT_UNITS = 8  # the daemon's context: the previous segment's last words

if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from agent.config.loader import load_config  # noqa: E402
from pipelines.detect import KeywordDetector  # noqa: E402
from pipelines.normalize import join_units, units  # noqa: E402
from pipelines.reading import READER_FORMAT, Reader, features  # noqa: E402


@dataclass(frozen=True)
class Example:
    feats: tuple[str, ...]
    label: int
    source: str


def detector(reader: Reader | None = None) -> KeywordDetector:
    cfg = load_config(REPO / "configs/agent.yaml", overrides=["llm.enabled=false"]).config
    return KeywordDetector(cfg.faults, cfg.keywords, reader)


def corpus_examples(
    det: KeywordDetector, files: Iterable[Path]
) -> tuple[list[Example], Counter[str]]:
    out: list[Example] = []
    seen: Counter[str] = Counter()
    for path in files:
        for item in yaml.safe_load(path.read_text(encoding="utf-8")):
            spans = det.spans(item["text"])
            own = [s for s in spans if s[0] == item["code"]] or spans
            seen["segments"] += 1
            seen["no candidate" if not own else "with a candidate"] += 1
            for _, seq, a, b, end, floor in own:
                feats = tuple(features(seq, a, b, end, floor))
                out.append(Example(feats, int(item["report"]), path.name))
    return out, seen


def part_examples(det: KeywordDetector, parts: Iterable[str]) -> list[Example]:
    out: list[Example] = []
    for part in parts:
        for st in yaml.safe_load((SET_DIR / f"{part}.yaml").read_text(encoding="utf-8")):
            tail: list[str] = []
            for i, text in enumerate(st["segments"]):
                context = join_units(tail[-CONTEXT_UNITS:])
                tail = (tail + [u.text for u in units(text)])[-CONTEXT_UNITS:]
                if st["kind"] != "negative" and i not in st["evidence"]:
                    continue  # talk around a fault: neither label is sure
                label = int(st["kind"] != "negative")
                for code, seq, a, b, end, floor in det.spans(text, context=context):
                    if label and code not in st["faults"]:
                        continue
                    out.append(Example(tuple(features(seq, a, b, end, floor)), label, part))
    return out


def fit(
    examples: list[Example], *, l2: float, steps: int, lr: float
) -> tuple[dict[str, float], float]:
    vocab: dict[str, int] = {}
    rows = [[vocab.setdefault(f, len(vocab)) for f in sorted(set(e.feats))] for e in examples]
    y = np.array([e.label for e in examples], dtype=np.float64)
    idx = np.concatenate([np.array(r, dtype=np.int64) for r in rows])
    owner = np.concatenate([np.full(len(r), i, dtype=np.int64) for i, r in enumerate(rows)])
    pos = y.sum()
    weight = np.where(y == 1, len(y) / (2 * pos), len(y) / (2 * (len(y) - pos)))
    w = np.zeros(len(vocab))
    b = 0.0
    for _ in range(steps):
        z = b + np.bincount(owner, weights=w[idx], minlength=len(y))
        p = 1.0 / (1.0 + np.exp(-z))
        g = weight * (p - y) / len(y)
        grad = np.bincount(idx, weights=g[owner], minlength=len(vocab)) + l2 * w
        w -= lr * grad
        b -= lr * float(g.sum())
    names = {i: f for f, i in vocab.items()}
    return {names[i]: round(float(v), 4) for i, v in enumerate(w) if abs(v) >= 1e-3}, round(b, 4)


def stream_table(
    det: KeywordDetector, parts: Iterable[str], base: KeywordDetector
) -> list[dict[str, Any]]:
    """Per part: streams found / alarmed, and per segment what `det` keeps of what `base`
    (the cues alone) raises: the keyword streams' evidence segments, the negatives' segments.
    The threshold rule reads the evidence segments kept (>= 0.97)."""
    rows = []
    for part in parts:
        c: Counter[str] = Counter()
        for st in yaml.safe_load((SET_DIR / f"{part}.yaml").read_text(encoding="utf-8")):
            tail: list[str] = []
            codes: set[str] = set()
            for i, text in enumerate(st["segments"]):
                context = join_units(tail[-CONTEXT_UNITS:])
                tail = (tail + [u.text for u in units(text)])[-CONTEXT_UNITS:]
                said = {m.code for m in det.detect(text, context=context, lang=st["lang"])}
                cued = {m.code for m in base.detect(text, context=context, lang=st["lang"])}
                codes |= said
                if st["kind"] == "keyword" and i in st["evidence"] and cued & set(st["faults"]):
                    c["evidence"] += 1
                    c["evidence kept"] += bool(said & set(st["faults"]))
                elif st["kind"] == "negative" and cued:
                    c["negative"] += 1
                    c["negative kept"] += bool(said)
            if st["kind"] == "keyword":
                c["kw"] += 1
                c["found"] += set(st["faults"]) <= codes
            elif st["kind"] == "negative":
                c["negs"] += 1
                c["neg"] += bool(codes)
                c["injs"] += st["negative"] == "injection"
                c["inj"] += bool(codes) and st["negative"] == "injection"
        rows.append(
            {
                "part": part,
                "keyword found": f"{c['found']}/{c['kw']}",
                "negatives alarmed": f"{c['neg']}/{c['negs']}",
                "injections alarmed": f"{c['inj']}/{c['injs']}",
                "evidence segments kept": f"{c['evidence kept']}/{c['evidence']}",
                "negative segments still raised": f"{c['negative kept']}/{c['negative']}",
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--parts", default=",".join(DEV_PARTS), help="development parts to train on as well"
    )
    ap.add_argument("--eval", default="", help="parts to print a table for (not trained on)")
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--l2", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=600)
    ap.add_argument("--lr", type=float, default=2.0)
    ap.add_argument("--threshold", type=float, default=0.15)
    ap.add_argument("--sweep", type=float, nargs="+", default=[0.05, 0.1, 0.15, 0.2, 0.3])
    args = ap.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    evals = [p for p in args.eval.split(",") if p]
    if set(parts) & set(evals):
        ap.error("a part cannot be trained on and evaluated")
    base = detector()
    files = sorted(CORPUS.glob("*.yaml"))
    examples, seen = corpus_examples(base, files)
    examples += part_examples(base, parts)
    weights, bias = fit(examples, l2=args.l2, steps=args.steps, lr=args.lr)
    labels = Counter(e.label for e in examples)
    model = {
        "format": READER_FORMAT,
        "threshold": args.threshold,
        "bias": bias,
        "trained_on": {
            "corpus": {f.name: hashlib.sha256(f.read_bytes()).hexdigest()[:16] for f in files},
            "parts": {
                p: hashlib.sha256((SET_DIR / f"{p}.yaml").read_bytes()).hexdigest()[:16]
                for p in parts
            },
            "examples": {"report": labels[1], "no report": labels[0]},
            "corpus segments": dict(seen),
            "l2": args.l2,
            "steps": args.steps,
            "lr": args.lr,
        },
        "weights": dict(sorted(weights.items())),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / "reader.json"
    path.write_text(json.dumps(model, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {path}: {len(weights)} weights from {len(examples)} examples {dict(labels)}")
    if evals:
        rows = [{"reader": "none", **r} for r in stream_table(base, evals, base)]
        for cut in args.sweep:
            read = detector(Reader.from_file(path, threshold=cut))
            rows += [{"reader": f"threshold {cut}", **r} for r in stream_table(read, evals, base)]
        heads = list(rows[0])
        print("| " + " | ".join(heads) + " |\n|" + "---|" * len(heads))
        for r in rows:
            print("| " + " | ".join(str(r[h]) for h in heads) + " |")


if __name__ == "__main__":
    main()
