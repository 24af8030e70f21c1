/* tidal — the lane reduction that ends td_gemm_fixed's order (gemm.h), shared by its kernels
 * (gemm_fixed.c) and the 16-bit-weight kernels that must give its bits (gemm_w16.c): eight lane
 * sums s0..s7 of one output reduced as ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)). Internal to
 * src/recipe; x86 only. Also the AVX-512 form of eight such reductions at once (td_lanes_reduce8x8),
 * for the kernels that hold two columns per zmm (gemm_fixed.c, gemm_fp8fast.c). */
#ifndef TIDAL_RECIPE_GEMM_LANES_H
#define TIDAL_RECIPE_GEMM_LANES_H

#include <immintrin.h>

__attribute__((target("avx2"))) static inline float td_lanes_hsum8(__m256 v)
{
    /* (s0+s4, s1+s5, s2+s6, s3+s7), then (a0+a2, a1+a3), then their sum */
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

/* The 8 columns' reductions of one row at once: acc[p] holds columns 2p and 2p+1. Lane i of a
 * column is s_i; each step below adds the same operands in the same order as reduce8:
 *   q_i = s_i + s_{i+4}:   the low 128 bits of a column's half plus its high 128 bits;
 *   a0 = q0 + q2, a1 = q1 + q3;   then a0 + a1.
 * Returns the 8 sums in column order. */
__attribute__((target("avx2,fma,avx512f,avx512dq,avx512vl"), always_inline))
static inline __m256 td_lanes_reduce8x8(const __m512 acc[4])
{
    /* 128-bit blocks [col 0 s0..3, col 1 s0..3, col 2 s0..3, col 3 s0..3] + the s4..7 blocks */
    __m512 q03 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[0], acc[1], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(acc[0], acc[1], _MM_SHUFFLE(3, 1, 3, 1)));
    __m512 q47 = _mm512_add_ps(_mm512_shuffle_f32x4(acc[2], acc[3], _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_f32x4(acc[2], acc[3], _MM_SHUFFLE(3, 1, 3, 1)));
    /* block b: [a0, a1 of column b, a0, a1 of column 4+b] */
    __m512 a01 = _mm512_add_ps(_mm512_shuffle_ps(q03, q47, _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_ps(q03, q47, _MM_SHUFFLE(3, 2, 3, 2)));
    /* block b: [sum of column b, sum of column 4+b, (copies)] */
    __m512 sum = _mm512_add_ps(_mm512_shuffle_ps(a01, a01, _MM_SHUFFLE(2, 0, 2, 0)),
                               _mm512_shuffle_ps(a01, a01, _MM_SHUFFLE(3, 1, 3, 1)));
    __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0);
    return _mm512_castps512_ps256(_mm512_permutexvar_ps(order, sum));
}

#endif
