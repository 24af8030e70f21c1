/* The batch-invariant GEMM (see gemm.h, td_gemm_fixed): one summation order per output
 * element, whatever the number of rows M, the columns N, where the element sits in a tile, or
 * which thread computes it — as the batch-invariant kernels of the inference engines fix
 * theirs (one tile shape and one split for every batch size).
 *
 * The order, for c = sum_{k<K} a[k] w[k]:
 *   eight lane sums s_l = fma(a[k], w[k], s_l) for k = l, l+8, l+16, ... in increasing k
 *   (k >= K contributes fma(0, 0, s_l)), then ((s0+s4) + (s2+s6)) + ((s1+s5) + (s3+s7)).
 * Every multiply-add is a fused multiply-add (one rounding), so the SIMD kernels and the
 * portable one (fmaf, correctly rounded by C11) give the same bits: results do not depend on
 * the machine either. A chunk t holds k in [8t, 8t+8): lane l of a vector is s_l.
 *
 * Three kernels, picked at run time (td_gemm_fixed_max_kernel caps the choice for tests):
 *   portable  one element at a time, the order as written above: the reference.
 *   AVX2+FMA  R rows x S columns of 8-lane accumulators, R * S <= 12 of the 16 ymm registers
 *             (4 x 3 on packed w); each chunk loads the S columns' w, then one row of a at
 *             a time against all of them.
 *   AVX-512   6 rows x 8 columns in 24 zmm registers: a zmm holds the lane sums of two
 *             columns (low and high 256 bits), w of the two columns side by side, and the
 *             row's chunk of a broadcast to both halves — each half is the AVX2 lane order.
 *             A row's 8 reductions run side by side in shuffles (td_lanes_reduce8x8, gemm_lanes.h), same adds.
 * Both SIMD kernels keep the order by construction (per lane, the same fma's in the same k
 * order; the same reduction), so they differ only in how much they reuse per load. Blocking
 * that a fast GEMM needs changes no order either:
 *   - w is packed per call in groups of columns, chunk by chunk, one span of K (KSPAN chunks)
 *     at a time, in blocks of columns whose span stays in L2 while every strip of rows of a
 *     passes (pack_span); between spans a tile's lane sums wait in a buffer and continue from
 *     there, so a strip's span of a is read from L1 by all the panels of the block, and a is
 *     read once per block and span (GotoBLAS's loops);
 *   - the next block's w is prefetched into L2 while the strips pass over the current one.
 * Fewer than PACK_MIN_ROWS rows (decode, small batches) take the AVX2 tile on w in place:
 * packing w (a copy of N*K floats, ~13 GB/s) costs more than those few rows gain from it (on
 * Zen 4 the crossover is 8-48 rows, lower when w comes from memory). On a CPU without AVX-512,
 * fewer than LONG_K_ROWS rows over more than one span of K take it too: there the packed
 * driver also parks every tile's lane sums between spans, and in the backend's 128-column
 * tiles the in-place tile ran 1.6-1.9x the packed one at 8 rows and 1.1-1.2x at 16 (K 1,536-
 * 4,864; one Zen 3 core, interleaved; at K <= 1,024, 0.9-1.0x, so one span stays packed).
 * Measured against OpenBLAS 0.3.21 sgemm, one thread each, on the Qwen2.5-0.5B shapes at
 * M = 256 (tests/bench/gemm.sh, AMD EPYC Zen 4): 0.95-1.05 of its speed with AVX-512
 * (OpenBLAS's Cooper Lake kernel), 0.82-0.96 with AVX2 (against its Haswell one);
 * the kernel this replaced (4 x 2 AVX2 blocks over the whole K, nothing packed) ran at 0.53-0.66.
 * Blocking whole rows of K instead (before 2026-11-30) left one 8-column panel per block at
 * K = 4864 and read all of a from memory per 8 columns: 0.60-0.73 of sgemm on this Xeon, 0.8-0.9
 * since (cpu-speed.md). Scratch (the packed w and the parked lane sums) is the thread's
 * (gemm_scratch.h): the function is single-threaded; callers' threads take whole column tiles. */
#include "tidal/gemm.h"
#include "tidal/isa.h"
#include "gemm_scratch.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#include "gemm_lanes.h"
#define TD_HAVE_AVX2_PATH 1
#endif

