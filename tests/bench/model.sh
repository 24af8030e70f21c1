#!/usr/bin/env bash
# Throughput of the fp32 CPU forward (tools/tidal-bench-model) against the same forward in
# PyTorch (tests/bench/torch_model.py, 2 threads), same checkpoint, same shapes:
#   a Qwen2.5-0.5B-shaped random checkpoint (tidal-init --preset qwen2.5-0.5b --dtype f32,
#   cached in $BUILD/bench/), cases
#     tf        teacher-forced log-probs, TF_BATCH sequences of TF_LEN tokens
#     decode1   1 slot, prefill PROMPT tokens, STEPS decode steps (full log-softmax rows)
#     decode16  16 slots, the same, one batched step per token of every slot
# Each side runs ROUNDS times, interleaved, and keeps its best (the machine is shared, so
# timings are noisy). Both sides run with OMP_WAIT_POLICY=PASSIVE and a 10 us spin
# (GOMP_SPINCOUNT=1000) unless set, as the tools do: with other jobs on the 2 cores, OpenMP
# workers spinning at barriers while their partner is descheduled cost tidal's decode (about 100
# parallel regions per step) 2-5x; passive waiting costs ~1% when the machine is quiet. Prints
#   bench: model-NAME tidal=X torch=Y ratio=R     (tokens/s; R = tidal / torch)
#   bench: model-peak-rss tidal_mb=X
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-2}
[ -n "${OMP_WAIT_POLICY:-}" ] || export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000}   # as the tools do (src/util/opts.c)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ARGS=(--tf-batch "${TF_BATCH:-2}" --tf-len "${TF_LEN:-512}" --prompt "${PROMPT:-32}"
      --steps "${STEPS:-16}" --decode-batch 16)
DIR=$BUILD/bench/qwen2.5-0.5b
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3

if [ ! -f "$DIR/model.safetensors" ] || [ ! -f "$DIR/config.json" ]; then
  "$BUILD/bin/tidal-init" --preset qwen2.5-0.5b --dtype f32 --seed 1 -o "$DIR" 2>/dev/null \
    || { echo "model.sh: tidal-init failed" >&2; exit 1; }
fi

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
have_torch=1
"$PY" -c "import torch, safetensors" 2>/dev/null || have_torch=0
for r in $(seq "$ROUNDS"); do
  "$BUILD/bin/tidal-bench-model" --model "$DIR" "${ARGS[@]}" >>"$tmp/tidal" \
    || { echo "model.sh: tidal-bench-model failed" >&2; exit 1; }
  if [ $have_torch = 1 ]; then
    "$PY" tests/bench/torch_model.py --model "$DIR" "${ARGS[@]}" >>"$tmp/torch" \
      || { echo "model.sh: torch_model.py failed" >&2; have_torch=0; }
  fi
done

best() {  # best tokens/s of case $2 in file $1
  awk -v c="$2" '$1 == "case" && $2 == c && $4 > b { b = $4 } END { if (b) printf "%.2f", b }' "$1"
}
for c in tf decode1 decode16; do
  t=$(best "$tmp/tidal" $c)
  if [ $have_torch = 1 ]; then
    p=$(best "$tmp/torch" $c)
    echo "bench: model-$c tidal=$t torch=$p ratio=$(awk -v a="$t" -v b="$p" 'BEGIN { printf "%.2f", a / b }')"
  else
    echo "bench: model-$c tidal=$t torch=NA ratio=NA"
  fi
done
rss=$(awk '$1 == "peak_rss_mb" && $2 > b { b = $2 } END { print b }' "$tmp/tidal")
echo "bench: model-peak-rss tidal_mb=$rss"
