#!/usr/bin/env bash
# reports/big: a Llama-3-8B-shaped bf16 checkpoint diffed on this machine (24 GiB RAM, 2 cores).
#   1. tidal-init writes the checkpoint (16 GB, bf16; kept out of git under $BIG, default
#      build/big/llama3-8b): C 4096, L 32, NH 32, NKV 8, F 14336, V 128256, rope_theta 500000
#   2. tidal-diff bf16-train vs bf16-infer, and bf16-train vs fp8-rollout, 8 prompts x 64 new
#      tokens (--no-stop-at-eos: every sequence runs its 64 tokens), one batch of 8
# each under /usr/bin/time -v (peak RSS = "Maximum resident set size", wall = "Elapsed");
# logs and run files in $OUT (default build/big/out). NEW=N runs N new tokens instead of 64.
# Usage: reports/big/make.sh   (about 10-20 minutes per run on 2 shared cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
B=$BUILD/bin
BIG=${BIG:-$BUILD/big/llama3-8b}
OUT=${OUT:-$BUILD/big/out}
NEW=${NEW:-64}
export OMP_WAIT_POLICY=PASSIVE
mkdir -p "$OUT"
if [ ! -f "$BIG/model.safetensors" ]; then
  /usr/bin/time -v "$B/tidal-init" --arch llama --hidden-size 4096 --num-layers 32 --num-heads 32 \
      --num-kv-heads 8 --intermediate-size 14336 --vocab-size 128256 --rope-theta 500000 --no-tie \
      --dtype bf16 --seed 1 -o "$BIG" 2> "$OUT/init.log"
fi
# 8 prompts of 12-19 token ids (the random checkpoint has no tokenizer)
python3 - "$OUT/prompts.jsonl" <<'PY'
import json, random, sys
rng = random.Random(8)
with open(sys.argv[1], "w") as f:
    for i in range(8):
        f.write(json.dumps({"tokens": [rng.randrange(1000, 128000) for _ in range(12 + i)]}) + "\n")
PY
for b in bf16-infer fp8-rollout; do
  /usr/bin/time -v "$B/tidal-diff" --model "$BIG" --prompts "$OUT/prompts.jsonl" --recipe-a bf16-train \
      --recipe-b "$b" --max-new-tokens "$NEW" --batch 8 --seed 1 --no-stop-at-eos \
      -o "$OUT/8b-$b.h5" --force > "$OUT/8b-$b.txt" 2> "$OUT/8b-$b.log"
  echo "== bf16-train vs $b: $(grep -E 'Maximum resident|Elapsed' "$OUT/8b-$b.log" | tr -s ' ' | tr '\n' ' ')"
done