enum {
    STRIP = 6,           /* rows per AVX-512 tile, and per AVX2 tile on w in place            */
    AVX2_STRIP = 4,      /* the AVX2 tile on packed w: 4 rows x AVX2_GROUP columns            */
    AVX2_GROUP = 3,
    KSPAN = 128,         /* chunks per span of K: a strip's span of a is <= 24 KiB, in L1     */
    PACK_FLOATS = 65536, /* packed w per column block: 256 KiB, within L2                      */
    PACK_MIN_ROWS = 8,   /* fewer rows take w in place (packing costs more than it saves)     */
    LONG_K_ROWS = 24,    /* AVX2 only: fewer rows over more than one span take w in place      */
    GROUP_ROWS = 384,    /* rows whose lane sums are parked between spans at a time (a multiple
                            of both strips: about 0.8 MB of lane sums)                        */
    PACK_AHEAD = 4,      /* pack_span prefetches the rows of w this many groups ahead          */
};

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
/* Columns packed in groups of G for the SIMD kernels, one span of K at a time: for chunks
 * [t0, t1) (t = k / 8) and columns j..j+G-1 of group g, 8G floats per chunk, w_j[8t..8t+8)
 * w_{j+1}[8t..8t+8) ..., the span's chunks of a group contiguous and the groups in order (group
 * g at g * (t1 - t0) * 8G); zeros past K and for missing columns, so a kernel reads a group as
 * one stream and needs no mask on w. Plain C: it moves the block's floats once, against the
 * strips' multiply-adds that read them. A group's G rows of w are read side by side, so the
 * packed span is written in order, and the rows PACK_AHEAD groups on are prefetched into L1 as
 * it goes: the block's rows come from memory or L3 (the prefetch of prefetch_rows does not
 * survive in Zen 3's 512 KiB L2 while the strips pass), and one row at a time, writing 32 bytes
 * every 8G floats, kept ~1 load in flight. Packing took 7.0-8.4 % of a 256 x 896 x 4864 product
 * that way, 4.6-4.8 % this way (cycles counted around the packs, one Zen 3 core, 3 runs). */
static void pack_span(const float *w, int ldw, int ncols, int K, int t0, int t1, int ngroups,
                      int G, float *p)
{
    int kfull = K / 8, tf = t1 < kfull ? t1 : kfull;
    for (int g = 0; g < ngroups; g++) {
        int q0 = g * G, whole = q0 + G <= ncols;
        float *o = p + (size_t)g * (t1 - t0) * 8 * G;
        int t = t0;
        if (whole) {
            const float *wq = w + (size_t)q0 * ldw, *ahead = wq + (size_t)PACK_AHEAD * G * ldw;
            int prefetch = q0 + (PACK_AHEAD + 1) * G <= ncols;
            for (; t < tf; t++, o += 8 * G) {
                if (prefetch && (t & 1) == 0)   /* a 64-byte line holds two chunks */
                    for (int q = 0; q < G; q++) __builtin_prefetch(ahead + (size_t)q * ldw + 8 * t, 0, 3);
                for (int q = 0; q < G; q++) memcpy(o + 8 * q, wq + (size_t)q * ldw + 8 * t, 8 * sizeof(float));
            }
        }
        for (; t < t1; t++, o += 8 * G)   /* the partial chunk, and groups with missing columns */
            for (int q = 0; q < G; q++) {
                const float *wq = w + (size_t)(q0 + q) * ldw;
                int n = q0 + q >= ncols ? 0 : K - 8 * t;
                for (int l = 0; l < 8; l++) o[8 * q + l] = l < n ? wq[8 * t + l] : 0.0f;
            }
    }
}

/* Into L2, part `part` of `parts` of the cache lines of nrows rows of `bytes` bytes, `stride`
 * bytes apart from base: the driver spreads the lines of the block it packs next over the strips
 * of the current one, so that packing reads cache instead of waiting on memory (packing took
 * ~10 % of a 256 x 4864 x 896 product; 0.57-0.72 -> 0.93-1.17 of sgemm with this and the span
 * blocking). */
