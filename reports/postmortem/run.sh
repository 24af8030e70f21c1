#!/usr/bin/env bash
# reports/postmortem: tidal-postmortem on reports/rl/lora's own runs, checked against what that report
# knows (README.md here).
#   reports/postmortem/run.sh curves     every grid run's curves (runs/grid/*/rl.h5: the packed run files
#                                        keep /steps, no checkpoint): build/postmortem/grid/NAME.json
#   reports/postmortem/run.sh measured   grid run s2-bf16-merged (dead at the end; the detector marked a
#                                        dip at step 166, the reward recovered, then died near step 560)
#                                        again for 700 steps with a checkpoint every 25 (same seed and
#                                        settings: the same trajectory, checked), then the whole
#                                        post-mortem with 6 checkpoints diffed -> reports/postmortem/s2-bf16-merged/
#   BIN=DIR ...                          a copy of the tools (default build/bin)
set -eu
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=PASSIVE
BIN=${BIN:-build/bin}
what=${1:-curves}
if [ "$what" = curves ]; then
  mkdir -p build/postmortem/grid
  for d in reports/rl/lora/runs/grid/*/; do
    n=$(basename "$d")
    "$BIN"/tidal-postmortem "$d" --no-measure --json -o "build/postmortem/grid/$n" > "build/postmortem/grid/$n.json"
  done
  echo "run.sh: $(ls build/postmortem/grid/*.json | wc -l) post-mortems in build/postmortem/grid"
elif [ "$what" = measured ]; then
  run=build/postmortem/s2-bf16-merged-run
  if [ ! -f "$run/checkpoint-700/adapter_config.json" ]; then
    "$BIN"/tidal-rl --model-path datasets/models/add --dataset-path datasets/tasks/add/train.jsonl --num-generations 8 \
      --per-device-batch-size 16 --gradient-accumulation-steps 2 --max-completion-length 48 --max-steps 700 --save-steps 25 \
      --beta 0.001 --scale-rewards batch --mask-truncated-completions --eval-steps 50 --eval-max-samples 200 \
      --learning-rate 0.01 --quiet --seed 2 --model-dtype bf16 --dtype bf16 --lora-sync merged --lora-r 1 --lora-alpha 2 \
      --output-dir "$run" $( [ -f "$run/rl.h5" ] && echo --resume )
  fi
  "$BIN"/tidal-postmortem "$run" --max-checkpoints 6 --max-prompts 32 --rollout-recipe bf16-infer \
    -o reports/postmortem/s2-bf16-merged --json > reports/postmortem/s2-bf16-merged.json
else
  echo "usage: $0 curves|measured" >&2; exit 2
fi
