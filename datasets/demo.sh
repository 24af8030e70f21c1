#!/usr/bin/env bash
# make demo: tidal's main job on the shipped demo model, the SFT-trained addition model
# (datasets/models/add, made by tidal-sft), and 32 prompts of its test split. The training path
# (recipe A) and the inference path (recipe B) see the same prompts in bf16 and in fp16; the
# inference path samples the completions; per-token divergence goes to HDF5 run files under
# out/demo/, then tidal-report compares the two runs and tidal-heatmap draws them.
set -euo pipefail
BUILD=${1:-build}
OUT=out/demo
mkdir -p "$OUT"
for p in bf16 fp16; do
  echo "== $p: training path $p-train vs inference path $p-infer"
  "$BUILD/bin/tidal-diff" --model datasets/models/add --prompts datasets/demo-task-prompts.jsonl \
      --recipe-a "$p-train" --recipe-b "$p-infer" --max-new-tokens 40 --batch 8 --seed 1 \
      -o "$OUT/$p.h5" --force
done
echo
echo "run files: $OUT/bf16.h5 $OUT/fp16.h5 (layout: reports/SCHEMA.md; read with h5py or pandas)"
echo
echo "== the two runs side by side (tidal-report; --markdown / --json for files, tidal-heatmap for pictures)"
"$BUILD/bin/tidal-report" "$OUT/bf16.h5" "$OUT/fp16.h5" --worst 3 | sed -n '1,40p'
"$BUILD/bin/tidal-heatmap" "$OUT/bf16.h5" "$OUT/fp16.h5" -o "$OUT/seqpos_dlogp.png" >/dev/null
echo
echo "picture: $OUT/seqpos_dlogp.png (|dlogp| by sequence and position, both runs)"
