#!/usr/bin/env bash
# Reference runs for behaviour-preserving refactors of the model code (issue 11): every run
# file and tidal-logprobs output that the forward, the recipes, the KV cache, --layers and LoRA
# produce on a few models, written under OUTDIR. Run it before and after a change, then
#   .venv/bin/python tests/house/compare.py OUTDIR_BEFORE OUTDIR_AFTER
# which compares every HDF5 dataset and every text output bit for bit.
# Usage: tests/house/runs.sh OUTDIR   (BUILD=build by default; takes a few minutes on 2 cores)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${1:?usage: tests/house/runs.sh OUTDIR}
BUILD=${BUILD:-build}
B=$BUILD/bin
export OMP_WAIT_POLICY=PASSIVE
mkdir -p "$OUT"
DEMO=datasets/demo-model PROMPTS=datasets/demo-prompts.jsonl
MODELS=$OUT/models
rm -rf "$MODELS"; mkdir -p "$MODELS"

# what make demo runs
for p in bf16 fp16; do
  "$B/tidal-diff" --model $DEMO --prompts $PROMPTS --recipe-a $p-train --recipe-b $p-infer \
      --max-new-tokens 48 --batch 8 --seed 1 -o "$OUT/demo-$p.h5" --force 2>/dev/null >"$OUT/demo-$p.txt"
done

diffrun() {  # name model recipe-a recipe-b [flags]
  local name=$1 model=$2 a=$3 b=$4; shift 4
  "$B/tidal-diff" --model "$model" --prompts "${PROMPTS_FOR:-$PROMPTS}" --recipe-a "$a" --recipe-b "$b" \
      --max-new-tokens "${MAXNEW:-24}" --batch "${BATCH:-8}" --seed 1 -o "$OUT/$name.h5" --force "$@" \
      2>/dev/null >"$OUT/$name.txt"
}

# a recipe file covering what no preset does: eager (full) bf16 attention, fp8 KV cache with a
# scale, split-K 3, batch invariance, fused norm with unfused rope
cat > "$OUT/custom.json" <<'J'
{"name":"custom","weights":"bf16","activations":"bf16","gemm_inputs":"bf16","accumulate":"fp32",
 "split_k":3,"attention":"full","decode_splits":1,"kv_cache":"e4m3","kv_scale":0.5,
 "lm_head":"native","norm":"fused","rope":"unfused","batch_invariant":true}
J

diffrun fp32 $DEMO fp32 fp32 --layers
diffrun fp8-rollout $DEMO bf16-train fp8-rollout --layers
diffrun fp8-unified $DEMO fp8-unified fp8-unified
diffrun fp32head $DEMO bf16-train-fp32head bf16-infer-fp32head --score-prompt
diffrun custom $DEMO fp16-train "$OUT/custom.json" --layers

# LoRA, as tests/py/test_lora.py and reports/precision/make.sh make them
"$B/tidal-init" --lora-for $DEMO --rank 16 --alpha 32 --lora-std 0.01 --seed 5 -o "$MODELS/lora" >/dev/null 2>&1
diffrun lora-unmerged $DEMO bf16-train bf16-infer --lora "$MODELS/lora"
diffrun lora-merged-b $DEMO bf16-train bf16-infer --lora "$MODELS/lora" --lora-merge-b
diffrun lora-fp32-merged-a $DEMO fp32 fp32 --lora "$MODELS/lora" --lora-merge-a --layers
diffrun lora-fp8 $DEMO fp8-unified fp8-rollout --lora "$MODELS/lora" --lora-merge-b

# other architectures: llama (GQA, untied), qwen3 (q/k norm, tied), mistral; a vocabulary large
# enough that the log-softmax splits rows over threads; long prompts for blocked attention
"$B/tidal-init" --arch qwen3 --preset tiny --vocab 4096 --seed 3 --embed-std 0.5 -o "$MODELS/qwen3" >/dev/null 2>&1
"$B/tidal-init" --arch llama --preset tiny --hidden 256 --intermediate 704 --heads 4 --kv-heads 2 --head-dim 64 --vocab 4096 --seed 4 --dtype bf16 -o "$MODELS/llama" >/dev/null 2>&1
"$B/tidal-init" --arch mistral --preset tiny --vocab 4096 --seed 5 --dtype f16 -o "$MODELS/mistral" >/dev/null 2>&1
.venv/bin/python - "$OUT/long.jsonl" <<'PY'
import json, random, sys
rng = random.Random(11)
with open(sys.argv[1], "w") as f:
    for i in range(6):
        f.write(json.dumps({"tokens": [rng.randrange(3, 4096) for _ in range(rng.choice([5, 40, 150]))]}) + "\n")
