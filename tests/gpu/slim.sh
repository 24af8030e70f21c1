#!/usr/bin/env bash
# Keeps the packed run files of reports/ out of what a device call carries (64 MiB in all, tracked
# files included: reports/gpu/README.md). The device tool counts what `git ls-files` lists, so `on`
# takes each folder of packed runs out of main's index (git rm --cached) and ignores it in
# .git/info/exclude for the call; `off` puts the index and the exclude file back. The files on disk
# are never touched. Nothing on the GPU reads the packed runs (they are for the reports' tables
# and figures). Commit nothing between `on` and `off`: the index then lacks those folders.
#
#   tests/gpu/slim.sh on     before tests/gpu/pack.sh and the device call
#   tests/gpu/slim.sh off    after the call (also safe when `on` never ran)
set -euo pipefail
cd "$(dirname "$0")/../.."
# the exclude file and slim.sh's own list sit in git's directory, wherever it is (a clone made
# without git's templates, as CI's is, has no .git/info until something makes it)
x=$(git rev-parse --git-path info/exclude)
mine=$(git rev-parse --git-path tidal-slim)
dirs=$(git ls-tree -r --name-only HEAD | grep -E '^reports/(.+/)?runs/' | sed -E 's#^(reports/(.+/)?runs)/.*#\1#' | sort -u)
case "${1:-}" in
  on)
    # the device tool counts what `git ls-files` lists (a nested .git did not keep them out:
    # 2026-11-29, the first real call was refused at 77 MiB), so the folders leave main's index
    # for the call and .git/info/exclude ignores them; `off` puts them back in the index
    # (the files on disk are never touched; do not commit between on and off)
    mkdir -p "$(dirname "$x")"
    [ -e "$x" ] || { : > "$x"; : > "$mine.created"; }   # `off` removes an exclude file `on` made
    for d in $dirs; do
      [ -d "$d" ] || continue
      git rm -r -q --cached --ignore-unmatch "$d"
      # (an exclude line takes no comment after its pattern: $mine lists what was added)
      if ! grep -qxF "/$d/" "$x" 2>/dev/null; then echo "/$d/" >> "$x"; echo "/$d/" >> "$mine"; fi
    done
    echo "slim.sh: $(echo "$dirs" | wc -w) folders of packed runs stay behind a device call; 'tests/gpu/slim.sh off' after it" ;;
  off)
    if [ -f "$mine" ]; then
      grep -vxF -f "$mine" "$x" > "$x.tmp" || true
      mv "$x.tmp" "$x" && rm -f "$mine"
    fi
    if [ -e "$mine.created" ]; then [ -s "$x" ] || rm -f "$x"; rm -f "$mine.created"; fi
    for d in $dirs; do
      [ -e "$d/.git/tidal-slim" ] && rm -rf "$d/.git"   # an older slim.sh's nested repositories
    done
    git reset -q HEAD -- $dirs
    echo "slim.sh: the packed runs travel with a device call again" ;;
  *) echo "usage: tests/gpu/slim.sh on|off" >&2; exit 2 ;;
esac
