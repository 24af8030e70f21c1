/* tidal — the lane reduction that ends td_gemm_fixed's order (gemm.h), shared by its kernels
 * (gemm_fixed.c) and the 16-bit-weight kernels that must give its bits (gemm_w16.c): eight lane
 * sums s0..s7 of one output reduced as ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)). Internal to
 * src (recipe and backend); x86 only. Also the AVX-512 form of eight such reductions at once
 * (td_lanes_reduce8x8), for the kernels that hold two columns per zmm (gemm_fixed.c,
 * gemm_fp8fast512.c), its AVX2 form on 8 or 4 ymms (gemm_fp8fast.c), and the 16 x 16 and 8 x 8
 * register transposes (cpu_backward.c's transposes, the fp8-fast packed kernels' panels:
 * gemm_fp8fast512.c, gemm_fp8packed.c). */
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

/* The AVX2 form (gemm_fp8fast.c's AVX2 kernel, which reduces after every step): the reductions of
 * 8 outputs at once, v[i] holding output i's lane sums s0..s7, with reduce8's adds and operand
 * order: q_i = s_i + s_{i+4} (two outputs' low halves against their high halves), a0 = q0 + q2 and
 * a1 = q1 + q3 (two outputs' pairs side by side), then a0 + a1. */
__attribute__((target("avx2"), always_inline)) static inline __m256 td_lanes_q2_avx2(__m256 x, __m256 y)
{
    /* [x's q0..q3 | y's q0..q3] */
    return _mm256_add_ps(_mm256_permute2f128_ps(x, y, 0x20), _mm256_permute2f128_ps(x, y, 0x31));
}

/* [a0, a1 of x's first, a0, a1 of y's first | the same of their second] (x, y from td_lanes_q2_avx2) */
__attribute__((target("avx2"), always_inline)) static inline __m256 td_lanes_a2_avx2(__m256 x, __m256 y)
{
    return _mm256_add_ps(_mm256_shuffle_ps(x, y, _MM_SHUFFLE(1, 0, 1, 0)), _mm256_shuffle_ps(x, y, _MM_SHUFFLE(3, 2, 3, 2)));
}

/* The 8 sums in the lanes [0, 2, 4, 6 | 1, 3, 5, 7] (TD_LANES_EO(i): output i's lane): a kernel that
 * only adds and truncates them elementwise stores them in order once, at the end */
#define TD_LANES_EO(i) ((i) % 2 * 4 + (i) / 2)
__attribute__((target("avx2"), always_inline)) static inline __m256 td_lanes_reduce8_avx2(const __m256 v[8])
{
    __m256 a0 = td_lanes_a2_avx2(td_lanes_q2_avx2(v[0], v[1]), td_lanes_q2_avx2(v[2], v[3]));   /* outputs 0, 2 | 1, 3 */
    __m256 a1 = td_lanes_a2_avx2(td_lanes_q2_avx2(v[4], v[5]), td_lanes_q2_avx2(v[6], v[7]));   /* 4, 6 | 5, 7 */
    return _mm256_add_ps(_mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(a0, a1, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* the same for 4 outputs (v[0..3]): [0, 2, 0, 2 | 1, 3, 1, 3], output i in lane TD_LANES_EO(i) */
__attribute__((target("avx2"), always_inline)) static inline __m256 td_lanes_reduce4_avx2(const __m256 v[4])
{
    __m256 a = td_lanes_a2_avx2(td_lanes_q2_avx2(v[0], v[1]), td_lanes_q2_avx2(v[2], v[3]));   /* 0, 2 | 1, 3 */
    return _mm256_add_ps(_mm256_shuffle_ps(a, a, _MM_SHUFFLE(2, 0, 2, 0)), _mm256_shuffle_ps(a, a, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* The AVX2 transpose of 8 rows of 8 floats (unpacks, 64-bit shuffles, 128-bit lane swaps): r[k]
 * becomes column k. A copy: no arithmetic. */
__attribute__((target("avx2"), always_inline)) static inline void td_transpose8_avx2(__m256 r[8])
{
    __m256 t[8], u[8];
    for (int i = 0; i < 8; i += 2) {
        t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
        t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
    }
    for (int i = 0; i < 8; i += 4) {
        u[i] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], _MM_SHUFFLE(3, 2, 3, 2));
        u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(1, 0, 1, 0));
        u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* The classic three-stage register transpose of 16 rows of 16 32-bit values (32-bit unpacks,
 * 64-bit unpacks, 128-bit lane shuffles): r[k] becomes column k. A copy: no arithmetic. */
__attribute__((target("avx512f"), always_inline)) static inline void td_transpose16_regs(__m512i r[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        r[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        r[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        r[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        r[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    for (int h = 0; h < 16; h += 8)
        for (int i = 0; i < 4; i++) {
            t[h + i] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0x88);
            t[h + i + 4] = _mm512_shuffle_i32x4(r[h + i], r[h + i + 4], 0xdd);
        }
    for (int i = 0; i < 8; i++) {
        r[i] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0x88);
        r[i + 8] = _mm512_shuffle_i32x4(t[i], t[i + 8], 0xdd);
    }
}

#endif
