#!/usr/bin/env bash
# Regenerates reports/precision/NAME.md: one checkpoint diffed by tidal-diff under every preset
# pair. Usage: reports/precision/make.sh NAME MODEL_DIR PROMPTS.jsonl MAX_NEW BATCH [extra tidal-diff flags]
# Run files go to out/precision/NAME/ (not committed); the Markdown table is made from the
# run files by tidal-diff's summary of each.
set -euo pipefail
cd "$(dirname "$0")/../.."
NAME=$1 MODEL=$2 PROMPTS=$3 MAXNEW=$4 BATCH=$5
shift 5
BUILD=${BUILD:-build}
OUT=out/precision/$NAME
mkdir -p "$OUT"
MD=reports/precision/$NAME.md
PAIRS=("fp32 fp32" "bf16-train bf16-infer" "fp16-train fp16-infer" "bf16-train fp8-rollout"
       "fp8-unified-train fp8-unified-infer" "fp8-unified fp8-unified"
       "bf16-train-fp32head bf16-infer-fp32head" "bf16-infer bf16-infer" "fp16-infer fp16-infer"
       "bf16-train vllm-bf16" "bf16-train sglang-bf16" "bf16-autocast vllm-bf16" "fp16-train vllm-fp16"
       "bf16-train vllm-fp8" "bf16-train vllm-fp8-per-token")
# which comparison a row is: the two paths' kernels differ as a trainer's and an engine's do,
# or the same recipe runs both paths (only the structure differs: teacher forcing vs KV cache)
what() {
  case "$1 $2" in
    "fp32 fp32") echo "fp32 reference, structure only" ;;
    "fp8-unified fp8-unified") echo "same FP8 kernels both paths: structure only" ;;
    "fp8-unified-train fp8-unified-infer") echo "unified FP8, trainer vs engine kernels (fair)" ;;
    *-infer" "*-infer) echo "same recipe both paths: structure only" ;;
    *) echo "trainer vs engine" ;;
  esac
}
# LoRA rows: the trainer keeps the adapter unmerged, the rollout engine merges it into its bf16
# weights; a random adapter (rank 16, alpha 32, all projections) of each std is made here
LORA_STDS=(${LORA_STDS:-0.001 0.01})
{
  echo "# Training vs inference path mismatch by recipe pair: $NAME"
  echo
  echo "Checkpoint \`$MODEL\`, prompts \`$PROMPTS\`, $MAXNEW generated tokens per prompt, batch $BATCH, seed 1,"
  echo "default sampling (temperature 1). Made by \`reports/precision/make.sh $NAME $MODEL $PROMPTS $MAXNEW $BATCH $*\`"
  echo "on $(date -u +%Y-%m-%d), $(nproc) CPU cores; each row is one \`tidal-diff\` run (command below the table)."
  echo
  echo "| recipe A (training) | recipe B (inference) | comparison | tokens | mean \\|Δlogp\\| | p99 \\|Δlogp\\| | max \\|Δlogp\\| | mean KL(B‖A) | mean k3 | top-1 agree |"
  echo "|---|---|---|---|---|---|---|---|---|---|"
} > "$MD.tmp"
for pair in "${PAIRS[@]}"; do
  set -- $pair "$@"
  A=$1 B=$2
  shift 2
  run="$OUT/${A}__${B}.h5"
  s=$("$BUILD/bin/tidal-diff" --model "$MODEL" --prompts "$PROMPTS" --recipe-a "$A" --recipe-b "$B" \
        --max-new-tokens "$MAXNEW" --batch "$BATCH" --seed 1 -o "$run" --force "$@" 2>/dev/null)
  tok=$(echo "$s" | awk '$1 == "sequences" { print $5 }')
  dl=$(echo "$s" | awk '$1 == "|dlogp|" { print $3, $5, $7 }')
  kl=$(echo "$s" | awk '$1 == "KL(B||A)" { print $3, $6 }')
  t1=$(echo "$s" | awk '$1 == "top-1" { print $3 }')
  set -- $dl $kl
  echo "| $A | $B | $(what $A $B) | $tok | $1 | $2 | $3 | $4 | $5 | $t1 |" >> "$MD.tmp"
  set --
done
for std in "${LORA_STDS[@]}"; do
  ad="$OUT/lora-$std"
  "$BUILD/bin/tidal-init" --lora-for "$MODEL" --rank 16 --alpha 32 --lora-std "$std" --seed 5 -o "$ad" >/dev/null 2>&1
  for merge in "" "--lora-merge-b"; do
    run="$OUT/lora-$std${merge:+-merged}.h5"
    s=$("$BUILD/bin/tidal-diff" --model "$MODEL" --prompts "$PROMPTS" --recipe-a bf16-train --recipe-b bf16-infer \
          --max-new-tokens "$MAXNEW" --batch "$BATCH" --seed 1 -o "$run" --force --lora "$ad" $merge "$@" 2>"$run.log")
    surv=$(grep -o "[0-9.]*% of the update survives" "$run.log" | head -1 || true)
    tok=$(echo "$s" | awk '$1 == "sequences" { print $5 }')
    dl=$(echo "$s" | awk '$1 == "|dlogp|" { print $3, $5, $7 }')
    kl=$(echo "$s" | awk '$1 == "KL(B||A)" { print $3, $6 }')
    t1=$(echo "$s" | awk '$1 == "top-1" { print $3 }')
    set -- $dl $kl
    if [ -n "$merge" ]; then label="bf16-infer + LoRA std $std merged into bf16 weights ($surv)"
    else label="bf16-infer + LoRA std $std unmerged"; fi
    echo "| bf16-train + LoRA std $std unmerged | $label | trainer vs engine | $tok | $1 | $2 | $3 | $4 | $5 | $t1 |" >> "$MD.tmp"
    set --
  done
done
{
  echo
  echo "LoRA rows: \`tidal-init --lora-for $MODEL --rank 16 --alpha 32 --lora-std STD --seed 5 -o ADAPTER\` (random A and B),"
  echo "then the bf16 pair with \`--lora ADAPTER\` (unmerged in both paths) or \`--lora ADAPTER --lora-merge-b\`."
  echo
  echo "Commands (one per row): \`$BUILD/bin/tidal-diff --model $MODEL --prompts $PROMPTS --recipe-a A --recipe-b B --max-new-tokens $MAXNEW --batch $BATCH --seed 1 -o $OUT/A__B.h5\`"
  echo "(\`tidal-diff --list-recipes\` prints every preset in full.)"
} >> "$MD.tmp"
mv "$MD.tmp" "$MD"
echo "wrote $MD"
