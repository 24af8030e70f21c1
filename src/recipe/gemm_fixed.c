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
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TD_HAVE_AVX2_PATH 1
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

TGT static void gemm_avx2(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                          int M, int N, int K, int add)
{
    int rem = K % 8;
    __m256i mask = _mm256_setr_epi32(rem > 0 ? -1 : 0, rem > 1 ? -1 : 0, rem > 2 ? -1 : 0,
                                     rem > 3 ? -1 : 0, rem > 4 ? -1 : 0, rem > 5 ? -1 : 0,
                                     rem > 6 ? -1 : 0, 0);
    /* columns in panels of 16 (16 x K of w stays in cache while every row block passes) */
    for (int j0 = 0; j0 < N; j0 += 16) {
        int j1 = j0 + 16 < N ? j0 + 16 : N, i = 0;
        for (; i + 4 <= M; i += 4)
            row_panel(a + (size_t)i * lda, lda, w, ldw, c + (size_t)i * ldc, ldc, j0, j1, K, add, 4, mask);
        for (; i < M; i++)
            row_panel(a + (size_t)i * lda, lda, w, ldw, c + (size_t)i * ldc, ldc, j0, j1, K, add, 1, mask);
    }
}
#endif

void td_gemm_fixed(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M,
                   int N, int K, int add)
{
#ifdef TD_HAVE_AVX2_PATH
    if (!td_gemm_fixed_portable_only && __builtin_cpu_supports("avx2") &&
        __builtin_cpu_supports("fma")) {
        gemm_avx2(a, lda, w, ldw, c, ldc, M, N, K, add);
        return;
    }
#endif
    gemm_portable(a, lda, w, ldw, c, ldc, M, N, K, add);
}

int td_gemm_fixed_portable_only = 0;
