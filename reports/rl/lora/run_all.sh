#!/usr/bin/env bash
# The LoRA experiment (issue 23) in the order it runs; each sweep skips finished runs and resumes
# the others, so this can be interrupted and started again.
#   reports/rl/lora/run_all.sh            the learning-rate scan (exact-match control, merged sync)
#   LR=X reports/rl/lora/run_all.sh       then the grid at the rate the scan chose (README: the rule)
#   BIN=DIR ...                           run a copy of the tools (so that `make` may relink build/bin
#                                         while the grid runs); default build/bin
set -u
cd "$(dirname "$0")/../../.."
export OMP_WAIT_POLICY=PASSIVE
# pi_old by a forward of its own, as these runs were made (tidal-rl reads it from the update's forward
# since 2026-11-29, TRL's rule; the two differed in rare steps of dying runs: include/tidal/rl.h step 4)
export TIDAL_RL_OLD_FORWARD=${TIDAL_RL_OLD_FORWARD:-1}
BIN=${BIN:-build/bin}
"$BIN"/tidal-sweep reports/rl/lora/lrscan.json --workers "${WORKERS:-2}" || exit 1
[ -n "${LR:-}" ] || { echo "run_all.sh: lrscan done; pick the rate (README) and rerun with LR=..." >&2; exit 0; }
mkdir -p build/rl/lora
sed -e "s/\"LR_CHOSEN\"/$LR/" -e "s#\"build/bin/tidal-rl\"#\"$BIN/tidal-rl\"#" reports/rl/lora/grid.json > build/rl/lora/grid.json
"$BIN"/tidal-sweep build/rl/lora/grid.json --workers "${WORKERS:-2}" || exit 1
