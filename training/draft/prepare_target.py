"""The tuned model on a machine with only the GGUF: convert the base, merge the adapter.

    python training/draft/prepare_target.py --gguf SmolLM2-135M-Instruct.Q4_1.gguf \
        --adapter models/smollm2-135m-edge --work DIR     # -> DIR/base, DIR/tuned

The same steps as setup (training/train.py's convert_gguf: agent/engine/model_prep.py's
conversion; agent/engine/lora.py's merge, loaded by path so that the service's
dependencies are not needed), so the merged weights are those the service serves. Prints
the base digest against the one the adapter was trained on, and the merged digest.
Idempotent: a finished folder is kept.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[2]


def _module(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--gguf", type=Path, required=True)
    ap.add_argument("--adapter", type=Path, default=REPO / "models" / "smollm2-135m-edge")
    ap.add_argument("--work", type=Path, required=True)
    args = ap.parse_args(argv)
    lora = _module("edge_lora", REPO / "agent/engine/lora.py")
    train = _module("edge_train", REPO / "training/train.py")
    base, tuned = args.work / "base", args.work / "tuned"
    if not (base / "model.safetensors").is_file():
        tmp = args.work / "base.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        train.convert_gguf(args.gguf, tmp)
        tmp.rename(base)
    base_sha = lora.weights_digest(base / "model.safetensors")
    meta = json.loads((args.adapter / "adapter_meta.json").read_text())
    print(
        f"base sha256 {base_sha} (adapter trained on {meta.get('base_weights_sha256')}: "
        f"{'same' if base_sha == meta.get('base_weights_sha256') else 'DIFFERENT'})",
        flush=True,
    )
    if not (tuned / "model.safetensors").is_file():
        from safetensors.torch import load_file, save_file

        tmp = args.work / "tuned.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for item in base.iterdir():
            if item.is_file() and item.suffix != ".safetensors" and not item.name.startswith("."):
                shutil.copy2(item, tmp / item.name)
        config = json.loads((args.adapter / lora.ADAPTER_CONFIG).read_text())
        merged = lora.merge_lora(
            load_file(str(base / "model.safetensors")),
            load_file(str(args.adapter / lora.ADAPTER_WEIGHTS)),
            config,
        )
        save_file({k: v.contiguous() for k, v in merged.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})  # fmt: skip
        tmp.rename(tuned)
    print(f"tuned {tuned} sha256 {lora.weights_digest(tuned / 'model.safetensors')}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