static void prefetch_rows(const void *base, size_t stride, int nrows, size_t bytes, int part, int parts)
{
    size_t per_row = (bytes + 63) / 64, total = per_row * (size_t)nrows;
    size_t from = total * part / parts, to = total * (part + 1) / parts;
    for (size_t l = from; l < to; l++)
        __builtin_prefetch((const char *)base + (l / per_row) * stride + (l % per_row) * 64, 0, 2);
}

#define TGT __attribute__((target("avx2,fma")))
#define TGT512 __attribute__((target("avx2,fma,avx512f,avx512dq,avx512vl")))
#define INLINE inline __attribute__((always_inline))

#define hsum_fixed td_lanes_hsum8   /* reduce8's order on a ymm (gemm_lanes.h) */

/* lanes k < K % 8 of the last, partial chunk (all lanes when K % 8 == 0: no partial chunk) */
TGT static __m256i tail_mask_of(int K)
{
    int rem = K % 8;
    return _mm256_setr_epi32(rem > 0 ? -1 : 0, rem > 1 ? -1 : 0, rem > 2 ? -1 : 0,
                             rem > 3 ? -1 : 0, rem > 4 ? -1 : 0, rem > 5 ? -1 : 0,
                             rem > 6 ? -1 : 0, 0);
}

TGT static INLINE void store_out(float *o, float d, int add) { *o = add ? *o + d : d; }

/* Chunks [t0, t1) of K (T = ceil(K / 8) in all): starting from zero lane sums when t0 == 0,
 * else from those parked in lanes; ending with the reduction into c when t1 == T, else parking
 * the lane sums in lanes again. A lane's sum just continues across calls: the order is the
 * same as one pass over K. */
typedef struct { int t0, t1; float *lanes; } kspan;

/* AVX2: R rows x S columns of 8-lane accumulators (both constant, R * S <= 12: with the
 * columns' w and one row of a, within the 16 registers). Column s of chunk t (counted from
 * ks.t0) is read at w + s * ldw + step * t: a packed group of G columns is (ldw 8, step 8G),
 * w in place is (its row stride, step 8). Masked lanes load 0, so the partial chunk is fma(0, 0, s) as in
 * the portable form (a packed w is 0 there already). */
TGT static INLINE void chunk2(__m256 acc[6][8], const float *a, int lda, const float *w,
                              size_t ldw, int k, __m256i mask, int R, int S, int partial)
{
    __m256 x[8];
    #pragma GCC unroll 8
    for (int s = 0; s < S; s++)
        x[s] = partial ? _mm256_maskload_ps(w + s * ldw, mask) : _mm256_loadu_ps(w + s * ldw);
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        const float *ar = a + (size_t)r * lda + k;
        __m256 av = partial ? _mm256_maskload_ps(ar, mask) : _mm256_loadu_ps(ar);
        /* a register, not a memory operand: GCC would fold the load into every multiply-add
         * of the row, S loads where one does */
        __asm__("" : "+x"(av));
        #pragma GCC unroll 8
        for (int s = 0; s < S; s++) acc[r][s] = _mm256_fmadd_ps(av, x[s], acc[r][s]);
    }
}

TGT static INLINE void tile2(const float *a, int lda, const float *w, size_t ldw, size_t step,
                             int K, kspan ks, float *c, int ldc, int ncols, int add, int R, int S)
{
    __m256i mask = tail_mask_of(K);
    __m256 acc[6][8];
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 8
        for (int s = 0; s < S; s++)
            acc[r][s] = ks.t0 ? _mm256_loadu_ps(ks.lanes + (r * S + s) * 8) : _mm256_setzero_ps();
    int T = (K + 7) / 8, full = ks.t1 < K / 8 ? ks.t1 : K / 8;
    size_t t = ks.t0;
    for (; t < (size_t)full; t++) chunk2(acc, a, lda, w + step * (t - ks.t0), ldw, 8 * t, mask, R, S, 0);
    if (t < (size_t)ks.t1) chunk2(acc, a, lda, w + step * (t - ks.t0), ldw, 8 * t, mask, R, S, 1);
    if (ks.t1 < T) {
        for (int r = 0; r < R; r++)
            for (int s = 0; s < S; s++) _mm256_storeu_ps(ks.lanes + (r * S + s) * 8, acc[r][s]);
        return;
    }
    for (int r = 0; r < R; r++)
        for (int s = 0; s < ncols; s++) store_out(c + (size_t)r * ldc + s, hsum_fixed(acc[r][s]), add);
}

