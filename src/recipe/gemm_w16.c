/* The fixed-order GEMM (td_gemm_fixed, gemm.h) over weights stored as 16-bit codes, bf16 or fp16,
 * read in their storage and widened in registers: a decode step reads every weight once, 2 bytes
 * each, instead of widening whole tiles to fp32 in memory and reading them again. Widening is
 * exact (bf16: a shift; fp16: vcvtph2ps), so every output is td_gemm_fixed's on the decoded
 * weights, bit for bit: the same eight lane sums s_l += a[k] w[k] (k = l mod 8, increasing k,
 * fused multiply-adds) and the same reduction ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)). A NaN
 * result is NaN in both, its payload not defined (an FMA passes on the payload of the operand
 * its register form puts first; IEEE leaves it open), so NaN weights are not canonicalised here.
 * tests/test_gemm.c checks each kernel against td_gemm_fixed on decoded weights.
 *
 * Kernels, picked at run time:
 *   AVX-512 (F, DQ)  a zmm holds the eight lane sums of two output columns: the 8 codes of each
 *                    column at k widened side by side, a[k..k+8) broadcast to both halves (the
 *                    lane order is unchanged); blocks of up to 8 rows x 3 column pairs (24
 *                    accumulators), so one load of a serves three FMAs and one load of w eight.
 *   AVX2 + FMA       one ymm per output (8 lane sums), blocks of 4 rows x 3 columns (12 sums in
 *                    flight; a call of one row: 1 x 6), as td_gemm_fixed's own AVX2 kernel.
 *   portable         each weight row decoded (td_decode_row), then td_gemm_fixed.
 * (TIDAL_ISA caps the choice: include/tidal/isa.h.) Both SIMD kernels are compiled once per
 * format (the widening a constant: at -O2 GCC kept the test of the format inside the inner
 * loop). On one Zen 3 core, the backend's 128-column tiles, against the 4 x 2 blocks with the
 * format tested per chunk: 8 rows 1.29-1.66x, 4 rows 1.33x, one row 1.45-1.70x (K 896-14,336).
 * Single-threaded, like td_gemm_fixed; callers parallelise over column tiles. */
#include "tidal/gemm.h"
#include "tidal/isa.h"

#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "gemm_lanes.h"
#define TD_HAVE_W16_SIMD 1
#endif

int td_gemm_w16_force = 0;

static void gemm_w16_portable(const float *a, int lda, const uint16_t *w, int ldw, td_format wf,
                              float *c, int ldc, int M, int N, int K, int add)
{
    float stackbuf[4096];
    float *row = K <= 4096 ? stackbuf : td_xmalloc((size_t)K * sizeof(float));
    for (int j = 0; j < N; j++) {
        td_decode_row(wf, w + (size_t)j * ldw, row, (size_t)K);
        td_gemm_fixed(a, lda, row, K, c + j, ldc, M, 1, K, add);
    }
    if (row != stackbuf) free(row);
}

#ifdef TD_HAVE_W16_SIMD
#define TGT2 __attribute__((target("avx2,fma,f16c")))
#define TGT5 __attribute__((target("avx512f,avx512dq,avx2,fma,f16c")))
#define INLINE static inline __attribute__((always_inline))

/* the fixed lane reduction of td_gemm_fixed, on the 8 lanes of a ymm (gemm_lanes.h) */
#define hsum_fixed td_lanes_hsum8

TGT2 INLINE void store(float *o, float d, int add) { *o = add ? *o + d : d; }

/* ---- AVX2: 8 codes -> 8 fp32 ---- */
TGT2 INLINE __m256 widen8(const uint16_t *p, int f16)
{
    __m128i h = _mm_loadu_si128((const __m128i *)p);
    if (!f16) return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    return _mm256_cvtph_ps(h);
}

/* R x S block (R <= 4 and S <= 3, or R = 1 and S <= 6), whole K; a_tail/w_tail: the last K % 8
 * elements zero-padded to 8 (rows of a: 8 floats per row; columns of w: 8 codes per column), code
 * 0 being +0 */
TGT2 INLINE void block2(const float *a, int lda, const uint16_t *w, int ldw, float *c, int ldc,
                        int K8, int tail, const float *a_tail, const uint16_t *w_tail, int add,
                        int R, int S, int f16)
{
    __m256 acc[4][6];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 6
        for (int s = 0; s < S; s++) acc[r][s] = _mm256_setzero_ps();
    for (int k = 0; k < K8; k += 8) {
        __m256 wv[6];
        #pragma GCC unroll 6
        for (int s = 0; s < S; s++) wv[s] = widen8(w + (size_t)s * ldw + k, f16);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            __m256 av = _mm256_loadu_ps(a + (size_t)r * lda + k);
            __asm__("" : "+x"(av));   /* one load per row, not one per multiply-add */
            #pragma GCC unroll 6
            for (int s = 0; s < S; s++) acc[r][s] = _mm256_fmadd_ps(av, wv[s], acc[r][s]);
        }
    }
    if (tail)
        for (int r = 0; r < R; r++) {
            __m256 av = _mm256_loadu_ps(a_tail + 8 * r);
            for (int s = 0; s < S; s++) acc[r][s] = _mm256_fmadd_ps(av, widen8(w_tail + 8 * s, f16), acc[r][s]);
        }
    for (int r = 0; r < R; r++)
        for (int s = 0; s < S; s++) store(c + (size_t)r * ldc + s, hsum_fixed(acc[r][s]), add);
}

