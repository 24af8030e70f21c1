/* tidal — the fp8-fast GEMM's AVX-512 kernels (the order: gemm_fp8fast.c): 6 rows x 8 columns with
 * w read in place (fp32 rows or codes decoded in registers), and from PACKED_MIN_ROWS rows w packed
 * k-major in panels of 16 columns. */
#include "gemm_fp8fast.h"
#include "gemm_scratch.h"

#ifdef TD_HAVE_FP8FAST_SIMD
/* AVX-512: R (constant, <= 6) rows x 8 columns (nc real ones; the others repeat the last and are
 * not stored). One step of n products at s0; full: n == 32 (no masks). */
TGT512 static INLINE void step512(__m512 acc[6][4], const float *a, int lda, const float *const wc[8],
                                  int s0, int n, int R, int full)
{
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
    for (int k = 0; k < (full ? STEP : n); k += 8) {   /* unrolled when full (a constant) */
        int m = full || n - k >= 8 ? 8 : n - k;
        __mmask8 mk = (__mmask8)((1u << m) - 1);
        __m512 x[4];
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            const float *lo = wc[2 * p] + s0 + k, *hi = wc[2 * p + 1] + s0 + k;
            __m256 l = full ? _mm256_loadu_ps(lo) : _mm256_maskz_loadu_ps(mk, lo);
            __m256 h = full ? _mm256_loadu_ps(hi) : _mm256_maskz_loadu_ps(mk, hi);
            x[p] = _mm512_insertf32x8(_mm512_castps256_ps512(l), h, 1);
        }
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const float *ar = a + (size_t)r * lda + s0 + k;
            __m512 av = _mm512_broadcast_f32x8(full ? _mm256_loadu_ps(ar) : _mm256_maskz_loadu_ps(mk, ar));
            __asm__("" : "+v"(av));   /* one load per row, not one per FMA */
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++) acc[r][p] = _mm512_fmadd_ps(av, x[p], acc[r][p]);
        }
    }
}

/* ---- fp8 codes decoded in registers (td_gemm_fp8_fast_codes): a column pair's 8 + 8 codes at k
 * widened through fp16 (e5m2: the code is fp16's high byte; e4m3: the magnitude shifted by 7 is
 * the fp16 code of value / 2^8) and multiplied by the pair's block scales (e4m3: 256 * scale,
 * exact while |scale| <= 2^119, which the caller checks), one rounding: the value
 * td_fp8_decode_scaled_row gives. NaN codes give NaN lanes; lanes past n are zero. */

/* the pair's 16 codes at k (the low column's 8, then the high one's; lanes past m zero) as values
 * divided by the folded scale factor (e4m3: value / 2^8 before the x 256 in sc2) */
TGT512 static INLINE __m512 decode_pair(int e5m2, const uint8_t *lo, const uint8_t *hi, __m512 sc2, int m)
{
    __mmask16 mk = (__mmask16)((1u << m) - 1);
    __m128i b = m == 8 ? _mm_castpd_si128(_mm_loadh_pd(_mm_castsi128_pd(_mm_loadl_epi64((const __m128i *)lo)), (const double *)hi))
                       : _mm_unpacklo_epi64(_mm_maskz_loadu_epi8(mk, lo), _mm_maskz_loadu_epi8(mk, hi));
    /* the codes sign-extended to 16 bits: e5m2's fp16 code is s << 8; e4m3's is s << 7 (the
     * magnitude at bits 7-13, the sign's copy at bit 15) with bit 14 (the sign's own) cleared */
    __m256i s16 = _mm256_cvtepi8_epi16(b), h;
    if (e5m2)
        h = _mm256_slli_epi16(s16, 8);
    else
        h = _mm256_and_si256(_mm256_slli_epi16(s16, 7), _mm256_set1_epi16((short)0xBF80));
    __m512 f = _mm512_mul_ps(_mm512_cvtph_ps(h), sc2);
    return m < 8 ? _mm512_maskz_mov_ps((__mmask16)(mk | (mk << 8)), f) : f;
}

/* the scales of pair p in scale block kb of K (srow: each column's row of block scales), times 256
 * for e4m3 */
TGT512 static INLINE __m512 pair_scales(int e5m2, const float *const srow[8], int p, int kb)
{
    float k256 = e5m2 ? 1.0f : 256.0f;
    float slo = srow[2 * p][kb] * k256, shi = srow[2 * p + 1][kb] * k256;
    return _mm512_insertf32x8(_mm512_set1_ps(slo), _mm256_set1_ps(shi), 1);
}

/* one step; the block scales are read once per step (block kb) when a step never crosses a scale
 * block (sc and the step's start multiples of 32: per_step), else per chunk of 8 */
