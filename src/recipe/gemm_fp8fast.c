/* The fp8-fast accumulation (gemm.h, recipe.h: DeepGEMM's promotion model) as one kernel:
 * c (M, N; ldc) = a (M, K) . w (N rows of stride ldw)^T where, per output, K is walked in
 * promotion blocks of `promote` products [k0, k1) and each block in WGMMA steps of 32 products
 * [s0, s0 + 32) (the last shorter); a step's sum is td_gemm_fixed's order over its products
 * (eight lane sums from zero, s_l = fma(a[k], w[k], s_l) for k = s0 + l, s0 + l + 8, ...,
 * missing k as fma(0, 0, s_l); then ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7))); the block's
 * partial is part = trunc(part + step, bits) after every step (td_trunc_fraction), and
 * total += part (fp32, from 0) at the end of every block.
 *
 * That is the arithmetic td_gemm_accumulate did before this kernel by cutting K into 32-product
 * GEMMs (td_gemm_fixed for a batch-invariant recipe or at most TD_GEMM_FIXED_ROWS rows: those
 * bits are unchanged) and passing over the (M, N) partials after each; larger products of other
 * recipes took OpenBLAS's sgemm for the step, whose order within 32 products depended on its
 * micro-kernel (the CPU), and now take this order too: an fp8-fast GEMM's bits depend on nothing
 * but the two operand rows and the recipe, on every machine.
 *
 * Kernels, picked at run time (td_gemm_fixed_max_kernel and TIDAL_ISA cap the choice as they
 * do td_gemm_fixed's; all give the same bits):
 *   AVX-512, packed (40 rows and more): w packed k-major in panels of 16 columns, a zmm per row
 *             and lane (16 columns), each product an FMA of a broadcast value of a; a step ends
 *             in vertical adds (gemm512_packed, below). 1.2-1.5x the in-place kernel on 128-512
 *             rows (one Xeon thread, interleaved medians).
 *   AVX-512   6 rows x 8 columns, a zmm per row and column pair (the two columns' lane sums
 *             side by side, a row's 8 values broadcast to both halves), w read in place;
 *             after each step a row's 8 columns reduced at once (td_lanes_reduce8x8) and the
 *             partials truncated with one AND.
 *   AVX2, packed (24 rows and more): the same in panels of 16 columns, two ymm per row and
 *             lane; 16 registers hold 2 lanes of 3 rows, so a step runs in four phases of two
 *             lanes in the reduction's order (gemm2_packed). 128 rows, one Zen 3 core: 15 GFLOP/s
 *             with per-output reductions, 44-50 in panels of 8 (load-bound), 54-63 in panels of 16.
 *   AVX2+FMA  4 rows x 3 columns of 8-lane accumulators, w in place, reduced 8 at a time after
 *             each step (td_lanes_reduce8_avx2) with the partials and totals vectors (before:
 *             one horizontal sum, scalar truncation and add per output and step; 1.8x on 4 rows).
 *   portable  one element at a time, as written above: the reference.
 * td_gemm_fp8_fast_codes is the AVX-512 kernel (or the AVX2 tile, 4 rows x 2 columns) over fp8
 * codes and their block scales, decoded in registers (a decode step's rows: each weight read once,
 * 1 byte): the bits of the widened rows; 1.03-1.12x the widen-then-multiply path on 4 rows (one
 * Zen 4 core, K 4864 and 896), the decode of the codes costing about what the store and reload of
 * the widened rows did. On Zen 3 the AVX2 tile is bound by its shuffle pipes, not its FMAs: an
 * assembly model of one step (4 x 2 outputs, 32 products) takes 17 cycles for the FMAs alone, 43
 * with the e4m3 decode and the step's reduction (the F16C decode it replaced: 53). Decoding into a
 * packed k-major panel per call ran at half the tile's speed on 1-8 rows (the transpose costs
 * more than the rows reuse); a panel packed once per weight would not pay that per call.
 * td_gemm_fp8_fast_panels takes the codes in k-major panels of 8 rows (the CPU backend's layout on
 * a CPU with AVX2 and no AVX-512): 8 columns' codes at k are 8 contiguous bytes, one decode serves
 * a ymm of 8 columns, and a step's lanes are registers ending in vertical adds (gemm2_panels: strips
 * of 4 rows; from 24 rows gemm2_packed, its panels decoded straight from the codes' panels). One
 * Zen 3 core, realistic codes: 1.41-1.65x the row tile on 1-8 rows, 1.00-1.18x widen + packed on
 * 128-256 rows. (Random codes, a sixteenth of them subnormal, ran both at half speed: the decode's
 * multiply of a subnormal is slow on Zen 3; quantised weights have almost none.)
 * Single-threaded; callers parallelise over column tiles. Scratch: the packed kernel's block
 * partials (the thread's, gemm_scratch.h; without it the in-place kernel runs) and a 16 KiB panel
 * on the stack. */
