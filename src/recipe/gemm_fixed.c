/* The batch-invariant GEMM (see gemm.h, td_gemm_fixed): one summation order per output
 * element, whatever the number of rows M, the columns N, where the element sits in a tile, or
 * which thread computes it — as the batch-invariant kernels of the inference engines fix
 * theirs (one tile shape and one split for every batch size).
 *
 * The order, for c = sum_{k<K} a[k] w[k]:
 *   eight lane sums s_l = fma(a[k], w[k], s_l) for k = l, l+8, l+16, ... in increasing k
 *   (k >= K contributes fma(0, 0, s_l)), then ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)).
 * Every multiply-add is a fused multiply-add (one rounding), so the AVX2+FMA kernel and the
 * portable one (fmaf, correctly rounded by C11) give the same bits: results do not depend on
 * the machine either.
 *
 * The AVX2 kernel holds a 4-row x 2-column block of accumulators (8 registers) and walks K once
 * per block; threads (the caller's) take whole column tiles, so nothing is shared. */
#include "tidal/gemm.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TD_HAVE_AVX2_PATH 1
#endif

#ifndef PACK_FLOATS
#define PACK_FLOATS 65536
#endif

/* the fixed lane reduction, on 8 lane sums */
static inline float reduce8(const float s[8])
{
    float a0 = s[0] + s[4], a1 = s[1] + s[5], a2 = s[2] + s[6], a3 = s[3] + s[7];
    return (a0 + a2) + (a1 + a3);
}

/* one element, portable: the order above with fmaf */
static float dot_portable(const float *a, const float *w, int K)
{
    float s[8] = {0};
    int k = 0;
    for (; k + 8 <= K; k += 8)
        for (int l = 0; l < 8; l++) s[l] = fmaf(a[k + l], w[k + l], s[l]);
    if (k < K)
        for (int l = 0; l < 8; l++) {
            float x = k + l < K ? a[k + l] : 0.0f, y = k + l < K ? w[k + l] : 0.0f;
            s[l] = fmaf(x, y, s[l]);
        }
    return reduce8(s);
}

static void gemm_portable(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                          int M, int N, int K, int add)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float d = dot_portable(a + (size_t)i * lda, w + (size_t)j * ldw, K);
            float *o = c + (size_t)i * ldc + j;
            *o = add ? *o + d : d;
        }
}

#ifdef TD_HAVE_AVX2_PATH
#define TGT __attribute__((target("avx2,fma")))

