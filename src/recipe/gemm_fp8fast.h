/* tidal — the fp8-fast GEMM's pieces shared by its files (src/recipe, internal): the order's step
 * and block helpers, the codes' decode on AVX2, and the kernels one file calls in another.
 *   gemm_fp8fast.c     the order (its comment), the portable reference, the AVX2 tile, the entry
 *                      points td_gemm_fp8_fast and td_gemm_fp8_fast_codes, the NaN scans
 *   gemm_fp8fast512.c  the AVX-512 kernels (in place, over codes, packed)
 *   gemm_fp8packed.c   the AVX2 packed kernel (fp32 rows or codes in panels of 8 rows)
 *   gemm_fp8panels.c   the AVX2 kernel over codes in k-major panels of 8 rows, and that layout */
#ifndef TIDAL_RECIPE_GEMM_FP8FAST_H
#define TIDAL_RECIPE_GEMM_FP8FAST_H

#include "tidal/gemm.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "gemm_lanes.h"
#define TD_HAVE_FP8FAST_SIMD 1
#endif

/* fewer rows: packing costs more than it gains (crossover 24-48 rows, one Xeon thread; with AVX2's
 * panels of 16, 16-24 rows, one Zen 3 thread) */
enum { STEP = 32, PACKED_MIN_ROWS = 40, PACKED_MIN_ROWS2 = 24 };

/* the packed kernels (gemm_fp8fast512.c, gemm_fp8packed.c): K in chunks of at most KC products, rows
 * in groups of GROUP whose chunk of a stays in L2 */
enum { KC = 256, GROUP = 192 };

/* the end of s0's promotion block (or K); the block after one ending at e < K ends at next_block(e) */
static inline int block_end(int s0, int K, int promote)
{
    int k1 = (s0 / promote + 1) * promote;
    return k1 > K || k1 < 0 ? K : k1;
}

static inline int next_block(int e, int K, int promote) { return promote > K - e ? K : e + promote; }

/* moves a scale block of K (index kb, ending at kend; sc wide) on to the one holding k without a
 * division (one per step was most of a decode step's time); 1 when it moved */
static inline int scale_block_at(int k, int sc, int *kb, int *kend)
{
    if (k < *kend) return 0;
    do {
        (*kb)++;
        *kend += sc;
    } while (k >= *kend);
    return 1;
}

/* the end of the step starting at s0 (steps restart at every promotion block) */
static inline int step_end(int s0, int K, int promote)
{
    int k1 = block_end(s0, K, promote);
    return s0 + STEP < k1 ? s0 + STEP : k1;
}

/* the end of the packed kernels' chunk of K from c0: whole steps, at most kc products */
static inline int chunk_end(int c0, int K, int promote, int kc)
{
    int c1 = c0;
    while (c1 < K && step_end(c1, K, promote) - c0 <= kc) c1 = step_end(c1, K, promote);
    return c1;
}

/* promotion at least one step, 0..23 kept fraction bits (both kernels' entry points) */
static inline void clamp_fp8_args(int *promote, int *bits)
{
    if (*promote < STEP) *promote = STEP;
    if (*bits < 0) *bits = 0;
    if (*bits > 23) *bits = 23;
}

/* rows x N of c zeroed (the packed kernels' products over K = 0) */
static inline void zero_rows(float *c, int ldc, int rows, int N)
{
    for (int i = 0; i < rows; i++)
        for (int j = 0; j < N; j++) c[(size_t)i * ldc + j] = 0.0f;
}

/* 1 when a step ending at e closes its promotion block */
static inline int closes_block(int e, int K, int promote) { return e == K || e % promote == 0; }

/* the exact-factor test both codes entry points make: every e4m3 block scale the call reads at
 * most lim (2^120 x scale, or 256 x scale on AVX-512, must not overflow) */
static inline int scales_fit(const float *scale, int row0, int N, int sr, int nbc, float lim)
{
    for (int b = row0 / sr; b <= (row0 + N - 1) / sr; b++)
        for (int q = 0; q < nbc; q++)
            if (!(fabsf(scale[(size_t)b * nbc + q]) <= lim)) return 0;
    return 1;
}

#ifdef TD_HAVE_FP8FAST_SIMD
#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT512 __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl,avx512bw")))
#define INLINE inline __attribute__((always_inline))

/* fp8 codes with their block scales, as the codes kernels read them: N rows of stride ldw from row
 * row0 of the matrix (panels: the panel holding row0), scale blocks of sr rows x sc columns, nbc
 * blocks a row of blocks */
typedef struct {
    const uint8_t *w;
    const float *scale;
    int ldw, row0, sr, sc, nbc, e5m2;
} codes_w;

/* 8 codes at p (m of them; lanes past m zero) as fp32 and multiplied by sc: td_fp8_decode_scaled_row's
 * value. e4m3: each code shuffled into the top byte of its lane, shifted down 4 arithmetically (the
 * sign stays in bit 31; its copies in bits 27-30 masked off) gives fp32's sign, exponent and
 * mantissa fields, the value x 2^-120 exactly (a subnormal code a subnormal fp32: no DAZ here),
 * and sc is 2^120 x the block scale (exact: the caller keeps scales <= 2^7), so the one rounding
 * is that of value x scale. (The sign-extend form, vpmovsxbd and a shift, measured the same on
 * Zen 3: tests/bench/fp8_mix_probe.c; a decode costs about 2 cycles either way.) e5m2: the code
 * is fp16's top byte, widened by F16C (its infinities stay infinite), sc the block scale. */
TGT static INLINE __m256 decode8(int e5m2, const uint8_t *p, __m256 sc, int m, __m256i mask)
{
    __m128i b;
    if (m == 8) {
        b = _mm_loadl_epi64((const __m128i *)p);
    } else {
        uint8_t t[8] = {0};
        memcpy(t, p, (size_t)m);
        b = _mm_loadl_epi64((const __m128i *)t);
    }
    __m256 v;
    if (e5m2) {
        v = _mm256_cvtph_ps(_mm_slli_epi16(_mm_cvtepi8_epi16(b), 8));
    } else {   /* code i in byte 3 of lane i */
        const __m256i put = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1, -1, 3,
                                             -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6, -1, -1, -1, 7);
        __m256i d = _mm256_srai_epi32(_mm256_shuffle_epi8(_mm256_broadcastq_epi64(b), put), 4);
        v = _mm256_castsi256_ps(_mm256_and_si256(d, _mm256_set1_epi32((int)0x87FFFFFF)));
    }
    __m256 f = _mm256_mul_ps(v, sc);
    return m < 8 ? _mm256_and_ps(f, _mm256_castsi256_ps(mask)) : f;   /* 0, not 0 x scale */
}

/* gemm_fp8fast512.c */
void td_fp8fast_gemm512(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M, int N, int K,
                        int promote, int bits);
void td_fp8fast_gemm512_codes(const float *a, int lda, const codes_w *cw, float *c, int ldc, int M, int N, int K,
                              int promote, int bits);
int td_fp8fast_gemm512_packed(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M, int N,
                              int K, int promote, int bits);
int td_fp8fast_has_nan512(const uint8_t *w, int ldw, int N, int K, int e5m2);
/* gemm_fp8packed.c: w (fp32 rows, pn NULL) or pn (codes in panels of 8 rows); 0 when the partials'
 * buffer cannot be had (the caller takes the in-place kernel: the same bits) */
int td_fp8fast_packed2(const float *a, int lda, const float *w, int ldw, const codes_w *pn, float *c, int ldc,
                       int M, int N, int K, int promote, int bits);
#endif

#endif