#include "tidal/gemm.h"
#include "tidal/isa.h"
#include "gemm_scratch.h"

#include <math.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "gemm_lanes.h"
#define TD_HAVE_FP8FAST_SIMD 1
#endif

/* fewer rows: packing costs more than it gains (crossover 24-48 rows, one Xeon thread; with AVX2's
 * panels of 16, 16-24 rows, one Zen 3 thread) */
enum { STEP = 32, PACKED_MIN_ROWS = 40, PACKED_MIN_ROWS2 = 24 };

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
static void clamp_fp8_args(int *promote, int *bits)
{
    if (*promote < STEP) *promote = STEP;
    if (*bits < 0) *bits = 0;
    if (*bits > 23) *bits = 23;
}

/* 1 when a step ending at e closes its promotion block */
static inline int closes_block(int e, int K, int promote) { return e == K || e % promote == 0; }

static float fp8_fast_portable(const float *a, const float *w, int K, int promote, int bits)
{
    float total = 0.0f, part = 0.0f;
    for (int s0 = 0; s0 < K;) {
        int e = step_end(s0, K, promote), n = e - s0;
        float s[8] = {0};
        for (int k = 0; k < n; k += 8)
            for (int l = 0; l < 8; l++) {
                float x = k + l < n ? a[s0 + k + l] : 0.0f, y = k + l < n ? w[s0 + k + l] : 0.0f;
                s[l] = fmaf(x, y, s[l]);
            }
        float step = ((s[0] + s[4]) + (s[2] + s[6])) + ((s[1] + s[5]) + (s[3] + s[7]));
        part = td_trunc_fraction(part + step, bits);
        if (closes_block(e, K, promote)) {
            total += part;
            part = 0.0f;
        }
        s0 = e;
    }
    return total;
}

#ifdef TD_HAVE_FP8FAST_SIMD
#define TGT __attribute__((target("avx2,fma,f16c")))
#define TGT512 __attribute__((target("avx2,fma,f16c,avx512f,avx512dq,avx512vl,avx512bw")))
#define INLINE inline __attribute__((always_inline))

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
typedef struct {
    const uint8_t *w;
    const float *scale;
    int ldw, row0, sr, sc, nbc, e5m2;
} codes_w;

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
TGT512 static int has_nan_code(const uint8_t *w, int ldw, int N, int K, int e5m2)
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

TGT512 static void gemm512(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                           int M, int N, int K, int promote, int bits)
{
    gemm512_any(a, lda, w, ldw, NULL, c, ldc, M, N, K, promote, bits, 0);
}

TGT512 static void gemm512_codes(const float *a, int lda, const codes_w *cw, float *c, int ldc, int M,
                                 int N, int K, int promote, int bits)
{
    if (cw->e5m2) gemm512_any(a, lda, NULL, 0, cw, c, ldc, M, N, K, promote, bits, 1);   /* the format a constant */
    else          gemm512_any(a, lda, NULL, 0, cw, c, ldc, M, N, K, promote, bits, 0);
}

/* ---- larger M: w packed into panels of 16 columns, k-major (pk[k][16], the panel's columns
 * side by side), so that one zmm of lane l's sums holds 16 columns of one row: lane l of a step
 * is its own accumulator (acc[r][l]), each product an FMA of a row's value at k (broadcast from
 * memory) and the panel's 16 weights at k, and a step ends in vertical adds in the order of the
 * reduction above: ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)), no shuffles. A lane's products are
 * the same fmaf chain in the same k order as the kernels above; a product past n (fma(0, 0, s) in
 * the model) is left out, which is the same: s starts at +0 and a sum of fmas from +0 is never -0,
 * so s + 0 = s, NaN and infinities included. Columns past nc are packed as zeros and not stored.
 * K is walked in chunks of at most KC products that end where steps end; a chunk of the panel is
 * packed once (16 x 16 register transposes) for a group of up to GROUP rows, whose block partials
 * wait in `part` between chunks and whose totals in c. */
