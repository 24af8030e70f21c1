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
# A pair that fails on either device gets a row saying so (its log: RUNS/NAME__DEV.err) and the
# script goes on; exit 1 at the end if any did. Needs: python with numpy-free json only.
# TIDAL_GPU_TINY=1 (tests/gpu/run.sh's rehearsal on the simulator): a tiny Qwen2 in place of the
# 0.5B, 4 prompts of 8 tokens, 4 new tokens, 8 add prompts; the table goes to $OUT only.
set -uo pipefail
cd "$(dirname "$0")/../.."
SET=${1:-small}
BUILD=${BUILD:-build} OUT=${OUT:-out/gpu}
B=$BUILD/bin
RUNS=$OUT/fidelity/$SET
mkdir -p "$RUNS"
PY=${TIDAL_PY:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
TINY=${TIDAL_GPU_TINY:-0}
die() { echo "fidelity.sh: $*" >&2; exit 1; }
PAIRS=("fp32 fp32" "bf16-train bf16-infer" "fp16-train fp16-infer" "fp16-train bf16-infer"
       "bf16-train fp8-rollout" "fp8-unified-train fp8-unified-infer" "bf16-train vllm-bf16"
       "bf16-train sglang-bf16")
case "$SET" in
  small)
    if [ "$TINY" = 1 ]; then
      Q=$BUILD/gpu/tiny-qwen2-bf16
      [ -f "$Q/config.json" ] || "$B/tidal-init" --arch qwen2 --hidden-size 64 --num-layers 2 --num-heads 4 \
          --num-kv-heads 2 --intermediate-size 128 --vocab-size 512 --dtype bf16 --seed 1 -o "$Q" >/dev/null ||
        die "tidal-init of $Q failed"
      head -n 8 datasets/models/prompts-add.jsonl > "$RUNS/prompts-add-8.jsonl"
      "$PY" -c "import json, random; r = random.Random(1)
for i in range(4): print(json.dumps({'tokens': [r.randrange(512) for _ in range(8)]}))" > "$RUNS/prompts-512.jsonl"
      MODELS=("datasets/models/add $RUNS/prompts-add-8.jsonl 4 8" "$Q $RUNS/prompts-512.jsonl 4 4")
    else
      Q=$BUILD/gpu/qwen2.5-0.5b-bf16
      [ -f "$Q/config.json" ] || "$B/tidal-init" --preset qwen2.5-0.5b --dtype bf16 --seed 1 -o "$Q" >/dev/null ||
        die "tidal-init of $Q failed"
      MODELS=("datasets/models/add datasets/models/prompts-add.jsonl 32 16"
              "$Q datasets/random-prompts-151936.jsonl 64 8")
    fi ;;
  8b)
    L=$BUILD/big/llama3-8b
    [ -f "$L/config.json" ] || "$B/tidal-init" --arch llama --hidden-size 4096 --num-layers 32 --num-heads 32 \
        --num-kv-heads 8 --intermediate-size 14336 --vocab-size 128256 --rope-theta 500000 --no-tie \
        --dtype bf16 --seed 1 -o "$L" >/dev/null || die "tidal-init of $L failed"
    P=$RUNS/prompts-128256.jsonl   # 8 prompts of 24 random token ids below the vocabulary
    "$PY" -c "import json, random; r = random.Random(1)
for i in range(8): print(json.dumps({'tokens': [r.randrange(128000) for _ in range(24)]}))" > "$P"
    MODELS=("$L $P 32 8") ;;
  *) echo "fidelity.sh: SET is small or 8b" >&2; exit 2 ;;
esac
# the table grows in $OUT row by row, each row printed as it comes (so a killed run's log has
# it: tests/gpu/run.sh returns the log live), and is copied into this folder when complete (not
# by a rehearsal)
MD=reports/gpu/fidelity-$SET.md
[ "$TINY" = 1 ] && MD=$OUT/fidelity-$SET-tiny.md
TMP=$OUT/fidelity-$SET.md.partial
failed=0
{
  echo "# Emulation fidelity: CPU emulation vs real GPU kernels ($SET)"
  echo
  echo "Made by \`reports/gpu/fidelity.sh $SET\` on $(date -u +%Y-%m-%d), $(nvidia-smi -L | head -n1 | sed 's/ (UUID.*//')."
  echo "Each row: one tidal-diff run per device, same checkpoint, prompts, recipe pair, seed 1. ratio = GPU mean |Δlogp| / CPU mean |Δlogp|."
  echo
  echo "| checkpoint | recipe A | recipe B | tokens CPU / GPU | mean \\|Δlogp\\| CPU | GPU | ratio | p99 CPU | p99 GPU | mean k3 CPU | GPU | seq ESS frac CPU | GPU |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|---|---|"
} > "$TMP"
for m in "${MODELS[@]}"; do
  set -- $m
  MODEL=$1 PROMPTS=$2 MAXNEW=$3 BATCH=$4
  for pair in "${PAIRS[@]}"; do
    set -- $pair
    A=$1 R=$2
    base=$RUNS/$(basename "$MODEL")__${A}__${R}
    bad=
    for dev in cpu cuda; do
      t0=$(date +%s)
      "$B/tidal-diff" --model "$MODEL" --prompts "$PROMPTS" --recipe-a "$A" --recipe-b "$R" \
        --max-new-tokens "$MAXNEW" --batch "$BATCH" --seed 1 --device "$dev" --force \
        -o "${base}__$dev.h5" --json > "${base}__$dev.json" 2> "${base}__$dev.err" || bad="$bad $dev (exit $?: $(tail -n1 "${base}__$dev.err"))"
      echo "fidelity.sh: $(basename "$MODEL") $A / $R on $dev: $(( $(date +%s) - t0 )) s"
    done
    if [ -n "$bad" ]; then
      echo "fidelity.sh: $(basename "$MODEL") $A / $R failed on$bad" >&2
      echo "| $(basename "$MODEL") | $A | $R | FAILED on$bad | | | | | | | | | |" >> "$TMP"
      failed=1
      continue
    fi
    "$PY" - "$base" "$B/tidal-report" "$MODEL" "$A" "$R" >> "$TMP" <<'PYEOF' ||
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
    { echo "fidelity.sh: the row of $base failed" >&2; failed=1; }
    tail -n1 "$TMP"
  done
done
mv "$TMP" "$OUT/$(basename "$MD")"
[ "$MD" -ef "$OUT/$(basename "$MD")" ] || cp "$OUT/$(basename "$MD")" "$MD"
cat "$MD"
exit $failed
