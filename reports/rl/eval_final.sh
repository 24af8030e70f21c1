#!/usr/bin/env bash
# The final policy of each run, scored on a clean inference path: tidal-rl with --exact-match
# (no rollout noise, no precision mismatch), --learning-rate 0, 2 steps x 64 completions of
# prompts the seed 12345 picks. Separates "the trained policy got worse" from "the rollouts are
# noisy" in the synthetic dose-response arm. Writes build/rl/eval/<sweep>/<run>/rl.h5 (read by
# summarize.py). Usage: reports/rl/eval_final.sh SWEEP_DIR DATASET [MAX_COMPLETION]
set -eu
cd "$(dirname "$0")/../.."
dir=$1 data=$2 len=${3:-48}
base=build/rl/base-short
ev() {   # ev MODEL OUT
  OMP_WAIT_POLICY=PASSIVE build/bin/tidal-rl --model-path "$1" --dataset-path "$data" --train-recipe bf16-train \
    --exact-match --learning-rate 0 --max-steps 2 --num-generations 8 --per-device-batch-size 32 \
    --gradient-accumulation-steps 2 --max-completion-length "$len" --seed 12345 --log-completions 0 -q --output-dir "$2"
}
[ -f build/rl/eval/base/base-short/rl.h5 ] || ev $base build/rl/eval/base/base-short   # the starting policy
for run in "$dir"/*/; do
  run=${run%/}; name=$(basename "$run")
  [ -f "$run/model/model.safetensors" ] || continue
  out=build/rl/eval/$(basename "$dir")/$name
  [ -f "$out/rl.h5" ] && continue
  for f in tokenizer.json tokenizer_config.json generation_config.json; do   # runs made before tidal-rl copied them
    [ -f "$run/model/$f" ] || cp "$base/$f" "$run/model/$f"
  done
  ev "$run/model" "$out"
done