/* AVX-512: R rows (constant, <= 6) x 8 columns (4 packed pairs, pstride floats apart).
 * acc[r][p] holds the lane sums of columns 2p (low 256 bits) and 2p+1 (high); a row's 8
 * values of a chunk are broadcast to both halves, so each half runs the lane order of one
 * column. 24 accumulators + 4 w vectors + one row of a: 29 of the 32 registers. */
TGT512 static INLINE void chunk512(__m512 acc[6][4], const float *a, int lda, const float *wt,
                                   size_t pstride, int k, __m256i mask, int R, int partial)
{
    __m512 x0 = _mm512_loadu_ps(wt), x1 = _mm512_loadu_ps(wt + pstride),
           x2 = _mm512_loadu_ps(wt + 2 * pstride), x3 = _mm512_loadu_ps(wt + 3 * pstride);
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++) {
        const float *ar = a + (size_t)r * lda + k;
        __m512 av = _mm512_broadcast_f32x8(partial ? _mm256_maskload_ps(ar, mask) : _mm256_loadu_ps(ar));
        acc[r][0] = _mm512_fmadd_ps(av, x0, acc[r][0]);
        acc[r][1] = _mm512_fmadd_ps(av, x1, acc[r][1]);
        acc[r][2] = _mm512_fmadd_ps(av, x2, acc[r][2]);
        acc[r][3] = _mm512_fmadd_ps(av, x3, acc[r][3]);
    }
}

TGT512 static INLINE void tile512(const float *a, int lda, const float *wp, size_t pstride, int K,
                                  kspan ks, float *c, int ldc, int ncols, int add, int R)
{
    __m256i mask = tail_mask_of(K);
    __m512 acc[6][4];
    #pragma GCC unroll 6
    for (int r = 0; r < R; r++)
        #pragma GCC unroll 4
        for (int p = 0; p < 4; p++)
            acc[r][p] = ks.t0 ? _mm512_loadu_ps(ks.lanes + (r * 4 + p) * 16) : _mm512_setzero_ps();
    int T = (K + 7) / 8, full = ks.t1 < K / 8 ? ks.t1 : K / 8;
    size_t t = ks.t0;
    for (; t < (size_t)full; t++) chunk512(acc, a, lda, wp + 16 * (t - ks.t0), pstride, 8 * t, mask, R, 0);
    if (t < (size_t)ks.t1) chunk512(acc, a, lda, wp + 16 * (t - ks.t0), pstride, 8 * t, mask, R, 1);
    if (ks.t1 < T) {
        for (int r = 0; r < R; r++)
            for (int p = 0; p < 4; p++) _mm512_storeu_ps(ks.lanes + (r * 4 + p) * 16, acc[r][p]);
        return;
    }
    __mmask8 keep = (__mmask8)((1u << ncols) - 1);
    for (int r = 0; r < R; r++) {
        __m256 d = td_lanes_reduce8x8(acc[r]);
        float *o = c + (size_t)r * ldc;
        if (add) d = _mm256_add_ps(_mm256_maskz_loadu_ps(keep, o), d);
        _mm256_mask_storeu_ps(o, keep, d);
    }
}

/* The kernels on a packed panel (R rows, panel_cols columns), R made a constant so the
 * unrolled loops keep the accumulators in registers. */
#define BY_ROWS(R, call)                                                                       \
    switch (R) {                                                                               \
    case 6: call(6); break;                                                                    \
    case 5: call(5); break;                                                                    \
    case 4: call(4); break;                                                                    \
    case 3: call(3); break;                                                                    \
    case 2: call(2); break;                                                                    \
    default: call(1); break;                                                                   \
    }

TGT static void panel_avx2(const float *a, int lda, const float *wp, size_t pstride, int K,
                           kspan ks, float *c, int ldc, int ncols, int add, int R)
{
#define CALL(r) tile2(a, lda, wp, 8, 8 * AVX2_GROUP, K, ks, c, ldc, ncols, add, r, AVX2_GROUP)
    switch (R) {
    case 4: CALL(4); break;
    case 3: CALL(3); break;
    case 2: CALL(2); break;
    default: CALL(1); break;
    }
#undef CALL
}

