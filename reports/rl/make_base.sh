#!/usr/bin/env bash
# Rebuilds the RL experiment's base models under build/rl/ (seeded: the same bits on any machine
# and thread count). About 6 min of one CPU core: 1500 steps of a 4000-step cosine schedule.
set -eu
cd "$(dirname "$0")/../.."
B=build/bin; W=build/rl/sft-work
mkdir -p $W
$B/tidal-task generate --task add --seed 2026 --length short --train-size 20000 --test-size 200 -o $W/add-big --force
$B/tidal-task generate --task add --seed 2026 --length long --train-size 6000 --test-size 100 -o $W/addlong-big --force
# the shipped files are the first 250 / 100 lines: left out of SFT (they are the RL prompts)
(tail -n +251 $W/add-big/train.jsonl; tail -n +101 $W/addlong-big/train.jsonl) > $W/sft-mix.jsonl
$B/tidal-init --arch qwen2 --hidden-size 128 --num-layers 4 --num-heads 4 --num-kv-heads 2 \
  --intermediate-size 384 --vocab-size 100 --no-tie --seed 7 -o $W/init
$B/tidal-tokenize --write-char-vocab $W/init
# tidal-init leaves bos/eos unset: the character vocabulary's <bos> = 1, <eos> = 2
.venv/bin/python - "$W/init" <<'PY'
import json, sys
d = sys.argv[1]
c = json.load(open(f"{d}/config.json")); c["bos_token_id"] = 1; c["eos_token_id"] = 2
json.dump(c, open(f"{d}/config.json", "w"), indent=2)
json.dump({"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}, open(f"{d}/generation_config.json", "w"), indent=2)
PY
mkdir -p $W/base
OMP_WAIT_POLICY=PASSIVE OMP_NUM_THREADS=1 build/tests/helpers/rl_base_sft --model $W/init \
  --dataset-path $W/sft-mix.jsonl --output-dir $W/base --max-steps 4000 --batch 32 --lr 2e-3 --save-every 250 --stop-after 1500
rm -rf build/rl/base-short build/rl/base-long
cp -r $W/base/step-500 build/rl/base-short
cp -r $W/base/step-1500 build/rl/base-long
