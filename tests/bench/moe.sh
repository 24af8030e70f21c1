#!/usr/bin/env bash
# Throughput of the fp32 CPU forward on a mixture of experts (tools/tidal-bench-model) against
# transformers' own eager MoE model (tests/bench/torch_moe.py, 2 threads), same checkpoint, same
# shapes: a Mixtral-shaped random model (C 512, 4 layers, 8 heads / 2 KV heads, 8 experts top-2 of
# width 1024, V 8192; written by transformers into $BUILD/bench/mixtral-moe once), cases as model.sh:
#     tf        teacher-forced log-probs, TF_BATCH sequences of TF_LEN tokens
#     decode1   1 slot, prefill PROMPT tokens, STEPS decode steps (full log-softmax rows)
#     decode16  16 slots, the same
#     train     a training step (forward, backward through experts and routers, clip, AdamW) in fp32
#               on TRAIN_BATCH sequences of TRAIN_LEN tokens: tests/helpers/train_probe against
#               torch_moe.py --train (transformers' model under autograd), SECONDS_PER of steps each
# An MoE forward costs its active parameters: each expert's GEMMs run on the rows routed to it.
# Each side runs ROUNDS times, interleaved, and keeps its best. Prints
#   bench: moe-NAME tidal=X torch=Y ratio=R     (tokens/s; R = tidal / torch)
# (torch=NA when transformers is not installed: the checkpoint comes from it, so tidal is skipped too)
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
ROUNDS=${ROUNDS:-2}
[ -n "${OMP_WAIT_POLICY:-}" ] || export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000}   # as the tools do (src/util/opts.c)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE}
ARGS=(--tf-batch "${TF_BATCH:-2}" --tf-len "${TF_LEN:-512}" --prompt "${PROMPT:-32}" --steps "${STEPS:-16}"
      --decode-batch 16)
DIR=$BUILD/bench/mixtral-moe
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
if ! "$PY" -c "import torch, transformers" 2>/dev/null; then
  for c in tf decode1 decode16; do echo "bench: moe-$c tidal=NA torch=NA ratio=NA (transformers not installed)"; done
  exit 0
fi
[ -f "$DIR/model.safetensors" ] || "$PY" tests/bench/torch_moe.py --make "$DIR" 2>/dev/null \
  || { echo "moe.sh: could not write the checkpoint" >&2; exit 1; }
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for r in $(seq "$ROUNDS"); do
  "$BUILD/bin/tidal-bench-model" --model "$DIR" "${ARGS[@]}" >>"$tmp/tidal" \
    || { echo "moe.sh: tidal-bench-model failed" >&2; exit 1; }
  "$PY" tests/bench/torch_moe.py --model "$DIR" "${ARGS[@]}" >>"$tmp/torch" 2>/dev/null \
    || { echo "moe.sh: torch_moe.py failed" >&2; exit 1; }
done
best() { awk -v c="$2" '$1 == "case" && $2 == c && $4 > b { b = $4 } END { if (b) printf "%.2f", b }' "$1"; }
for c in tf decode1 decode16; do
  t=$(best "$tmp/tidal" $c); p=$(best "$tmp/torch" $c)
  echo "bench: moe-$c tidal=$t torch=$p ratio=$(awk -v a="$t" -v b="$p" 'BEGIN { printf "%.2f", a / b }')"
done
# the training step
PROBE=$BUILD/tests/helpers/train_probe
[ -x "$PROBE" ] || { echo "moe.sh: $PROBE missing (make tests)" >&2; exit 1; }
"$PY" tests/bench/make_batch.py 8192 "${TRAIN_BATCH:-4}" "${TRAIN_LEN:-128}" > "$tmp/batch.json"
: > "$tmp/tt"; : > "$tmp/pt"
for r in $(seq "$ROUNDS"); do
  "$PROBE" --model "$DIR" --batch "$tmp/batch.json" --recipe fp32 --lr 1e-5 --bench-seconds "${SECONDS_PER:-8}" \
    | awk '$1 == "tokens_per_s" { print $2 }' >> "$tmp/tt"
  "$PY" tests/bench/torch_moe.py --model "$DIR" --train "$tmp/batch.json" --seconds "${SECONDS_PER:-8}" 2>/dev/null \
    | awk '$1 == "tokens_per_s" { print $2 }' >> "$tmp/pt"
done
t=$(sort -g "$tmp/tt" | tail -n1); p=$(sort -g "$tmp/pt" | tail -n1)
echo "bench: moe-train-fp32 tidal=$t torch=$p ratio=$(awk -v a="$t" -v b="$p" 'BEGIN { if (a > 0 && b > 0) printf "%.2f", a / b; else print "NA" }')"
