#!/usr/bin/env bash
# Regenerates reports/attribution/demo.md and its figures: which recipe field causes the
# mismatch on the demo checkpoint. One tidal-diff run per pair (recipe B generates the tokens
# once), then tidal-attribute replays those tokens under every configuration.
# Usage: reports/attribution/make.sh   (about a minute on 2 cores). Run files: out/attribution/.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
OUT=out/attribution
FIG=reports/attribution/figures
mkdir -p "$OUT" "$FIG"
MD=reports/attribution/demo.md
DIFF=(--model datasets/demo-model --prompts datasets/demo-prompts.jsonl --max-new-tokens 64 --batch 8 --seed 1 --force)
"$BUILD/bin/tidal-diff" "${DIFF[@]}" --recipe-a bf16-train --recipe-b bf16-infer -o "$OUT/bf16.h5" >/dev/null 2>&1
"$BUILD/bin/tidal-diff" "${DIFF[@]}" --recipe-a bf16-train --recipe-b fp8-rollout -o "$OUT/fp8.h5" >/dev/null 2>&1
{
  echo "# Attribution on the demo checkpoint: which setting to change?"
  echo
  echo "Made by \`reports/attribution/make.sh\` on $(date -u +%Y-%m-%d). Checkpoint \`datasets/demo-model\`, its 32 prompts,"
  echo "64 new tokens, batch 8, seed 1. Each section: one \`tidal-diff\` run (recipe B generates the tokens once),"
  echo "then \`tidal-attribute\` rescoring those tokens under every configuration it needs (tokens, batches and"
  echo "thread count held fixed; see include/tidal/attribute.h). Values are mean |Δlogp| over the response tokens."
  echo
  echo "## 1. bf16-train vs bf16-infer: which engine kernel choice?"
  echo
  echo "\`$BUILD/bin/tidal-diff ${DIFF[*]} --recipe-a bf16-train --recipe-b bf16-infer -o $OUT/bf16.h5\`"
  echo
  "$BUILD/bin/tidal-attribute" "$OUT/bf16.h5" --markdown --plot "$FIG/bf16_fields.png" 2>/dev/null
  echo
  echo "![bf16 fields](figures/bf16_fields.png)"
  echo
  echo "## 2. Do I also have to move the inference engine to FP16? (bf16 pair → fp16 pair)"
  echo
  "$BUILD/bin/tidal-attribute" "$OUT/bf16.h5" --to-a fp16-train --to-b fp16-infer --by-side --markdown \
      --plot "$FIG/bf16_to_fp16_sides.png" 2>/dev/null
  echo
  echo "![sides](figures/bf16_to_fp16_sides.png)"
  echo
  echo "Field by field (weights and the activation dtype group of each side):"
  echo
  "$BUILD/bin/tidal-attribute" "$OUT/bf16.h5" --to-a fp16-train --to-b fp16-infer --markdown 2>/dev/null
  echo
  echo "## 3. bf16-train vs fp8-rollout: FP8 GEMMs or the engine's kernels?"
  echo
  echo "\`$BUILD/bin/tidal-diff ${DIFF[*]} --recipe-a bf16-train --recipe-b fp8-rollout -o $OUT/fp8.h5\`"
  echo
  "$BUILD/bin/tidal-attribute" "$OUT/fp8.h5" --markdown --plot "$FIG/fp8_fields.png" 2>/dev/null
  echo
  echo "![fp8 fields](figures/fp8_fields.png)"
} > "$MD.tmp"
mv "$MD.tmp" "$MD"
echo "wrote $MD"
