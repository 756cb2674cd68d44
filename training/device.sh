#!/usr/bin/env bash
# The slow tier's candidates on a GPU machine: the bases from their GGUFs, the corpora made
# here, trainings side by side on the one GPU, adapters returned in parts.
#
#   bash training/device.sh train NAME...   # train these candidates at once (CANDIDATES below)
#   bash training/device.sh pack NAME...    # their adapters and reports into $OUT, split < 16 MB
#
# Needs: torch, transformers, peft, safetensors (the lent H200's image has them as python3);
# in $CARRY (default $HOME/carry) the GGUF parts (smollm2.gguf.part.*, gemma.gguf.part.*),
# the gguf wheel (gguf-*.whl) and the corpora as made by training/reproduce.sh
# (corpora.tar: smol-gen/, smol-people/, smol-mix/, gemma-mix/). Everything it builds stays
# in $WORK (default $HOME/slow) for the next stage on the same machine. BUDGET_S (default
# 540) is a stage's wall-clock budget: every training plans its steps to end inside it.
# TRAIN_ARGS adds options to every training (a CPU smoke run: "--max-examples 40
# --batch-tokens 4000").
# The GGUF digests it prints must equal those setup checks (agent/engine/bases.py).
set -uo pipefail
cd "$(dirname "$0")/.."
STAGE=${1:?train or pack}; shift
WORK=${WORK:-$HOME/slow}
CARRY=${CARRY:-$HOME/carry}
OUT=${OUT:-/tmp/slow-out}
BUDGET_S=${BUDGET_S:-540}
PY=${PY:-python3}
START=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
export PYTHONPATH=$WORK/site-gguf:$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$WORK" "$OUT"
exec > >(tee -a "$OUT/log-$STAGE.txt") 2>&1
say() { echo "[device.sh $STAGE +$(( $(date +%s) - START ))s] $*"; }

# name: base corpus mode settings (one candidate each; docs/training.md has the table)
declare -A CANDIDATES=(
  [smol-gen]="smollm2 smol-gen --rank 16 --alpha 32 --lr 4e-4 --epochs 2"
  [smol-people]="smollm2 smol-people --rank 16 --alpha 32 --lr 4e-4 --epochs 2"
  [smol-mix]="smollm2 smol-mix --rank 16 --alpha 32 --lr 4e-4 --epochs 2"
  [smol-full]="smollm2 smol-mix --full --export-rank 32 --lr 5e-5 --epochs 2"
  [gemma-lora]="gemma gemma-mix --rank 16 --alpha 32 --lr 4e-4 --epochs 2"
  [gemma-full]="gemma gemma-mix --full --export-rank 32 --lr 5e-5 --epochs 2"
)

prepare() {
  if [ ! -d "$WORK/site-gguf/gguf" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site-gguf" \
      "$CARRY"/gguf-*.whl || return 1
  fi
  for b in smollm2 gemma; do
    local g=$WORK/$b.gguf
    if [ ! -f "$g" ] && ls "$CARRY/$b.gguf.part."* >/dev/null 2>&1; then
      cat "$CARRY/$b.gguf.part."* > "$g.tmp" && mv "$g.tmp" "$g"
      say "$b gguf sha256 $(sha256sum "$g" | cut -c1-64)"
    fi
  done
  if [ ! -d "$WORK/corpora" ] && [ -f "$CARRY/corpora.tar" ]; then
    mkdir -p "$WORK/corpora" && tar -xf "$CARRY/corpora.tar" -C "$WORK/corpora"
  fi
}

case "$STAGE" in
  train)
    prepare || { say "prepare failed"; exit 1; }
    for name in "$@"; do
      read -r base corpus settings <<< "${CANDIDATES[$name]:?unknown candidate $name}"
      # the first run of a base converts it; the others wait for its folder
      [ -f "$WORK/base-$base/model.safetensors" ] || \
        "$PY" -c "import sys; sys.path.insert(0, '.'); from training.train import convert_gguf; from pathlib import Path; convert_gguf(Path('$WORK/$base.gguf'), Path('$WORK/base-$base'))"
      T=$(( BUDGET_S - ($(date +%s) - START) - 90 ))
      say "$name: $base on $corpus ($settings), at most ${T}s"
      # shellcheck disable=SC2086
      "$PY" training/train.py --corpus "$WORK/corpora/$corpus" --base "$WORK/base-$base" \
        --out "$WORK/out/$name" --max-seconds "$T" --eval-every 100000 --seed 1 $settings ${TRAIN_ARGS:-} \
        > "$WORK/$name.log" 2>&1 &
    done
    wait
    for name in "$@"; do
      tail -n 3 "$WORK/$name.log"
      [ -f "$WORK/out/$name/train_report.json" ] && cp "$WORK/out/$name/train_report.json" "$OUT/$name-report.json"
    done
    ;;
  pack)
    for name in "$@"; do
      d=$WORK/out/$name
      [ -f "$d/adapter_model.safetensors" ] || { say "$name: no adapter (see $WORK/$name.log)"; tail -n 20 "$WORK/$name.log"; continue; }
      tar -cf "$WORK/$name.tar" -C "$d" adapter_config.json adapter_model.safetensors train_report.json loss.csv
      split -b 15000000 -d "$WORK/$name.tar" "$OUT/$name.tar.part."
    done
    ls -la "$OUT"
    ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
say "done"