enum { PW = 16, KC = 256, GROUP = 192 };

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
TGT512 static int gemm512_packed(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                                 int M, int N, int K, int promote, int bits)
{
    __m512 keep = _mm512_castsi512_ps(_mm512_set1_epi32((int)~((1u << (23 - bits)) - 1u)));
    int panels = (N + PW - 1) / PW;
    float *part = td_gemm_scratch(TD_SCRATCH_FP8FAST, (size_t)GROUP * PW * panels);
    if (!part) return 0;
    float pk[KC * PW] __attribute__((aligned(64)));
    for (int g = 0; g < M; g += GROUP) {   /* rows: the group's K-chunk of a stays in L2 over the panels */
        int gm = M - g < GROUP ? M - g : GROUP;
        if (K == 0)
            for (int i = 0; i < gm; i++)
                for (int j = 0; j < N; j++) c[(size_t)(g + i) * ldc + j] = 0.0f;
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

/* The AVX2 tile's weights: S column rows of fp32 (codes NULL), or of fp8 codes with each column's
 * row of block scales (srow; block width sc, a multiple of 8) decoded in registers */
typedef struct {
    const float *w[4];
    const uint8_t *codes[4];
    const float *srow[4];
    int sc, e5m2;
} wsrc2;

/* 8 codes at p (m of them; lanes past m zero) as fp32 and multiplied by sc: td_fp8_decode_scaled_row's
 * value. e4m3: each code shuffled into the top byte of its lane, shifted down 4 arithmetically (the
 * sign stays in bit 31; its copies in bits 27-30 masked off) gives fp32's sign, exponent and
 * mantissa fields, the value x 2^-120 exactly (a subnormal code a subnormal fp32: no DAZ here),
 * and sc is 2^120 x the block scale (exact: the caller keeps scales <= 2^7), so the one rounding
 * is that of value x scale. No lane crossing: on Zen 3 F16C's conversion and vpmovsx into a ymm
 * run one per cycle on one pipe, shuffles within lanes two. e5m2: the code is fp16's top byte,
 * widened by F16C (its infinities stay infinite), sc the block scale. */
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

/* the scale block of K a chunk at k is in (kb, ending at kend), moved on without a division; the
 * columns' factors (e4m3: x 2^120, decode8) refreshed when it changes */
TGT static INLINE void scale_block2(const wsrc2 *ws, int k, int *kb, int *kend, __m256 sc2[4], int S)
{
    if (!scale_block_at(k, ws->sc, kb, kend)) return;
    for (int s = 0; s < S; s++) sc2[s] = _mm256_set1_ps(ws->srow[s][*kb] * (ws->e5m2 ? 1.0f : 0x1p+120f));
}

/* AVX2: 8 products at k (m < 8 of them, the rest zero, when partial) into R x S lane sums; codes:
 * the weights decoded (ws->codes) with the factors sc2 */
TGT static INLINE void chunk2(__m256 acc[12], const float *a, int lda, const wsrc2 *ws, const __m256 sc2[4],
                              int k, int m, int R, int S, int partial, int codes, int e5m2)
{
    __m256i mask = _mm256_cmpgt_epi32(_mm256_set1_epi32(m), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    __m256 x[4];
    #pragma GCC unroll 4
    for (int s = 0; s < S; s++) {
        if (codes) x[s] = decode8(e5m2, ws->codes[s] + k, sc2[s], partial ? m : 8, mask);
        else x[s] = partial ? _mm256_maskload_ps(ws->w[s] + k, mask) : _mm256_loadu_ps(ws->w[s] + k);
        __asm__("" : "+x"(x[s]));   /* a column's weights loaded once, not once per row */
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        const float *ar = a + (size_t)r * lda + k;
        __m256 av = partial ? _mm256_maskload_ps(ar, mask) : _mm256_loadu_ps(ar);
        __asm__("" : "+x"(av));
        #pragma GCC unroll 4
        for (int s = 0; s < S; s++) acc[r * S + s] = _mm256_fmadd_ps(av, x[s], acc[r * S + s]);
    }
}

/* AVX2: one step of n products at s0 into R x S lane sums from zero (codes: kb, kend and sc2 the
 * scale block's state, carried across steps) */
TGT static INLINE void step2(__m256 acc[12], const float *a, int lda, const wsrc2 *ws, __m256 sc2[4], int *kb,
                             int *kend, int s0, int n, int R, int S, int codes, int e5m2)
{
    #pragma GCC unroll 12
    for (int o = 0; o < R * S; o++) acc[o] = _mm256_setzero_ps();
    if (n == STEP) {
        #pragma GCC unroll 4
        for (int k = 0; k < STEP; k += 8) {
            if (codes) scale_block2(ws, s0 + k, kb, kend, sc2, S);
            chunk2(acc, a, lda, ws, sc2, s0 + k, 8, R, S, 0, codes, e5m2);
        }
        return;
    }
    for (int k = 0; k < n; k += 8) {
        if (codes) scale_block2(ws, s0 + k, kb, kend, sc2, S);
        chunk2(acc, a, lda, ws, sc2, s0 + k, n - k, R, S, n - k < 8, codes, e5m2);
    }
}

/* AVX2: R x S (constants, R * S <= 12) outputs, one ymm of lane sums each (acc[r * S + s]); after
 * every step the outputs' sums are reduced 8 (or the last 4) at a time in the flat order r * S + s
 * (td_lanes_reduce8_avx2; the sums come out in its even-odd lane order), and their partials
 * truncated and totals added as vectors, stored in order at the end. The columns past nc repeat
 * the last real one (ws holds S of them) and are not stored. 12 sums, S weight vectors and one row
 * of a fill the 16 registers when R x S is 4 x 3. */
TGT static INLINE void tile2(const float *a, int lda, const wsrc2 *ws, float *c, int ldc, int K, int promote,
                             __m256 keep, int nc, int R, int S, int codes, int e5m2)
{
    const int O = R * S, G = (O + 7) / 8;
    __m256 part[2], total[2], acc[12], sc2[4] = {0};   /* sc2: set by scale_block2 before use */
    int kb = -1, kend = 0;   /* codes: before the first scale block */
    #pragma GCC unroll 2
    for (int g = 0; g < G; g++) part[g] = total[g] = _mm256_setzero_ps();
    int bend = block_end(0, K, promote);   /* no division per step: bend moves on as blocks close */
    for (int s0 = 0; s0 < K;) {
        int e = bend - s0 > STEP ? s0 + STEP : bend, close = e == bend;
        step2(acc, a, lda, ws, sc2, &kb, &kend, s0, e - s0, R, S, codes, e5m2);
        if (close && e < K) bend = next_block(e, K, promote);
        #pragma GCC unroll 2
        for (int g = 0; g < G; g++) {
            __m256 v[8], d;
            #pragma GCC unroll 8
            for (int i = 0; i < 8; i++) v[i] = acc[8 * g + i < O ? 8 * g + i : O - 1];
            d = O - 8 * g > 4 ? td_lanes_reduce8_avx2(v) : td_lanes_reduce4_avx2(v);
            part[g] = _mm256_and_ps(_mm256_add_ps(part[g], d), keep);
            if (close) {
                total[g] = _mm256_add_ps(total[g], part[g]);
                part[g] = _mm256_setzero_ps();
            }
        }
        s0 = e;
    }
    float out[16];
    for (int g = 0; g < G; g++) _mm256_storeu_ps(out + 8 * g, total[g]);
    for (int r = 0; r < R; r++)
        for (int s = 0; s < nc; s++) c[(size_t)r * ldc + s] = out[(r * S + s) / 8 * 8 + TD_LANES_EO((r * S + s) % 8)];
}

/* Strips of 4 rows x column triples, all of K per tile (each strip reads w once): fewer rows than
 * PACKED_MIN_ROWS2, or no scratch for the packed kernel's partials; fp32 rows (cw NULL: w, ldw) or
 * codes (cw; the two callers pass it as a constant) in column pairs: with the e4m3 decode, 4 x 3 ran
 * 15-25 GFLOP/s against 4 x 2's 26-33 (one Zen 3 core, 4 x 896 x 4864 and 4 x 4864 x 896,
 * interleaved), its 12 sums, 3 weight vectors and the decode's constants more than 16 registers */
TGT static INLINE void gemm2_any(const float *a, int lda, const float *w, int ldw, const codes_w *cw, float *c,
                                 int ldc, int M, int N, int K, int promote, int bits, int e5m2)
{
    __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32((int)~((1u << (23 - bits)) - 1u)));
    const int S = cw ? 2 : 3;
    for (int j = 0; j < N; j += S) {
        int nc = N - j < S ? N - j : S;
        wsrc2 ws = {.sc = cw ? cw->sc : 0, .e5m2 = e5m2};
        for (int s = 0; s < S; s++) {
            int jc = j + (s < nc ? s : nc - 1);
            if (cw) {
                ws.codes[s] = cw->w + (size_t)jc * cw->ldw;
                ws.srow[s] = cw->scale + (size_t)((cw->row0 + jc) / cw->sr) * cw->nbc;
            } else {
                ws.w[s] = w + (size_t)jc * ldw;
            }
        }
        for (int i = 0; i < M; i += 4) {
            const float *ai = a + (size_t)i * lda;
            float *ci = c + (size_t)i * ldc + j;
            switch (M - i < 4 ? M - i : 4) {
#define CALL(r) tile2(ai, lda, &ws, ci, ldc, K, promote, keep, nc, r, S, cw != NULL, e5m2); break
            case 4: CALL(4);
            case 3: CALL(3);
            case 2: CALL(2);
            default: CALL(1);
#undef CALL
            }
        }
    }
}

TGT static void gemm2(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M,
                      int N, int K, int promote, int bits)
{
    gemm2_any(a, lda, w, ldw, NULL, c, ldc, M, N, K, promote, bits, 0);
}

TGT static void gemm2_codes(const float *a, int lda, const codes_w *cw, float *c, int ldc, int M, int N,
                            int K, int promote, int bits)
{
    if (cw->e5m2) gemm2_any(a, lda, NULL, 0, cw, c, ldc, M, N, K, promote, bits, 1);   /* the format a constant */
    else          gemm2_any(a, lda, NULL, 0, cw, c, ldc, M, N, K, promote, bits, 0);
}

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
 * same k order as the kernels above, a product past n left out (as in gemm512_packed). The driver
 * is gemm512_packed's: row groups whose chunk of a stays in L2, K in chunks of at most KC products
 * packed once per panel. */
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
TGT static int gemm2_packed(const float *a, int lda, const float *w, int ldw, const codes_w *pn, float *c,
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
        if (K == 0)
            for (int i = 0; i < gm; i++)
                for (int j = 0; j < N; j++) c[(size_t)(g + i) * ldc + j] = 0.0f;
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

/* ---- AVX2, codes in k-major panels of 8 rows of w (td_fp8_codes_to_panels: panel p's code of
 * row 8p + i at k is byte k * 8 + i): the 8 columns' codes at k are 8 contiguous bytes, so one
 * decode (decode8) gives a ymm of 8 columns at k, and a step's lane l of a row is its own ymm
 * over 8 columns, as in the packed kernels: the step ends in vertical adds, without the row
 * tile's horizontal reduction per output and step (on Zen 3 that reduction's shuffles, not its
 * FMAs, bound the row tile). Strips of up to 4 rows x one panel; a step in two halves of two
 * phases each in the reduction's order (lanes 0 and 4, then 2 and 6: a0; 1 and 5, then 3 and 7:
 * a1), a0 waiting in memory while the second half holds the registers. Each lane's products are
 * the same fmaf chain in the same k order as the kernels above, a product past n left out. The
 * step's 32 k lie in one scale block (the caller: sc and promote multiples of 32), so the factor
 * is one per panel and step. */
TGT static INLINE void lanes_pn(__m256 q[4], const float *a, int lda, const uint8_t *cp, __m256 f, int s0,
                                int n, int l, int R, int full, int e5m2)
{
    __m256 x[4], y[4];
    const __m256i none = _mm256_setzero_si256();
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) x[r] = y[r] = _mm256_setzero_ps();
    #pragma GCC unroll 4
    for (int k = l; k < STEP; k += 8) {
        if (full || k < n) {
            __m256 w = decode8(e5m2, cp + (size_t)(s0 + k) * 8, f, 8, none);
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) x[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + (size_t)r * lda + s0 + k), w, x[r]);
        }
        if (full || k + 4 < n) {
            __m256 w = decode8(e5m2, cp + (size_t)(s0 + k + 4) * 8, f, 8, none);
            #pragma GCC unroll 4
            for (int r = 0; r < R; r++) y[r] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + (size_t)r * lda + s0 + k + 4), w, y[r]);
        }
    }
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) q[r] = _mm256_add_ps(x[r], y[r]);
}