TGT512 static void panel_avx512(const float *a, int lda, const float *wp, size_t pstride, int K,
                                kspan ks, float *c, int ldc, int ncols, int add, int R)
{
#define CALL(r) tile512(a, lda, wp, pstride, K, ks, c, ldc, ncols, add, r)
    BY_ROWS(R, CALL)
#undef CALL
}

/* Few rows (fewer than PACK_MIN_ROWS, or than LONG_K_ROWS over long K without AVX-512: decode,
 * small batches; see the header): the AVX2 tile reads w where it is, columns in panels of 16
 * (16 rows of w stay in cache while the rows pass). One row takes 8 columns per tile, two rows
 * 4 and three rows 3, so that 8 or 9 accumulators hide the multiply-add latency; the panel's
 * rest goes 2 columns at a time (a last single column as a pair of it with itself, stride 0,
 * stored once). */
TGT static void gemm_avx2_direct(const float *a, int lda, const float *w, int ldw, float *c,
                                 int ldc, int M, int N, int K, int add)
{
    kspan whole = {0, (K + 7) / 8, NULL};
    for (int j0 = 0; j0 < N; j0 += 16) {
        int j1 = j0 + 16 < N ? j0 + 16 : N;
        for (int i = 0; i < M; i += STRIP) {
            int R = M - i < STRIP ? M - i : STRIP, j = j0;
            const float *ai = a + (size_t)i * lda;
            float *ci = c + (size_t)i * ldc;
#define CALL(r, s, nc, ld) tile2(ai, lda, w + (size_t)j * ldw, ld, 8, K, whole, ci + j, ldc, nc, add, r, s)
            if (R == 1)
                for (; j + 8 <= j1; j += 8) CALL(1, 8, 8, ldw);
            else if (R == 2)
                for (; j + 4 <= j1; j += 4) CALL(2, 4, 4, ldw);
            else if (R == 3)
                for (; j + 3 <= j1; j += 3) CALL(3, 3, 3, ldw);
            for (; j < j1; j += 2) {
                int nc = j + 1 < j1 ? 2 : 1;
                size_t ld = nc == 2 ? (size_t)ldw : 0;
#define CALL2(r) CALL(r, 2, nc, ld)
                BY_ROWS(R, CALL2)
#undef CALL2
            }
#undef CALL
        }
    }
}

typedef void panel_fn(const float *a, int lda, const float *wp, size_t pstride, int K, kspan ks,
                      float *c, int ldc, int ncols, int add, int R);

/* A kernel on packed w: the tile function, its rows, its columns (a panel), and how many
 * columns a packed group holds. */
typedef struct { panel_fn *panel; int strip, panel_cols, group; } packed_kernel;

/* The packed driver, GotoBLAS's loops in the fixed order. Columns in blocks whose span of K
 * (KSPAN chunks, the last one shorter) packs into at most PACK_FLOATS floats, which stay in L2
 * while every strip of rows passes over them; each strip's span of a (strip x 8 KSPAN floats)
 * is read from L1 by all the panels of the block. Over a span, a tile's lane sums continue from
 * those parked at the end of the span before (one slot per strip and panel of the block, for
 * GROUP_ROWS rows at a time), so a's rows are read once per block and span, not once per panel
 * of columns (with whole rows of K packed, a K of 4864 left one 8-column panel per block and
 * read all of a from memory per 8 columns). While the strips pass, the next block's w is
 * prefetched. Scratch: the thread's (gemm_scratch.h); 0 when it cannot be had (the caller then
 * runs the direct kernel: same bits). */
