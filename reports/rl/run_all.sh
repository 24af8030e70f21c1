#!/usr/bin/env bash
# The whole experiment in the order it ran (each sweep skips finished runs and resumes the others,
# so this can be interrupted and started again). Base models: reports/rl/make_base.sh.
set -u
cd "$(dirname "$0")/../.."
export OMP_WAIT_POLICY=PASSIVE
for c in lrscan grid lr0 dose long lr2x; do
  build/bin/tidal-sweep reports/rl/$c.json --workers ${WORKERS:-2} || exit 1
done
# the final policies on a clean path (summarize.py reads them), then the numbers
reports/rl/eval_final.sh build/rl/grid datasets/tasks/add/train.jsonl
reports/rl/eval_final.sh build/rl/lr2x datasets/tasks/add/train.jsonl
.venv/bin/python reports/rl/summarize.py > reports/rl/summary.md
