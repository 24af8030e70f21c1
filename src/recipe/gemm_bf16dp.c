/* The GEMM of bf16 operands on the CPU's own bf16 dot products (AVX512-BF16 vdpbf16ps), for
 * recipes whose GEMMs multiply bf16 values with fp32 accumulation (gemm.h): the arithmetic a
 * tensor core does, two products per fp32 lane per instruction, twice sgemm's rate over the same
 * values widened to fp32. Its summation order is the instruction's, written down here and
 * transcribed in portable C (td_gemm_bf16dp_ref, the reference the kernel is tested against):
 *
 *   c = sum_k a[k] w[k], K walked in blocks of 32 (zero-padded): sixteen lane sums, lane l of
 *   block t taking k1 = 32t + 2l + 1, then k0 = 32t + 2l:
 *       s_l = ftz(fma(daz(a[k1]), daz(w[k1]), s_l));  s_l = ftz(fma(daz(a[k0]), daz(w[k0]), s_l))
 *   then u_l = s_l + s_(l+8) (l < 8) and ((u0+u4) + (u2+u6)) + ((u1+u5) + (u3+u7)) in IEEE fp32.
 *   daz: a bf16 subnormal operand counts as a zero of its sign; ftz: a sum that is tiny becomes a
 *   zero of its sign, tiny as x86 detects it, after rounding (its exact value rounded to 24 bits
 *   with an unbounded exponent below 2^-126: 2^-126 - 2^-150 is, 2^-126 - 2^-190 is not). (Intel's pseudo-code of VDPBF16PS; measured identical on an AMD
 *   Zen 4 on 3.2e7 lanes with subnormal operands and sums, and on sums that round up to 2^-126
 *   (test_bf16dp_tiny); the products are exact in fp32, so each fma rounds once.)
 *
 * The order depends on nothing but K: not on M, N, the tiling or the thread, so results do not
 * depend on the thread count (nor on the batch). Before first use the kernel is run against the
 * reference on a small product with subnormals, ties and cancellations; a CPU whose instruction
 * gives other bits keeps OpenBLAS (td_gemm_bf16dp_available says which). Subnormal bf16 values
 * (below 2^-126) are the one semantic difference from an fp32 GEMM of the same values: they
 * count as zeros here, as in the instruction.
 *
 * Kernels: (1) vdpbf16ps, blocks of 4 rows x 4 columns (K <= 1536) or x 6, one zmm of 16 lane
 * sums per output (16 or 24 accumulators); per block of 32 k, four loads of a, four or six of w,
 * 16 or 24 dot products. (2) The same lane sums on fp32 FMAs (gemm_avx512fma, below) for CPUs
 * where the instruction is slow (a Xeon of 2026-11-30: one every second cycle) or absent but
 * AVX-512 is there: two FMAs per pair of products, MXCSR's DAZ / FTZ for the flushes. The faster
 * of those whose bits match the reference runs. Single-threaded; callers parallelise over column
 * tiles. On an AVX-512 CPU without AVX512-BF16 the recipes' bf16 GEMMs took OpenBLAS's sgemm
 * until 2026-11-30 and take this order since: the same bits as on the CPUs that have it. */
#include "tidal/gemm.h"
#include "tidal/isa.h"
#include "tidal/progress.h"
#include "gemm_scratch.h"

#include <float.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

/* ---- the reference: the order above in portable C ---- */

static inline float bf16_value(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float x;
    memcpy(&x, &u, 4);
    return x;
}

static inline float flush(float x) { return fpclassify(x) == FP_SUBNORMAL ? copysignf(0.0f, x) : x; }

/* ftz(fma(x, y, s)) as the instruction flushes: x86's tininess after rounding, i.e. a result is
 * flushed to a zero of its sign when its exact value, rounded to 24 bits with an unbounded
 * exponent, lies below 2^-126 in magnitude. Where fmaf gives +-2^-126 the exact value may sit just
 * below it: flushed iff below 2^-126 - 2^-151 (tests/test_gemm.c test_bf16dp_tiny on Zen 4:
 * 2^-126 - 2^-150 gives 0, 2^-126 - 2^-190 gives 2^-126). x and y are bf16 values, so x y is
 * exact in double; the exact sum's side of the threshold comes from an error-free sum in double. */
