#!/usr/bin/env bash
# Makes the shipped task models (datasets/models/TASK) with tidal's own tools, from nothing:
#   bash datasets/models/make.sh [TASK...]      (default: add sort countdown; build/ must be built)
# Each model: a seeded random-init Qwen2-shaped checkpoint with the character vocabulary
# (tidal-init + tidal-tokenize), SFT by tidal-sft on 20000 generated training records of the
# task's short preset (tidal-task generate; the test split is the shipped datasets/tasks/TASK/
# test.jsonl, which the same command reproduces byte for byte), stored in BF16, then the greedy
# solve rate of the stored model on that test split (tidal-sft --eval-only).
# The steps per task were chosen so the solve rate lands in the "perfectible" 20-70 % band.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
WORK=${WORK:-out/models-work}
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
declare -A STEPS=([add]=250 [sort]=800 [countdown]=1600)
mkdir -p "$WORK"
INIT="$WORK/init"
if [ ! -f "$INIT/model.safetensors" ]; then
  "$BUILD/bin/tidal-init" --arch qwen2 --hidden-size 192 --num-layers 4 --num-heads 6 --num-kv-heads 2 --head-dim 32 \
      --intermediate-size 512 --vocab-size 100 --no-tie --seed 2026 -o "$INIT"
  "$BUILD/bin/tidal-tokenize" --write-char-vocab "$INIT"
fi
for t in "${@:-add sort countdown}"; do
  for task in $t; do
    "$BUILD/bin/tidal-task" generate --task "$task" --seed 2026 --length short --train-size 20000 --test-size 100 \
        -o "$WORK/data/$task" --force
    cmp "$WORK/data/$task/test.jsonl" "datasets/tasks/$task/test.jsonl"
    OUT="$WORK/sft-$task"
    "$BUILD/bin/tidal-sft" --model-path "$INIT" --dataset-path "$WORK/data/$task" \
        --eval-dataset-path "datasets/tasks/$task/test.jsonl" --output-dir "$OUT" --overwrite-output-dir \
        --learning-rate 1e-3 --lr-scheduler constant_with_warmup --warmup-steps 50 --per-device-batch-size 32 \
        --max-steps "${STEPS[$task]}" --eval-steps 50 --save-dtype bf16 --seed 1
    DEST="datasets/models/$task"
    mkdir -p "$DEST"
    for f in model.safetensors config.json generation_config.json tokenizer.json tokenizer_config.json sft.h5; do
      cp "$OUT/$f" "$DEST/$f"
    done
    "$BUILD/bin/tidal-sft" --model-path "$DEST" --dataset-path "datasets/tasks/$task" --eval-only \
        --completions "$WORK/$task-completions.jsonl" | tee "$DEST/eval.json"
  done
done
