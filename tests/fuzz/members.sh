#!/usr/bin/env bash
# The libtidal sources the fuzz targets use (Makefile `fuzz`): each tests/fuzz/fuzz_*.c linked by
# the main compiler against the main build's archive, a stub main standing in for libFuzzer's,
# with a link map; the archive members the map pulls in, as source paths (a member's name is its
# file name, so where two sources share one, both). Only these are compiled again by clang: 44 of
# 147 files, the parsers and what they call, not the GEMMs and the model. Prints them on one line.
#   tests/fuzz/members.sh CC LIB 'CFLAGS' 'LDLIBS' SOURCE...
set -eu
cc=$1 lib=$2 cflags=$3 ldlibs=$4
shift 4
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
printf '%s\n' '#include <stddef.h>' '#include <stdint.h>' \
  'int LLVMFuzzerTestOneInput(const uint8_t *d, size_t n);' \
  'int main(void) { return LLVMFuzzerTestOneInput((const uint8_t *)"", 0); }' > "$tmp/main.c"
for f in tests/fuzz/fuzz_*.c; do
  # shellcheck disable=SC2086
  if ! $cc $cflags "$f" "$tmp/main.c" -o "$tmp/a.out" "$lib" $ldlibs -Wl,-Map="$tmp/map" 2> "$tmp/err"; then
    echo "tests/fuzz/members.sh: linking $f against $lib failed:" >&2
    cat "$tmp/err" >&2
    exit 1
  fi
  grep -o "^$lib([^)]*)" "$tmp/map" | sed 's/.*(\(.*\)\.o)$/\1/' >> "$tmp/names"
done
sort -u "$tmp/names" > "$tmp/uniq"
for s in "$@"; do
  b=$(basename "$s" .c)
  if grep -qxF "$b" "$tmp/uniq"; then printf '%s ' "$s"; fi
done
echo
