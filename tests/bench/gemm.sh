#!/usr/bin/env bash
# The batch-invariant GEMM (td_gemm_fixed) against OpenBLAS sgemm, single-threaded, on
# Qwen2.5-0.5B shapes (tests/bench/gemm_bench.c). Prints
#   bench: gemm-fixed-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R   (peer = OpenBLAS sgemm)
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
mkdir -p "$BUILD/bench"
CFLAGS=$(pkg-config --cflags openblas 2>/dev/null || true)
LIBS=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
cc -O2 -march=x86-64-v2 -std=c11 -D_GNU_SOURCE -Iinclude $CFLAGS tests/bench/gemm_bench.c \
   -o "$BUILD/bench/gemm_bench" "$BUILD/libtidal.a" $LIBS -lm -fopenmp
"$BUILD/bench/gemm_bench"
