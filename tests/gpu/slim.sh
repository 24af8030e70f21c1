#!/usr/bin/env bash
# Keeps the packed run files of reports/ out of what a device call carries (64 MiB in all, tracked
# files included: reports/gpu/README.md). The device tool sends "a submodule or other nested git
# repository ... without its files" (/work/.library/device/README.md), so `on` makes each folder of
# packed runs a nested repository for the call (an empty `git init`: main's index and the files
# themselves are untouched) and `off` removes those nested .git folders again. Nothing on the GPU
# reads the packed runs (they are for the reports' tables and figures).
#
#   tests/gpu/slim.sh on     before tests/gpu/pack.sh and the device call
#   tests/gpu/slim.sh off    after the call (also safe when `on` never ran)
set -euo pipefail
cd "$(dirname "$0")/../.."
dirs=$(git ls-files | grep -E '^reports/(.+/)?runs/' | sed -E 's#^(reports/(.+/)?runs)/.*#\1#' | sort -u)
case "${1:-}" in
  on)
    for d in $dirs; do
      [ -d "$d" ] || continue
      if [ ! -e "$d/.git" ]; then git init -q "$d" && touch "$d/.git/tidal-slim"; fi
    done
    echo "slim.sh: $(echo "$dirs" | wc -w) folders of packed runs stay behind a device call; 'tests/gpu/slim.sh off' after it" ;;
  off)
    for d in $dirs; do
      [ -e "$d/.git/tidal-slim" ] && rm -rf "$d/.git"
    done
    echo "slim.sh: the packed runs travel with a device call again" ;;
  *) echo "usage: tests/gpu/slim.sh on|off" >&2; exit 2 ;;
esac
