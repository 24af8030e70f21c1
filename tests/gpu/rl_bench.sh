#!/usr/bin/env bash
# A GRPO step's wall time on the GPU, tidal against PyTorch + transformers (issue 27's step-time
# table; tests/gpu/run.sh rl-bench). For each SHAPE:RESPONSE_TOKENS of $RL_BENCH (default
# "0.5b:1024"; "0.5b:1024 1.5b:1024" does not fit one device call with the other stages): a
# random bf16 checkpoint of that shape (tidal-init; Qwen2.5-0.5B preset, or Qwen2.5-1.5B's dimensions), a synthetic byte-level tokenizer (tests/gpu/make_tokenizer.py),
# 8 prompts of random words x 8 completions = 64 per step, exactly RESPONSE_TOKENS each as far
# as the random policy does not stop (it rarely draws EOS), --gradient-checkpointing:
#   tidal   tidal-rl --device cuda --dtype bf16, 2 steps; step 2's time_rollout / time_old /
#           time_update / time_step from rl.h5 (step 1 pays the warm-up)
#   peer    tests/gpu/grpo_bench.py on the same checkpoint and shapes (fp32 masters under bf16
#           autocast, TRL's default; generate at fixed length, pi_old, update with AdamW)
# Prints  bench: gpu-grpo-SHAPE-R-PHASE tidal=S peer=S ratio=R   (ratio = peer / tidal: > 1 is
# tidal faster), and the rows into $OUT/rl-bench.md (row by row). Target (issue 27): step ratio >= 1.
# tidal-rl's run directory (its last checkpoint: ~12 bytes a parameter) stays in $BUILD/bench;
# rl.h5 and the logs are copied to $OUT. Needs: numpy (rl.h5 is read with h5py or tidal-export:
# tests/py/runfile_read.py); the peer needs torch (CUDA) + transformers, else its columns are NA.
# TIDAL_GPU_TINY=1 (tests/gpu/run.sh's rehearsal on the simulator): RL_BENCH defaults to "tiny:8",
# a tiny Qwen2, 2 prompts x 2 completions of 4 words; TIDAL_TORCH_DEVICE=cpu for the peer.
set -u
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build} OUT=${OUT:-out/gpu}
PY=${TIDAL_PY:-.venv/bin/python}; [ -x "$PY" ] || PY=python3
mkdir -p "$OUT" "$BUILD/bench"
export OMP_WAIT_POLICY=PASSIVE
NP=8 NG=8 WORDS=48 JOBS=${RL_BENCH:-0.5b:1024}
[ "${TIDAL_GPU_TINY:-0}" = 1 ] && NP=2 NG=2 WORDS=4 JOBS=${RL_BENCH:-tiny:8}
NC=$((NP * NG)) MB=8
[ $NC -lt 8 ] && MB=$NC
rc=0
echo "| shape | response tokens | phase | tidal s | transformers s | transformers / tidal |" > "$OUT/rl-bench.md"
echo "|---|---|---|---|---|---|" >> "$OUT/rl-bench.md"
for job in $JOBS; do
  shape=${job%%:*} R=${job##*:}
  dir=$BUILD/bench/grpo-$shape
  if [ ! -f "$dir/tokenizer.json" ]; then
    case $shape in
      0.5b) init=(--preset qwen2.5-0.5b) ;;
      1.5b) init=(--arch qwen2 --hidden-size 1536 --num-layers 28 --num-heads 12 --num-kv-heads 2
                  --intermediate-size 8960 --vocab-size 151936) ;;
      tiny) init=(--arch qwen2 --hidden-size 64 --num-layers 2 --num-heads 4 --num-kv-heads 2
                  --intermediate-size 128 --vocab-size 512) ;;
      *) echo "rl_bench.sh: unknown shape $shape (0.5b, 1.5b, tiny)" >&2; rc=1; continue ;;
    esac
    "$BUILD/bin/tidal-init" "${init[@]}" --dtype bf16 --seed 1 -o "$dir" >/dev/null 2>&1 &&
      "$PY" tests/gpu/make_tokenizer.py "$dir" || { echo "rl_bench.sh: $shape checkpoint failed" >&2; rc=1; continue; }
  fi
  "$PY" -c "import json, random, sys
