#!/usr/bin/env bash
# The CPU backend's own GEMM kernels against OpenBLAS, single-threaded (tests/bench/kernels_bench.c):
# a decode step over bf16 weights (td_gemm_fixed_w16) against the widen + sgemm/sgemv it replaced,
# and the bf16 dot-product GEMM (td_gemm_bf16dp) against sgemm. Prints
#   bench: decode-gemm-bf16-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R
#   bench: gemm-bf16dp-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
mkdir -p "$BUILD/bench"
CFLAGS=$(pkg-config --cflags openblas 2>/dev/null || true)
LIBS=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
cc -O2 -march=x86-64-v2 -std=c11 -D_GNU_SOURCE -Iinclude $CFLAGS tests/bench/kernels_bench.c \
   -o "$BUILD/bench/kernels_bench" "$BUILD/libtidal.a" $LIBS -lm -fopenmp
"$BUILD/bench/kernels_bench"