/* one step's sums of R rows x 8 columns: ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)) */
TGT static INLINE void step_pn(__m256 sum[4], const float *a, int lda, const uint8_t *cp, __m256 f, int s0,
                               int n, int R, int full, int e5m2)
{
    float wait[4 * 8] __attribute__((aligned(32)));
    __m256 q[4], t[4];
    lanes_pn(q, a, lda, cp, f, s0, n, 0, R, full, e5m2);
    lanes_pn(t, a, lda, cp, f, s0, n, 2, R, full, e5m2);
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) _mm256_store_ps(wait + 8 * r, _mm256_add_ps(q[r], t[r]));
    lanes_pn(q, a, lda, cp, f, s0, n, 1, R, full, e5m2);
    lanes_pn(t, a, lda, cp, f, s0, n, 3, R, full, e5m2);
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) sum[r] = _mm256_add_ps(_mm256_load_ps(wait + 8 * r), _mm256_add_ps(q[r], t[r]));
}

/* R rows (constant) x one panel (nc of its 8 columns stored), all of K; srow: the panel's block
 * scales along K */
TGT static INLINE void strip_pn(const float *a, int lda, const uint8_t *cp, const float *srow, int sc,
                                float *c, int ldc, int nc, int K, int promote, __m256 keep, int R, int e5m2)
{
    __m256 part[4], total[4];
    #pragma GCC unroll 4
    for (int r = 0; r < R; r++) part[r] = total[r] = _mm256_setzero_ps();
    const float fac = e5m2 ? 1.0f : 0x1p+120f;   /* decode8's factor */
    int bend = block_end(0, K, promote), kb = -1, kend = 0;   /* before the first scale block */
    __m256 f = _mm256_setzero_ps();
    for (int s0 = 0; s0 < K;) {
        int e = bend - s0 > STEP ? s0 + STEP : bend, close = e == bend;
        if (scale_block_at(s0, sc, &kb, &kend)) f = _mm256_set1_ps(srow[kb] * fac);   /* K = 0 reads none */
        __m256 sum[4];
        if (e - s0 == STEP) step_pn(sum, a, lda, cp, f, s0, STEP, R, 1, e5m2);
        else                step_pn(sum, a, lda, cp, f, s0, e - s0, R, 0, e5m2);
        #pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            part[r] = _mm256_and_ps(_mm256_add_ps(part[r], sum[r]), keep);
            if (close) {
                total[r] = _mm256_add_ps(total[r], part[r]);
                part[r] = _mm256_setzero_ps();
            }
        }
        if (close && e < K) bend = next_block(e, K, promote);
        s0 = e;
    }
    float out[8];
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(out, total[r]);
        memcpy(c + (size_t)r * ldc, out, (size_t)nc * sizeof(float));
    }
}

