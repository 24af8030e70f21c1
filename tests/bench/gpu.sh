#!/usr/bin/env bash
# GPU benchmarks of the CUDA backend (issue 17), against peers measured in the same run on the
# same GPU; skipped with a message where there is no NVIDIA GPU or tidal was built without CUDA.
#   checkpoint  a Qwen2.5-0.5B-shaped random bf16 checkpoint (tidal-init, cached in $BUILD/bench/)
#   tidal       tidal-bench-model --device cuda: teacher-forced (bf16-train) TF_BATCH x TF_LEN,
#               decode (bf16-infer) at batch 1 and DECODE_BATCH (64), full log-softmax rows kept in device memory (as tidal-diff keeps them)
#   peers       $BUILD/gpu/peer (tests/gpu/peer.cu): cuBLASLt BF16 GEMM throughput on each of the
#               model's own GEMM shapes, and the HBM bandwidth; tests/gpu/hf_bench.py:
#               transformers (eager attention, bf16) on the same checkpoint and shapes
# Prints
#   bench: gpu-tf-vs-cublas tidal=S peer=S_ideal ratio=R   (seconds of one teacher-forced batch;
#          the peer is the time cuBLASLt alone needs for the model's GEMMs at its measured rate:
#          R = fraction of cuBLAS BF16 peak on these shapes)
#   bench: gpu-decodeB-vs-hbm tidal=GB/s peer=GB/s ratio=R  (weight bytes read per step / step time,
#          against the measured bandwidth; B = 1 and DECODE_BATCH)
#   bench: gpu-NAME-vs-transformers tidal=X peer=Y ratio=R  (tokens/s, NAME = tf, decode1, decodeB)
#   bench: gpu-diff-vs-transformers tidal=X peer=Y ratio=R  (scored tokens/s of a whole diff:
#          tidal-diff --device cuda, bf16-train vs bf16-infer, DIFF_PROMPTS prompts of DIFF_PLEN
#          random tokens, DIFF_NEW sampled tokens each, batch DIFF_BATCH, against
#          tests/gpu/hf_diff_bench.py: transformers (SDPA, bf16) generating and scoring the same)
# Targets (issue 17): tf >= 1.5x transformers eager; decode1 >= 50 % of HBM bandwidth;
# (issue 26) a whole diff >= 1.5x transformers.
# Needs: the CUDA build's tools and $BUILD/gpu/peer (tests/gpu/pack.sh packs them; built here
# with nvcc if absent); python with torch (CUDA) + transformers for the peers (else their ratios
# are NA). TIDAL_GPU_TINY=1 (tests/gpu/run.sh's rehearsal on the simulator): a tiny Qwen2 and
# tiny shapes; TIDAL_TORCH_DEVICE=cpu runs the transformers peers on the CPU.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
PY=${TIDAL_PY:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
TDEV=${TIDAL_TORCH_DEVICE:-cuda}
if [ "${TIDAL_GPU_TINY:-0}" = 1 ]; then
  : "${TF_BATCH:=1}" "${TF_LEN:=16}" "${PROMPT:=4}" "${STEPS:=4}" "${DECODE_BATCH:=2}"
  : "${DIFF_PROMPTS:=2}" "${DIFF_PLEN:=8}" "${DIFF_NEW:=4}" "${DIFF_BATCH:=2}"
fi
TF_BATCH=${TF_BATCH:-4} TF_LEN=${TF_LEN:-512} PROMPT=${PROMPT:-32} STEPS=${STEPS:-64} DB=${DECODE_BATCH:-64}
DIFF_PROMPTS=${DIFF_PROMPTS:-32} DIFF_PLEN=${DIFF_PLEN:-256} DIFF_NEW=${DIFF_NEW:-128} DIFF_BATCH=${DIFF_BATCH:-16}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "bench: gpu skipped (no NVIDIA GPU on this machine: run tests/gpu/run.sh bench on one)"
  exit 0
fi
# the checkpoint the other GPU stages use too (tests/gpu/test_vs_transformers.py, fidelity, memory)
DIR=$BUILD/gpu/qwen2.5-0.5b-bf16
INIT=(--preset qwen2.5-0.5b)
if [ "${TIDAL_GPU_TINY:-0}" = 1 ]; then
  DIR=$BUILD/gpu/tiny-qwen2-bf16
  INIT=(--arch qwen2 --hidden-size 64 --num-layers 2 --num-heads 4 --num-kv-heads 2 --intermediate-size 128 --vocab-size 512)
fi
if [ ! -f "$DIR/config.json" ]; then
  "$BUILD/bin/tidal-init" "${INIT[@]}" --dtype bf16 --seed 1 -o "$DIR" >/dev/null \
    || { echo "gpu.sh: tidal-init failed" >&2; exit 1; }
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
if ! "$BUILD/bin/tidal-bench-model" --model "$DIR" --device cuda --only tf --tf-batch 1 --tf-len 16 >/dev/null 2>"$tmp/err"; then
  echo "bench: gpu skipped ($(tail -n1 "$tmp/err"))"
  exit 0
fi
# the packed peer as it is (the device machine has no nvcc, and make would rebuild it whenever the
# copied tests/gpu/peer.cu looks newer than the archive's binary)
if [ ! -x "$BUILD/gpu/peer" ]; then
  make --no-print-directory "$BUILD/gpu/peer" >/dev/null || { echo "gpu.sh: $BUILD/gpu/peer absent and building it failed" >&2; exit 1; }
fi
B="$BUILD/bin/tidal-bench-model --model $DIR --device cuda --prompt $PROMPT --steps $STEPS"
$B --recipe bf16-train --only tf --tf-batch "$TF_BATCH" --tf-len "$TF_LEN" > "$tmp/tf" || exit 1
$B --recipe bf16-infer --only decode1 --bandwidth > "$tmp/d1" || exit 1
$B --recipe bf16-infer --only decodeB --decode-batch "$DB" > "$tmp/dB" || exit 1
"$PY" tests/gpu/hf_bench.py --model "$DIR" --device "$TDEV" --dtype bf16 --attn eager --tf-batch "$TF_BATCH" --tf-len "$TF_LEN" \
  --prompt "$PROMPT" --steps "$STEPS" --decode-batch "$DB" > "$tmp/hf" || echo "gpu.sh: transformers peer failed" >&2
"$BUILD/gpu/peer" bandwidth > "$tmp/bw" || exit 1
# the model's GEMMs, (M, N, K, count): each layer's projections at M = TF_BATCH*TF_LEN rows, the
# lm_head in tidal's chunks of 256 rows
M=$((TF_BATCH * TF_LEN))
"$PY" - "$DIR/config.json" "$M" > "$tmp/shapes" <<'PYEOF'
import json, sys
c = json.load(open(sys.argv[1])); M = int(sys.argv[2])
C, F, L, V = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
HD = c.get("head_dim") or C // c["num_attention_heads"]
QD, KVD = c["num_attention_heads"] * HD, c["num_key_value_heads"] * HD
for n, k in [(QD, C), (KVD, C), (KVD, C), (C, QD), (F, C), (F, C), (C, F)]:
    print(M, n, k, L)
print(256, V, C, (M + 255) // 256)
PYEOF
ideal=0
while read -r m n k cnt; do
  t=$("$BUILD/gpu/peer" gemm "$m" "$n" "$k" 20 | awk '{ print $6 }')
  ideal=$(awk -v s="$ideal" -v m="$m" -v n="$n" -v k="$k" -v c="$cnt" -v t="$t" 'BEGIN { printf "%.9f", s + c * 2 * m * n * k / (t * 1e12) }')
done < "$tmp/shapes"
tf_s=$(awk '$1 == "case" && $2 == "tf" { print $6 }' "$tmp/tf")
echo "bench: gpu-tf-vs-cublas tidal=$tf_s peer=$ideal ratio=$(awk -v a="$ideal" -v b="$tf_s" 'BEGIN { printf "%.3f", a / b }')"
bw=$(awk '$1 == "bandwidth_gbs" { print $2 }' "$tmp/bw")
bytes=$(awk '$1 == "decode_bytes_per_step" { print $2 }' "$tmp/d1")
for f in d1 dB; do
  c=$(awk '$1 == "case" && $2 ~ /^decode/ { print $2 }' "$tmp/$f")
  s=$(awk '$1 == "case" && $2 ~ /^decode/ { print $6 }' "$tmp/$f")
  gbs=$(awk -v b="$bytes" -v n="$STEPS" -v s="$s" 'BEGIN { printf "%.1f", b * n / s / 1e9 }')
  echo "bench: gpu-$c-vs-hbm tidal=$gbs peer=$bw ratio=$(awk -v a="$gbs" -v b="$bw" 'BEGIN { printf "%.3f", a / b }')"
done
for c in tf decode1 "decode$DB"; do
  t=$(cat "$tmp/tf" "$tmp/d1" "$tmp/dB" | awk -v c="$c" '$1 == "case" && $2 == c { print $4 }')
  p=$(awk -v c="$c" '$1 == "case" && $2 == c { print $4 }' "$tmp/hf")
  if [ -n "$p" ]; then
    echo "bench: gpu-$c-vs-transformers tidal=$t peer=$p ratio=$(awk -v a="$t" -v b="$p" 'BEGIN { printf "%.2f", a / b }')"
  else
    echo "bench: gpu-$c-vs-transformers tidal=$t peer=NA ratio=NA"
  fi
done
# a whole diff: tidal-diff --device cuda against transformers generating and scoring the same
"$PY" -c "import json, random, sys
r = random.Random(1); V = json.load(open(sys.argv[1]))['vocab_size']
for _ in range(int(sys.argv[2])): print(json.dumps({'tokens': [r.randrange(V) for _ in range(int(sys.argv[3]))]}))" \
  "$DIR/config.json" "$DIFF_PROMPTS" "$DIFF_PLEN" > "$tmp/prompts.jsonl"
"$BUILD/bin/tidal-diff" --model "$DIR" --device cuda --prompts "$tmp/prompts.jsonl" -o "$tmp/diff.h5" \
  --max-new-tokens "$DIFF_NEW" --batch "$DIFF_BATCH" --no-stop-at-eos --recipe-a bf16-train --recipe-b bf16-infer \
  > "$tmp/diff.out" 2>&1 || { echo "gpu.sh: tidal-diff failed: $(tail -n1 "$tmp/diff.out")" >&2; exit 1; }
"$PY" tests/gpu/hf_diff_bench.py --model "$DIR" --prompts "$tmp/prompts.jsonl" --max-new-tokens "$DIFF_NEW" \
  --batch "$DIFF_BATCH" --dtype bf16 --attn sdpa --device "$TDEV" > "$tmp/hfdiff" 2>&1 ||
  echo "gpu.sh: transformers diff peer failed: $(tail -n2 "$tmp/hfdiff")" >&2
t=$(awk '$1 == "throughput" { print $2 }' "$tmp/diff.out" | tail -n1)
p=$(awk '$1 == "throughput" { print $2 }' "$tmp/hfdiff")
if [ -n "$p" ]; then
  echo "bench: gpu-diff-vs-transformers tidal=$t peer=$p ratio=$(awk -v a="$t" -v b="$p" 'BEGIN { printf "%.2f", a / b }')"
else
  echo "bench: gpu-diff-vs-transformers tidal=$t peer=NA ratio=NA"
fi
