#!/usr/bin/env bash
# tidal-report plus every tidal-heatmap picture of a 1M-token run file (synthetic, written by
# tests/py/synth_run.py with 8 per-layer columns; generation is outside the timing).
# Target from issue 6: report and all heatmaps in under 10 s.
# Peer: numpy + h5py computing the same report numbers (the reference of
# tests/py/test_report_numpy.py: summaries, parity, Pearson/Spearman, buckets, worst, IS).
# Prints:
#   bench: report-1M tidal=X s numpy=Y s ratio=R          (R = numpy time / tidal time)
#   bench: report+heatmaps-1M tidal=X s wall (Y s cpu) target=10 s   (report + 5 pictures)
# Timings are noisy when other jobs share the machine: the load average is printed, and the
# CPU time (user + system) is the steadier figure.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
PY=.venv/bin/python; [ -x "$PY" ] || PY=python3
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$PY" tests/py/synth_run.py "$tmp/run.h5" --tokens 1000000 --layers 8 --seed 7 \
  || { echo "bench: report-1M skipped (numpy/h5py missing)"; exit 0; }
# each command timed by /usr/bin/time: wall, user and system seconds appended to $tmp/times
timed() { /usr/bin/time -f "%e %U %S" -a -o "$tmp/times" "$@"; }
timed "$BUILD/bin/tidal-report" "$tmp/run.h5" --json > "$tmp/rep.json"
timed "$BUILD/bin/tidal-heatmap" "$tmp/run.h5" -o "$tmp/seqpos.png"
timed "$BUILD/bin/tidal-heatmap" "$tmp/run.h5" --metric kl -o "$tmp/seqpos_kl.png"
timed "$BUILD/bin/tidal-heatmap" "$tmp/run.h5" --plot layers -o "$tmp/layers.png"
timed "$BUILD/bin/tidal-heatmap" "$tmp/run.h5" --plot density -o "$tmp/density.png"
timed "$BUILD/bin/tidal-heatmap" "$tmp/run.h5" --plot hist -o "$tmp/hist.png"
peer=$("$PY" - "$tmp" <<'PYEOF'
import json, os, sys, time
sys.path.insert(0, "tests/py")
import test_report_numpy as t
d = sys.argv[1]
rep = json.load(open(d + "/rep.json"))
t.IS_SPECS = ["token:truncate:2", "token:mask:0.5:5", "sequence:truncate:3", "sequence:mask:3",
              "geometric:mask:0.999:1.001"]  # tidal-report's defaults
t0 = time.perf_counter()
t.check_run(d + "/run.h5", rep, 10)
dt = time.perf_counter() - t0
if t.failures:
    print("disagree:", t.failures[:5], file=sys.stderr)
    sys.exit(1)
print("%.3f" % dt)
PYEOF
)
awk -v p="$peer" -v load="$(cut -d' ' -f1 /proc/loadavg)" '
  NR == 1 { rw = $1 } { w += $1; cpu += $2 + $3 }
  END {
    printf "bench: report-1M tidal=%.2f s numpy=%.2f s ratio=%.2f\n", rw, p, p / rw;
    printf "bench: report+heatmaps-1M tidal=%.2f s wall (%.2f s cpu) target=10 s %s (load average %s on %d cores)\n",
           w, cpu, (w < 10) ? "ok" : "SLOW", load, '"$(nproc)"' }' "$tmp/times"