/* ---- AVX-512: the 8 codes of two columns -> one zmm (column j low, column j + 1 high) ---- */
TGT5 INLINE __m512 widen8x2(const uint16_t *p0, const uint16_t *p1, int f16)
{
    __m256i h = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)p0)),
                                        _mm_loadu_si128((const __m128i *)p1), 1);
    if (!f16) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    return _mm512_cvtph_ps(h);
}

/* R x P block of column pairs (R <= 8, P <= 3); the pair p reads columns col[2p], col[2p+1]
 * (offsets in codes from w; the last pair of an odd N repeats its column and drops it) */
TGT5 INLINE void block5(const float *a, int lda, const uint16_t *w, const size_t *col, float *c,
                        int ldc, int K8, int tail, const float *a_tail, const uint16_t *w_tail,
                        int add, int R, int P, int ncols, int f16)
{
    __m512 acc[8][3];
    #pragma GCC unroll 8
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 3
        for (int p = 0; p < P; p++) acc[r][p] = _mm512_setzero_ps();
    for (int k = 0; k < K8; k += 8) {
        __m512 wv[3];
        #pragma GCC unroll 3
        for (int p = 0; p < P; p++) wv[p] = widen8x2(w + col[2 * p] + k, w + col[2 * p + 1] + k, f16);
        #pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_broadcast_f32x8(_mm256_loadu_ps(a + (size_t)r * lda + k));
            #pragma GCC unroll 3
            for (int p = 0; p < P; p++) acc[r][p] = _mm512_fmadd_ps(av, wv[p], acc[r][p]);
        }
    }
    if (tail) {
        __m512 wv[3];
        for (int p = 0; p < P; p++) wv[p] = widen8x2(w_tail + 16 * p, w_tail + 16 * p + 8, f16);
        for (int r = 0; r < R; r++) {
            __m512 av = _mm512_broadcast_f32x8(_mm256_loadu_ps(a_tail + 8 * r));
            for (int p = 0; p < P; p++) acc[r][p] = _mm512_fmadd_ps(av, wv[p], acc[r][p]);
        }
    }
    for (int r = 0; r < R; r++)
        for (int p = 0; p < P; p++) {
            float *o = c + (size_t)r * ldc + 2 * p;
            store(o, hsum_fixed(_mm512_castps512_ps256(acc[r][p])), add);
            if (2 * p + 1 < ncols) store(o + 1, hsum_fixed(_mm512_extractf32x8_ps(acc[r][p], 1)), add);
        }
}

/* the zero-padded tails of rows [i, i + R) of a, 8 floats each */
static void a_tails(const float *a, int lda, int K8, int tail, int R, float *out)
{
    memset(out, 0, (size_t)R * 8 * sizeof(float));
    for (int r = 0; r < R; r++) memcpy(out + 8 * r, a + (size_t)r * lda + K8, (size_t)tail * sizeof(float));
}

static void w_tail(const uint16_t *w, int K8, int tail, uint16_t *out)
{
    memset(out, 0, 8 * sizeof(uint16_t));
    memcpy(out, w + K8, (size_t)tail * sizeof(uint16_t));
}

/* The row-block dispatch: R as a constant, so each block's loops unroll. */
#define ROWS4(CALL) \
    switch (R) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; \
                 default: CALL(4); break; }
#define ROWS8(CALL) \
    switch (R) { case 1: CALL(1); break; case 2: CALL(2); break; case 3: CALL(3); break; \
                 case 4: CALL(4); break; case 5: CALL(5); break; case 6: CALL(6); break; \
                 case 7: CALL(7); break; default: CALL(8); break; }

