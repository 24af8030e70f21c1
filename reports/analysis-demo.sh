#!/usr/bin/env bash
# Regenerates reports/analysis-demo.md and reports/figures/*.png from real tidal-diff runs:
#   bash reports/analysis-demo.sh [BUILD]        (after `make -j2`; about a minute on 2 cores)
# Model: the project's demo checkpoint (datasets/demo-model: random-init Qwen2 shape, peaked
# distributions, character vocabulary) and its 32 text prompts (datasets/demo-prompts.jsonl).
# Runs (--layers): bf16-train vs bf16-infer, fp16-train vs fp16-infer, bf16-train vs fp8-rollout.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
B="$BUILD/bin"
# RUNS_DIR=DIR keeps the model and runs there and reuses them (redrawing without re-running)
if [ -n "${RUNS_DIR:-}" ]; then work=$RUNS_DIR; mkdir -p "$work"; else work=$(mktemp -d); trap 'rm -rf "$work"' EXIT; fi
for pair in "bf16-train bf16-infer bf16" "fp16-train fp16-infer fp16" "bf16-train fp8-rollout fp8"; do
  set -- $pair
  [ -n "${RUNS_DIR:-}" ] && [ -f "$work/$3.h5" ] && continue
  "$B/tidal-diff" --model datasets/demo-model --prompts datasets/demo-prompts.jsonl --recipe-a "$1" --recipe-b "$2" \
    -o "$work/$3.h5" --max-new-tokens 96 --batch 8 --seed 1 --layers --force >/dev/null 2>&1
done
runs=("$work/bf16.h5" "$work/fp16.h5" "$work/fp8.h5")
mkdir -p reports/figures
H="$B/tidal-heatmap"
"$H" "${runs[@]}" -o reports/figures/seqpos_dlogp.png
"$H" "${runs[@]}" --metric kl --pool mean -o reports/figures/seqpos_kl.png
"$H" "${runs[@]}" --plot hist -o reports/figures/hist_dlogp.png
"$H" "${runs[@]}" --plot density -o reports/figures/density_pa_pb.png
"$H" "${runs[@]}" --plot layers -o reports/figures/layers_rel_err.png
{
  cat <<EOF
# Where the train/inference mismatch lives — demo analysis

Made by \`bash reports/analysis-demo.sh\` (tidal-report and tidal-heatmap over three real
tidal-diff runs). **Model:** \`datasets/demo-model\` — the project's demo checkpoint: a
random-initialised Qwen2-shaped model (C=192, 4 layers, bf16 weights) whose embedding and
lm_head are drawn with std 0.2, so its next-token distributions are peaked (mean entropy about
2.3 nats) like a trained model's; still random weights, so read the numbers as the mechanics of
each recipe, not a trained LLM's magnitudes. **Prompts:** \`datasets/demo-prompts.jsonl\` (32 text
prompts, character tokenizer). **Runs:** \`tidal-diff --max-new-tokens 96 --batch 8 --seed 1
--layers\` with recipes bf16-train vs bf16-infer, fp16-train vs fp16-infer and bf16-train vs
fp8-rollout; B (the inference path) generated the responses, response tokens are scored.

Commands (the script holds them all):

\`\`\`
tidal-diff --model datasets/demo-model --prompts datasets/demo-prompts.jsonl --recipe-a bf16-train --recipe-b bf16-infer -o bf16.h5 --max-new-tokens 96 --batch 8 --seed 1 --layers
tidal-report bf16.h5 fp16.h5 fp8.h5 --markdown --figure figures/seqpos_dlogp.png ...
tidal-heatmap bf16.h5 fp16.h5 fp8.h5 -o figures/seqpos_dlogp.png
tidal-heatmap bf16.h5 fp16.h5 fp8.h5 --metric kl --pool mean -o figures/seqpos_kl.png
tidal-heatmap bf16.h5 fp16.h5 fp8.h5 --plot hist -o figures/hist_dlogp.png
tidal-heatmap bf16.h5 fp16.h5 fp8.h5 --plot density -o figures/density_pa_pb.png
tidal-heatmap bf16.h5 fp16.h5 fp8.h5 --plot layers -o figures/layers_rel_err.png
\`\`\`

## What these runs show (measured 2026-11-21 with the commands above; runs are seeded)

- **fp16 < bf16 < fp8 rollout on every metric.** Mean |Δlogp| 0.0013 (fp16), 0.0106 (bf16),
  0.032 (bf16 trainer vs fp8 rollout): fp16 is 8.3× below bf16 (the literature reports about
  8×; the bf16 figure is close to the reported ≈0.011 for BF16 rollouts), the fp8 rollout 3×
  above it. Mean KL(B‖A) 1.8e-6, 1.2e-4, 9.0e-4.
- **Parity bands** (share of tokens with p_B/p_A within ±1 %): 99.97 % fp16, 60 % bf16,
  24 % fp8 rollout; within ±5 %: 100 %, 99.5 %, 77 %.
- **Low-probability tokens carry it.** |Δlogp| falls with the token's probability under the
  trainer (Spearman −0.30 bf16, −0.35 fp16, −0.39 fp8): in bf16, tokens with p_A in
  [0.001, 0.1) average 0.013–0.014, tokens with p_A ≥ 0.9 only 0.0013. It rises with the
  entropy of the position (Spearman +0.18 / +0.24 / +0.25).
- **Not along the sequence** in this short-context toy: the position maps show no hot spots
  and the correlation with position is ≈ 0 (bf16 −0.04); the fp8 rollout's mismatch even eases
  slightly with position (0.038 at positions 16–31, 0.031 at 64–127).
- **It grows through the layers.** The residual stream's relative error rises from layer 0 to
  layer 3: 0.0017 → 0.0038 (bf16), 0.00022 → 0.00047 (fp16), and highest for the fp8 rollout
  (the layers figure).
- **Importance sampling:** no token weight π/μ leaves [0.5, 5] or exceeds 2 in any run
  (token weights 0.92–1.09 bf16, 0.84–1.19 fp8), so token TIS/IcePop would change nothing
  here; sequence weights span 0.67–1.33 (bf16) and 0.27–2.14 (fp8 rollout: ESS/n 0.83), and
  the geometric mask [0.999, 1.001] would drop 44 % of bf16 sequences and 75 % of fp8-rollout
  ones but none in fp16.
- **Caveat:** a random-weight model with a 100-character vocabulary; the worst tokens and
  sequences below are decoded with its character tokenizer, and their text is noise.

EOF
  "$BUILD/bin/tidal-report" "${runs[@]}" --markdown \
    --figure figures/seqpos_dlogp.png --figure figures/seqpos_kl.png \
    --figure figures/hist_dlogp.png --figure figures/density_pa_pb.png --figure figures/layers_rel_err.png \
    | sed "s|$work/||g"
} > reports/analysis-demo.md
"$BUILD/bin/tidal-report" "${runs[@]}" --json | sed "s|$work/||g" > reports/analysis-demo.json
ls -la reports/figures/*.png >&2