static inline float fma_ftz(float x, float y, float s)
{
    float r = fmaf(x, y, s), a = fabsf(r);
    if (!(a <= FLT_MIN)) return r;                     /* above the least normal, inf, NaN */
    if (a < FLT_MIN) return copysignf(0.0f, r);        /* below it whichever way it is rounded */
    double p = (double)x * y, sum = p + s, bb = sum - p;
    double e = (p - (sum - bb)) + ((double)s - bb);     /* p + s = sum + e exactly (TwoSum) */
    double t = (double)FLT_MIN - 0x1p-151;              /* the exact values that round to 2^-126 */
    double d = r > 0 ? sum - t : -sum - t;              /* exact: sum and t within a factor 2 */
    double ee = r > 0 ? e : -e;
    int below = d != 0 ? d < 0 : ee < 0;               /* |e| is below d's granularity */
    return below ? copysignf(0.0f, r) : r;
}

static float reduce16(const float s[16])
{
    float u[8];
    for (int l = 0; l < 8; l++) u[l] = s[l] + s[l + 8];
    return ((u[0] + u[4]) + (u[2] + u[6])) + ((u[1] + u[5]) + (u[3] + u[7]));
}

static float dot_ref(const uint16_t *a, const uint16_t *w, int K)
{
    float s[16] = {0};
    for (int k0 = 0; k0 < K; k0 += 32)
        for (int l = 0; l < 16; l++)
            for (int q = 1; q >= 0; q--) {
                int k = k0 + 2 * l + q;
                float x = k < K ? flush(bf16_value(a[k])) : 0.0f, y = k < K ? flush(bf16_value(w[k])) : 0.0f;
                s[l] = fma_ftz(x, y, s[l]);
            }
    return reduce16(s);
}

void td_gemm_bf16dp_ref(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c, int ldc,
                        int M, int N, int K, int add)
{
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float d = dot_ref(a + (size_t)i * lda, w + (size_t)j * ldw, K);
            float *o = c + (size_t)i * ldc + j;
            *o = add ? *o + d : d;
        }
}

/* ---- the AVX512-BF16 kernel ---- */

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 10)
#include <immintrin.h>
#define TD_HAVE_BF16DP 1
#define TGT __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512bf16")))
#define TGTF __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl")))   /* the FMA kernel's */
#define INLINE static inline __attribute__((always_inline))

TGTF INLINE float hsum16(__m512 v)
{
    __m256 u = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));
    __m128 q = _mm_add_ps(_mm256_castps256_ps128(u), _mm256_extractf128_ps(u, 1));
    __m128 h = _mm_add_ps(q, _mm_movehl_ps(q, q));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_shuffle_ps(h, h, 1)));
}

TGT INLINE __m512bh load_bh(const uint16_t *p, __mmask32 m, int masked)
{
    __m512i v = masked ? _mm512_maskz_loadu_epi16(m, p) : _mm512_loadu_si512((const void *)p);
    return (__m512bh)v;
}

/* hsum16 of 16 vectors at once: out[a] = hsum16(v[a]), each by the same additions in the same
 * tree (u_i = v_i + v_{i+8}, q_i = u_i + u_{i+4}, h_i = q_i + q_{i+2}, h_0 + h_1), so the same bits;
 * the vectors' halves, quarters and pairs are brought together by shuffles, four levels of 8, 4,
 * 2 and 1 additions instead of 16 separate reductions. The last level's element 4L + j holds
 * v[4j + L]'s sum. */