TGT5 INLINE void gemm_w16_avx512_any(const float *a, int lda, const uint16_t *w, int ldw, float *c,
                                     int ldc, int M, int N, int K, int add, int f16)
{
    int tail = K % 8, K8 = K - tail;
    float at[8 * 8];
    uint16_t wt[6 * 8];
    for (int i = 0; i < M; i += 8) {
        int R = M - i < 8 ? M - i : 8;
        const float *ai = a + (size_t)i * lda;
        float *ci = c + (size_t)i * ldc;
        if (tail) a_tails(ai, lda, K8, tail, R, at);
        for (int j = 0; j < N; j += 6) {
            int ncols = N - j < 6 ? N - j : 6, P = (ncols + 1) / 2;
            size_t col[6];
            for (int q = 0; q < 2 * P; q++) col[q] = (size_t)(j + (q < ncols ? q : ncols - 1)) * ldw;
            if (tail)
                for (int q = 0; q < 2 * P; q++) w_tail(w + col[q], K8, tail, wt + 8 * q);
#define B5(RR) \
            do { if (P == 3) block5(ai, lda, w, col, ci + j, ldc, K8, tail, at, wt, add, RR, 3, ncols, f16); \
                 else if (P == 2) block5(ai, lda, w, col, ci + j, ldc, K8, tail, at, wt, add, RR, 2, ncols, f16); \
                 else block5(ai, lda, w, col, ci + j, ldc, K8, tail, at, wt, add, RR, 1, ncols, f16); } while (0)
            ROWS8(B5)
#undef B5
        }
    }
}

TGT2 INLINE void gemm_w16_avx2_any(const float *a, int lda, const uint16_t *w, int ldw, float *c,
                                   int ldc, int M, int N, int K, int add, int f16)
{
    int tail = K % 8, K8 = K - tail;
    float at[4 * 8];
    uint16_t wt[6 * 8];
    const int cols = M == 1 ? 6 : 3;   /* one row: 6 columns a block, so that 6 sums hide the FMA latency */
    for (int i = 0; i < M; i += 4) {
        int R = M - i < 4 ? M - i : 4;
        const float *ai = a + (size_t)i * lda;
        float *ci = c + (size_t)i * ldc;
        if (tail) a_tails(ai, lda, K8, tail, R, at);
        for (int j = 0; j < N; j += cols) {
            int S = N - j < cols ? N - j : cols;
            const uint16_t *wj = w + (size_t)j * ldw;
            if (tail)
                for (int s = 0; s < S; s++) w_tail(wj + (size_t)s * ldw, K8, tail, wt + 8 * s);
#define B(RR, SS) block2(ai, lda, wj, ldw, ci + j, ldc, K8, tail, at, wt, add, RR, SS, f16)
            if (cols == 6) {
                switch (S) {
                case 6: B(1, 6); break;
                case 5: B(1, 5); break;
                case 4: B(1, 4); break;
                case 3: B(1, 3); break;
                case 2: B(1, 2); break;
                default: B(1, 1); break;
                }
                continue;
            }
#define B2(RR) \
            do { if (S == 3) B(RR, 3); else if (S == 2) B(RR, 2); else B(RR, 1); } while (0)
            ROWS4(B2)
#undef B2
#undef B
        }
    }
}

/* each kernel with the format a constant */
TGT5 static void gemm_w16_avx512(const float *a, int lda, const uint16_t *w, int ldw, float *c,
                                 int ldc, int M, int N, int K, int add, int f16)
{
    if (f16) gemm_w16_avx512_any(a, lda, w, ldw, c, ldc, M, N, K, add, 1);
    else     gemm_w16_avx512_any(a, lda, w, ldw, c, ldc, M, N, K, add, 0);
}

TGT2 static void gemm_w16_avx2(const float *a, int lda, const uint16_t *w, int ldw, float *c,
                               int ldc, int M, int N, int K, int add, int f16)
{
    if (f16) gemm_w16_avx2_any(a, lda, w, ldw, c, ldc, M, N, K, add, 1);
    else     gemm_w16_avx2_any(a, lda, w, ldw, c, ldc, M, N, K, add, 0);
}
#endif

int td_gemm_w16_kernel(void)
{
#ifdef TD_HAVE_W16_SIMD
    td_isa isa = td_isa_level();
    if (td_gemm_w16_force == 1) return 0;
    if (td_gemm_w16_force != 2 && isa >= TD_ISA_AVX512) return 2;
    if (isa >= TD_ISA_AVX2) return 1;
#endif
    return 0;
}

void td_gemm_fixed_w16(const float *a, int lda, const uint16_t *w, int ldw, td_format wf, float *c,
                       int ldc, int M, int N, int K, int add)
{
    if (M <= 0 || N <= 0) return;
#ifdef TD_HAVE_W16_SIMD
    int f16 = wf == TD_F16;
    switch (td_gemm_w16_kernel()) {
    case 2: gemm_w16_avx512(a, lda, w, ldw, c, ldc, M, N, K, add, f16); return;
    case 1: gemm_w16_avx2(a, lda, w, ldw, c, ldc, M, N, K, add, f16); return;
    default: break;
    }
#endif
    gemm_w16_portable(a, lda, w, ldw, wf, c, ldc, M, N, K, add);
}