r = random.Random(1)
for _ in range(int(sys.argv[1])): print(json.dumps({'prompt': ' '.join('w%d' % r.randrange(100000) for _ in range(int(sys.argv[2])))}))" \
    "$NP" "$WORDS" > "$dir/prompts.jsonl"
  run=$BUILD/bench/rl-bench-$shape-$R out=$OUT/rl-bench-$shape-$R
  t0=$(date +%s)
  if ! "$BUILD/bin/tidal-rl" --model-path "$dir" --dataset-path "$dir/prompts.jsonl" --device cuda --dtype bf16 \
      --reward-command "python3 -c 'import sys, random; [print(random.random(), flush=True) for _ in sys.stdin]'" \
      --num-generations "$NG" --per-device-batch-size "$MB" --gradient-accumulation-steps $((NC / MB)) \
      --max-completion-length "$R" --max-seq-length $((R + 512)) --max-steps 2 --gradient-checkpointing \
      --overwrite-output-dir -o "$run" > "$out.log" 2>&1; then
    echo "rl_bench.sh: tidal-rl $shape:$R failed: $(tail -n2 "$out.log")" >&2; rc=1; continue
  fi
  echo "rl_bench.sh: tidal-rl $shape:$R: $(( $(date +%s) - t0 )) s (2 steps, checkpoint written)"
  cp "$run/rl.h5" "$out.rl.h5"
  P=$("$PY" - "$run/rl.h5" <<'PYEOF'
import sys
sys.path.insert(0, "tests/py")
import runfile_read
s = runfile_read.steps(sys.argv[1])
print(' '.join('%.3f' % float(s[k][-1]) for k in ('time_rollout', 'time_old', 'time_update', 'time_step')),
      '%.0f' % float(s['response_length_mean'][-1]))
PYEOF
  )
  read -r t_roll t_old t_upd t_step rlen <<< "$P"
  if [ -z "${rlen:-}" ]; then echo "rl_bench.sh: cannot read /steps of $run/rl.h5" >&2; rc=1; continue; fi
  plen=$("$PY" -c "import json, sys   # no merges: a prompt is one token a byte
l = [len(json.loads(x)['prompt'].encode()) for x in open(sys.argv[1])]; print(round(sum(l) / len(l)))" "$dir/prompts.jsonl")
  t0=$(date +%s)
  "$PY" tests/gpu/grpo_bench.py --model "$dir" --dtype bf16 --completions "$NC" --num-generations "$NG" \
    --prompt-len "$plen" --response-len "$R" --micro-batch "$MB" --gradient-checkpointing \
    --device "${TIDAL_TORCH_DEVICE:-cuda}" > "$out.peer" 2>&1 ||
    echo "rl_bench.sh: the transformers peer failed: $(tail -n2 "$out.peer")" >&2
  echo "rl_bench.sh: grpo_bench.py $shape:$R: $(( $(date +%s) - t0 )) s"
  for ph in rollout:$t_roll pi_old:$t_old update:$t_upd step:$t_step; do
    name=${ph%%:*} t=${ph##*:}
    p=$(awk -v c="$name" '$1 == "case" && $2 == c { print $4 }' "$out.peer")
    r=$([ -n "$p" ] && awk -v a="$p" -v b="$t" 'BEGIN { printf "%.2f", a / b }' || echo NA)
    echo "bench: gpu-grpo-$shape-$R-$name tidal=$t peer=${p:-NA} ratio=$r"
    echo "| $shape | $R (tidal's mean $rlen) | $name | $t | ${p:-NA} | $r |" >> "$OUT/rl-bench.md"
  done
done
exit $rc