static int gemm_packed(const float *a, int lda, const float *w, int ldw, float *c, int ldc,
                       int M, int N, int K, int add, const packed_kernel *pk)
{
    int T = (K + 7) / 8, P = pk->panel_cols, G = pk->group, strip = pk->strip;
    int span = T < KSPAN ? T : KSPAN, spans = (T + KSPAN - 1) / KSPAN;
    size_t panel_floats = (size_t)span * 8 * P;   /* one panel's packed span */
    size_t lane_floats = (size_t)strip * P * 8;   /* one tile's lane sums */
    int npan = (N + P - 1) / P;
    size_t fit = PACK_FLOATS / panel_floats;
    if (fit < (size_t)npan) npan = fit ? (int)fit : 1;
    int rows = spans > 1 && M > GROUP_ROWS ? GROUP_ROWS : M, nstrips = (rows + strip - 1) / strip;
    size_t nlanes = spans > 1 ? lane_floats * npan * nstrips : 0;
    float *buf = td_gemm_scratch(TD_SCRATCH_FIXED, panel_floats * npan + nlanes);
    if (!buf) return 0;
    float *lanes = buf + panel_floats * npan;
    for (int i0 = 0; i0 < M; i0 += rows) {
        int i1 = M - i0 < rows ? M : i0 + rows;
        for (int j0 = 0; j0 < N; j0 += P * npan) {
            int nj = N - j0 < P * npan ? N - j0 : P * npan;
            int ngroups = (nj + P - 1) / P * P / G;
            for (int t0 = 0; t0 < T; t0 += KSPAN) {
                int t1 = T - t0 < KSPAN ? T : t0 + KSPAN;
                size_t pstride = (size_t)(t1 - t0) * 8 * G;
                /* the block packed next: the next span, else the next columns' first, else
                 * the next rows' (from the start of w again) */
                int nt0 = t1 < T ? t1 : 0, nj0 = t1 < T ? j0 : j0 + nj < N ? j0 + nj : 0;
                int nt1 = T - nt0 < KSPAN ? T : nt0 + KSPAN;
                int nnj = N - nj0 < P * npan ? N - nj0 : P * npan;
                int last = t1 == T && j0 + nj == N && i1 == M;
                pack_span(w + (size_t)j0 * ldw, ldw, nj, K, t0, t1, ngroups, G, buf);
                for (int i = i0, s = 0; i < i1; i += strip, s++) {
                    if (!last)   /* a strip's share of the next block's lines */
                        prefetch_rows(w + (size_t)nj0 * ldw + 8 * nt0, sizeof(float) * ldw, nnj,
                                      sizeof(float) * ((8 * nt1 < K ? 8 * nt1 : K) - 8 * nt0), s,
                                      (i1 - i0 + strip - 1) / strip);
                    for (int j = 0; j < nj; j += P) {
                        kspan ks = {t0, t1, nlanes ? lanes + ((size_t)s * npan + j / P) * lane_floats : NULL};
                        pk->panel(a + (size_t)i * lda, lda, buf + (size_t)(j / G) * pstride, pstride,
                                  K, ks, c + (size_t)i * ldc + j0 + j, ldc,
                                  nj - j < P ? nj - j : P, add, i1 - i < strip ? i1 - i : strip);
                    }
                }
            }
        }
    }
    return 1;
}

static const packed_kernel k_avx2 = {panel_avx2, AVX2_STRIP, AVX2_GROUP, AVX2_GROUP};
static const packed_kernel k_avx512 = {panel_avx512, STRIP, 8, 2};
#endif

void td_gemm_fixed(const float *a, int lda, const float *w, int ldw, float *c, int ldc, int M,
                   int N, int K, int add)
{
#ifdef TD_HAVE_AVX2_PATH
    /* the CPU's level, capped by TIDAL_ISA (isa.h) and by the tests' knob */
    int avx2 = td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX2 && td_isa_level() >= TD_ISA_AVX2;
    int avx512 = avx2 && td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX512 && td_isa_level() >= TD_ISA_AVX512;
    int in_place = M < PACK_MIN_ROWS || (!avx512 && M < LONG_K_ROWS && K > 8 * KSPAN);
    if (avx2 && !in_place &&
        gemm_packed(a, lda, w, ldw, c, ldc, M, N, K, add, avx512 ? &k_avx512 : &k_avx2))
        return;
    if (avx2) {
        gemm_avx2_direct(a, lda, w, ldw, c, ldc, M, N, K, add);
        return;
    }
#endif
    gemm_portable(a, lda, w, ldw, c, ldc, M, N, K, add);
}

td_gemm_fixed_kernel td_gemm_fixed_max_kernel = TD_GEMM_FIXED_AVX512;
