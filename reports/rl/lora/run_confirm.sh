#!/usr/bin/env bash
# Issue 41's confirmatory runs (README.md section 5, pre-registered before any of them ran), in the
# order they run; each sweep skips finished runs and resumes the others (Ctrl-C stops cleanly), so
# this can be interrupted and started again.
#   reports/rl/lora/run_confirm.sh             seeds 6-15 of the four H1 arms and the exact-match
#                                              control at the grid's rate 1e-2, then the control's
#                                              seeds 1-5 (the grid's missing arm)
#   LR=3e-3 ARMS=followup reports/rl/lora/run_confirm.sh
#                                              section 5's conditional follow-up (bf16 and fp16
#                                              merge-unmerge and the control at 3e-3, seeds 6-10)
#   BIN=DIR ...                                a copy of the tools (so that `make` may relink
#                                              build/bin while the sweep runs); default build/bin
set -u
cd "$(dirname "$0")/../../.."
export OMP_WAIT_POLICY=PASSIVE
# pi_old by a forward of its own, as these runs were made (tidal-rl reads it from the update's forward
# since 2026-11-29, TRL's rule; the two differed in rare steps of dying runs: include/tidal/rl.h step 4)
export TIDAL_RL_OLD_FORWARD=${TIDAL_RL_OLD_FORWARD:-1}
BIN=${BIN:-build/bin}
LR=${LR:-1e-2}
TAG=lr${LR}
mkdir -p build/rl/lora
.venv/bin/python reports/rl/prune_checkpoints.py build/rl/lora || true   # finished runs keep their last checkpoint only
# finished runs packed in reports/ (a new checkout has no build/): restored so the sweep skips them
for f in reports/rl/lora/runs/confirm-*/*/rl.h5 reports/rl/lora/runs/control-*/*/rl.h5; do
  [ -f "$f" ] || continue
  d=build/rl/lora/${f#reports/rl/lora/runs/}; d=${d%/rl.h5}
  [ -f "$d/rl.h5" ] || { mkdir -p "$d" && cp "$f" "$d/rl.h5"; }
done
mk() {   # mk CONFIG OUT: the config with the rate, the tag and the binaries filled in
  sed -e "s/\"LR_CHOSEN\"/$LR/" -e "s/LRTAG/$TAG/g" -e "s#\"build/bin/tidal-rl\"#\"$BIN/tidal-rl\"#" "$1" > "$2"
}
mk reports/rl/lora/confirm.json build/rl/lora/confirm-$TAG.json
if [ "${ARMS:-}" = followup ]; then   # seeds 6-10 of bf16-mu, fp16-mu and em only
  .venv/bin/python - "build/rl/lora/confirm-$TAG.json" <<'PY'
import json, sys
p = sys.argv[1]; c = json.load(open(p))
c["grid"][0]["values"] = {k: v for k, v in c["grid"][0]["values"].items() if int(k[1:]) <= 10}
c["grid"][1]["values"] = {k: v for k, v in c["grid"][1]["values"].items() if k in ("bf16-mu", "fp16-mu", "em")}
json.dump(c, open(p, "w"), indent=2)
PY
fi
"$BIN"/tidal-sweep build/rl/lora/confirm-$TAG.json --workers "${WORKERS:-2}" || exit $?
[ "${ARMS:-}" = followup ] && exit 0
mk reports/rl/lora/control.json build/rl/lora/control-$TAG.json
"$BIN"/tidal-sweep build/rl/lora/control-$TAG.json --workers "${WORKERS:-2}" || exit $?