TGTF INLINE __m512 hsum16x16_vec(const __m512 *v)
{
    __m512 s1[8], s2[4], s3[2];
    #pragma GCC unroll 8
    for (int k = 0; k < 8; k++)   /* [v_2k lanes 0-7 | v_2k+1 lanes 0-7] + [their lanes 8-15] */
        s1[k] = _mm512_add_ps(_mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0x44),
                              _mm512_shuffle_f32x4(v[2 * k], v[2 * k + 1], 0xEE));
    #pragma GCC unroll 4
    for (int m = 0; m < 4; m++)   /* 128-bit lane L of s2[m]: v[4m + L]'s q */
        s2[m] = _mm512_add_ps(_mm512_shuffle_f32x4(s1[2 * m], s1[2 * m + 1], 0x88),
                              _mm512_shuffle_f32x4(s1[2 * m], s1[2 * m + 1], 0xDD));
    #pragma GCC unroll 2
    for (int m = 0; m < 2; m++)   /* lane L: h of v[8m + L], then of v[8m + 4 + L] */
        s3[m] = _mm512_add_ps(_mm512_shuffle_ps(s2[2 * m], s2[2 * m + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                              _mm512_shuffle_ps(s2[2 * m], s2[2 * m + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_ps(s3[0], s3[1], _MM_SHUFFLE(3, 1, 3, 1)));
}

TGTF INLINE void hsum16x16(const __m512 *v, float *out)
{
    float t[16];
    _mm512_storeu_ps(t, hsum16x16_vec(v));
    #pragma GCC unroll 16
    for (int a = 0; a < 16; a++) out[a] = t[4 * (a & 3) + (a >> 2)];
}

/* the R x S lane sums reduced (hsum16's tree) and stored, added to c where add */
TGTF INLINE void store_sums(__m512 acc[4][6], float *c, int ldc, int add, int R, int S)
{
    if (R == 4 && S == 4) {   /* one group of 16 exactly; rows written as vectors */
        __m512 flat16[16];
        #pragma GCC unroll 4
        for (int r = 0; r < 4; r++)
            #pragma GCC unroll 4
            for (int s = 0; s < 4; s++) flat16[r * 4 + s] = acc[r][s];
        /* hsum16x16_vec's element 4s + r holds (r, s): gathered to row-major, row r = lane r */
        const __m512i rowmajor = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
        __m512 v = _mm512_permutexvar_ps(rowmajor, hsum16x16_vec(flat16));
        __m128 r0 = _mm512_castps512_ps128(v), r1 = _mm512_extractf32x4_ps(v, 1);
        __m128 r2 = _mm512_extractf32x4_ps(v, 2), r3 = _mm512_extractf32x4_ps(v, 3);
        if (add) {
            r0 = _mm_add_ps(_mm_loadu_ps(c), r0);
            r1 = _mm_add_ps(_mm_loadu_ps(c + ldc), r1);
            r2 = _mm_add_ps(_mm_loadu_ps(c + 2 * (size_t)ldc), r2);
            r3 = _mm_add_ps(_mm_loadu_ps(c + 3 * (size_t)ldc), r3);
        }
        _mm_storeu_ps(c, r0);
        _mm_storeu_ps(c + ldc, r1);
        _mm_storeu_ps(c + 2 * (size_t)ldc, r2);
        _mm_storeu_ps(c + 3 * (size_t)ldc, r3);
        return;
    }
    /* the R x S sums, 16 at a time (hsum16x16: hsum16's bits; zero vectors pad the last group) */
    __m512 flat[32];
    int n = 0;
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 6
        for (int s = 0; s < S; s++) flat[n++] = acc[r][s];
    int n16 = (n + 15) & ~15;
    for (int q = n; q < n16; q++) flat[q] = _mm512_setzero_ps();
    float sums[32];
    for (int g = 0; g < n16; g += 16) hsum16x16(flat + g, sums + g);
    for (int r = 0; r < R; r++)
        for (int s = 0; s < S; s++) {
            float d = sums[r * S + s], *o = c + (size_t)r * ldc + s;
            *o = add ? *o + d : d;
        }
}

/* R x S block (R <= 4, S <= 6): the whole K, the last block of 32 masked */
TGT INLINE void block(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c, int ldc,
                      int K, int add, int R, int S)
{
    __m512 acc[4][6];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 6
        for (int s = 0; s < S; s++) acc[r][s] = _mm512_setzero_ps();
    int K32 = K & ~31;
    for (int k = 0; k < K32; k += 32) {
        __m512bh av[4];
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) av[r] = load_bh(a + (size_t)r * lda + k, 0, 0);
        #pragma GCC unroll 6
        for (int s = 0; s < S; s++) {
            __m512bh wv = load_bh(w + (size_t)s * ldw + k, 0, 0);
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) acc[r][s] = _mm512_dpbf16_ps(acc[r][s], av[r], wv);
        }
    }
    if (K32 < K) {
        __mmask32 m = (__mmask32)((1ull << (K - K32)) - 1);
        __m512bh av[4];
        for (int r = 0; r < R; r++) av[r] = load_bh(a + (size_t)r * lda + K32, m, 1);
        for (int s = 0; s < S; s++) {
            __m512bh wv = load_bh(w + (size_t)s * ldw + K32, m, 1);
            for (int r = 0; r < R; r++) acc[r][s] = _mm512_dpbf16_ps(acc[r][s], av[r], wv);
        }
    }
    store_sums(acc, c, ldc, add, R, S);
}

#define COLS(RR)                                                                                   \
    switch (S) {                                                                                   \
    case 6: block(ai, lda, wj, ldw, ci + j, ldc, K, add, RR, 6); break;                           \
    case 5: block(ai, lda, wj, ldw, ci + j, ldc, K, add, RR, 5); break;                           \
    case 4: block(ai, lda, wj, ldw, ci + j, ldc, K, add, RR, 4); break;                           \
    case 3: block(ai, lda, wj, ldw, ci + j, ldc, K, add, RR, 3); break;                           \
    case 2: block(ai, lda, wj, ldw, ci + j, ldc, K, add, RR, 2); break;                           \
    default: block(ai, lda, wj, ldw, ci + j, ldc, K, add, RR, 1); break;                          \
    }

TGT static void gemm_avx512bf16(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c,
                                int ldc, int M, int N, int K, int add)
{
    /* 4 x 4 blocks up to K = 1536 (one reduction group of 16, rows stored as vectors: the
     * reduction weighs most at small K), 4 x 6 above (more products per load); measured on Zen 4,
     * one thread: K 192 112 -> 140 GFLOP/s, K 512 158 -> 173, K 4864 unchanged at 210 */
    int ts = K > 1536 ? 6 : 4;
    /* column panels of 48 (48 x K codes of w stay in L2 while every row block passes) */
    for (int j0 = 0; j0 < N; j0 += 48) {
        int j1 = j0 + 48 < N ? j0 + 48 : N;
        for (int i = 0; i < M; i += 4) {
            int R = M - i < 4 ? M - i : 4;
            const uint16_t *ai = a + (size_t)i * lda;
            float *ci = c + (size_t)i * ldc;
            for (int j = j0; j < j1; j += ts) {
                int S = j1 - j < ts ? j1 - j : ts;
                const uint16_t *wj = w + (size_t)j * ldw;
                switch (R) {
                case 4: COLS(4) break;
                case 3: COLS(3) break;
                case 2: COLS(2) break;
                default: COLS(1) break;
                }
            }
        }
    }
}
#undef COLS

/* The same order on fp32 FMAs, for CPUs whose vdpbf16ps is slow or absent (on the Xeon of
 * 2026-11-30 the instruction issues every second cycle, a quarter of the FMAs' rate, so two FMAs
 * per pair of products are about twice as fast). Each block of 32 codes is split into fp32
 * values: its odd codes (k1, the high half of every dword, the even ones masked off) and its even
 * codes (k0, shifted up by 16); lane l then takes fma(k1) and fma(k0), the instruction's two
 * steps. The products of bf16 values are exact in fp32, so each fma rounds once, as there. daz and
 * ftz are the CPU's own (MXCSR's DAZ and FTZ, x86's tininess after rounding, as the
 * instruction's), set while the lane sums run and put back before the reduction, whose additions
 * are IEEE's. The barriers keep the compiler from moving the sums across the two MXCSR writes.
 * w's columns are split once per panel of 48 (pack_rows), a's rows once per call (in chunks) where
 * K is small, once per span and panel where it is not (gemm_fma_spans). 4 x 4 blocks: 16 sums, 8 split rows and 2 split columns
 * stay in the 32 registers. */
#define BARRIER(R, S, acc)                                                                         \
    do {                                                                                           \
        _Pragma("GCC unroll 4") for (int r_ = 0; r_ < (R); r_++)                                   \
            _Pragma("GCC unroll 4") for (int s_ = 0; s_ < (S); s_++)                               \
                __asm__ volatile("" : "+v"(acc[r_][s_]));                                          \
    } while (0)

TGTF INLINE void split_codes(const uint16_t *p, __mmask32 m, __m512 *odd, __m512 *even)
{
    *odd = _mm512_castsi512_ps(_mm512_maskz_loadu_epi16(m & 0xAAAAAAAAu, p));
    *even = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_maskz_loadu_epi16(m, p), 16));
}

