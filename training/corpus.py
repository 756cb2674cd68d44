"""`python -m training.corpus`: the corpus the slow tier's model is tuned on.

Its ingredients (training/mix.py): hand-written streams (training/people/), windows joined
from them, and the seeded generator's streams, each rendered through the service's own
analyzer (training/render.py). Writes, into `--out`:
- `corpus.npz`: every example's prompt and target token ids (uint16 while the vocabulary
  fits, else uint32), the boundaries, the split (train / val by stream), the task, the
  language and the ingredient;
- `manifest.json`: the seed and mix, counts, token statistics, the hashes of the
  generator's sources, of the hand-written files and of the catalogue (the model card
  quotes them), and the corpus digest;
- `samples.md`: a few examples of each ingredient as text, for a person to read.

Deterministic: the same seed, mix, sources and tokenizer give the same bytes (each stream
draws from its own `random.Random`).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import io
import json
import logging
import random
import sys
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import structlog
import yaml

from pipelines.detect import FaultRule
from training.bank_en import BANK_EN
from training.bank_zh import BANK_ZH
from training.mix import INGREDIENTS, Mix, Tagged
from training.people import PEOPLE_DIR, kinds, load
from training.render import Example, Renderer
from training.streams import StreamMaker

__all__ = ["SOURCES", "build", "load_catalogue", "main", "people_digest", "source_digest"]

REPO = Path(__file__).resolve().parents[1]
# What an example depends on besides the seed: the generator, the prompt and the rules.
SOURCES = (
    "training/bank.py",
    "training/bank_en.py",
    "training/bank_zh.py",
    "training/noise.py",
    "training/streams.py",
    "training/render.py",
    "training/corpus.py",
    "training/mix.py",
    "training/people.py",
    "pipelines/analysis_prompt.py",
    "pipelines/analysis/__init__.py",
    "pipelines/analysis/settings.py",
    "pipelines/analysis/protocols.py",
    "pipelines/analysis/state.py",
    "pipelines/analysis/scheduler.py",
    "pipelines/analysis/window.py",
    "pipelines/analysis/answer.py",
    "pipelines/context.py",
    "pipelines/evidence.py",
    "pipelines/detect.py",
)
BANKS = {"en": BANK_EN, "zh": BANK_ZH}


def load_catalogue(config: Path) -> list[FaultRule]:
    """The `faults:` of an agent config file (the catalogue the service runs with)."""
    data = yaml.safe_load(config.read_text(encoding="utf-8"))
    return [FaultRule.model_validate(entry) for entry in data["faults"]]


def source_digest(root: Path = REPO) -> str:
    """sha256 over the generator's sources: the 'generator revision' of a model card."""
    h = hashlib.sha256()
    for rel in SOURCES:
        h.update(rel.encode() + b"\0" + (root / rel).read_bytes() + b"\0")
    return h.hexdigest()


def people_digest(folder: Path) -> str:
    """sha256 over the hand-written files (names and bytes), in name order."""
    h = hashlib.sha256()
    for path in sorted(folder.glob("*.jsonl")):
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _catalogue_digest(rules: Sequence[FaultRule]) -> str:
    body = json.dumps([r.model_dump(mode="json") for r in rules], sort_keys=True)
    return hashlib.sha256(body.encode()).hexdigest()


async def _render_all(
    renderer: Renderer, maker: StreamMaker, seed: int, mix: Mix
) -> list[tuple[Tagged, Example]]:
    out: list[tuple[Tagged, Example]] = []
    for index, (tag, stream) in enumerate(mix.streams(seed, maker)):
        rng = random.Random(f"{seed}:render:{index}")
        for example in await renderer.render(stream, rng):
            out.append((tag, example))
    return out


def build(
    *, tokenizer: Any, catalogue: Sequence[FaultRule], seed: int, mix: Mix, budget: int
) -> tuple[list[tuple[Tagged, Example]], dict[str, Any]]:
    """Render the mix; returns (tag, example) pairs and statistics."""
    maker = StreamMaker(BANKS, catalogue)
    renderer = Renderer(tokenizer, catalogue, BANKS, budget=budget)
    examples = asyncio.run(_render_all(renderer, maker, seed, mix))
    stats = {
        "generator_streams": mix.generator_streams,
        "people_records": len(mix.people),
        "people_passes": mix.people_passes,
        "joined_windows": mix.joined,
        "people_kinds": kinds(mix.people),
        "examples": len(examples),
        "dropped_examples": renderer.dropped,
        "redrawn_clauses": maker.rejected_clauses,
    }
    return examples, stats


