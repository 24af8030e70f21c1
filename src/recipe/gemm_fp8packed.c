/* tidal — the fp8-fast GEMM's AVX2 packed kernel (the order: gemm_fp8fast.c), from PACKED_MIN_ROWS2
 * rows: fp32 rows of w, or codes in k-major panels of 8 rows decoded into its panels. */
#include "gemm_fp8fast.h"
#include "gemm_scratch.h"

#ifdef TD_HAVE_FP8FAST_SIMD
/* ---- AVX2, larger M: w packed k-major in panels of 16 columns (pk[k][16], two ymm), as the
 * AVX-512 packed kernel does: a step's lane l of a row is its own pair of accumulators (16
 * columns), each product an FMA of a row's value at k (broadcast from memory) and the panel's
 * weights at k, and a step ends in vertical adds. 16 registers do not hold 8 lanes of 3 rows, so a
 * step runs in four phases of two lanes each, in the reduction's order: lanes 0 and 4 (q0 = s0 +
 * s4), 2 and 6 (q2; a0 = q0 + q2), 1 and 5 (q1), 3 and 7 (q3; a1 = q1 + q3), then a0 + a1; a phase
 * holds 12 lane sums (3 rows, 2 lanes, 2 halves) in registers, a0 and q1 wait in memory. Per k
 * two loads of weights and three broadcasts feed six FMAs: panels of 8 columns fed three FMAs with
 * one load and three broadcasts, and the loads bounded them (the two patterns alone in a loop,
 * one Zen 3 core: 97 and 70 GFLOP/s, the FMA peak 98). Always 3 rows: a group's last 1 or 2 rows
 * repeat its last row, computed and not stored. A lane's products are the same fmaf chain in the
 * same k order as the other kernels, a product past n left out (as in td_fp8fast_gemm512_packed,
 * whose driver this is: row groups whose chunk of a stays in L2, K in chunks of at most KC products
 * packed once per panel). */
enum { PW2 = 16 };

/* pk[k][0..16) = w[j][k0 + k] for k < kn, zeros past nc */
TGT static void pack_panel2(const float *w, int ldw, int nc, int k0, int kn, float *pk)
{
    int k = 0;
    if (nc == PW2)
        for (; k + 8 <= kn; k += 8)
            for (int h = 0; h < PW2; h += 8) {
                __m256 r[8];
                #pragma GCC unroll 8
                for (int j = 0; j < 8; j++) r[j] = _mm256_loadu_ps(w + (size_t)(h + j) * ldw + k0 + k);
                td_transpose8_avx2(r);
                #pragma GCC unroll 8
                for (int q = 0; q < 8; q++) _mm256_storeu_ps(pk + (size_t)(k + q) * PW2 + h, r[q]);
            }
    for (; k < kn; k++)
        for (int j = 0; j < PW2; j++) pk[(size_t)k * PW2 + j] = j < nc ? w[(size_t)j * ldw + k0 + k] : 0.0f;
}

/* pk as pack_panel2 fills it, from codes in panels of 8 rows (cw: td_gemm_fp8_fast_panels's; j a
 * multiple of 8): pk[k][0..8) the panel of columns j.. at k, decoded (decode8: the widened rows'
 * values), pk[k][8..16) the next one's or zeros: no transposes, the layout is already k-major. A
 * panel's rows past the call's are computed and not stored (panels do not straddle scale blocks). */
TGT static void pack_panel2_pn(const codes_w *cw, int j, int nc, int k0, int kn, float *pk)
{
    const __m256i none = _mm256_setzero_si256();
    const float fac = cw->e5m2 ? 1.0f : 0x1p+120f;
    for (int h = 0; h < PW2; h += 8) {
        if (nc <= h) {
            for (int k = 0; k < kn; k++) _mm256_store_ps(pk + (size_t)k * PW2 + h, _mm256_setzero_ps());
            continue;
        }
        const uint8_t *cp = cw->w + (size_t)(j + h) * cw->ldw;
        const float *srow = cw->scale + (size_t)((cw->row0 + j + h) / cw->sr) * cw->nbc;
        int kb = k0 / cw->sc, kend = (kb + 1) * cw->sc;
        __m256 f = _mm256_set1_ps(srow[kb] * fac);
        for (int k = 0; k < kn; k++) {
            if (scale_block_at(k0 + k, cw->sc, &kb, &kend)) f = _mm256_set1_ps(srow[kb] * fac);
            __m256 v = cw->e5m2 ? decode8(1, cp + (size_t)(k0 + k) * 8, f, 8, none)
                                : decode8(0, cp + (size_t)(k0 + k) * 8, f, 8, none);
            _mm256_store_ps(pk + (size_t)k * PW2 + h, v);
        }
    }
}