/* R x S block over [k0, k1) on rows of a and columns of w split beforehand (pack_rows: per row
 * and block of 32 k, 16 odd values then 16 even ones, zeros past K), ap and wp holding [k0, k1)
 * at stride ldp; the lane sums start from park where k0 > 0 and wait there where more of K
 * follows, else are reduced and stored */
TGTF INLINE void block_fma(const float *ap, int K, int k0, int k1, const float *wp, int ldp, float *park,
                           float *c, int ldc, int add, int R, int S)
{
    __m512 acc[4][6];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int s = 0; s < S; s++) acc[r][s] = k0 ? _mm512_loadu_ps(park + (r * 4 + s) * 16) : _mm512_setzero_ps();
    unsigned csr = _mm_getcsr();
    _mm_setcsr(csr | 0x8040);   /* FTZ (bit 15), DAZ (bit 6) */
    BARRIER(R, S, acc);
    for (int k = 0; k < k1 - k0; k += 32) {
        __m512 ao[4], ae[4];
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            ao[r] = _mm512_loadu_ps(ap + (size_t)r * ldp + k);
            ae[r] = _mm512_loadu_ps(ap + (size_t)r * ldp + k + 16);
        }
        #pragma GCC unroll 4
        for (int s = 0; s < S; s++) {
            __m512 wo = _mm512_loadu_ps(wp + (size_t)s * ldp + k);
            __m512 we = _mm512_loadu_ps(wp + (size_t)s * ldp + k + 16);
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++)
                acc[r][s] = _mm512_fmadd_ps(ae[r], we, _mm512_fmadd_ps(ao[r], wo, acc[r][s]));
        }
    }
    BARRIER(R, S, acc);
    _mm_setcsr(csr);
    if (k1 < ((K + 31) & ~31)) {   /* more of K to come: the lane sums wait in park */
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 4
            for (int s = 0; s < S; s++) _mm512_storeu_ps(park + (r * 4 + s) * 16, acc[r][s]);
        return;
    }
    store_sums(acc, c, ldc, add, R, S);
}