TGT512 static INLINE void step512_codes(__m512 acc[6][4], const float *a, int lda, const codes_w *cw,
                                        const int jc[8], const float *const srow[8], int kb, int s0, int n,
                                        int R, int full, int per_step, int e5m2)
{
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) acc[r][p] = _mm512_setzero_ps();
    __m512 sc2[4];
    #pragma GCC unroll 4
    for (int p = 0; p < 4; p++) sc2[p] = pair_scales(e5m2, srow, p, per_step ? kb : s0 / cw->sc);
    for (int k = 0; k < (full ? STEP : n); k += 8) {
        int m = full || n - k >= 8 ? 8 : n - k;
        __mmask8 mk = (__mmask8)((1u << m) - 1);
        __m512 x[4];
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++) {
            if (!per_step && k) sc2[p] = pair_scales(e5m2, srow, p, (s0 + k) / cw->sc);
            x[p] = decode_pair(e5m2, cw->w + (size_t)jc[2 * p] * cw->ldw + s0 + k,
                               cw->w + (size_t)jc[2 * p + 1] * cw->ldw + s0 + k, sc2[p], m);
        }
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++) {
            const float *ar = a + (size_t)r * lda + s0 + k;
            __m512 av = _mm512_broadcast_f32x8(full ? _mm256_loadu_ps(ar) : _mm256_maskz_loadu_ps(mk, ar));
            __asm__("" : "+v"(av));
            #pragma GCC unroll 4
            for (int p = 0; p < 4; p++) acc[r][p] = _mm512_fmadd_ps(av, x[p], acc[r][p]);
        }
    }
}

/* One tile: R rows (constant, <= 6) x 8 columns from j0 (nc real ones; the others repeat the last
 * and are not stored), over all of K; the weights as fp32 rows (cw NULL: w, ldw) or as codes (cw). */
TGT512 static INLINE void tile512(const float *a, int lda, const float *w, int ldw, const codes_w *cw,
                                  int j0, float *c, int ldc, int K, int promote, __m256 keep, int nc, int R, int e5m2)
{
    int jc[8], kb = 0, kend = cw ? cw->sc : 0;   /* the scale block of K a step is in, and its end */
    const float *wc[8], *srow[8];   /* fp32 rows, or each column's row of block scales (codes) */
    for (int s = 0; s < 8; s++) {
        jc[s] = j0 + (s < nc ? s : nc - 1);
        wc[s] = cw ? NULL : w + (size_t)jc[s] * ldw;
        srow[s] = cw ? cw->scale + (size_t)((cw->row0 + jc[s]) / cw->sr) * cw->nbc : NULL;
    }
    __m256 part[6], total[6];
    __m512 acc[6][4];
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) part[r] = total[r] = _mm256_setzero_ps();
    for (int s0 = 0; s0 < K;) {
        int e = step_end(s0, K, promote), full = e - s0 == STEP;
        if (!cw) {
            if (full) step512(acc, a, lda, wc, s0, STEP, R, 1);
            else      step512(acc, a, lda, wc, s0, e - s0, R, 0);
        } else {
            int per_step = cw->sc % STEP == 0 && s0 % STEP == 0;
            scale_block_at(s0, cw->sc, &kb, &kend);
            if (full && per_step) step512_codes(acc, a, lda, cw, jc, srow, kb, s0, STEP, R, 1, 1, e5m2);
            else                  step512_codes(acc, a, lda, cw, jc, srow, kb, s0, e - s0, R, 0, 0, e5m2);
        }
        #pragma GCC unroll 6
        for (int r = 0; r < R; r++)
            part[r] = _mm256_and_ps(_mm256_add_ps(part[r], td_lanes_reduce8x8(acc[r])), keep);
        if (closes_block(e, K, promote)) {
            #pragma GCC unroll 6
            for (int r = 0; r < R; r++) {
                total[r] = _mm256_add_ps(total[r], part[r]);
                part[r] = _mm256_setzero_ps();
            }
        }
        s0 = e;
    }
    __mmask8 km = (__mmask8)((1u << nc) - 1);
    for (int r = 0; r < R; r++) _mm256_mask_storeu_ps(c + (size_t)r * ldc, km, total[r]);
}

/* 1 when a row holds a NaN code (e4m3 S.1111.111; e5m2 S.11111.mm, mm != 0) */
TGT512 int td_fp8fast_has_nan512(const uint8_t *w, int ldw, int N, int K, int e5m2)
{
    const __m512i m7f = _mm512_set1_epi8(0x7F), lim = _mm512_set1_epi8(e5m2 ? 0x7C : 0x7E);
    for (int j = 0; j < N; j++) {
        const uint8_t *row = w + (size_t)j * ldw;
        for (int k = 0; k < K; k += 64) {
            __mmask64 mk = K - k >= 64 ? ~(__mmask64)0 : (((__mmask64)1 << (K - k)) - 1);
            __m512i b = _mm512_and_si512(_mm512_maskz_loadu_epi8(mk, row + k), m7f);
            if (_mm512_cmpgt_epu8_mask(b, lim)) return 1;
        }
    }
    return 0;
}