/* the panel's 16 weights at k (p) times the 3 rows' values at k, into each row's two sums */
#define FMA3x16(p, k, A0, A1, B0, B1, C0, C1)                                                      \
    do {                                                                                           \
        __m256 x0_ = _mm256_loadu_ps(p), x1_ = _mm256_loadu_ps((p) + 8);                           \
        __m256 b_ = _mm256_broadcast_ss(r0 + (k));                                                 \
        A0 = _mm256_fmadd_ps(b_, x0_, A0), A1 = _mm256_fmadd_ps(b_, x1_, A1);                      \
        b_ = _mm256_broadcast_ss(r1 + (k));                                                        \
        B0 = _mm256_fmadd_ps(b_, x0_, B0), B1 = _mm256_fmadd_ps(b_, x1_, B1);                      \
        b_ = _mm256_broadcast_ss(r2 + (k));                                                        \
        C0 = _mm256_fmadd_ps(b_, x0_, C0), C1 = _mm256_fmadd_ps(b_, x1_, C1);                      \
    } while (0)

/* q[2r + h] = s_l + s_{l+4} of row r (r0, r1, r2: the rows at the step's start), half h, over the
 * step of n products (ps: the panel at the step's start); full (n == 32) a constant */
TGT static INLINE void lanes2(__m256 q[6], const float *r0, const float *r1, const float *r2,
                              const float *ps, int n, int l, int full)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, b0 = a0, b1 = a0, c0 = a0, c1 = a0;   /* lane l */
    __m256 d0 = a0, d1 = a0, e0 = a0, e1 = a0, f0 = a0, f1 = a0;                    /* lane l + 4 */
    #pragma GCC unroll 4
    for (int k = l; k < STEP; k += 8) {
        if (full || k < n) FMA3x16(ps + (size_t)k * PW2, k, a0, a1, b0, b1, c0, c1);
        if (full || k + 4 < n) FMA3x16(ps + (size_t)(k + 4) * PW2, k + 4, d0, d1, e0, e1, f0, f1);
    }
    a0 = _mm256_add_ps(a0, d0), a1 = _mm256_add_ps(a1, d1);
    b0 = _mm256_add_ps(b0, e0), b1 = _mm256_add_ps(b1, e1);
    c0 = _mm256_add_ps(c0, f0), c1 = _mm256_add_ps(c1, f1);
    /* the 6 sums in registers here: GCC otherwise keeps all 12 lane sums until the step's end
     * and spills them, 12 stores and 12 loads a phase (the kernel alone in L1, one Zen 3 core:
     * 57 GFLOP/s with the spills, 78 without) */
    __asm__("" : "+x"(a0), "+x"(a1), "+x"(b0), "+x"(b1), "+x"(c0), "+x"(c1));
    q[0] = a0, q[1] = a1, q[2] = b0, q[3] = b1, q[4] = c0, q[5] = c1;
}

/* the step sums of the 3 rows: ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)); q0, then a0, and q1
 * wait in wait (12 ymm) while the later phases hold the registers */
TGT static INLINE void step_packed2(__m256 sum[6], const float *r0, const float *r1, const float *r2,
                                    const float *ps, int n, int full, float *wait)
{
    __m256 q[6], t[6];
    lanes2(t, r0, r1, r2, ps, n, 0, full);
    #pragma GCC unroll 6
    for (int i = 0; i < 6; i++) _mm256_store_ps(wait + i * 8, t[i]);
    lanes2(q, r0, r1, r2, ps, n, 2, full);
    #pragma GCC unroll 6
    for (int i = 0; i < 6; i++) _mm256_store_ps(wait + i * 8, _mm256_add_ps(_mm256_load_ps(wait + i * 8), q[i]));
    lanes2(t, r0, r1, r2, ps, n, 1, full);
    #pragma GCC unroll 6
    for (int i = 0; i < 6; i++) _mm256_store_ps(wait + (6 + i) * 8, t[i]);
    lanes2(q, r0, r1, r2, ps, n, 3, full);
    #pragma GCC unroll 6
    for (int i = 0; i < 6; i++)
        sum[i] = _mm256_add_ps(_mm256_load_ps(wait + i * 8), _mm256_add_ps(_mm256_load_ps(wait + (6 + i) * 8), q[i]));
}