/* block_fma with R, S (1..4) as constants */
TGTF static void block_fma_rs(const float *ap, int K, int k0, int k1, const float *wp, int ldp, float *park,
                              float *c, int ldc, int add, int R, int S)
{
#define CASE(RR, SS) case (RR) * 8 + (SS): block_fma(ap, K, k0, k1, wp, ldp, park, c, ldc, add, RR, SS); break;
    switch (R * 8 + S) {
    CASE(4, 4) CASE(4, 3) CASE(4, 2) CASE(4, 1)
    CASE(3, 4) CASE(3, 3) CASE(3, 2) CASE(3, 1)
    CASE(2, 4) CASE(2, 3) CASE(2, 2) CASE(2, 1)
    CASE(1, 4) CASE(1, 3) CASE(1, 2) default: block_fma(ap, K, k0, k1, wp, ldp, park, c, ldc, add, 1, 1); break;
    }
#undef CASE
}

/* rows [0, n) of x (w's columns or a's rows) split into fp32 values, ldp = K rounded up to 32
 * floats a row */
TGTF static void pack_rows(const uint16_t *w, int ldw, int n, int K, float *wp, int ldp)
{
    for (int j = 0; j < n; j++)
        for (int k = 0; k < ldp; k += 32) {
            __mmask32 m = K - k >= 32 ? 0xFFFFFFFFu : (__mmask32)((1ull << (K - k)) - 1);
            __m512 o, e;
            split_codes(w + (size_t)j * ldw + k, m, &o, &e);
            _mm512_storeu_ps(wp + (size_t)j * ldp + k, o);
            _mm512_storeu_ps(wp + (size_t)j * ldp + k + 16, e);
        }
}
#undef BARRIER

/* each thread's panel (gemm_scratch.h: kept between calls) */
static float *panel_buffer(size_t floats) { return td_gemm_scratch(TD_SCRATCH_BF16DP, floats); }

/* Where K is large (above 1536), K is walked in spans of SPAN products: for a chunk of up to
 * SPAN_ROWS rows, a panel of 48 columns and a span, a's rows (128 x SPAN floats) and the panel's
 * columns (48 x SPAN) are split once, and a block of 4 columns (16 KiB) stays in L1 while every
 * 4-row strip of the chunk passes. Between spans a block's 16 lane sums wait in a buffer (one
 * slot per strip and block of the panel: 384 KiB). Every lane sum takes the same fmas in the same
 * k order as over the whole K at once, and the reduction runs once, after the last span: the
 * same bits. (Before: each 4 x 4 block walked all of K from L2, splitting a's codes in
 * registers, a quarter more instructions than FMAs: 0.61-0.70 of OpenBLAS's sgemm at K = 4864
 * on a Xeon.) */
enum { SPAN = 1024, SPAN_ROWS = 128 };