TGT static inline float hsum_fixed(__m256 v)
{
    /* (s0+s4, s1+s5, s2+s6, s3+s7), then (a0+a2, a1+a3), then their sum: reduce8's order */
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

/* An R x S block (R <= 4, S <= 2) of rows a[0..R) and columns w[0..S), the whole K. Called
 * with constant R and S, so the loops unroll; each element's operations are the same in
 * every shape. */
TGT static inline __attribute__((always_inline)) void block(const float *a, int lda,
                                                            const float *w, int ldw, float *c,
                                                            int ldc, int K, int add, int R, int S,
                                                            __m256i tail_mask)
{
    __m256 acc[4][2];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 2
        for (int s = 0; s < S; s++) acc[r][s] = _mm256_setzero_ps();
    int k = 0;
    for (; k + 8 <= K; k += 8) {
        __m256 wv[2], av;
        #pragma GCC unroll 2
        for (int s = 0; s < S; s++) wv[s] = _mm256_loadu_ps(w + (size_t)s * ldw + k);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            av = _mm256_loadu_ps(a + (size_t)r * lda + k);
            #pragma GCC unroll 2
            for (int s = 0; s < S; s++) acc[r][s] = _mm256_fmadd_ps(av, wv[s], acc[r][s]);
        }
    }
    if (k < K) {   /* masked lanes load 0: fma(0, 0, s) as the portable form */
        __m256 wv[2], av;
        for (int s = 0; s < S; s++) wv[s] = _mm256_maskload_ps(w + (size_t)s * ldw + k, tail_mask);
        for (int r = 0; r < R; r++) {
            av = _mm256_maskload_ps(a + (size_t)r * lda + k, tail_mask);
            for (int s = 0; s < S; s++) acc[r][s] = _mm256_fmadd_ps(av, wv[s], acc[r][s]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int s = 0; s < S; s++) {
            float d = hsum_fixed(acc[r][s]);
            float *o = c + (size_t)r * ldc + s;
            *o = add ? *o + d : d;
        }
}

/* R rows (constant) against columns [j0, j1): 2-column blocks, then a last single column */
TGT static inline __attribute__((always_inline)) void row_panel(const float *ai, int lda,
                                                                const float *w, int ldw,
                                                                float *ci, int ldc, int j0, int j1,
                                                                int K, int add, int R,
                                                                __m256i mask)
{
    int j = j0;
    for (; j + 2 <= j1; j += 2) block(ai, lda, w + (size_t)j * ldw, ldw, ci + j, ldc, K, add, R, 2, mask);
    if (j < j1) block(ai, lda, w + (size_t)j * ldw, ldw, ci + j, ldc, K, add, R, 1, mask);
}

TGT static __m256i tail_mask_of(int K)
{
    int rem = K % 8;
    return _mm256_setr_epi32(rem > 0 ? -1 : 0, rem > 1 ? -1 : 0, rem > 2 ? -1 : 0,
                             rem > 3 ? -1 : 0, rem > 4 ? -1 : 0, rem > 5 ? -1 : 0,
                             rem > 6 ? -1 : 0, 0);
}

TGT static void gemm_avx2(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                          int M, int N, int K, int add)
{
    __m256i mask = tail_mask_of(K);
    /* columns in panels of 16 (16 x K of w stays in cache while every row block passes) */
    for (int j0 = 0; j0 < N; j0 += 16) {
        int j1 = j0 + 16 < N ? j0 + 16 : N, i = 0;
        for (; i + 4 <= M; i += 4)
            row_panel(a + (size_t)i * lda, lda, w, ldw, c + (size_t)i * ldc, ldc, j0, j1, K, add, 4, mask);
        for (; i < M; i++)
            row_panel(a + (size_t)i * lda, lda, w, ldw, c + (size_t)i * ldc, ldc, j0, j1, K, add, 1, mask);
    }
}

#define TGT512 __attribute__((target("avx2,fma,avx512f,avx512dq")))

/* W columns packed in pairs: for columns (j, j+1) and k-chunk t, 16 floats
 * w_j[8t..8t+8) w_{j+1}[8t..8t+8), zeros past K and past N. A panel of 8 columns is 4 pairs
 * per chunk, so the kernel reads it as one stream: [t][pair][16]. */
TGT512 static void pack_panel(const float *w, int ldw, int ncols, int K, int T, float *p)
{
    __m256i mask = tail_mask_of(K);
    int kfull = K / 8;
    for (int q = 0; q < 8; q++) {
        float *o = p + (q / 2) * 16 + (q % 2) * 8;
        if (q >= ncols) {
            for (int t = 0; t < T; t++) _mm256_storeu_ps(o + (size_t)t * 64, _mm256_setzero_ps());
            continue;
        }
        const float *wq = w + (size_t)q * ldw;
        int t = 0;
        for (; t < kfull; t++) _mm256_storeu_ps(o + (size_t)t * 64, _mm256_loadu_ps(wq + 8 * t));
        if (t < T) _mm256_storeu_ps(o + (size_t)t * 64, _mm256_maskload_ps(wq + 8 * t, mask));
    }
}

/* R rows (constant, <= 6) x one packed panel of 8 columns, the whole K. Accumulator
 * acc[r][p] holds the 8 lane sums of columns 2p (low half) and 2p+1 (high half); the rows'
 * 8 values of a chunk are broadcast to both halves, so each half runs the lane order. */
TGT512 static inline __attribute__((always_inline)) void tile512(const float *a, int lda,
                                                                 const float *wp, int K, int T,
                                                                 __m256i mask, float *c, int ldc,
                                                                 int ncols, int add, int R)
{
    __m512 acc[6][4];
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
    int kfull = K / 8, t = 0;
    for (; t < kfull; t++) {
        const float *wt = wp + (size_t)t * 64;
        __m512 w0 = _mm512_loadu_ps(wt), w1 = _mm512_loadu_ps(wt + 16),
               w2 = _mm512_loadu_ps(wt + 32), w3 = _mm512_loadu_ps(wt + 48);
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_broadcast_f32x8(_mm256_loadu_ps(a + (size_t)r * lda + 8 * t));
            acc[r][0] = _mm512_fmadd_ps(av, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, w1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(av, w2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(av, w3, acc[r][3]);
        }
    }
    if (t < T) {   /* the last chunk: a masked to 0, w packed as 0 past K */
        const float *wt = wp + (size_t)t * 64;
        __m512 w0 = _mm512_loadu_ps(wt), w1 = _mm512_loadu_ps(wt + 16),
               w2 = _mm512_loadu_ps(wt + 32), w3 = _mm512_loadu_ps(wt + 48);
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_broadcast_f32x8(_mm256_maskload_ps(a + (size_t)r * lda + 8 * t, mask));
            acc[r][0] = _mm512_fmadd_ps(av, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(av, w1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(av, w2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(av, w3, acc[r][3]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int q = 0; q < ncols; q++) {
            __m512 v = acc[r][q / 2];
            float d = hsum_fixed(q % 2 ? _mm512_extractf32x8_ps(v, 1) : _mm512_castps512_ps256(v));
            float *o = c + (size_t)r * ldc + q;
            *o = add ? *o + d : d;
        }
}

TGT512 static void rows512(const float *a, int lda, const float *wp, int K, int T, __m256i mask,
                           float *c, int ldc, int ncols, int add, int R)
{
    switch (R) {
    case 6: tile512(a, lda, wp, K, T, mask, c, ldc, ncols, add, 6); break;
    case 5: tile512(a, lda, wp, K, T, mask, c, ldc, ncols, add, 5); break;
    case 4: tile512(a, lda, wp, K, T, mask, c, ldc, ncols, add, 4); break;
    case 3: tile512(a, lda, wp, K, T, mask, c, ldc, ncols, add, 3); break;
    case 2: tile512(a, lda, wp, K, T, mask, c, ldc, ncols, add, 2); break;
    default: tile512(a, lda, wp, K, T, mask, c, ldc, ncols, add, 1); break;
    }
}

TGT512 static int gemm_avx512(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                              int M, int N, int K, int add)
{
    int T = (K + 7) / 8;
    size_t panel = (size_t)T * 64;
    int npan_max = (int)(PACK_FLOATS / panel);
    if (npan_max < 1) npan_max = 1;
    int npan_all = (N + 7) / 8;
    if (npan_max > npan_all) npan_max = npan_all;
    float *buf = malloc(sizeof(float) * panel * npan_max);
    if (!buf) return 0;
    __m256i mask = tail_mask_of(K);
    for (int j0 = 0; j0 < N; j0 += 8 * npan_max) {
        int np = (N - j0 + 7) / 8;
        if (np > npan_max) np = npan_max;
        for (int p = 0; p < np; p++) {
            int jc = j0 + 8 * p, nc = N - jc < 8 ? N - jc : 8;
            pack_panel(w + (size_t)jc * ldw, ldw, nc, K, T, buf + panel * p);
        }
        for (int i = 0; i < M; i += 6) {
            int R = M - i < 6 ? M - i : 6;
            for (int p = 0; p < np; p++) {
                int jc = j0 + 8 * p, nc = N - jc < 8 ? N - jc : 8;
                rows512(a + (size_t)i * lda, lda, buf + panel * p, K, T, mask,
                        c + (size_t)i * ldc + jc, ldc, nc, add, R);
            }
        }
    }
    free(buf);
    return 1;
}
#endif

void td_gemm_fixed(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M,
                   int N, int K, int add)
{
#ifdef TD_HAVE_AVX2_PATH
    if (!td_gemm_fixed_portable_only && M >= 4 && __builtin_cpu_supports("avx512f") &&
        __builtin_cpu_supports("avx512dq") && gemm_avx512(a, lda, w, ldw, c, ldc, M, N, K, add))
        return;
    if (!td_gemm_fixed_portable_only && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma")) {
        gemm_avx2(a, lda, w, ldw, c, ldc, M, N, K, add);
        return;
    }
#endif
    gemm_portable(a, lda, w, ldw, c, ldc, M, N, K, add);
}

int td_gemm_fixed_portable_only = 0;
