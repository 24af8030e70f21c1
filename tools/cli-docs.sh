#!/usr/bin/env bash
# docs/cli/TOOL.md from each tool's own --help, so the reference never says other than the tool
# does (`make docs-cli`; tests/py/test_docs.py checks the files are current).
#   tools/cli-docs.sh BUILD/bin OUTDIR
set -euo pipefail
bin=$1
out=$2
mkdir -p "$out"
tools=()
for t in "$bin"/tidal "$bin"/tidal-*; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  tools+=("$name")
  { printf '# %s\n\n<!-- made by `make docs-cli` from `%s --help`: edit the tool, not this file -->\n\n```text\n' "$name" "$name"
    "$t" --help
    printf '```\n'
    if [ "$name" = tidal-task ]; then
      for c in generate score; do
        printf '\n## tidal-task %s\n\n```text\n' "$c"
        "$t" "$c" --help
        printf '```\n'
      done
    fi
  } > "$out/$name.md"
done
{ printf '# Command-line reference\n\n<!-- made by `make docs-cli`: edit the tools, not this file -->\n\n'
  printf 'Every tool prints the same with `--help`; the guides are in [../README.md](../README.md).\n\n'
  for n in "${tools[@]}"; do printf -- '- [%s](%s.md)\n' "$n" "$n"; done
} > "$out/README.md"