TGTF static void gemm_fma_spans(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c, int ldc,
                                int M, int N, int K, int add, float *buf)
{
    int ldp = (K + 31) & ~31;
    float *wp = buf, *ap = buf + (size_t)48 * SPAN, *park = ap + (size_t)SPAN_ROWS * SPAN;
    for (int i0 = 0; i0 < M; i0 += SPAN_ROWS) {
        int i1 = i0 + SPAN_ROWS < M ? i0 + SPAN_ROWS : M;
        for (int j0 = 0; j0 < N; j0 += 48) {
            int j1 = j0 + 48 < N ? j0 + 48 : N;
            for (int k0 = 0; k0 < ldp; k0 += SPAN) {
                int k1 = k0 + SPAN < ldp ? k0 + SPAN : ldp, kn = k1 - k0;
                pack_rows(a + (size_t)i0 * lda + k0, lda, i1 - i0, K - k0, ap, kn);
                pack_rows(w + (size_t)j0 * ldw + k0, ldw, j1 - j0, K - k0, wp, kn);
                for (int j = j0; j < j1; j += 4) {
                    int S = j1 - j < 4 ? j1 - j : 4;
                    const float *wj = wp + (size_t)(j - j0) * kn;
                    for (int i = i0; i < i1; i += 4) {
                        int R = i1 - i < 4 ? i1 - i : 4;
                        float *pk = park + ((size_t)((i - i0) / 4) * 12 + (size_t)(j - j0) / 4) * 256;
                        block_fma_rs(ap + (size_t)(i - i0) * kn, K, k0, k1, wj, kn, pk, c + (size_t)i * ldc + j, ldc,
                                     add, R, S);
                    }
                }
            }
        }
    }
}

TGTF static void gemm_avx512fma(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c,
                                int ldc, int M, int N, int K, int add)
{
    /* K <= 1536: column panels of 48, as gemm_avx512bf16, each split once into fp32 (48 x K floats,
     * in L2 while every row block passes), and a's rows split once for every panel, in chunks of
     * up to 2 MB (4 split rows, 24 KB, stay in L1 while a panel passes; split per row block and
     * panel, that splitting was 5 % of a bf16 training step). Above, spans of K (gemm_fma_spans). */
    int ldp = (K + 31) & ~31, small_k = K <= 1536;
    int mc = (((1 << 19) / ldp) & ~3);   /* rows a chunk: 2 MB of split rows */
    if (mc > ((M + 3) & ~3)) mc = (M + 3) & ~3;
    float *wp = panel_buffer(small_k ? (size_t)(48 + mc) * ldp : (size_t)(48 + SPAN_ROWS) * SPAN + (size_t)SPAN_ROWS / 4 * 12 * 256);
    if (!wp) {   /* no memory for the panels: the same bits, slowly */
        td_gemm_bf16dp_ref(a, lda, w, ldw, c, ldc, M, N, K, add);
        return;
    }
    if (!small_k) {
        gemm_fma_spans(a, lda, w, ldw, c, ldc, M, N, K, add, wp);
        return;
    }
    float *ap = wp + (size_t)48 * ldp;
    for (int i0 = 0; i0 < M; i0 += mc) {
        int i1 = i0 + mc < M ? i0 + mc : M;
        pack_rows(a + (size_t)i0 * lda, lda, i1 - i0, K, ap, ldp);
        for (int j0 = 0; j0 < N; j0 += 48) {
            int j1 = j0 + 48 < N ? j0 + 48 : N;
            pack_rows(w + (size_t)j0 * ldw, ldw, j1 - j0, K, wp, ldp);
            for (int i = i0; i < i1; i += 4)
                for (int j = j0; j < j1; j += 4)
                    block_fma_rs(ap + (size_t)(i - i0) * ldp, K, 0, ldp, wp + (size_t)(j - j0) * ldp, ldp, NULL,
                                 c + (size_t)i * ldc + j, ldc, add, i1 - i < 4 ? i1 - i : 4, j1 - j < 4 ? j1 - j : 4);
        }
    }
}

/* gemm_small_k's K = 1 with w's codes contiguous (ldw 1: a rank-1 LoRA's B, and A^T in its
 * gradient), 16 columns a vector: d = x0 w (exact, or inf, or NaN) unless |d| < 2^-126 (then +0,
 * as s + 0 turns any zero), w's subnormals counted as zeros first */
