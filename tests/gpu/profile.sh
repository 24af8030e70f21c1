#!/usr/bin/env bash
# Where the GPU time goes (tests/gpu/run.sh profile): the CUDA backend's own op-by-op timing
# (TIDAL_CUDA_PROFILE=FILE: every kernel launch, cuBLASLt GEMM and host<->device copy timed between
# device synchronisations; the table is appended to FILE at exit, src/backend/cuda/profile.cu) on
# the cases the H200 of 2026-11-29 found slow (reports/gpu/README.md, "Measured on an H200"):
#   tf        tidal-bench-model, 0.5B, 4 x 512 teacher-forced, bf16-train   (0.289 s: 1.2 % of cuBLAS)
#   decode1   the same, 32 decode steps at batch 1, bf16-infer               (3.8 % of HBM)
#   decode64  16 decode steps at batch 64                                   (1.0 % of HBM)
#   diff      tidal-diff 0.5B, 16 x (256 + 64), bf16-train vs vllm-bf16
#   diff-8b   tidal-diff on the 8B checkpoint of diff_8b8k.sh (written if absent, ~35 s),
#             1 prompt of 8,192 + 32 generated, bf16-train vs vllm-bf16     (270 ms a decode step)
#   rl        tidal-rl --device cuda, 0.5B, 1 step of 2 x 8 completions of 128 tokens
# The timing synchronises around every op, so the totals are slower than unprofiled runs; the
# table's shares (and "not in any op": the host's own work between ops) are what it is for.
# Each case under its own limit; tables in $OUT/profile-CASE.txt (with the GEMMs by shape), the
# tables without the shapes in $OUT/profile.md. TIDAL_GPU_TINY=1 (the rehearsal on the CUDA simulator): tiny models and shapes.
set -uo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build} OUT=${OUT:-out/gpu}
B=$BUILD/bin
PY=${TIDAL_PY:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
TINY=${TIDAL_GPU_TINY:-0}
W=$OUT/profile
mkdir -p "$W"
if [ "$TINY" = 1 ]; then
  Q=$BUILD/gpu/tiny-qwen2-bf16 QI=(--arch qwen2 --hidden-size 64 --num-layers 2 --num-heads 4 --num-kv-heads 2
                                    --intermediate-size 128 --vocab-size 512)
  L=$BUILD/big/tiny-llama TF=(--tf-batch 1 --tf-len 16) D1=(--steps 4) D64=(--steps 2 --decode-batch 4)
  DIFF=(2 16 4) BIG=(1 32 4) RLN=(2 2 8 2)
else
  Q=$BUILD/gpu/qwen2.5-0.5b-bf16 QI=(--preset qwen2.5-0.5b)
  L=$BUILD/big/llama-3.1-8b TF=(--tf-batch 4 --tf-len 512) D1=(--steps 32)
  D64=(--steps 16 --decode-batch 64) DIFF=(16 256 64) BIG=(1 8192 32) RLN=(2 8 128 16)
fi
[ -f "$Q/config.json" ] || "$B/tidal-init" "${QI[@]}" --dtype bf16 --seed 1 -o "$Q" >/dev/null || { echo "profile.sh: tidal-init $Q failed"; exit 1; }
prompts() {   # FILE N LEN VOCAB
  "$PY" -c "import json, random, sys; r = random.Random(1)
for _ in range(int(sys.argv[1])): print(json.dumps({'tokens': [r.randrange(int(sys.argv[3])) for _ in range(int(sys.argv[2]))]}))" "$2" "$3" "$4" > "$1"
}
V=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['vocab_size'])" "$Q/config.json")
rc=0
one() {   # CASE LIMIT COMMAND...
  local c=$1 lim=$2; shift 2
  rm -f "$W/profile-$c.txt"
  local t0=$(date +%s)
  TIDAL_CUDA_PROFILE="$W/profile-$c.txt" timeout -k 5 "$lim" "$@" > "$W/$c.out" 2> "$W/$c.err"; local r=$?
  echo "profile.sh: $c: exit $r, $(( $(date +%s) - t0 )) s"
  [ $r -eq 0 ] || { rc=1; tail -n 3 "$W/$c.err"; }
  { echo "## $c (exit $r, $(( $(date +%s) - t0 )) s)"; echo; echo '```'; echo "$*" | sed "s#$PWD/##g"
    if [ -s "$W/profile-$c.txt" ]; then sed '/-- by shape/q' "$W/profile-$c.txt"; else echo "(no table: the process did not reach its exit)"; fi
    echo '```'; echo; } >> "$W/profile.md.part"
}
rm -f "$W/profile.md.part"
one tf 60 "$B/tidal-bench-model" --model "$Q" --device cuda --recipe bf16-train --only tf "${TF[@]}"
one decode1 60 "$B/tidal-bench-model" --model "$Q" --device cuda --recipe bf16-infer --only decode1 "${D1[@]}"
one decode64 60 "$B/tidal-bench-model" --model "$Q" --device cuda --recipe bf16-infer --only decodeB "${D64[@]}"
prompts "$W/prompts-diff.jsonl" "${DIFF[0]}" "${DIFF[1]}" "$V"
one diff 90 "$B/tidal-diff" --model "$Q" --device cuda --prompts "$W/prompts-diff.jsonl" -o "$W/diff.h5" --force \
  --max-new-tokens "${DIFF[2]}" --batch "${DIFF[0]}" --no-stop-at-eos --recipe-a bf16-train --recipe-b vllm-bf16
