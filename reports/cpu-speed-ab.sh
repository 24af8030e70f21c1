#!/usr/bin/env bash
# reports/cpu-speed.md, "FP8 kernels and the bf16 order at large K": two builds of tidal, OLD and
# NEW (build directories, each after make all tests), interleaved, ROUNDS rounds: tidal-diff on
# tests/bench/diff.sh's 0.5B model, 4 prompts x (32 + 32) tokens (scored tokens/s), and train_probe
# on tests/bench/train.sh's model and batch (tokens/s), fp16 and fp8-unified recipes. Make OLD with
#   git worktree add /tmp/old 83cd6f6 && make -C /tmp/old BUILD=build CUDA=0 all tests
# Usage: OLD=/tmp/old/build NEW=build reports/cpu-speed-ab.sh
# PAIRS (recipe-a:recipe-b ...) and RECIPES (train_probe's) choose other recipes than those two.
set -u
cd "$(dirname "$0")/.."
OLD=${OLD:?OLD=build dir of the old tidal}; NEW=${NEW:-build}; ROUNDS=${ROUNDS:-3}
PAIRS=${PAIRS:-fp16-train:fp16-infer fp8-unified-train:fp8-unified-infer}
RECIPES=${RECIPES:-fp16-train fp8-unified-train}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-2} OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
. reports/cpu-speed-inputs.sh $NEW
for round in $(seq $ROUNDS); do
  for b in "$OLD" "$NEW"; do
    for pair in $PAIRS; do
      t=$($b/bin/tidal-diff --model $M --prompts $T/p.jsonl --recipe-a ${pair%%:*} --recipe-b ${pair##*:} \
          --max-new-tokens 32 --no-stop-at-eos --batch 4 -o $T/r.h5 --force 2>/dev/null | awk '$1 == "throughput" { print $2 }')
      echo "tidal-diff $pair $b ${t:-NA}"
    done
    for rec in $RECIPES; do
      t=$($b/tests/helpers/train_probe --model $D --batch $T/batch.json --recipe $rec --lr 1e-5 --bench-seconds 6 \
          | awk '$1 == "tokens_per_s" { print $2 }')
      echo "train_probe $rec $b ${t:-NA}"
    done
  done
done
