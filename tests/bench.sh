#!/usr/bin/env bash
# make bench: runs every tests/bench/*.sh; each prints lines
#   bench: NAME tidal=X peer=Y ratio=R   (R = tidal speed / peer speed, higher is better)
set -u
cd "$(dirname "$0")/.."
export BUILD=${BUILD:-build}
status=0
for b in tests/bench/*.sh; do
  [ -e "$b" ] || continue
  echo "=== $b" >&2
  bash "$b" || status=1
done
exit $status
