#!/usr/bin/env bash
# The GPU collapse experiment (reports/rl/gpu/README.md) with one command, on a machine with one
# NVIDIA GPU and a local copy of the policy checkpoint:
#   reports/rl/gpu/run_all.sh MODEL_DIR [PROBLEMS]     run the grid here (resumable: run it again)
#   EMIT=slurm|condor reports/rl/gpu/run_all.sh ...    write a cluster job array instead
# MODEL_DIR: DeepSeek-R1-Distill-Qwen-1.5B as downloaded from the hub (config.json, *.safetensors,
# tokenizer.json). PROBLEMS: the FP16 paper's sanity-test problems (sail/Sanity-Test-R1D-1.5B,
# .parquet/.jsonl with "problem" and "answer"); without it, 4,000 countdown problems from tidal-task.
# BIN=DIR runs another copy of the tools (default build/bin).
set -eu
cd "$(dirname "$0")/../../.."
export OMP_WAIT_POLICY=PASSIVE
BIN=${BIN:-build/bin}
MODEL=${1:?usage: reports/rl/gpu/run_all.sh MODEL_DIR [PROBLEMS]}
[ -f "$MODEL/config.json" ] || { echo "run_all.sh: $MODEL/config.json: not a checkpoint directory" >&2; exit 1; }
mkdir -p build/rl/gpu
ln -sfn "$(realpath "$MODEL")" build/rl/gpu/model
if [ ! -f build/rl/gpu/data/train.jsonl ]; then
  if [ -n "${2:-}" ]; then
    python3 reports/rl/gpu/prepare_data.py --math "$2" -o build/rl/gpu/data
  else
    BUILD=$(dirname "$BIN") python3 reports/rl/gpu/prepare_data.py --countdown 4000 -o build/rl/gpu/data
  fi
fi
sed "s#\"build/bin/tidal-rl\"#\"$BIN/tidal-rl\"#" reports/rl/gpu/grid.json > build/rl/gpu/grid.json
if [ -n "${EMIT:-}" ]; then
  exec "$BIN"/tidal-sweep build/rl/gpu/grid.json --emit "$EMIT"
fi
exec "$BIN"/tidal-sweep build/rl/gpu/grid.json --workers 1
