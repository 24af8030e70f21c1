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
 *             in vertical adds (td_fp8fast_gemm512_packed, gemm_fp8fast512.c). 1.2-1.5x the in-place kernel on 128-512
 *             rows (one Xeon thread, interleaved medians).
 *   AVX-512   6 rows x 8 columns, a zmm per row and column pair (the two columns' lane sums
 *             side by side, a row's 8 values broadcast to both halves), w read in place;
 *             after each step a row's 8 columns reduced at once (td_lanes_reduce8x8) and the
 *             partials truncated with one AND.
 *   AVX2, packed (24 rows and more): the same in panels of 16 columns, two ymm per row and
 *             lane; 16 registers hold 2 lanes of 3 rows, so a step runs in four phases of two
 *             lanes in the reduction's order (td_fp8fast_packed2, gemm_fp8packed.c). 128 rows,
 *             one Zen 3 core: 15 GFLOP/s with per-output reductions, 44-50 in panels of 8
 *             (load-bound), 54-63 in panels of 16.
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
 * of 4 rows; from 24 rows the AVX2 packed kernel, its panels decoded straight from the codes' panels). One
 * Zen 3 core, realistic codes: 1.41-1.65x the row tile on 1-8 rows, 1.00-1.18x widen + packed on
 * 128-256 rows. (Random codes, a sixteenth of them subnormal, ran both at half speed: the decode's
 * multiply of a subnormal is slow on Zen 3; quantised weights have almost none.)
 * Single-threaded; callers parallelise over column tiles. Scratch: the packed kernel's block
 * partials (the thread's, gemm_scratch.h; without it the in-place kernel runs) and a 16 KiB panel
 * on the stack.
 * Files (gemm_fp8fast.h lists them): this one holds the order, the reference, the AVX2 tile and the
 * entry points; the AVX-512 kernels, the AVX2 packed kernel and the panels' kernel and layout
 * have their own. */
#include "gemm_fp8fast.h"
#include "tidal/isa.h"

#include <math.h>

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
/* The AVX2 tile's weights: S column rows of fp32 (codes NULL), or of fp8 codes with each column's
 * row of block scales (srow; block width sc, a multiple of 8) decoded in registers */
typedef struct {
    const float *w[4];
    const uint8_t *codes[4];
    const float *srow[4];
    int sc, e5m2;
} wsrc2;
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
        if (M < PACKED_MIN_ROWS || !td_fp8fast_gemm512_packed(a, lda, w, ldw, c, ldc, M, N, K, promote, bits))
            td_fp8fast_gemm512(a, lda, w, ldw, c, ldc, M, N, K, promote, bits);
        return;
    }
    if (avx2) {
        if (M < PACKED_MIN_ROWS2 || !td_fp8fast_packed2(a, lda, w, ldw, NULL, c, ldc, M, N, K, promote, bits))
            gemm2(a, lda, w, ldw, c, ldc, M, N, K, promote, bits);
        return;
    }
#endif
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++)
            c[(size_t)i * ldc + j] = fp8_fast_portable(a + (size_t)i * lda, w + (size_t)j * ldw, K, promote, bits);
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
        if (!nan_free && td_fp8fast_has_nan512(w, ldw, N, K, wf == TD_E5M2))
            return 0;   /* NaN weights: the widened path */
        td_fp8fast_gemm512_codes(a, lda, &cw, c, ldc, M, N, K, promote, bits);
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
            if (td_fp8fast_has_nan512(codes + i, 0, 1, 1 << 30, f == TD_E5M2)) return 1;
        if (i < n && td_fp8fast_has_nan512(codes + i, 0, 1, (int)(n - i), f == TD_E5M2)) return 1;
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
