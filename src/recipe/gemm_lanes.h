/* tidal — the lane reduction that ends td_gemm_fixed's order (gemm.h), shared by its kernels
 * (gemm_fixed.c) and the 16-bit-weight kernels that must give its bits (gemm_w16.c): eight lane
 * sums s0..s7 of one output reduced as ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)). Internal to
 * src/recipe; x86 only. */
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

#endif
