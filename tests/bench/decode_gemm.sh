#!/usr/bin/env bash
# A decode step's GEMM over bf16 weights (td_gemm_fixed_w16) against the widen + OpenBLAS
# sgemm/sgemv it replaced, single-threaded, Llama-3-8B shapes (tests/bench/decode_gemm_bench.c).
# Prints
#   bench: decode-gemm-bf16-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
mkdir -p "$BUILD/bench"
CFLAGS=$(pkg-config --cflags openblas 2>/dev/null || true)
LIBS=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
cc -O2 -march=x86-64-v2 -std=c11 -D_GNU_SOURCE -Iinclude $CFLAGS tests/bench/decode_gemm_bench.c \
   -o "$BUILD/bench/decode_gemm_bench" "$BUILD/libtidal.a" $LIBS -lm -fopenmp
"$BUILD/bench/decode_gemm_bench"
