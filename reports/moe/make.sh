#!/usr/bin/env bash
# reports/moe: how much of a mixture of experts' training/inference mismatch its routing flips carry,
# against its dense twin (issue 34, item 6). Every preset pair below on datasets/models/add-moe and
# datasets/models/add (the 100 prompts of datasets/models/prompts-add.jsonl, sampled at temperature 1,
# 48 new tokens, seed 1, prompt tokens scored too), the MoE pairs with and without --routing-replay r3;
# then one table (summarize.py: tidal-diff's --json and the run files' /routing).
#   bash reports/moe/make.sh          (BUILD=DIR for another build; OUT=DIR for the run files)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=${OUT:-build/moe}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
mkdir -p "$OUT"
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
PAIRS=("bf16-train bf16-infer" "bf16-train vllm-bf16" "bf16-train sglang-bf16" "fp16-train fp16-infer"
       "bf16-train fp8-rollout" "fp8-unified-train fp8-unified-infer" "fp32 fp32")
for model in add add-moe; do
  for pair in "${PAIRS[@]}"; do
    set -- $pair
    for rr in none r3; do
      [ "$model" = add ] && [ "$rr" = r3 ] && continue
      name="$model--$1--$2--$rr"
      [ -f "$OUT/$name.json" ] && continue
      "$BUILD/bin/tidal-diff" --model "datasets/models/$model" --prompts datasets/models/prompts-add.jsonl \
          -o "$OUT/$name.h5" --force --recipe-a "$1" --recipe-b "$2" --max-new-tokens 48 --seed 1 --score-prompt \
          $( [ "$model" = add-moe ] && echo --routing-replay "$rr" ) --json > "$OUT/$name.json.tmp"
      mv "$OUT/$name.json.tmp" "$OUT/$name.json"
    done
  done
done
"$PY" reports/moe/summarize.py "$OUT" > reports/moe/table.md
"$BUILD/bin/tidal-report" "$OUT/add-moe--bf16-train--bf16-infer--none.h5" "$OUT/add-moe--bf16-train--bf16-infer--r3.h5" \
    --markdown > reports/moe/report-bf16.md
echo "reports/moe/table.md and report-bf16.md written" >&2
