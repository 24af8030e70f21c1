#!/usr/bin/env bash
# A GRPO step's wall time on the GPU, tidal against PyTorch + transformers (issue 27's step-time
# table; tests/gpu/run.sh rl-bench). For each SHAPE:RESPONSE_TOKENS of $RL_BENCH (default
# "0.5b:1024 1.5b:1024"): a random bf16 checkpoint of that shape (tidal-init; Qwen2.5-0.5B preset,
# or Qwen2.5-1.5B's dimensions), a synthetic byte-level tokenizer (tests/gpu/make_tokenizer.py),
# 8 prompts of random words x 8 completions = 64 per step, exactly RESPONSE_TOKENS each as far
# as the random policy does not stop (it rarely draws EOS), --gradient-checkpointing:
#   tidal   tidal-rl --device cuda --dtype bf16, 2 steps; step 2's time_rollout / time_old /
#           time_update / time_step from rl.h5 (step 1 pays the warm-up)
#   peer    tests/gpu/grpo_bench.py on the same checkpoint and shapes (fp32 masters under bf16
#           autocast, TRL's default; generate at fixed length, pi_old, update with AdamW)
# Prints  bench: gpu-grpo-SHAPE-R-PHASE tidal=S peer=S ratio=R   (ratio = peer / tidal: > 1 is
# tidal faster), and the rows into $OUT/rl-bench.md. Target (issue 27): step ratio >= 1.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build} OUT=${OUT:-out/gpu}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
mkdir -p "$OUT" "$BUILD/bench"
export OMP_WAIT_POLICY=PASSIVE
rc=0
echo "| shape | response tokens | phase | tidal s | transformers s | transformers / tidal |" > "$OUT/rl-bench.md"
echo "|---|---|---|---|---|---|" >> "$OUT/rl-bench.md"
for job in ${RL_BENCH:-0.5b:1024 1.5b:1024}; do
  shape=${job%%:*} R=${job##*:}
  dir=$BUILD/bench/grpo-$shape
  if [ ! -f "$dir/tokenizer.json" ]; then
    case $shape in
      0.5b) init=(--preset qwen2.5-0.5b) ;;
      1.5b) init=(--arch qwen2 --hidden-size 1536 --num-layers 28 --num-heads 12 --num-kv-heads 2
                  --intermediate-size 8960 --vocab-size 151936) ;;
      *) echo "rl_bench.sh: unknown shape $shape (0.5b, 1.5b)" >&2; rc=1; continue ;;
    esac
    "$BUILD/bin/tidal-init" "${init[@]}" --dtype bf16 --seed 1 -o "$dir" >/dev/null 2>&1 &&
      "$PY" tests/gpu/make_tokenizer.py "$dir" || { echo "rl_bench.sh: $shape checkpoint failed" >&2; rc=1; continue; }
  fi
  "$PY" -c "import json, random
r = random.Random(1)
for _ in range(8): print(json.dumps({'prompt': ' '.join('w%d' % r.randrange(100000) for _ in range(48))}))" > "$dir/prompts.jsonl"
  out=$OUT/rl-bench-$shape-$R
  if ! "$BUILD/bin/tidal-rl" --model-path "$dir" --dataset-path "$dir/prompts.jsonl" --device cuda --dtype bf16 \
      --reward-command "python3 -c 'import sys, random; [print(random.random(), flush=True) for _ in sys.stdin]'" \
      --num-generations 8 --per-device-batch-size 8 --gradient-accumulation-steps 8 --max-completion-length "$R" \
      --max-seq-length $((R + 512)) --max-steps 2 --gradient-checkpointing --quiet --overwrite-output-dir \
      -o "$out" > "$out.log" 2>&1; then
    echo "rl_bench.sh: tidal-rl $shape:$R failed: $(tail -n2 "$out.log")" >&2; rc=1; continue
  fi
  P=$("$PY" -c "import h5py; import sys
s = h5py.File(sys.argv[1], 'r')['steps']
print(' '.join('%.3f' % float(s[k][-1]) for k in ('time_rollout', 'time_old', 'time_update', 'time_step')),
      '%.0f' % float(s['response_length_mean'][-1]))" "$out/rl.h5")
  read -r t_roll t_old t_upd t_step rlen <<< "$P"
  plen=$("$PY" -c "import json, sys   # no merges: a prompt is one token a byte
l = [len(json.loads(x)['prompt'].encode()) for x in open(sys.argv[1])]; print(round(sum(l) / len(l)))" "$dir/prompts.jsonl")
  "$PY" tests/gpu/grpo_bench.py --model "$dir" --dtype bf16 --completions 64 --num-generations 8 \
    --prompt-len "$plen" --response-len "$R" --micro-batch 8 --gradient-checkpointing > "$out.peer" 2>&1 ||
    echo "rl_bench.sh: the transformers peer failed: $(tail -n2 "$out.peer")" >&2
  for ph in rollout:$t_roll pi_old:$t_old update:$t_upd step:$t_step; do
    name=${ph%%:*} t=${ph##*:}
    p=$(awk -v c="$name" '$1 == "case" && $2 == c { print $4 }' "$out.peer")
    r=$([ -n "$p" ] && awk -v a="$p" -v b="$t" 'BEGIN { printf "%.2f", a / b }' || echo NA)
    echo "bench: gpu-grpo-$shape-$R-$name tidal=$t peer=${p:-NA} ratio=$r"
    echo "| $shape | $R (tidal's mean $rlen) | $name | $t | ${p:-NA} | $r |" >> "$OUT/rl-bench.md"
  done
done
exit $rc