/* cw->w: the panel holding row cw->row0 (a multiple of 8); panels of 8 K-long rows */
TGT static INLINE void gemm2_panels_any(const float *a, int lda, const codes_w *cw, float *c, int ldc, int M,
                                        int N, int K, int promote, int bits, int e5m2)
{
    __m256 keep = _mm256_castsi256_ps(_mm256_set1_epi32((int)~((1u << (23 - bits)) - 1u)));
    for (int j = 0; j < N; j += 8) {
        int nc = N - j < 8 ? N - j : 8;
        const uint8_t *cp = cw->w + (size_t)j * K;
        const float *srow = cw->scale + (size_t)((cw->row0 + j) / cw->sr) * cw->nbc;
        for (int i = 0; i < M; i += 4) {
            const float *ai = a + (size_t)i * lda;
            float *ci = c + (size_t)i * ldc + j;
            switch (M - i < 4 ? M - i : 4) {
#define CALL(r) strip_pn(ai, lda, cp, srow, cw->sc, ci, ldc, nc, K, promote, keep, r, e5m2); break
            case 4: CALL(4);
            case 3: CALL(3);
            case 2: CALL(2);
            default: CALL(1);
#undef CALL
            }
        }
    }
}

TGT static void gemm2_panels(const float *a, int lda, const codes_w *cw, float *c, int ldc, int M, int N,
                             int K, int promote, int bits)
{
    if (cw->e5m2) gemm2_panels_any(a, lda, cw, c, ldc, M, N, K, promote, bits, 1);   /* the format a constant */
    else          gemm2_panels_any(a, lda, cw, c, ldc, M, N, K, promote, bits, 0);
}
#endif

