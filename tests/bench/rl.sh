#!/usr/bin/env bash
# RL throughput of tidal-rl against PyTorch doing the same GRPO step on the same shapes
# (tests/bench/torch_rl.py: generate with a KV cache + pi_old as tidal-rl takes it (the update's
# own log-probs, TRL's rule, LoRA included) + forward/backward + AdamW), both on 2 threads, on the RL experiment's model shape (reports/rl: a Qwen2-shaped
# C=128 L=4 NH=4 NKV=2 F=384 V=100 model; the SFT'd base when build/rl/base-short exists, else a
# tidal-init model of that shape): 32 completions per step of 4 prompts x 8, ~9 prompt tokens,
# 32 response tokens. Cases
#   fp32   tidal fp32 recipes on both paths vs torch fp32
#   bf16   tidal bf16-train / bf16-infer (emulated bf16 rounding at every kernel boundary) vs
#          torch.autocast("cpu", bfloat16)
# On a loaded machine the peer suffers far more than tidal (measured: torch fp32 0.09-0.28 steps/s
# at load average 8-10 against 5.5 on a quiet machine): compare ratios taken when it is quiet.
# tidal: steps/s = 1 / mean time_step, rollout tokens/s = response tokens / time_rollout, from
# /steps of a --max-steps STEPS run (the first step left out as warm-up). A random-init model does
# not stop at EOS by itself: responses then run to --max-completion-length 32, the peer's length.
# Each side runs ROUNDS times interleaved, the best kept (the machine is shared). Prints
#   bench: rl-steps-fp32 tidal=X torch=Y ratio=R      (RL steps/s; R = tidal / torch)
#   bench: rl-rollout-tokens-fp32 tidal=X torch=Y ratio=R
#   (and the bf16 pair, and lora-bf16: the LoRA grids' step, reports/rl/lora: LoRA r 1, alpha 2 on
#   q_proj,v_proj, bf16 base and recipes, TRL's merge-unmerge sync; the peer torch_rl.py
#   --lora-r 1 under bf16 autocast, generating on merged weights)
set -u
cd "$(dirname "$0")/../.."
. tests/bench/common.bash   # ratio
BUILD=${BUILD:-build}
STEPS=${STEPS:-4}; ROUNDS=${ROUNDS:-2}
[ -n "${OMP_WAIT_POLICY:-}" ] || export GOMP_SPINCOUNT=${GOMP_SPINCOUNT:-1000}   # as the tools do (src/util/opts.c)
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-PASSIVE} OMP_NUM_THREADS=${OMP_NUM_THREADS:-2}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
MODEL=build/rl/base-short
if [ ! -f "$MODEL/model.safetensors" ]; then
  MODEL=$BUILD/bench/rl-model
  if [ ! -f "$MODEL/model.safetensors" ]; then
    "$BUILD/bin/tidal-init" --arch qwen2 --hidden-size 128 --num-layers 4 --num-heads 4 --num-kv-heads 2 \
      --intermediate-size 384 --vocab-size 100 --no-tie --seed 7 -o "$MODEL" >/dev/null 2>&1 \
      && "$BUILD/bin/tidal-tokenize" --write-char-vocab "$MODEL" \
      && "$PY" -c "import json,sys; p=sys.argv[1]+'/config.json'; c=json.load(open(p)); c.update(bos_token_id=1, eos_token_id=2); json.dump(c, open(p, 'w'))" "$MODEL" \
      || { echo "rl.sh: cannot make the bench model" >&2; exit 1; }
  fi
fi
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
have_torch=1
"$PY" -c "import torch, safetensors, h5py" 2>/dev/null || have_torch=0
for case in fp32 bf16 lora-bf16; do
  if [ $case = fp32 ]; then R="--train-recipe fp32 --rollout-recipe fp32"; else R="--dtype bf16"; fi
  PL=""
  if [ $case = lora-bf16 ]; then
    R="--dtype bf16 --model-dtype bf16 --lora-r 1 --lora-alpha 2 --lora-sync merge-unmerge"; PL="--lora-r 1 --lora-alpha 2"
  fi
  dt=float32; [ $case != fp32 ] && dt=bfloat16
  t_steps=0; t_tok=0; p_steps=0; p_tok=0
  for r in $(seq "$ROUNDS"); do
    "$BUILD/bin/tidal-rl" --model-path "$MODEL" --dataset-path datasets/tasks/add/train.jsonl $R --num-generations 8 \
      --per-device-batch-size 16 --gradient-accumulation-steps 2 --max-completion-length 32 --learning-rate 1e-6 \
      --max-steps "$STEPS" --n-jobs 2 --log-completions 0 -q --output-dir "$tmp/$case" --overwrite-output-dir >/dev/null 2>&1 \
      || { echo "rl.sh: tidal-rl failed" >&2; exit 1; }
    read a b resp <<<"$("$PY" -c "
import h5py, sys
s = h5py.File(sys.argv[1], 'r')['steps']
ts, tr, n = s['time_step'][1:], s['time_rollout'][1:], s['response_length_mean'][1:] * 32
print(f'{len(ts) / ts.sum():.4f} {n.sum() / tr.sum():.1f} {n.mean() / 32:.0f}')" "$tmp/$case/rl.h5")"
    t_steps=$(awk -v x="$a" -v y="$t_steps" 'BEGIN { print (x > y ? x : y) }')
    t_tok=$(awk -v x="$b" -v y="$t_tok" 'BEGIN { print (x > y ? x : y) }')
    if [ $have_torch = 1 ]; then
      out=$("$PY" tests/bench/torch_rl.py --model "$MODEL" --batch 32 --prompt-len 9 --response-len "$resp" \
            --dtype $dt --steps "$STEPS" $PL 2>/dev/null)
      a=$(echo "$out" | awk '$1 == "steps_per_s" { print $2 }')
      b=$(echo "$out" | awk '$1 == "rollout_tokens_per_s" { print $2 }')
      p_steps=$(awk -v x="${a:-0}" -v y="$p_steps" 'BEGIN { print (x > y ? x : y) }')
      p_tok=$(awk -v x="${b:-0}" -v y="$p_tok" 'BEGIN { print (x > y ? x : y) }')
    fi
  done
  [ "$p_steps" = 0 ] && p_steps=NA; [ "$p_tok" = 0 ] && p_tok=NA
  echo "bench: rl-steps-$case tidal=$t_steps torch=$p_steps ratio=$(ratio "$t_steps" "$p_steps")"
  echo "bench: rl-rollout-tokens-$case tidal=$t_tok torch=$p_tok ratio=$(ratio "$t_tok" "$p_tok")"
done
