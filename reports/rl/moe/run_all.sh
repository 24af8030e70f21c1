#!/usr/bin/env bash
# issue 35's experiment in the order it runs; each sweep skips finished runs and resumes the others
# (Ctrl-C stops cleanly), so this can be interrupted and started again.
#   reports/rl/moe/run_all.sh          the learning-rate scan (exact-match, both models, 3 seeds)
#   LR=X reports/rl/moe/run_all.sh     then the grid at the rate the README's rule picked
#   BIN=DIR ...                        a copy of the tools (so that `make` may relink build/bin)
set -u
cd "$(dirname "$0")/../../.."
export OMP_WAIT_POLICY=PASSIVE
BIN=${BIN:-build/bin}
mkdir -p build/rl/moe
.venv/bin/python reports/rl/prune_checkpoints.py build/rl/moe || true   # finished runs keep their last checkpoint only
# finished runs packed in reports/ (a new checkout has no build/): restored so the sweep skips them
for f in reports/rl/moe/runs/*/*/rl.h5; do
  [ -f "$f" ] || continue
  d=build/rl/moe/${f#reports/rl/moe/runs/}; d=${d%/rl.h5}
  [ -f "$d/rl.h5" ] || { mkdir -p "$d" && cp "$f" "$d/rl.h5"; }
done
sed -e "s#\"build/bin/tidal-rl\"#\"$BIN/tidal-rl\"#" reports/rl/moe/lrscan.json > build/rl/moe/lrscan.json
"$BIN"/tidal-sweep build/rl/moe/lrscan.json --workers "${WORKERS:-2}" || exit $?
[ -n "${LR:-}" ] || { echo "run_all.sh: lrscan done; apply the README's rule and rerun with LR=..." >&2; exit 0; }
sed -e "s/\"LR_CHOSEN\"/$LR/" -e "s#\"build/bin/tidal-rl\"#\"$BIN/tidal-rl\"#" reports/rl/moe/grid.json > build/rl/moe/grid.json
"$BIN"/tidal-sweep build/rl/moe/grid.json --workers "${WORKERS:-2}" || exit $?
