#!/usr/bin/env bash
# Regenerates reports/outliers/granularity.md: does FP8 scaling granularity matter? The demo
# checkpoint's shape and seed, without and with PLANTED outlier channels (tidal-init
# --outlier-channels; synthetic, recorded in the checkpoints' metadata), diffed bf16-train
# against FP8 rollouts that differ only in their scaling granularity (recipes/*.json).
# Usage: reports/outliers/make.sh [NEW_TOKENS] [BATCH]   (about a minute on 2 cores)
# Checkpoints and run files go to out/outliers/ (not committed).
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
MAXNEW=${1:-64} BATCH=${2:-8}
OUT=out/outliers
mkdir -p "$OUT"
MD=reports/outliers/granularity.md
SHAPE="--arch qwen2 --hidden 192 --layers 4 --heads 6 --kv-heads 2 --head-dim 32 --intermediate 512 --vocab 100 --no-tie --embed-std 0.2 --dtype bf16 --seed 2026"
# name | extra tidal-init flags (the first is datasets/demo-model's own command: same tensors)
MODELS=("none|" "3 planted, x100|--outlier-channels 3 --outlier-scale 100" "3 planted, x1000|--outlier-channels 3 --outlier-scale 1000" "3 planted, x10000|--outlier-channels 3 --outlier-scale 10000" "3 planted, x100000|--outlier-channels 3 --outlier-scale 100000")
PAIRS=("bf16-infer|bf16-infer" "per-tensor (w, act)|reports/outliers/recipes/fp8-tensor.json"
       "per-row (w channel, act token)|reports/outliers/recipes/fp8-row.json"
       "block: w 128x128, act 1x128 (fp8-rollout)|fp8-rollout" "MX: 1x32, E8M0 (w, act)|reports/outliers/recipes/fp8-mx.json"
       "w 128x128, act per-tensor|reports/outliers/recipes/fp8-act-tensor.json"
       "w 128x128, act per-token|reports/outliers/recipes/fp8-act-row.json")
declare -A CELL
declare -a MODELNOTE
i=0
for m in "${MODELS[@]}"; do
  name=${m%%|*} flags=${m#*|}
  dir="$OUT/model$i"
  "$BUILD/bin/tidal-init" $SHAPE $flags -o "$dir" 2>/dev/null
  cp datasets/demo-model/tokenizer.json datasets/demo-model/tokenizer_config.json "$dir/"
  j=0
  for p in "${PAIRS[@]}"; do
    B=${p#*|}
    s=$("$BUILD/bin/tidal-diff" --model "$dir" --prompts datasets/demo-prompts.jsonl --recipe-a bf16-train --recipe-b "$B" \
          --max-new-tokens "$MAXNEW" --batch "$BATCH" --seed 1 -o "$OUT/m${i}_p$j.h5" --force --json 2>/dev/null)
    CELL[$i,$j]=$(echo "$s" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.4f / %.4f" % (d["mean_abs_dlogp"], d["mean_kl_ba"]))')
    j=$((j + 1))
  done
  meta=$(python3 -c 'import json,struct,sys; f=open(sys.argv[1],"rb"); n=struct.unpack("<Q",f.read(8))[0]; print(json.loads(f.read(n))["__metadata__"].get("tidal_synthetic","(none planted)"))' "$dir/model.safetensors")
  MODELNOTE[$i]="$name: \`tidal-init $SHAPE $flags -o DIR\` — metadata tidal_synthetic: $meta"
  i=$((i + 1))
done
{
  echo "# FP8 scaling granularity with and without planted outlier channels"
  echo
  echo "Made by \`reports/outliers/make.sh $MAXNEW $BATCH\` on $(date -u +%Y-%m-%d): the demo checkpoint's shape and seed (C=192, 4 layers, bf16),"
  echo "the 32 demo prompts, $MAXNEW new tokens, batch $BATCH, seed 1; recipe A = bf16-train, recipe B as in each row."
  echo "Cells: mean |Δlogp| / mean KL(B‖A) over the scored tokens (each cell one \`tidal-diff\` run)."
  echo "**The outlier channels are planted** (synthetic, \`tidal-init --outlier-channels N --outlier-scale S\`), not learned."
  echo
  printf "| recipe B (inference path) |"
  for m in "${MODELS[@]}"; do printf " outliers: %s |" "${m%%|*}"; done
  echo
  printf "|---|"; for m in "${MODELS[@]}"; do printf -- "---:|"; done; echo
  j=0
  for p in "${PAIRS[@]}"; do
    printf "| %s |" "${p%%|*}"
    for ((k = 0; k < i; k++)); do printf " %s |" "${CELL[$k,$j]}"; done
    echo
    j=$((j + 1))
  done
  echo
  echo "Checkpoints:"
  echo
  for ((k = 0; k < i; k++)); do echo "- ${MODELNOTE[$k]}"; done
  echo
  echo "Each run: \`$BUILD/bin/tidal-diff --model DIR --prompts datasets/demo-prompts.jsonl --recipe-a bf16-train --recipe-b B --max-new-tokens $MAXNEW --batch $BATCH --seed 1 -o OUT.h5\`"
} > "$MD.tmp"
mv "$MD.tmp" "$MD"
echo "wrote $MD"
