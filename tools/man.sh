#!/usr/bin/env bash
# A tool's man page (troff, section 1) from its own --help, so the page never says other than the
# tool does: NAME from the help's first paragraph, SYNOPSIS from its usage lines, the rest as it
# prints it (monospaced: the options' columns stay aligned). `make install` writes one per tool.
#   tools/man.sh BUILD/bin/TOOL VERSION > TOOL.1
set -euo pipefail
bin=$1
version=${2:-}
name=$(basename "$bin")
help=$("$bin" --help)
# the first sentence of the first paragraph after the usage lines
summary=$(printf '%s\n' "$help" | awk 'NR > 1 && NF && !/^       / { p = p (p ? " " : "") $0; s = 1; next } s && !NF { exit } END { print p }' |
          sed -e 's/\([.:]\) .*/\1/' -e 's/[.:]$//')
esc() { sed -e 's/\\/\\e/g' -e 's/^\./\\\&./' -e "s/^'/\\\\\\&'/"; }
{
  printf '.TH %s 1 "" "tidal %s" "tidal"\n' "$(printf '%s' "$name" | tr a-z A-Z)" "$version"
  printf '.SH NAME\n%s \\- %s\n' "$name" "$(printf '%s' "$summary" | esc)"
  printf '.SH SYNOPSIS\n.nf\n'
  printf '%s\n' "$help" | awk '/^usage: / { sub(/^usage: /, ""); print; u = 1; next } u && /^       / { sub(/^ +/, ""); print; next } { if (u) exit }' | esc
  printf '.fi\n.SH DESCRIPTION\n.nf\n'
  printf '%s\n' "$help" | awk 'f { print } /^$/ && !f { f = 1 }' | esc
  printf '.fi\n.SH SEE ALSO\nThe README.md and reports/SCHEMA.md of tidal (Training\\(enInference Divergence Analysis Lab).\n'
}