TGT static void gemm_k1_avx512(const uint16_t *a, int lda, const uint16_t *w, float *c, int ldc, int M, int N,
                               int add)
{
    const __m512 least = _mm512_set1_ps(FLT_MIN);
    const __m512i absmask = _mm512_set1_epi32(0x7FFFFFFF);
    for (int i = 0; i < M; i++) {
        float x0 = flush(bf16_value(a[(size_t)i * lda]));
        __m512 xv = _mm512_set1_ps(x0);
        float *ci = c + (size_t)i * ldc;
        for (int j = 0; j < N; j += 16) {
            __mmask16 m = N - j >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - j)) - 1);
            __m512i codes = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, w + j));
            __m512 wv = _mm512_castsi512_ps(_mm512_slli_epi32(codes, 16));
            __mmask16 wsub = _mm512_cmp_ps_mask(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(wv), absmask)),
                                                least, _CMP_LT_OQ);
            wv = _mm512_maskz_mov_ps((__mmask16)~wsub, wv);                      /* daz */
            __m512 p = _mm512_mul_ps(xv, wv);
            __mmask16 tiny = _mm512_cmp_ps_mask(_mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(p), absmask)),
                                                least, _CMP_LT_OQ);
            __m512 d = _mm512_maskz_mov_ps((__mmask16)~tiny, p);                 /* ftz, then + 0 */
            if (add) d = _mm512_add_ps(_mm512_maskz_loadu_ps(m, ci + j), d);
            _mm512_mask_storeu_ps(ci + j, m, d);
        }
    }
}
#endif

/* ---- availability: each kernel's bits checked against the reference once, the faster kept ---- */

typedef void (*gemm_fn)(const uint16_t *, int, const uint16_t *, int, float *, int, int, int, int, int);

static gemm_fn bf16dp_kernel;          /* the one td_gemm_bf16dp runs; NULL: none matched */
static const char *bf16dp_name;
static pthread_once_t bf16dp_once = PTHREAD_ONCE_INIT;
int td_gemm_bf16dp_disabled = 0;

#ifdef TD_HAVE_BF16DP
/* the kernel's bits against the reference's on operands of every kind */
static int kernel_matches(gemm_fn f)
{
    /* 5 x 7 outputs over K = 77 (two full blocks and a masked one): operands of every kind,
     * subnormals and exact cancellations included */
    enum { M = 5, N = 7, K = 77 };
    uint16_t a[M * K], w[N * K];
    uint64_t x = 0x9E3779B97F4A7C15ull;
    for (int i = 0; i < M * K + N * K; i++) {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17;
        uint16_t h = (uint16_t)(x & 0x807F);                  /* sign and fraction */
        int e = (int)((x >> 20) % 8);
        h |= (uint16_t)((e == 0 ? 0 : e == 1 ? 1 : 0x70 + (int)((x >> 24) % 24)) << 7);
        if (i < M * K) a[i] = h; else w[i - M * K] = h;
    }
    for (int k = 0; k < K; k += 5) w[k] = a[k] ^ 0x8000;     /* cancellations in row 0 x col 0 */
    float got[M * N], want[M * N];
    td_gemm_bf16dp_ref(a, K, w, K, want, N, M, N, K, 0);
    f(a, K, w, K, got, N, M, N, K, 0);
    int ok = memcmp(got, want, sizeof got) == 0;
    /* and the flush rule at the edge of the normals (fma_ftz): 2^-126 - 2^-150 flushed,
     * 2^-126 - 2^-190 not: a CPU that flushes otherwise keeps the reference's bits elsewhere */
    const uint16_t ea[2][2] = {{0x9A00, 0xA000}, {0x8080, 0xA000}};   /* -2^-75 | -2^-126, then -2^-63 */
    const uint16_t ew[2][2] = {{0x1A00, 0xA000}, {0x1F80, 0xA000}};   /*  2^-75 |  2^-64,  then -2^-63 */
    float eg[2][2], ef[2][2];
    td_gemm_bf16dp_ref(&ea[0][0], 2, &ew[0][0], 2, &ef[0][0], 2, 2, 2, 2, 0);
    f(&ea[0][0], 2, &ew[0][0], 2, &eg[0][0], 2, 2, 2, 2, 0);
    return ok && memcmp(eg, ef, sizeof eg) == 0 && ef[0][0] == 0.0f && ef[1][1] == FLT_MIN;
}

/* the best of 5 interleaved timings of each kernel on a 64 x 48 x 1024 product (6.3 MFLOP, well
 * under a millisecond each): the choice changes the speed only, never a bit */
