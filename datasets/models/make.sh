#!/usr/bin/env bash
# Makes the shipped task models (datasets/models/TASK) with tidal's own tools, from nothing:
#   bash datasets/models/make.sh [TASK...]      (default: add sort countdown; build/ must be built)
#   bash datasets/models/make.sh add-moe         the mixture-of-experts twin of add (below)
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
# add-moe: the dense add model's mixture-of-experts twin (reports/rl/moe): the same attention (Qwen2,
# q/k/v biases), vocabulary, data, schedule and seed, every layer's MLP a Qwen2-MoE block of 8 experts
# of width 192, top-2, renormalised, plus a shared expert of width 128 behind its sigmoid gate: the
# active MLP width 2 x 192 + 128 = 512 is the dense model's intermediate_size, so the active
# parameters match (the routers and shared gates add 4 x 1,728); 3/4 of the active MLP is routed.
INIT_MOE="$WORK/init-moe"
if [[ " $* " == *" add-moe "* ]] && [ ! -f "$INIT_MOE/model.safetensors" ]; then
  "$BUILD/bin/tidal-init" --arch qwen2_moe --hidden-size 192 --num-layers 4 --num-heads 6 --num-kv-heads 2 \
      --head-dim 32 --intermediate-size 512 --num-experts 8 --num-experts-per-tok 2 --moe-intermediate-size 192 \
      --shared-expert-intermediate-size 128 --norm-topk-prob --vocab-size 100 --no-tie --seed 2026 -o "$INIT_MOE"
  "$BUILD/bin/tidal-tokenize" --write-char-vocab "$INIT_MOE"
fi
for t in "${@:-add sort countdown}"; do
  for name in $t; do
    task=${name%-moe}
    init=$INIT; [ "$name" = "$task" ] || init=$INIT_MOE
    "$BUILD/bin/tidal-task" generate --task "$task" --seed 2026 --length short --train-size 20000 --test-size 100 \
        -o "$WORK/data/$task" --force
    cmp "$WORK/data/$task/test.jsonl" "datasets/tasks/$task/test.jsonl"
    OUT="$WORK/sft-$name"
    "$BUILD/bin/tidal-sft" --model-path "$init" --dataset-path "$WORK/data/$task" \
        --eval-dataset-path "datasets/tasks/$task/test.jsonl" --output-dir "$OUT" --overwrite-output-dir \
        --learning-rate 1e-3 --lr-scheduler constant_with_warmup --warmup-steps 50 --per-device-batch-size 32 \
        --max-steps "${STEPS[$task]}" --eval-steps 50 --save-dtype bf16 --seed 1
    DEST="datasets/models/$name"
    mkdir -p "$DEST"
    for f in model.safetensors config.json generation_config.json tokenizer.json tokenizer_config.json sft.h5; do
      cp "$OUT/$f" "$DEST/$f"
    done
    "$BUILD/bin/tidal-sft" --model-path "$DEST" --dataset-path "datasets/tasks/$task" --eval-only \
        --completions "$WORK/$name-completions.jsonl" | tee "$DEST/eval.json"
  done
done