/* The AVX-512 driver: column panels of 8, strips of 6 rows; fp32 rows (cw NULL) or codes. The two
 * callers pass cw as a constant, so each gets its own copy of the inlined tile. */
TGT512 static INLINE void gemm512_any(const float *a, int lda, const float *w, int ldw, const codes_w *cw,
                                      float *c, int ldc, int M, int N, int K, int promote, int bits, int e5m2)
{
    __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32((int)~((1u << (23 - bits)) - 1u)));
    for (int j = 0; j < N; j += 8) {
        int nc = N - j < 8 ? N - j : 8;
        for (int i = 0; i < M; i += 6) {
            const float *ai = a + (size_t)i * lda;
            float *ci = c + (size_t)i * ldc + j;
            switch (M - i < 6 ? M - i : 6) {
#define CALL(r) tile512(ai, lda, w, ldw, cw, j, ci, ldc, K, promote, keep, nc, r, e5m2); break
            case 6: CALL(6);
            case 5: CALL(5);
            case 4: CALL(4);
            case 3: CALL(3);
            case 2: CALL(2);
            default: CALL(1);
#undef CALL
            }
        }
    }
}

TGT512 void td_fp8fast_gemm512(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                           int M, int N, int K, int promote, int bits)
{
    gemm512_any(a, lda, w, ldw, NULL, c, ldc, M, N, K, promote, bits, 0);
}

TGT512 void td_fp8fast_gemm512_codes(const float *a, int lda, const codes_w *cw, float *c, int ldc, int M,
                                 int N, int K, int promote, int bits)
{
    if (cw->e5m2) gemm512_any(a, lda, NULL, 0, cw, c, ldc, M, N, K, promote, bits, 1);   /* the format a constant */
    else          gemm512_any(a, lda, NULL, 0, cw, c, ldc, M, N, K, promote, bits, 0);
}

/* ---- larger M: w packed into panels of 16 columns, k-major (pk[k][16], the panel's columns
 * side by side), so that one zmm of lane l's sums holds 16 columns of one row: lane l of a step
 * is its own accumulator (acc[r][l]), each product an FMA of a row's value at k (broadcast from
 * memory) and the panel's 16 weights at k, and a step ends in vertical adds in the order's
 * reduction (gemm_fp8fast.c): ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)), no shuffles. A lane's
 * products are the same fmaf chain in the same k order as the in-place kernels'; a product past n
 * (fma(0, 0, s) in the model) is left out, which is the same: s starts at +0 and a sum of fmas
 * from +0 is never -0, so s + 0 = s, NaN and infinities included. Columns past nc are packed as
 * zeros and not stored.
 * K is walked in chunks of at most KC products that end where steps end; a chunk of the panel is
 * packed once (16 x 16 register transposes) for a group of up to GROUP rows, whose block partials
 * wait in `part` between chunks and whose totals in c. */
enum { PW = 16 };

/* pk[k][0..16) = w[j][k0 + k] for k < kn, zeros past nc */
TGT512 static void pack_panel(const float *w, int ldw, int nc, int k0, int kn, float *pk)
{
    int k = 0;
    if (nc == PW)
        for (; k + 16 <= kn; k += 16) {
            __m512i r[16];
            for (int j = 0; j < 16; j++) r[j] = _mm512_loadu_si512((const void *)(w + (size_t)j * ldw + k0 + k));
            td_transpose16_regs(r);
            for (int q = 0; q < 16; q++) _mm512_storeu_si512((void *)(pk + (size_t)(k + q) * PW), r[q]);
        }
    for (; k < kn; k++)
        for (int j = 0; j < PW; j++) pk[(size_t)k * PW + j] = j < nc ? w[(size_t)j * ldw + k0 + k] : 0.0f;
}

/* R (constant, <= 3) rows of one panel over the steps of [c0, c1) (c0 and c1 at step ends; the
 * panel packed from c0); part (R x 16) and total (c, the nc stored columns) carried in and out */