void td_gemm_fp8_fast(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M,
                      int N, int K, int promote, int bits)
{
    if (M <= 0 || N <= 0) return;
    clamp_fp8_args(&promote, &bits);
#ifdef TD_HAVE_FP8FAST_SIMD
    int avx2 = td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX2 && td_isa_level() >= TD_ISA_AVX2;
    int avx512 = avx2 && td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX512 && td_isa_level() >= TD_ISA_AVX512;
    if (avx512) {
        if (M < PACKED_MIN_ROWS || !gemm512_packed(a, lda, w, ldw, c, ldc, M, N, K, promote, bits))
            gemm512(a, lda, w, ldw, c, ldc, M, N, K, promote, bits);
        return;
    }
    if (avx2) {
        if (M < PACKED_MIN_ROWS2 || !gemm2_packed(a, lda, w, ldw, NULL, c, ldc, M, N, K, promote, bits))
            gemm2(a, lda, w, ldw, c, ldc, M, N, K, promote, bits);
        return;
    }
#endif
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            c[(size_t)i * ldc + j] = fp8_fast_portable(a + (size_t)i * lda, w + (size_t)j * ldw, K, promote, bits);
}

/* the exact-factor test both codes entry points make: every e4m3 block scale the call reads at
 * most lim (2^120 x scale, or 256 x scale on AVX-512, must not overflow) */
static int scales_fit(const float *scale, int row0, int N, int sr, int nbc, float lim)
{
    for (int b = row0 / sr; b <= (row0 + N - 1) / sr; b++)
        for (int q = 0; q < nbc; q++)
            if (!(fabsf(scale[(size_t)b * nbc + q]) <= lim)) return 0;
    return 1;
}

