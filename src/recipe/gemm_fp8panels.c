/* tidal — the fp8-fast GEMM over codes in k-major panels of 8 rows (the CPU backend's layout on a
 * CPU with AVX2 and no AVX-512; the order: gemm_fp8fast.c), and that layout. */
#include "gemm_fp8fast.h"
#include "tidal/isa.h"

#ifdef TD_HAVE_FP8FAST_SIMD
/* ---- AVX2, codes in k-major panels of 8 rows of w (td_fp8_codes_to_panels: panel p's code of
 * row 8p + i at k is byte k * 8 + i): the 8 columns' codes at k are 8 contiguous bytes, so one
 * decode (decode8) gives a ymm of 8 columns at k, and a step's lane l of a row is its own ymm
 * over 8 columns, as in the packed kernels: the step ends in vertical adds, without the row
 * tile's horizontal reduction per output and step (on Zen 3 that reduction's shuffles, not its
 * FMAs, bound the row tile). Strips of up to 4 rows x one panel; a step in two halves of two
 * phases each in the reduction's order (lanes 0 and 4, then 2 and 6: a0; 1 and 5, then 3 and 7:
 * a1), a0 waiting in memory while the second half holds the registers. Each lane's products are
 * the same fmaf chain in the same k order as the other kernels', a product past n left out. The
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
    if (M < PACKED_MIN_ROWS2 || !td_fp8fast_packed2(a, lda, NULL, 0, &cw, c, ldc, M, N, K, promote, bits))
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