def _describe(examples: Sequence[tuple[Tagged, Example]]) -> dict[str, Any]:
    analysis = [e for _, e in examples if e.task == "analysis"]
    by_codes = Counter(len(e.codes) for e in analysis)
    prompt_tokens = sorted(len(e.prompt) for _, e in examples)
    return {
        "analysis": len(analysis),
        "summary": sum(1 for _, e in examples if e.task == "summary"),
        "negative_answers": by_codes.get(0, 0),
        "positive_answers": len(analysis) - by_codes.get(0, 0),
        "faults_per_answer": {str(k): v for k, v in sorted(by_codes.items())},
        "by_code": dict(sorted(Counter(c for e in analysis for c in e.codes).items())),
        "by_lang": dict(sorted(Counter(e.lang for _, e in examples).items())),
        "by_source": dict(sorted(Counter(t.source for t, _ in examples).items())),
        "with_drops": sum(1 for _, e in examples if e.drops),
        "prompt_tokens": {
            "total": sum(prompt_tokens),
            "median": prompt_tokens[len(prompt_tokens) // 2] if prompt_tokens else 0,
            "max": prompt_tokens[-1] if prompt_tokens else 0,
        },
    }


def write(
    out: Path,
    examples: Sequence[tuple[Tagged, Example]],
    tokenizer: Any,
    manifest: dict[str, Any],
) -> dict[str, Any]:
    import numpy as np

    out.mkdir(parents=True, exist_ok=True)
    eos = int(tokenizer.eos_token_id)
    prompts: list[int] = []
    targets: list[int] = []
    p_off, t_off = [0], [0]
    split, task, lang, source = [], [], [], []
    for tag, example in examples:
        ids = [*tokenizer.encode(example.target, add_special_tokens=False), eos]
        prompts.extend(example.prompt)
        targets.extend(ids)
        p_off.append(len(prompts))
        t_off.append(len(targets))
        split.append(1 if tag.val else 0)
        task.append(1 if example.task == "summary" else 0)
        lang.append(1 if example.lang == "zh" else 0)
        source.append(INGREDIENTS.index(tag.source))
    # uint16 while the vocabulary fits (SmolLM2's 49,152), else uint32 (Gemma's 262,144)
    dtype = np.uint16 if max(prompts + targets, default=0) < 1 << 16 else np.uint32
    arrays: dict[str, Any] = {
        "prompt_ids": np.asarray(prompts, dtype=dtype),
        "prompt_offsets": np.asarray(p_off, dtype=np.int64),
        "target_ids": np.asarray(targets, dtype=dtype),
        "target_offsets": np.asarray(t_off, dtype=np.int64),
        "val": np.asarray(split, dtype=np.uint8),
        "summary": np.asarray(task, dtype=np.uint8),
        "zh": np.asarray(lang, dtype=np.uint8),
        "source": np.asarray(source, dtype=np.uint8),
    }
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    data = buf.getvalue()
    (out / "corpus.npz").write_bytes(data)
    digest = hashlib.sha256(b"".join(a.tobytes() for a in arrays.values())).hexdigest()
    manifest = {
        **manifest,
        "val_examples": int(sum(split)),
        "target_tokens": len(targets),
        "corpus_sha256": digest,
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n", encoding="utf-8")
    (out / "samples.md").write_text(_samples(examples, tokenizer), encoding="utf-8")
    return manifest


def _samples(examples: Sequence[tuple[Tagged, Example]], tokenizer: Any, n: int = 6) -> str:
    chosen: list[Example] = []
    for source in INGREDIENTS:
        short = [e for t, e in examples if t.source == source and len(e.prompt) < 1500]
        chosen += [e for e in short if e.task == "analysis"][: n // 2]
    chosen += [e for _, e in examples if e.task == "summary"][:1]
    parts = ["# Corpus samples (prompt as the model reads it, then the target)\n"]
    for e in chosen:
        parts.append(f"\n## {e.task}, {e.lang}, {e.lines} lines, faults {list(e.codes)}\n")
        parts.append("```\n" + tokenizer.decode(e.prompt) + "\n--- target ---\n" + e.target)
        parts.append("\n```\n")
    return "".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.corpus", description=__doc__)
    parser.add_argument("--out", type=Path, default=REPO / "build" / "corpus")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--streams", type=int, default=2000, help="generator streams (0: hand-written only)"
    )
    parser.add_argument(
        "--people",
        type=Path,
        default=PEOPLE_DIR,
        help="folder of hand-written *.jsonl records ('none': the generator alone)",
    )
    parser.add_argument("--people-passes", type=int, default=2, help="renderings of each record")
    parser.add_argument("--joined", type=int, default=600, help="windows joined from records")
    parser.add_argument("--budget", type=int, default=4096, help="cpu-dev's llm.context_tokens")
    parser.add_argument("--config", type=Path, default=REPO / "configs" / "agent.yaml")
    parser.add_argument("--tokenizer", type=Path, default=None, help="default: the base model")
    args = parser.parse_args(argv)
    # The analyzer logs every analysis and withheld segment: thousands here, none useful.
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))

    from transformers import AutoTokenizer

    from agent.engine.model_prep import ensure_default_model

    model_dir = args.tokenizer or ensure_default_model()
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir), local_files_only=True)
    catalogue = load_catalogue(args.config)
    people = [] if str(args.people) == "none" else load(args.people)
    mix = Mix(
        args.streams,
        people,
        args.people_passes,
        args.joined if people else 0,
    )
    examples, stats = build(
        tokenizer=tokenizer, catalogue=catalogue, seed=args.seed, mix=mix, budget=args.budget
    )
    manifest = {
        "seed": args.seed,
        "budget": args.budget,
        **stats,
        **_describe(examples),
        "generator_sha256": source_digest(),
        "people_sha256": people_digest(args.people) if people else None,
        "catalogue_sha256": _catalogue_digest(catalogue),
        "tokenizer": str(model_dir),
    }
    manifest = write(args.out, examples, tokenizer, manifest)
    json.dump(manifest, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