TGT512 static INLINE void strip_packed(const float *a, int lda, const float *pk, int c0, int c1, int K,
                                       int promote, __m512 keep, float *part, float *c, int ldc,
                                       __mmask16 cm, int first, int R)
{
    __m512 acc[3][8], pt[3], tot[3];
    #pragma GCC unroll 3
    for (int r = 0; r < R; r++) {
        pt[r] = first ? _mm512_setzero_ps() : _mm512_loadu_ps(part + r * PW);
        tot[r] = first ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(cm, c + (size_t)r * ldc);
    }
    for (int s0 = c0; s0 < c1;) {
        int e = step_end(s0, K, promote), n = e - s0;
        const float *ps = pk + (size_t)(s0 - c0) * PW;
        #pragma GCC unroll 3
        for (int r = 0; r < R; r++)
            #pragma GCC unroll 8
            for (int l = 0; l < 8; l++) acc[r][l] = _mm512_setzero_ps();
        if (n == STEP) {
            #pragma GCC unroll 32
            for (int k = 0; k < STEP; k++) {
                __m512 x = _mm512_loadu_ps(ps + (size_t)k * PW);
                __asm__("" : "+v"(x));   /* one load of the weights per k, the rows' values broadcast */
                #pragma GCC unroll 3
                for (int r = 0; r < R; r++)
                    acc[r][k & 7] = _mm512_fmadd_ps(_mm512_set1_ps(a[(size_t)r * lda + s0 + k]), x, acc[r][k & 7]);
            }
        } else {
            for (int k = 0; k < n; k += 8)
                #pragma GCC unroll 8
                for (int l = 0; l < 8; l++)
                    if (k + l < n) {
                        __m512 x = _mm512_loadu_ps(ps + (size_t)(k + l) * PW);
                        __asm__("" : "+v"(x));
                        #pragma GCC unroll 3
                        for (int r = 0; r < R; r++)
                            acc[r][l] = _mm512_fmadd_ps(_mm512_set1_ps(a[(size_t)r * lda + s0 + k + l]), x, acc[r][l]);
                    }
        }
        int close = closes_block(e, K, promote);
        #pragma GCC unroll 3
        for (int r = 0; r < R; r++) {
            __m512 step = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(acc[r][0], acc[r][4]), _mm512_add_ps(acc[r][2], acc[r][6])),
                                        _mm512_add_ps(_mm512_add_ps(acc[r][1], acc[r][5]), _mm512_add_ps(acc[r][3], acc[r][7])));
            pt[r] = _mm512_and_ps(_mm512_add_ps(pt[r], step), keep);
            if (close) {
                tot[r] = _mm512_add_ps(tot[r], pt[r]);
                pt[r] = _mm512_setzero_ps();
            }
        }
        s0 = e;
    }
    #pragma GCC unroll 3
    for (int r = 0; r < R; r++) {
        _mm512_storeu_ps(part + r * PW, pt[r]);
        _mm512_mask_storeu_ps(c + (size_t)r * ldc, cm, tot[r]);
    }
}

/* 0 when the partials' buffer (the thread's scratch, gemm_scratch.h) cannot be had (the caller
 * takes the other kernel: the same bits) */
TGT512 int td_fp8fast_gemm512_packed(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                                 int M, int N, int K, int promote, int bits)
{
    __m512 keep = _mm512_castsi512_ps(_mm512_set1_epi32((int)~((1u << (23 - bits)) - 1u)));
    int panels = (N + PW - 1) / PW;
    float *part = td_gemm_scratch(TD_SCRATCH_FP8FAST, (size_t)GROUP * PW * panels);
    if (!part) return 0;
    float pk[KC * PW] __attribute__((aligned(64)));
    for (int g = 0; g < M; g += GROUP) {   /* rows: the group's K-chunk of a stays in L2 over the panels */
        int gm = M - g < GROUP ? M - g : GROUP;
        if (K == 0) zero_rows(c + (size_t)g * ldc, ldc, gm, N);
        for (int c0 = 0; c0 < K;) {
            int c1 = chunk_end(c0, K, promote, KC);
            for (int p = 0; p < panels; p++) {
                int j = p * PW, nc = N - j < PW ? N - j : PW;
                __mmask16 cm = (__mmask16)((1u << nc) - 1);
                pack_panel(w + (size_t)j * ldw, ldw, nc, c0, c1 - c0, pk);
                for (int i = 0; i < gm; i += 3) {
                    const float *ai = a + (size_t)(g + i) * lda;
                    float *ci = c + (size_t)(g + i) * ldc + j, *pi = part + ((size_t)p * GROUP + i) * PW;
                    switch (gm - i < 3 ? gm - i : 3) {
#define CALL(r) strip_packed(ai, lda, pk, c0, c1, K, promote, keep, pi, ci, ldc, cm, c0 == 0, r); break
                    case 3: CALL(3);
                    case 2: CALL(2);
                    default: CALL(1);
#undef CALL
                    }
                }
            }
            c0 = c1;
        }
    }
    return 1;
}
#endif
