#!/usr/bin/env bash
# Retrain the shipped adapter (models/smollm2-135m-edge) from nothing, the way it was made.
#
#   bash training/reproduce.sh [OUT]          # default OUT: build/retrain
#
# Needs: the project's venv (`make setup`: the corpus generator and the converted base) and,
# for the two training stages, a CUDA GPU with torch, transformers and peft (PY_TRAIN, the
# python that has them; the lent H200's image has them as `python3`). Two stages, each a
# corpus at the generator revision it was made with (git worktrees of the commits the model
# card names), then LoRA training; stage 2 continues from stage 1. The corpus digests in
# OUT/stage*/corpus/manifest.json must equal the model card's. docs/training.md has the
# recipe for a machine that is only lent for minutes (corpora made here, carried there).
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-build/retrain}
PY=${PY:-$PWD/.venv/bin/python}
PY_TRAIN=${PY_TRAIN:-python3}
BASE=$("$PY" -c 'from agent.engine import ensure_default_model; print(ensure_default_model())')
mkdir -p "$OUT"

corpus() {  # corpus REVISION SEED STREAMS DIR
  local tree="$OUT/tree-$1"
  [ -d "$tree" ] || git worktree add --detach "$tree" "$1" >/dev/null
  (cd "$tree" && PYTHONPATH=. "$PY" -m training.corpus --seed "$2" --streams "$3" --out "$4" >/dev/null)
  python3 -c "import json,sys; print('corpus', sys.argv[1], json.load(open(sys.argv[1]+'/manifest.json'))['corpus_sha256'])" "$4"
}

corpus 9a54125 1 4500 "$PWD/$OUT/stage1/corpus"
corpus 8177505 2 3000 "$PWD/$OUT/stage2/corpus"

"$PY_TRAIN" training/train.py --corpus "$OUT/stage1/corpus" --base "$BASE" --out "$OUT/stage1" \
  --rank 32 --alpha 64 --lr 4e-4 --epochs 2.5 --decision-weight 5 --eval-every 300 --seed 1
"$PY_TRAIN" training/train.py --corpus "$OUT/stage2/corpus" --base "$BASE" --out "$OUT/stage2" \
  --init-adapter "$OUT/stage1" --rank 32 --alpha 64 --lr 2e-4 --epochs 1.0 --decision-weight 5 \
  --eval-every 100000 --quick --seed 1
echo "adapter: $OUT/stage2 (copy adapter_model.safetensors and adapter_config.json into models/smollm2-135m-edge)"
