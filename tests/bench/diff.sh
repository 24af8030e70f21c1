#!/usr/bin/env bash
# tidal-diff throughput on the Qwen2.5-0.5B-shaped random checkpoint (the one model.sh makes),
# against the PyTorch peer (tests/bench/torch_diff.py: the same generate + teacher-force + KL
# work in torch on the CPU, 2 threads) in fp32 and in bf16, and the emulation overhead of
# tidal's bf16 recipes against its fp32 recipe. Same shapes everywhere: BATCH prompts of
# PROMPT random tokens, GEN generated tokens each; tidal's runs best of ROUNDS (2), interleaved,
# torch's one run each (its bf16 run alone takes minutes). Prints
#   bench: diff-bf16-vs-torch-fp32 tidal=X torch=Y ratio=R   (scored tokens/s, R = tidal/torch)
#   bench: diff-bf16-vs-torch-bf16 tidal=X torch=Y ratio=R
#   bench: diff-emulation-overhead fp32=X bf16=Y overhead=Z  (Z = fp32 speed / bf16 speed; target <= 2)
#   bench: diff-fp16-vs-torch-fp16 tidal=X torch=Y ratio=R    (fp16-train vs fp16-infer; torch in float16)
#   bench: diff-fp16-vs-bf16 fp16=X bf16=Y ratio=R             (tidal's fp16 pair against its bf16 pair; target >= 0.8)
#   bench: diff-fp8-vs-bf16 fp8=X bf16=Y ratio=R               (fp8-unified-train vs fp8-unified-infer, block
#                                                              FP8 both sides; PyTorch has no FP8 GEMM on the CPU)
#   bench: diff-fp8-vs-fp16 fp8=X fp16=Y ratio=R               (the same FP8 pair against the fp16 pair; target >= 0.8)
set -u
cd "$(dirname "$0")/../.."
. tests/bench/common.bash   # best, ratio
BUILD=${BUILD:-build}
BATCH=${BATCH:-4}; PROMPT=${PROMPT:-32}; GEN=${GEN:-32}; ROUNDS=${ROUNDS:-2}
DIR=$BUILD/bench/qwen2.5-0.5b
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
if [ ! -f "$DIR/model.safetensors" ] || [ ! -f "$DIR/config.json" ]; then
  "$BUILD/bin/tidal-init" --preset qwen2.5-0.5b --dtype f32 --seed 1 -o "$DIR" 2>/dev/null \
    || { echo "diff.sh: tidal-init failed" >&2; exit 1; }
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PY" - "$BATCH" "$PROMPT" > "$tmp/prompts.jsonl" <<'PYEOF'
import json, random, sys
random.seed(1)
for _ in range(int(sys.argv[1])):
    print(json.dumps({"tokens": [random.randrange(151936) for _ in range(int(sys.argv[2]))]}))
PYEOF
tidal_tps() {  # $1 $2: recipes A and B -> scored tokens/s of tidal-diff
  "$BUILD/bin/tidal-diff" --model "$DIR" --prompts "$tmp/prompts.jsonl" --recipe-a "$1" --recipe-b "$2" \
    --max-new-tokens "$GEN" --no-stop-at-eos --batch "$BATCH" -o "$tmp/run.h5" --force 2>/dev/null \
    | awk '$1 == "throughput" { print $2 }'
}
# tidal's four pairs in turn, ROUNDS times, best of the rounds each: the ratios between them
# (fp16 and fp8 against bf16) then compare runs seconds apart, not minutes, on a shared machine
r32=; r16=; rh=; r8=
for _ in $(seq "$ROUNDS"); do
  r32="$r32 $(tidal_tps fp32 fp32)"
  r16="$r16 $(tidal_tps bf16-train bf16-infer)"
  rh="$rh $(tidal_tps fp16-train fp16-infer)"
  r8="$r8 $(tidal_tps fp8-unified-train fp8-unified-infer)"
done
t32=$(echo $r32 | best); t16=$(echo $r16 | best); th=$(echo $rh | best); t8=$(echo $r8 | best)
peer() { "$PY" tests/bench/torch_diff.py --model "$DIR" --dtype "$1" --batch "$BATCH" --prompt "$PROMPT" --gen "$GEN" \
           | awk '$1 == "case" { print $4 }'; }
p32=$(peer float32 2>/dev/null || true)
p16=$(peer bfloat16 2>/dev/null || true)
ph=$(peer float16 2>/dev/null || true)
echo "bench: diff-bf16-vs-torch-fp32 tidal=${t16:-NA} torch=${p32:-NA} ratio=$(ratio "$t16" "$p32")"
echo "bench: diff-bf16-vs-torch-bf16 tidal=${t16:-NA} torch=${p16:-NA} ratio=$(ratio "$t16" "$p16")"
echo "bench: diff-emulation-overhead fp32=${t32:-NA} bf16=${t16:-NA} overhead=$(ratio "$t32" "$t16")"
why=""; [ -z "$ph" ] && why=" (this PyTorch has no float16 GEMM on the CPU: $("$PY" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
echo "bench: diff-fp16-vs-torch-fp16 tidal=${th:-NA} torch=${ph:-NA} ratio=$(ratio "$th" "$ph")$why"
echo "bench: diff-fp16-vs-bf16 fp16=${th:-NA} bf16=${t16:-NA} ratio=$(ratio "$th" "$t16")"
echo "bench: diff-fp8-vs-bf16 fp8=${t8:-NA} bf16=${t16:-NA} ratio=$(ratio "$t8" "$t16")"
echo "bench: diff-fp8-vs-fp16 fp8=${t8:-NA} fp16=${th:-NA} ratio=$(ratio "$t8" "$th")"
