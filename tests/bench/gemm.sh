#!/usr/bin/env bash
# tidal's own GEMM kernels against OpenBLAS, single-threaded:
#   tests/bench/gemm_bench.c     the batch-invariant GEMM (td_gemm_fixed) against sgemm, Qwen2.5-0.5B shapes
#   tests/bench/kernels_bench.c  the decode kernel over bf16 weights (td_gemm_fixed_w16) against the
#                                widen + sgemm/sgemv it replaced, and the bf16 dot-product GEMM
#                                (td_gemm_bf16dp) against sgemm
#   tests/bench/fp8_bench.c      the fp8-unified recipe's prefill and decode products against the
#                                fp16 recipes' on the same shapes (issue 38's FP8 / FP16 >= 0.8)
# Prints
#   bench: gemm-fixed-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R
#   bench: decode-gemm-bf16-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R
#   bench: gemm-bf16dp-MxNxK tidal=GFLOPS peer=GFLOPS ratio=R
#   bench: gemm-fp8fast-MxNxK, decode-gemm-fp8-MxNxK tidal=GFLOPS (fp8) peer=GFLOPS (fp16) ratio=R
set -eu
cd "$(dirname "$0")/../.."
BUILD=${BUILD:-build}
mkdir -p "$BUILD/bench"
CFLAGS=$(pkg-config --cflags openblas 2>/dev/null || true)
LIBS=$(pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
for b in gemm_bench kernels_bench fp8_bench; do
  cc -O2 -march=x86-64-v2 -std=c11 -D_GNU_SOURCE -Iinclude $CFLAGS tests/bench/$b.c \
     -o "$BUILD/bench/$b" "$BUILD/libtidal.a" $LIBS -lm -fopenmp
  "$BUILD/bench/$b"
done
