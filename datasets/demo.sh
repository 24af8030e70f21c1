#!/usr/bin/env bash
# make demo: the toolkit's main job on shipped defaults.
set -euo pipefail
BUILD=${1:-build}
echo "tidal demo: a tour of the number formats with tidal-cast"
for v in 1 0.1 3.14159265 448 464 500 65504 65520 1e-8 nan; do
  printf '%-12s' "$v"
  for f in bf16 fp16 e4m3 e5m2; do printf '  %s %-22s' "$f" "$("$BUILD/bin/tidal-cast" --format $f "$v")"; done
  echo
done