# the 8B checkpoint is diff_8b8k.sh's (the same folder; written there if absent)
[ -f "$L/config.json" ] || bash tests/gpu/diff_8b8k.sh init || echo "profile.sh: the checkpoint $L failed"
if [ -f "$L/config.json" ]; then
  prompts "$W/prompts-8b.jsonl" "${BIG[0]}" "${BIG[1]}" 128000
  [ "$TINY" = 1 ] && prompts "$W/prompts-8b.jsonl" "${BIG[0]}" "${BIG[1]}" 250
  one diff-8b 150 "$B/tidal-diff" --model "$L" --device cuda --prompts "$W/prompts-8b.jsonl" -o "$W/diff-8b.h5" --force \
    --max-new-tokens "${BIG[2]}" --batch 1 --no-stop-at-eos --recipe-a bf16-train --recipe-b vllm-bf16
fi
# tidal-rl needs a tokenizer: the synthetic one rl_bench.sh makes (tests/gpu/make_tokenizer.py)
R=$BUILD/bench/profile-rl-model
if [ ! -f "$R/tokenizer.json" ]; then
  rm -rf "$R"; mkdir -p "$(dirname "$R")" && cp -r "$Q" "$R" && "$PY" tests/gpu/make_tokenizer.py "$R" >/dev/null || echo "profile.sh: the rl model's tokenizer failed"
fi
"$PY" -c "import json, random; r = random.Random(1)
for _ in range(${RLN[0]}): print(json.dumps({'prompt': ' '.join('w%d' % r.randrange(100000) for _ in range(${RLN[3]}))}))" > "$W/prompts-rl.jsonl"
one rl 120 "$B/tidal-rl" --model-path "$R" --dataset-path "$W/prompts-rl.jsonl" --device cuda --dtype bf16 \
  --reward-command "python3 -c 'import sys, random; [print(random.random(), flush=True) for _ in sys.stdin]'" \
  --num-generations "${RLN[1]}" --per-device-batch-size "${RLN[1]}" --gradient-accumulation-steps "${RLN[0]}" \
  --max-completion-length "${RLN[2]}" --max-seq-length $(( ${RLN[2]} + 512 )) --max-steps 1 --gradient-checkpointing \
  --overwrite-output-dir -o "$BUILD/bench/profile-rl-run"
mv -f "$W/profile.md.part" "$OUT/profile.md"
cat "$OUT/profile.md"
exit $rc
