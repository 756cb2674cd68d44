#!/usr/bin/env bash
# The trained draft's device pipeline (the lent H200), one stage per device command:
#
#   bash training/draft/device.sh train   # tuned model from the GGUF, regenerate answers, train the head
#   bash training/draft/device.sh bench   # none / eagle3 k=1..4 / ngram k=1..4 on the tuned model
#   bash training/draft/device.sh fp8     # bf16 vs fp8 weights on the 4B shape
#
# Needs: vLLM 0.26.0 installed (shared/gpu/README.md: PYTHONPATH=$HOME/site), the GGUF parts and
# the gguf wheel in $CARRY (default $HOME/carry: gguf.part.00, gguf.part.01, gguf-*.whl), and the
# corpora made here (CORPORA, default .devcarry/p3: draft-corpus/, bench-corpus/; made by
# `python -m training.corpus --seed 3 --streams 1500` and `--seed 7 --streams 60`).
# Everything it builds stays in $WORK (default $HOME/edge19) for the next stage on the same
# machine; a fresh machine rebuilds the tuned model (about 30 s). Results go to $OUT (at most 8
# files), the log to $OUT/log.txt. BUDGET_S (default 500) is the stage's wall-clock budget:
# training stops in time to save, the benchmark starts no configuration after it.
# REGEN_ARGS / TRAIN_ARGS pass extra options (a CPU smoke run: REGEN_ARGS="--limit 4 --eager"
# TRAIN_ARGS="--max-examples 4 --max-len 1200 --batch-tokens 4000 --draft-vocab 1024").
set -uo pipefail
cd "$(dirname "$0")/../.."
STAGE=${1:?train, bench or fp8}
WORK=${WORK:-$HOME/edge19}
CARRY=${CARRY:-$HOME/carry}
CORPORA=${CORPORA:-$PWD/.devcarry/p3}
OUT=${OUT:-/tmp/edge19-out}
BUDGET_S=${BUDGET_S:-500}
PY=${PY:-python3}
START=$(date +%s)
# spawn: the bench asks torch for the GPU first; forked workers cannot re-initialise CUDA
export PYTHONUNBUFFERED=1 VLLM_NO_USAGE_STATS=1 HF_HUB_OFFLINE=1 VLLM_WORKER_MULTIPROC_METHOD=spawn
export PYTHONPATH=$HOME/site:$WORK/site-gguf:$PWD${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$WORK" "$OUT"
exec > >(tee -a "$OUT/log.txt") 2>&1
left() { echo $(( BUDGET_S - ($(date +%s) - START) )); }
say() { echo "[device.sh $STAGE +$(( $(date +%s) - START ))s] $*"; }

prepare() {
  if [ -d "$CORPORA/draft-corpus" ]; then mkdir -p "$WORK/corpora" && cp -r "$CORPORA"/* "$WORK/corpora/"; fi
  [ -f "$WORK/tuned/model.safetensors" ] && return 0
  if [ ! -d "$WORK/site-gguf/gguf" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$WORK/site-gguf" "$CARRY"/gguf-*.whl || return 1
  fi
  local g=$WORK/gguf/SmolLM2-135M-Instruct.Q4_1.gguf
  if [ ! -f "$g" ]; then
    mkdir -p "$WORK/gguf" && cat "$CARRY"/gguf.part.* > "$g.tmp" && mv "$g.tmp" "$g" || return 1
  fi
  say "gguf sha256 $(sha256sum "$g" | cut -c1-64) (expected b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53)"
  "$PY" training/draft/prepare_target.py --gguf "$g" --work "$WORK"
}

case "$STAGE" in
  train)
    prepare || { say "prepare failed"; exit 1; }
    say "tuned model ready; regenerating answers"
    "$PY" training/draft/regen.py --model "$WORK/tuned" --corpus "$WORK/corpora/draft-corpus" \
      --out "$WORK/answers.npz" ${REGEN_ARGS:-} || say "regen failed: training on the corpus targets"
    ANS=(); [ -f "$WORK/answers.npz" ] && ANS=(--answers "$WORK/answers.npz") && cp "$WORK/answers.json" "$OUT/"
    T=$(( $(left) - 60 )); [ "$T" -lt 30 ] && T=30
    say "training for at most ${T}s"
    "$PY" training/draft/train.py --target "$WORK/tuned" --corpus "$WORK/corpora/draft-corpus" "${ANS[@]}" \
      --out "$WORK/draft" --max-seconds "$T" --draft-vocab "${DRAFT_VOCAB:-8192}" --ttt 4 ${TRAIN_ARGS:-}
    mkdir -p "$OUT/draft" && cp "$WORK"/draft/* "$OUT/draft/"
    ls -la "$OUT/draft"
    ;;
  bench)
    prepare || { say "prepare failed"; exit 1; }
    DRAFT=${DRAFT:-$WORK/draft}
    [ -f "$DRAFT/config.json" ] || DRAFT=$PWD/models/smollm2-135m-edge-eagle3
    say "draft $DRAFT"
    "$PY" bench/engine/bench_spec.py --model "$WORK/tuned" --draft "$DRAFT" \
      --prompts "$WORK/corpora/bench-corpus" --out "$OUT/spec" --n "${N:-32}" \
      --deadline-s $(( $(left) - 70 )) ${CONFIGS:+--configs "$CONFIGS"}
    ;;
  fp8)
    "$PY" bench/engine/bench_fp8.py --out "$OUT/fp8" --model-dir "$WORK/qwen3-4b-shape" \
      --deadline-s $(( $(left) - 150 )) ${FP8_CONFIGS:+--configs "$FP8_CONFIGS"}
    ;;
  *) echo "unknown stage $STAGE"; exit 2 ;;
esac
say "done"