int td_gemm_fp8_fast_codes(const float *a, int lda, const uint8_t *w, int ldw, td_format wf,
                           const float *scale, int row0, int sr, int sc, int nbc, float *c, int ldc,
                           int M, int N, int K, int promote, int bits, int nan_free)
{
    clamp_fp8_args(&promote, &bits);
#ifdef TD_HAVE_FP8FAST_SIMD
    int avx2 = td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX2 && td_isa_level() >= TD_ISA_AVX2;
    int avx512 = avx2 && td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX512 && td_isa_level() >= TD_ISA_AVX512;
    if (!avx2 || (wf != TD_E4M3 && wf != TD_E5M2) || sc % 8 || promote % 8 || sr < 1) return 0;
    if (M <= 0 || N <= 0) return 1;
    /* the factor exact for every block the call reads: 256 x scale (AVX-512), 2^120 x scale (AVX2) */
    if (wf == TD_E4M3 && !scales_fit(scale, row0, N, sr, nbc, avx512 ? 0x1p+119f : 0x1p+7f)) return 0;
    codes_w cw = {w, scale, ldw, row0, sr, sc, nbc, wf == TD_E5M2};
    if (avx512) {
        if (!nan_free && has_nan_code(w, ldw, N, K, wf == TD_E5M2)) return 0;   /* NaN weights: the widened path */
        gemm512_codes(a, lda, &cw, c, ldc, M, N, K, promote, bits);
        return 1;
    }
    if (!nan_free)
        for (int j = 0; j < N; j++)
            if (td_fp8_codes_have_nan(w + (size_t)j * ldw, (size_t)K, wf)) return 0;
    gemm2_codes(a, lda, &cw, c, ldc, M, N, K, promote, bits);
    return 1;
#else
    (void)a; (void)lda; (void)w; (void)ldw; (void)wf; (void)scale; (void)row0; (void)sr; (void)sc;
    (void)nbc; (void)c; (void)ldc; (void)M; (void)N; (void)K; (void)bits; (void)nan_free;
    return 0;
#endif
}

int td_gemm_fp8_fast_panels(const float *a, int lda, const uint8_t *p, td_format wf, const float *scale,
                            int row0, int sr, int sc, int nbc, float *c, int ldc, int M, int N, int K,
                            int promote, int bits, int nan_free)
{
    clamp_fp8_args(&promote, &bits);
#ifdef TD_HAVE_FP8FAST_SIMD
    if (!td_gemm_fp8_panels_apply(wf, sr, sc, promote) || row0 % 8 || (sr % 8 && (row0 + N - 1) / sr != row0 / sr))
        return 0;
    if (M <= 0 || N <= 0) return 1;
    if (wf == TD_E4M3 && !scales_fit(scale, row0, N, sr, nbc, 0x1p+7f)) return 0;
    if (!nan_free && td_fp8_codes_have_nan(p, (size_t)((N + 7) / 8) * 8 * (size_t)K, wf)) return 0;
    codes_w cw = {p, scale, K, row0, sr, sc, nbc, wf == TD_E5M2};
    if (M < PACKED_MIN_ROWS2 || !gemm2_packed(a, lda, NULL, 0, &cw, c, ldc, M, N, K, promote, bits))
        gemm2_panels(a, lda, &cw, c, ldc, M, N, K, promote, bits);
    return 1;
#else
    (void)a; (void)lda; (void)p; (void)wf; (void)scale; (void)row0; (void)sr; (void)sc; (void)nbc; (void)c;
    (void)ldc; (void)M; (void)N; (void)K; (void)bits; (void)nan_free;
    return 0;
#endif
}

int td_gemm_fp8_panels_apply(td_format wf, int sr, int sc, int promote)
{
#ifdef TD_HAVE_FP8FAST_SIMD
    return td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX2 && td_isa_level() >= TD_ISA_AVX2 &&
           (wf == TD_E4M3 || wf == TD_E5M2) && sr >= 1 && sc > 0 && sc % STEP == 0 && promote % STEP == 0;
#else
    (void)wf; (void)sr; (void)sc; (void)promote;
    return 0;
#endif
}

int td_gemm_fp8_panels_preferred(td_format wf, int sr, int sc, int promote)
{
    return td_gemm_fp8_panels_apply(wf, sr, sc, promote) &&
           !(td_isa_level() >= TD_ISA_AVX512 && td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX512);
}

#if defined(__x86_64__)
/* 8 rows' 16 codes from k (src[i]: row i at k) into out, k-major: three rounds of byte, word and
 * doubleword interleaves (SSE2) */