with open(sys.argv[1].replace("long", "replay"), "w") as f:   # rollouts replayed (replay mode)
    for i in range(4):
        n = rng.choice([6, 30])
        f.write(json.dumps({"prompt_ids": [rng.randrange(3, 4096) for _ in range(rng.choice([4, 50]))],
                            "response_ids": [rng.randrange(3, 4096) for _ in range(n)],
                            "rollout_logprobs": [-rng.random() * 5 for _ in range(n)]}) + "\n")
PY
for m in qwen3 llama mistral; do
  PROMPTS_FOR="$OUT/long.jsonl" BATCH=4 diffrun $m-bf16 "$MODELS/$m" bf16-train bf16-infer --layers --score-prompt
  PROMPTS_FOR="$OUT/long.jsonl" BATCH=3 diffrun $m-fp8 "$MODELS/$m" fp8-unified fp8-rollout
  PROMPTS_FOR="$OUT/long.jsonl" BATCH=2 MAXNEW=8 diffrun $m-fp32 "$MODELS/$m" fp32 fp32 --score-prompt
  PROMPTS_FOR="$OUT/long.jsonl" BATCH=2 MAXNEW=8 diffrun $m-custom "$MODELS/$m" fp16-infer "$OUT/custom.json"
  PROMPTS_FOR="$OUT/replay.jsonl" diffrun $m-replay "$MODELS/$m" fp16-train fp8-rollout
done

# the diff job's other ways through (issue 11's diff split, issue 14's run-file text): shards
# joined by tidal-merge, a run resumed after its /progress was cut back to its first batch (as a
# kill leaves it), replays whose dumps carry the trainer's log-probs, tidal-report's text
for k in 0 1 2; do BATCH=3 diffrun shard$k-of-3 $DEMO bf16-train bf16-infer --shard $k/3 --score-prompt; done
"$B/tidal-merge" -o "$OUT/merged.h5" --force "$OUT"/shard{0,1,2}-of-3.h5 >"$OUT/merged.txt" 2>/dev/null
BATCH=3 diffrun resumed $DEMO fp16-train fp16-infer
.venv/bin/python - "$OUT/resumed.h5" <<'PY'
import h5py, sys
with h5py.File(sys.argv[1], "r+") as f:
    for name in f["progress"]:
        f["progress"][name].resize((1,))
PY
"$B/tidal-diff" --model $DEMO --prompts $PROMPTS --recipe-a fp16-train --recipe-b fp16-infer \
    --max-new-tokens 24 --batch 3 --seed 1 -o "$OUT/resumed.h5" --resume 2>/dev/null >"$OUT/resumed-2.txt"
PROMPTS_FOR=datasets/rollouts/trl.jsonl diffrun replay-trl "$MODELS/qwen3" bf16-train fp8-rollout
PROMPTS_FOR=datasets/rollouts/verl.jsonl diffrun replay-verl "$MODELS/qwen3" bf16-train fp8-rollout --rollout-logprobs processed --temperature 0.7
for r in demo-bf16 merged resumed replay-trl fp32head; do
  "$B/tidal-report" "$OUT/$r.h5" >"$OUT/report-$r.txt" 2>/dev/null
done
"$B/tidal-report" --json "$OUT/merged.h5" >"$OUT/report-merged-json.txt" 2>/dev/null

# tidal-logprobs (teacher-forced and --decode) under several recipes
TOK=$(seq -s, 5 3 200)
for r in fp32 bf16-train bf16-infer fp16-infer fp8-rollout fp8-unified "$OUT/custom.json"; do
  n=$(basename "$r" .json)
  for m in $DEMO "$MODELS/qwen3"; do
    mn=$(basename "$m")
    t=$TOK; [ "$mn" = demo-model ] && t=$(seq -s, 3 1 60)
    "$B/tidal-logprobs" --model "$m" --tokens "$t" --top 3 --recipe "$r" >"$OUT/logprobs-$mn-$n.txt" 2>/dev/null
    "$B/tidal-logprobs" --model "$m" --tokens "$t" --top 3 --recipe "$r" --decode >"$OUT/logprobs-$mn-$n-decode.txt" 2>/dev/null
  done
done
echo "reference runs in $OUT: $(ls "$OUT"/*.h5 | wc -l) run files, $(ls "$OUT"/logprobs-*.txt | wc -l) logprobs outputs"
