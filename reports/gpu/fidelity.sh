#!/usr/bin/env bash
# The fidelity report of issue 17: the same recipe pairs, checkpoints, prompts and seed run by
# tidal-diff on the CPU (the emulation) and on the GPU (--device cuda: cuBLASLt GEMMs, tidal's
# kernels), statistics side by side, written to reports/gpu/fidelity-SET.md.
#
#   reports/gpu/fidelity.sh small   datasets/models/add (trained by tidal-sft) and a
#                                   Qwen2.5-0.5B-shaped random bf16 checkpoint (tidal-init)
#   reports/gpu/fidelity.sh 8b      a Llama-3-8B-shaped random bf16 checkpoint (16 GB, written
#                                   once to $BUILD/big/llama3-8b as reports/big/make.sh does)
#
# Run files go to $OUT/fidelity/ (default out/gpu). Needs a GPU and a CUDA build (tests/gpu/run.sh).
# Per row: mean / p99 |dlogp| and mean k3 (tidal-diff --json), the sequence-level importance
# weights' effective sample size fraction (tidal-report --json), each for CPU and GPU, and the
# ratio GPU / CPU of the mean |dlogp| (1 = the emulation predicts the real kernels' mismatch).
set -euo pipefail
cd "$(dirname "$0")/../.."
SET=${1:-small}
BUILD=${BUILD:-build} OUT=${OUT:-out/gpu}
B=$BUILD/bin
RUNS=$OUT/fidelity/$SET
mkdir -p "$RUNS"
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
PAIRS=("fp32 fp32" "bf16-train bf16-infer" "fp16-train fp16-infer" "fp16-train bf16-infer"
       "bf16-train fp8-rollout" "fp8-unified-train fp8-unified-infer" "bf16-train vllm-bf16"
       "bf16-train sglang-bf16")
case "$SET" in
  small)
    Q=$BUILD/gpu/qwen2.5-0.5b-bf16
    [ -f "$Q/config.json" ] || "$B/tidal-init" --preset qwen2.5-0.5b --dtype bf16 --seed 1 -o "$Q" >/dev/null
    MODELS=("datasets/models/add datasets/models/prompts-add.jsonl 32 16"
            "$Q datasets/random-prompts-151936.jsonl 64 8") ;;
  8b)
    L=$BUILD/big/llama3-8b
    [ -f "$L/config.json" ] || "$B/tidal-init" --arch llama --hidden-size 4096 --num-layers 32 --num-heads 32 \
        --num-kv-heads 8 --intermediate-size 14336 --vocab-size 128256 --rope-theta 500000 --no-tie \
        --dtype bf16 --seed 1 -o "$L" >/dev/null
    P=$RUNS/prompts-128256.jsonl   # 8 prompts of 24 random token ids below the vocabulary
    "$PY" -c "import json, random; r = random.Random(1)
for i in range(8): print(json.dumps({'tokens': [r.randrange(128000) for _ in range(24)]}))" > "$P"
    MODELS=("$L $P 32 8") ;;
  *) echo "fidelity.sh: SET is small or 8b" >&2; exit 2 ;;
esac
MD=reports/gpu/fidelity-$SET.md
{
  echo "# Emulation fidelity: CPU emulation vs real GPU kernels ($SET)"
  echo
  echo "Made by \`reports/gpu/fidelity.sh $SET\` on $(date -u +%Y-%m-%d), $(nvidia-smi -L | head -n1 | sed 's/ (UUID.*//')."
  echo "Each row: one tidal-diff run per device, same checkpoint, prompts, recipe pair, seed 1. ratio = GPU mean |Δlogp| / CPU mean |Δlogp|."
  echo
  echo "| checkpoint | recipe A | recipe B | tokens CPU / GPU | mean \\|Δlogp\\| CPU | GPU | ratio | p99 CPU | p99 GPU | mean k3 CPU | GPU | seq ESS frac CPU | GPU |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} > "$MD.tmp"
for m in "${MODELS[@]}"; do
  set -- $m
  MODEL=$1 PROMPTS=$2 MAXNEW=$3 BATCH=$4
  for pair in "${PAIRS[@]}"; do
    set -- $pair
    A=$1 R=$2
    for dev in cpu cuda; do
      "$B/tidal-diff" --model "$MODEL" --prompts "$PROMPTS" --recipe-a "$A" --recipe-b "$R" \
        --max-new-tokens "$MAXNEW" --batch "$BATCH" --seed 1 --device "$dev" --force \
        -o "$RUNS/$(basename "$MODEL")__${A}__${R}__$dev.h5" --json > "$RUNS/$(basename "$MODEL")__${A}__${R}__$dev.json"
    done
    "$PY" - "$RUNS/$(basename "$MODEL")__${A}__${R}" "$B/tidal-report" "$MODEL" "$A" "$R" >> "$MD.tmp" <<'PYEOF'
import json, subprocess, sys
base, report, model, a, b = sys.argv[1:]
s = {d: json.load(open(f"{base}__{d}.json")) for d in ("cpu", "cuda")}
ess = {}
for d in ("cpu", "cuda"):
    r = json.loads(subprocess.run([report, "--json", f"{base}__{d}.h5"], capture_output=True, text=True, check=True).stdout)
    ess[d] = next(x["ess_frac"] for x in r["is"] if x["level"] == "sequence")
c, g = s["cpu"], s["cuda"]
ratio = g["mean_abs_dlogp"] / c["mean_abs_dlogp"] if c["mean_abs_dlogp"] > 0 else float("nan")
print(f"| {model.rstrip('/').split('/')[-1]} | {a} | {b} | {c['tokens']} / {g['tokens']} | {c['mean_abs_dlogp']:.4g} | "
      f"{g['mean_abs_dlogp']:.4g} | {ratio:.3f} | {c['p99_abs_dlogp']:.4g} | {g['p99_abs_dlogp']:.4g} | "
      f"{c['mean_k3']:.3g} | {g['mean_k3']:.3g} | {ess['cpu']:.5f} | {ess['cuda']:.5f} |")
PYEOF
  done
done
mv "$MD.tmp" "$MD"
cp "$MD" "$OUT/" 2>/dev/null || true
cat "$MD"