static int first_is_faster(gemm_fn f, gemm_fn g)
{
    enum { M = 64, N = 48, K = 1024 };
    uint16_t *a = malloc((size_t)(M + N) * K * 2);
    float *c = malloc((size_t)M * N * 4);
    if (!a || !c) { free(a); free(c); return 1; }
    for (int i = 0; i < (M + N) * K; i++) a[i] = (uint16_t)(0x3F00 + (i * 37) % 255);
    double tf = 1e30, tg = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = td_now();
        f(a, K, a + (size_t)M * K, K, c, N, M, N, K, 0);
        double t1 = td_now();
        g(a, K, a + (size_t)M * K, K, c, N, M, N, K, 0);
        double t2 = td_now();
        if (t1 - t0 < tf) tf = t1 - t0;
        if (t2 - t1 < tg) tg = t2 - t1;
    }
    free(a); free(c);
    return tf <= tg;
}
#endif

static void bf16dp_check(void)
{
#ifdef TD_HAVE_BF16DP
    /* TIDAL_BF16DP_KERNEL=dp|fma: one kernel only (tests, benches); otherwise the faster of those
     * whose bits match */
    const char *want = getenv("TIDAL_BF16DP_KERNEL");
    if (want && !*want) want = NULL;
    int dp = (!want || !strcmp(want, "dp")) && td_cpu_has_avx512bf16() && kernel_matches(gemm_avx512bf16);
    int fma = (!want || !strcmp(want, "fma")) && td_isa_level() >= TD_ISA_AVX512 && kernel_matches(gemm_avx512fma);
    if (dp && (!fma || first_is_faster(gemm_avx512bf16, gemm_avx512fma))) {
        bf16dp_kernel = gemm_avx512bf16;
        bf16dp_name = "AVX512-BF16 vdpbf16ps";
    } else if (fma) {
        bf16dp_kernel = gemm_avx512fma;
        bf16dp_name = "AVX-512 fp32 FMA";
    }
#endif
}

int td_gemm_bf16dp_available(void)
{
    if (td_gemm_bf16dp_disabled) return 0;
    pthread_once(&bf16dp_once, bf16dp_check);
    return bf16dp_kernel != NULL;
}

const char *td_gemm_bf16dp_kernel_name(void)
{
    return td_gemm_bf16dp_available() ? bf16dp_name : "none (the reference)";
}

/* K <= 2 (a rank-1 or rank-2 LoRA's second GEMM and its gradient's): only lane 0 of the first block
 * holds products, s_0 = fma_ftz(a0, w0, fma_ftz(a1, w1, 0)), and the reduction adds zeros to it,
 * which turns -0 into +0 and changes nothing else: d = s_0 + 0. The reference's bits (and the
 * instruction's) without a masked block of 32 and a 16-lane reduction per output, which made these
 * GEMMs cost as much as ones of K = 32. K = 1 takes the same two steps, k = 1 being padding. */
static void gemm_small_k(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c, int ldc,
                         int M, int N, int K, int add)
{
    for (int i = 0; i < M; i++) {
        const uint16_t *ai = a + (size_t)i * lda;
        float x0 = flush(bf16_value(ai[0])), x1 = K > 1 ? flush(bf16_value(ai[1])) : 0.0f;
        float *ci = c + (size_t)i * ldc;
        for (int j = 0; j < N; j++) {
            const uint16_t *wj = w + (size_t)j * ldw;
            float y1 = K > 1 ? flush(bf16_value(wj[1])) : 0.0f;   /* K = 1: k = 1 is padding, 0 x 0 */
            float s = fma_ftz(x0, flush(bf16_value(wj[0])), fma_ftz(x1, y1, 0.0f));
            float d = s + 0.0f;
            ci[j] = add ? ci[j] + d : d;
        }
    }
}

void td_gemm_bf16dp(const uint16_t *a, int lda, const uint16_t *w, int ldw, float *c, int ldc,
                    int M, int N, int K, int add)
{
    if (K >= 1 && K <= 2) {
#ifdef TD_HAVE_BF16DP
        if (K == 1 && ldw == 1 && td_isa_level() >= TD_ISA_AVX512) {
            gemm_k1_avx512(a, lda, w, c, ldc, M, N, add);
            return;
        }
#endif
        gemm_small_k(a, lda, w, ldw, c, ldc, M, N, K, add);
        return;
    }
#ifdef TD_HAVE_BF16DP
    if (td_gemm_bf16dp_available()) {
        bf16dp_kernel(a, lda, w, ldw, c, ldc, M, N, K, add);
        return;
    }
#endif
    td_gemm_bf16dp_ref(a, lda, w, ldw, c, ldc, M, N, K, add);
}