static inline void panel_block16(const uint8_t *const src[8], size_t k, uint8_t *out)
{
    __m128i r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm_loadu_si128((const __m128i *)(src[i] + k));
    __m128i b[8], w[8];
    for (int i = 0; i < 4; i++) {   /* rows 2i, 2i+1 byte by byte */
        b[2 * i] = _mm_unpacklo_epi8(r[2 * i], r[2 * i + 1]);
        b[2 * i + 1] = _mm_unpackhi_epi8(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++)     /* rows 4i..4i+3: 4 bytes per k */
        for (int h = 0; h < 2; h++) {
            w[4 * i + 2 * h] = _mm_unpacklo_epi16(b[4 * i + h], b[4 * i + 2 + h]);
            w[4 * i + 2 * h + 1] = _mm_unpackhi_epi16(b[4 * i + h], b[4 * i + 2 + h]);
        }
    for (int q = 0; q < 4; q++) {   /* rows 0..7: 8 bytes per k, 2 k per store */
        _mm_storeu_si128((__m128i *)(out + 32 * q), _mm_unpacklo_epi32(w[q], w[4 + q]));
        _mm_storeu_si128((__m128i *)(out + 32 * q + 16), _mm_unpackhi_epi32(w[q], w[4 + q]));
    }
}
#endif

void td_fp8_codes_to_panels(const uint8_t *codes, size_t rows, size_t cols, uint8_t *out)
{
    size_t panels = (rows + 7) / 8;
    #pragma omp parallel for schedule(static) if (rows * cols > (1u << 20))
    for (size_t pi = 0; pi < panels; pi++) {
        uint8_t *o = out + pi * 8 * cols;
        size_t k = 0;
#if defined(__x86_64__)
        if (pi * 8 + 8 <= rows) {
            const uint8_t *src[8];
            for (int i = 0; i < 8; i++) src[i] = codes + (pi * 8 + (size_t)i) * cols;
            for (; k + 16 <= cols; k += 16) panel_block16(src, k, o + k * 8);
        }
#endif
        for (size_t i = 0; i < 8; i++) {   /* the rest, and a last panel's missing rows as 0 */
            size_t r = pi * 8 + i;
            const uint8_t *src = r < rows ? codes + r * cols : NULL;
            for (size_t kk = k; kk < cols; kk++) o[kk * 8 + i] = src ? src[kk] : 0;
        }
    }
}

void td_fp8_panels_piece(const uint8_t *panels, size_t cols, size_t r, size_t c0, size_t n, uint8_t *out)
{
    const uint8_t *p = panels + (r / 8) * 8 * cols + c0 * 8 + r % 8;
    for (size_t k = 0; k < n; k++) out[k] = p[k * 8];
}

#ifdef TD_HAVE_FP8FAST_SIMD
/* 1 when the first n & ~31 codes hold a NaN (the AVX2 scan; the caller checks the rest) */
TGT static int nan_scan_avx2(const uint8_t *codes, size_t n, int e5m2)
{
    const __m256i m7f = _mm256_set1_epi8(0x7F), lim = _mm256_set1_epi8(e5m2 ? 0x7C : 0x7E);
    for (size_t i = 0; i + 32 <= n; i += 32) {
        __m256i b = _mm256_and_si256(_mm256_loadu_si256((const __m256i *)(codes + i)), m7f);
        if (_mm256_movemask_epi8(_mm256_cmpgt_epi8(b, lim))) return 1;   /* b <= 0x7F: signed compare */
    }
    return 0;
}
#endif

int td_fp8_codes_have_nan(const uint8_t *codes, size_t n, td_format f)
{
    if (f != TD_E4M3 && f != TD_E5M2) return 0;
    size_t i = 0;
#ifdef TD_HAVE_FP8FAST_SIMD
    if (td_isa_level() >= TD_ISA_AVX512) {   /* rows of up to 2^30 codes through the kernel's scan */
        for (; i + (1u << 30) <= n; i += 1u << 30)
            if (has_nan_code(codes + i, 0, 1, 1 << 30, f == TD_E5M2)) return 1;
        if (i < n && has_nan_code(codes + i, 0, 1, (int)(n - i), f == TD_E5M2)) return 1;
        return 0;
    }
    if (td_isa_level() >= TD_ISA_AVX2) {
        if (nan_scan_avx2(codes, n, f == TD_E5M2)) return 1;
        i = n & ~(size_t)31;
    }
#endif
    for (; i < n; i++) {
        uint8_t b = codes[i] & 0x7F;
        if (f == TD_E4M3 ? b == 0x7F : b > 0x7C) return 1;
    }
    return 0;
}
