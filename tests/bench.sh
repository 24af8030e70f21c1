#!/usr/bin/env bash
# make bench: runs every tests/bench/*.sh; each prints lines
#   bench: NAME tidal=X peer=Y ratio=R   (R = tidal speed / peer speed, higher is better)
# Every line whose peer runs on OpenBLAS (sgemm, PyTorch's CPU matmul) ends with `blas=CORE`, the
# OpenBLAS core both sides ran. Where OpenBLAS falls back to a core without AVX2 on a CPU that has
# it (its Prescott kernels on a recent Xeon, issue 40), the CPU's real family (SkylakeX or Haswell)
# is forced with OPENBLAS_CORETYPE for the whole bench, once tests/bench/blas_probe.c has checked
# that core's products on the bench's shapes, so that each ratio is against the best peer this
# machine can run; the first line says which core OpenBLAS chose and which ran. tidal's tools force
# the same family themselves (td_blas_core_to_force, src/util/isa.c); the variable set here is for
# the peers (PyTorch loads the same OpenBLAS) and checks the core's products first.
set -u
cd "$(dirname "$0")/.."
export BUILD=${BUILD:-build}
mkdir -p "$BUILD/bench"
probe=$BUILD/bench/blas_probe
cc -O2 -std=c11 -D_GNU_SOURCE $(pkg-config --cflags openblas 2>/dev/null) tests/bench/blas_probe.c -o "$probe" \
   $(pkg-config --libs openblas 2>/dev/null || echo -lopenblas) -lm || exit 1
chosen=$(env -u OPENBLAS_CORETYPE "$probe" --core)
if [ -n "${OPENBLAS_CORETYPE:-}" ]; then
  core=$("$probe" --core); why="set by the caller (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)"
else
  core=$chosen; why="OpenBLAS's own choice"
  best=$("$probe" --best)
  if [ -n "$best" ]; then
    if [ "$(OPENBLAS_CORETYPE=$best "$probe" --core)" = "$best" ] && OPENBLAS_CORETYPE=$best "$probe" --check; then
      export OPENBLAS_CORETYPE=$best; core=$best
      why="OpenBLAS chose $chosen, a core without AVX2, on a CPU with it: $best forced, its products checked on the bench's shapes"
    else
      why="OpenBLAS chose $chosen on a CPU that has $best's instructions; $best failed its check, so $chosen ran"
    fi
  fi
fi
echo "bench: blas core=$core ($why)"
status=0
for b in tests/bench/*.sh; do
  [ -e "$b" ] || continue
  echo "=== $b" >&2
  # lines with an OpenBLAS-based peer (sgemm, torch on the CPU) get the core; the tokenizer's peer
  # (HF tokenizers), the report's (numpy reductions) and the GPU's do not use it
  bash "$b" | awk -v core="$core" '/^bench: / && /(peer|torch)=/ && !/^bench: (tokenizer|gpu|report)/ { $0 = $0 " blas=" core } { print; fflush() }'
  [ "${PIPESTATUS[0]}" = 0 ] || status=1
done
exit $status