/* 3 rows (a0, a1, a2) of one panel over the steps of [c0, c1) (c0 and c1 at step ends; the panel
 * packed from c0). park: each row's partials (16) and totals (16), carried between chunks through
 * memory rather than registers (the phases need the registers). */
TGT static void strip_packed2(const float *a0, const float *a1, const float *a2, const float *pk, int c0,
                              int c1, int K, int promote, __m256 keep, float *park, int first)
{
    float wait[12 * 8] __attribute__((aligned(32)));
    if (first)
        for (int i = 0; i < 3 * 2 * PW2; i++) park[i] = 0.0f;
    int bend = block_end(c0, K, promote);
    for (int s0 = c0; s0 < c1;) {
        int e = bend - s0 > STEP ? s0 + STEP : bend, close = e == bend;
        const float *ps = pk + (size_t)(s0 - c0) * PW2;
        __m256 sum[6];
        if (e - s0 == STEP) step_packed2(sum, a0 + s0, a1 + s0, a2 + s0, ps, STEP, 1, wait);
        else                step_packed2(sum, a0 + s0, a1 + s0, a2 + s0, ps, e - s0, 0, wait);
        #pragma GCC unroll 6
        for (int i = 0; i < 6; i++) {
            float *pr = park + (i >> 1) * 2 * PW2 + (i & 1) * 8;
            __m256 pt = _mm256_and_ps(_mm256_add_ps(_mm256_loadu_ps(pr), sum[i]), keep);
            if (close) {
                _mm256_storeu_ps(pr + PW2, _mm256_add_ps(_mm256_loadu_ps(pr + PW2), pt));
                pt = _mm256_setzero_ps();
            }
            _mm256_storeu_ps(pr, pt);
        }
        if (close && e < K) bend = next_block(e, K, promote);
        s0 = e;
    }
}

/* 0 when the partials' buffer cannot be had (the caller takes gemm2: the same bits) */
TGT int td_fp8fast_packed2(const float *a, int lda, const float *w, int ldw, const codes_w *pn, float *c,
                            int ldc, int M, int N, int K, int promote, int bits)
{
    __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32((int)~((1u << (23 - bits)) - 1u)));
    int panels = (N + PW2 - 1) / PW2;
    /* a group's repeated rows park in its own unused slots: GROUP a multiple of 3 */
    _Static_assert(GROUP % 3 == 0, "the repeated rows of a group's last strip need its own slots");
    float *part = td_gemm_scratch(TD_SCRATCH_FP8FAST, (size_t)GROUP * 2 * PW2 * panels);
    if (!part) return 0;
    float pk[KC * PW2] __attribute__((aligned(32)));
    for (int g = 0; g < M; g += GROUP) {
        int gm = M - g < GROUP ? M - g : GROUP;
        if (K == 0) zero_rows(c + (size_t)g * ldc, ldc, gm, N);
        for (int c0 = 0; c0 < K;) {
            int c1 = chunk_end(c0, K, promote, KC);
            for (int p = 0; p < panels; p++) {
                int j = p * PW2, nc = N - j < PW2 ? N - j : PW2;
                if (pn) pack_panel2_pn(pn, j, nc, c0, c1 - c0, pk);   /* codes in panels of 8 rows */
                else    pack_panel2(w + (size_t)j * ldw, ldw, nc, c0, c1 - c0, pk);
                for (int i = 0; i < gm; i += 3) {
                    int R = gm - i < 3 ? gm - i : 3;
                    const float *ai = a + (size_t)(g + i) * lda;
                    float *pi = part + ((size_t)p * GROUP + i) * 2 * PW2;
                    strip_packed2(ai, ai + (size_t)(R > 1) * lda, ai + (size_t)(R - 1) * lda, pk, c0, c1, K,
                                  promote, keep, pi, c0 == 0);
                    if (c1 == K)
                        for (int r = 0; r < R; r++)
                            for (int q = 0; q < nc; q++)
                                c[(size_t)(g + i + r) * ldc + j + q] = pi[r * 2 * PW2 + PW2 + q];
                }
            }
            c0 = c1;
        }
    }
    return 1;
}
#endif
