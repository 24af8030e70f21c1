/* Recipe-driven GEMM emulation against a long-double reference computed from the definition:
 *   ref = round_act( Σ_k in'[i,k] · w'[j,k] + bias[j] ), with in', w' the rounded operands.
 * Tolerances: the fp32 accumulation of K products differs from the exact sum by at most
 * ~K·2^-24·Σ|products| (standard bound; we use K·2^-23 for slack); after the output rounding
 * to bf16, results may differ by one bf16 ulp where the fp32 sum straddles a rounding point. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>
#include <math.h>
#include <cmocka.h>

#include "tidal/gemm.h"
#include "tidal/isa.h"
#include "tidal/formats.h"
#include "tidal/rng.h"

static float *randn(size_t n, uint64_t seed, float scale)
{
    td_rng r;
    td_rng_seed(&r, seed);
    float *x = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = (float)td_rng_normal(&r) * scale;
    return x;
}

/* Runs the three stages on (M, K) x (N, K). */
static void run_gemm(const td_recipe *r, const float *in, const float *w, const float *bias, int M,
                     int K, int N, float *out)
{
    float *inq = malloc((size_t)M * K * sizeof(float)), *wq = malloc((size_t)N * K * sizeof(float));
    float *scratch = malloc((td_gemm_scratch_floats(r, M, N) + 1) * sizeof(float));
    td_gemm_prepare_weight(r, w, N, K, wq);
    td_gemm_quant_input(r, in, M, K, inq);
    td_gemm_accumulate(r, inq, M, K, wq, K, N, out, N, scratch);
    td_gemm_finish(r, out, M, N, N, bias);
    free(inq); free(wq); free(scratch);
}

/* Max error of out vs the long-double reference, in units of the bound described above. */
static double check_vs_reference(const td_recipe *r, int M, int K, int N, int with_bias)
{
    float *in = randn((size_t)M * K, 1, 1.0f), *w = randn((size_t)N * K, 2, 0.05f);
    float *bias = with_bias ? randn((size_t)N, 3, 0.1f) : NULL;
    float *out = malloc((size_t)M * N * sizeof(float));
    run_gemm(r, in, w, bias, M, K, N, out);
    float *inq = malloc((size_t)M * K * sizeof(float)), *wq = malloc((size_t)N * K * sizeof(float));
    td_gemm_prepare_weight(r, w, N, K, wq);
    td_gemm_quant_input(r, in, M, K, inq);
    double worst = 0;
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            long double s = 0, a = 0;
            for (int k = 0; k < K; k++) {
                long double p = (long double)inq[(size_t)i * K + k] * wq[(size_t)j * K + k];
                s += p;
                a += fabsl(p);
            }
            if (bias) s += bias[j];
            float exact = (float)s;
            td_round_act(r, &exact, 1);
            double acc_bound = (double)a * K * 0x1p-23 + 1e-30;
            /* one output ulp of the activations dtype at this magnitude */
            int e;
            frexp(fabs((double)exact) + 1e-30, &e);
            int man = td_format_info(r->activations)->man_bits;
            double ulp = ldexp(1.0, e - 1 - man);
            double err = fabs((double)out[(size_t)i * N + j] - (double)exact);
            double units = err / (acc_bound + (r->activations == TD_F32 ? 0 : ulp));
            if (units > worst) worst = units;
        }
    free(in); free(w); free(bias); free(out); free(inq); free(wq);
    return worst;
}

static void test_fp32_and_bf16_within_bound(void **state)
{
    (void)state;
    const char *names[] = {"fp32", "bf16-train", "bf16-infer", "fp16-train", "fp16-infer"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const td_recipe *r = td_recipe_find_preset(names[i]);
        for (int M = 1; M <= 33; M += 32) {
            double u = check_vs_reference(r, M, 200, 48, 1);
            printf("%s M=%d: max error %.3f of the bound\n", names[i], M, u);
            assert_true(u <= 1.0);
        }
    }
}

static void test_fp8_fast_accumulation_bounded(void **state)
{
    (void)state;
    const td_recipe *r = td_recipe_find_preset("fp8-rollout");
    /* fp8-fast loses up to 2^-13 relative per truncation, K/32 truncations per promotion:
     * allow (K/32)·2^-13·Σ|p| on top of the fp32 bound: scale the check accordingly. */
    int M = 8, K = 512, N = 64;
    float *in = randn((size_t)M * K, 4, 1.0f), *w = randn((size_t)N * K, 5, 0.05f);
    float *out = malloc((size_t)M * N * sizeof(float)), *out_exact = malloc((size_t)M * N * sizeof(float));
    run_gemm(r, in, w, NULL, M, K, N, out);
    td_recipe exact = *r;
    exact.accumulate = TD_ACC_FP32;
    run_gemm(&exact, in, w, NULL, M, K, N, out_exact);
    size_t differ = 0;
    double worst_rel = 0;
    for (int i = 0; i < M * N; i++) {
        if (out[i] != out_exact[i]) differ++;
        double rel = fabs(out[i] - out_exact[i]) / (fabs(out_exact[i]) + 1e-3);
        if (rel > worst_rel) worst_rel = rel;
    }
    printf("fp8-fast vs fp32 accumulation on %dx%dx%d: %zu/%d outputs differ, max rel diff %.2e\n",
           M, K, N, differ, M * N, worst_rel);
    assert_true(differ > 0);                 /* the model changes results ...           */
    assert_true(worst_rel < (K / 32) * 0x1p-13 * 20);  /* ... within what truncation explains */
    /* with 23 kept bits and promotion over all of K, fp8-fast is fp32 in 32-product steps */
    td_recipe wide = *r;
    wide.acc_fraction_bits = 23;
    wide.promote_every = K;
    run_gemm(&wide, in, w, NULL, M, K, N, out);
    for (int i = 0; i < M * N; i++) assert_true(fabsf(out[i] - out_exact[i]) <= 1e-2f * fabsf(out_exact[i]) + 1e-2f);
    free(in); free(w); free(out); free(out_exact);
}

/* td_gemm_fp8_fast against the fp8-fast model written out with td_gemm_fixed (the portable
 * kernel) on each 32-product step, as td_gemm_accumulate computed it before the fused kernel:
 * every kernel the CPU has, bit for bit, on ragged shapes (K not a multiple of 8 or 32, blocks
 * not a multiple of 32), every promotion length the presets use and others, 13 and 23 bits
 * (M 25, 40, 41 and 200 take the packed kernels: AVX2's from 24 rows, AVX-512's from 40; their
 * row tails of 1 and 2); then td_gemm_accumulate under the fp8-rollout preset takes that order at
 * any M. */
static void fp8_fast_model(const float *a, const float *w, int M, int N, int K, int promote, int bits,
                           float *c)
{
    td_gemm_fixed_kernel saved = td_gemm_fixed_max_kernel;
    td_gemm_fixed_max_kernel = TD_GEMM_FIXED_PORTABLE;
    float *step = malloc((size_t)M * N * sizeof(float)), *part = malloc((size_t)M * N * sizeof(float));
    memset(c, 0, (size_t)M * N * sizeof(float));
    if (promote < 32) promote = 32;
    for (int k0 = 0; k0 < K; k0 += promote) {
        int k1 = k0 + promote < K ? k0 + promote : K;
        memset(part, 0, (size_t)M * N * sizeof(float));
        for (int s0 = k0; s0 < k1; s0 += 32) {
            int sn = s0 + 32 <= k1 ? 32 : k1 - s0;
            td_gemm_fixed(a + s0, K, w + s0, K, step, N, M, N, sn, 0);
            for (size_t j = 0; j < (size_t)M * N; j++) part[j] = td_trunc_fraction(part[j] + step[j], bits);
        }
        for (size_t j = 0; j < (size_t)M * N; j++) c[j] += part[j];
    }
    free(step); free(part);
    td_gemm_fixed_max_kernel = saved;
}

static void test_fp8_fast_kernel_matches_model(void **state)
{
    (void)state;
    const int shapes[][3] = {{1, 8, 128}, {3, 5, 37}, {6, 16, 256}, {7, 9, 100}, {13, 19, 300},
                             {20, 33, 896}, {1, 1, 5}, {9, 8, 0}, {8, 16, 300}, {40, 37, 1000}, {41, 16, 256},
                             {200, 18, 600}, {25, 21, 333}};
    const int promotes[] = {32, 128, 100, 65536};
    const int bits[] = {13, 23};
    td_gemm_fixed_kernel saved = td_gemm_fixed_max_kernel;
    int checked = 0;
    for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
        int M = shapes[si][0], N = shapes[si][1], K = shapes[si][2];
        float *a = randn((size_t)M * K + 1, 40 + si, 1.0f), *w = randn((size_t)N * K + 1, 60 + si, 0.05f);
        float *want = malloc((size_t)M * N * sizeof(float)), *got = malloc((size_t)M * N * sizeof(float));
        for (size_t pi = 0; pi < 4; pi++)
            for (size_t bi = 0; bi < 2; bi++) {
                fp8_fast_model(a, w, M, N, K, promotes[pi], bits[bi], want);
                for (int kern = TD_GEMM_FIXED_PORTABLE; kern <= TD_GEMM_FIXED_AVX512; kern++) {
                    td_gemm_fixed_max_kernel = (td_gemm_fixed_kernel)kern;
                    memset(got, 0xff, (size_t)M * N * sizeof(float));
                    td_gemm_fp8_fast(a, K, w, K, got, N, M, N, K, promotes[pi], bits[bi]);
                    if (memcmp(got, want, (size_t)M * N * sizeof(float)))
                        fail_msg("td_gemm_fp8_fast (kernel cap %d) differs from the model at M %d N %d K %d promote %d bits %d",
                                 kern, M, N, K, promotes[pi], bits[bi]);
                    checked++;
                }
            }
        free(a); free(w); free(want); free(got);
    }
    td_gemm_fixed_max_kernel = saved;
    /* through td_gemm_accumulate: the preset's promotion and bits, a decode-sized and a large M */
    const td_recipe *r = td_recipe_find_preset("fp8-rollout");
    for (int M = 4; M <= 40; M += 36) {
        int N = 24, K = 512;
        float *a = randn((size_t)M * K, 80, 1.0f), *w = randn((size_t)N * K, 81, 0.05f);
        float *want = malloc((size_t)M * N * sizeof(float)), *got = malloc((size_t)M * N * sizeof(float));
        fp8_fast_model(a, w, M, N, K, r->promote_every, r->acc_fraction_bits, want);
        td_gemm_accumulate(r, a, M, K, w, K, N, got, N, NULL);
        assert_memory_equal(got, want, (size_t)M * N * sizeof(float));
        free(a); free(w); free(want); free(got);
    }
    printf("td_gemm_fp8_fast: %d cases bit-identical to the step-by-step model (widest kernel here: %s)\n",
           checked, td_isa_level() >= TD_ISA_AVX512 ? "AVX-512" : td_isa_level() >= TD_ISA_AVX2 ? "AVX2" : "portable");
}

/* td_gemm_fp8_fast_codes (fp8 codes decoded in registers; the AVX-512 and AVX2 kernels) against
 * widening the same rows (td_fp8_decode_scaled_row per scale block) and td_gemm_fp8_fast: bit
 * for bit on random codes
 * of both formats, block shapes 128 x 128, per-tensor, 1 x 32 and 8-wide, rows offset into the
 * scale grid, ragged K, decode-sized M; a NaN code sends the call back to the caller (returns 0). */
/* n random codes of e4m3 (fmt 0) or e5m2 (1) without NaN or Inf, and ns block scales */
static void random_codes(td_rng *rng, int fmt, uint8_t *w, size_t n, float *scale, int ns)
{
    for (size_t i = 0; i < n; i++) {
        uint8_t cde = (uint8_t)td_rng_below(rng, 256);
        if ((cde & 0x7F) > (fmt ? 0x7B : 0x7E)) cde &= 0xBF;   /* no NaN / Inf codes */
        w[i] = cde;
    }
    for (int b = 0; b < ns; b++) scale[b] = (float)(0.001 + td_rng_uniform(rng)) * 0x1p-6f;
}

/* wide (N, K) = rows [row0, row0 + N) of the codes w (row-major, K each; w at row0) decoded with
 * their block scales (sr x sc, nbc per row of blocks), as the backend widens them */
static void widen_codes(td_format wf, const uint8_t *w, const float *scale, int row0, int N, int K, int sr, int sc,
                        int nbc, float *wide)
{
    for (int j = 0; j < N; j++)
        for (int k0 = 0; k0 < K; k0 += sc)
            td_fp8_decode_scaled_row(wf, w + (size_t)j * K + k0, scale[((row0 + j) / sr) * nbc + k0 / sc],
                                     wide + (size_t)j * K + k0, (size_t)(K - k0 < sc ? K - k0 : sc));
}

/* td_gemm_fp8_fast_panels (codes in k-major panels of 8 rows) against widening the same rows
 * (td_fp8_decode_scaled_row) and td_gemm_fp8_fast, bit for bit: both formats, random codes
 * (subnormals included), ragged K (a last partial step), N not a multiple of 8 (a partial panel),
 * 1-21 rows (strips of 4 and their tails), 25 and 40 (the packed kernel, its panels decoded from
 * the codes' panels; K 300 two chunks of it), row0 past a panel, scale blocks of 16 and 128 rows,
 * of 32 and 128 columns, promotion every 32, 96, 128 and 65536 products; and what it declines
 * (scale blocks of 8 columns or 12 rows that a panel straddles, row0 not a multiple of 8, a NaN
 * code). td_fp8_codes_to_panels / td_fp8_panels_piece round-trip every row. */
static void test_fp8_fast_panels_matches_widened(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 78);
    const int Ks[] = {64, 100, 300}, Ms[] = {1, 3, 4, 7, 8, 12, 16, 21, 25, 40}, proms[] = {128, 65536, 32, 96};
    int checked = 0, declined = 0;
    for (int fmt = 0; fmt < 2; fmt++)
        for (size_t ki = 0; ki < 3; ki++)
            for (int si = 0; si < 2; si++)
                for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
                    td_format wf = fmt ? TD_E5M2 : TD_E4M3;
                    int K = Ks[ki], M = Ms[mi], sc = si ? 32 : 128, sr = si ? 16 : 128, row0 = 8 * (int)(mi % 3);
                    int rows = row0 + 22 + (int)(mi & 1), N = rows - row0;   /* the call: rows [row0, rows) */
                    int nbc = (K + sc - 1) / sc, nbr = (rows + sr - 1) / sr;
                    uint8_t *w = malloc((size_t)rows * K), *pn = malloc((size_t)(rows + 7) / 8 * 8 * K), *back = malloc((size_t)K);
                    float *scale = malloc((size_t)nbr * nbc * sizeof(float)), *wide = malloc((size_t)N * K * sizeof(float));
                    float *a = randn((size_t)M * K, 60 + mi, 1.0f);
                    float *want = malloc((size_t)M * N * sizeof(float)), *got = malloc((size_t)M * N * sizeof(float));
                    random_codes(&rng, fmt, w, (size_t)rows * K, scale, nbr * nbc);
                    td_fp8_codes_to_panels(w, (size_t)rows, (size_t)K, pn);
                    for (int r = 0; r < rows; r++) {
                        td_fp8_panels_piece(pn, (size_t)K, (size_t)r, 0, (size_t)K, back);
                        assert_memory_equal(back, w + (size_t)r * K, (size_t)K);
                        td_fp8_panels_piece(pn, (size_t)K, (size_t)r, 7, (size_t)K - 9, back);
                        assert_memory_equal(back, w + (size_t)r * K + 7, (size_t)K - 9);
                    }
                    widen_codes(wf, w + (size_t)row0 * K, scale, row0, N, K, sr, sc, nbc, wide);
                    const uint8_t *p0 = pn + (size_t)row0 * K;   /* the panel holding row0 */
                    for (int pi = 0; pi < 4; pi++) {
                        int promote = proms[pi];
                        td_gemm_fp8_fast(a, K, wide, K, want, N, M, N, K, promote, 13);
                        if (!td_gemm_fp8_fast_panels(a, K, p0, wf, scale, row0, sr, sc, nbc, got, N, M, N, K, promote, 13, 0)) {
                            declined++;
                            continue;
                        }
                        if (memcmp(got, want, (size_t)M * N * sizeof(float)))
                            fail_msg("td_gemm_fp8_fast_panels differs (fmt %d K %d sc %d M %d row0 %d promote %d)", fmt, K, sc, M,
                                     row0, promote);
                        checked++;
                    }
                    /* declined: columns of scale blocks not a multiple of 32, a panel across two row
                     * blocks, row0 inside a panel, a NaN code */
                    assert_int_equal(td_gemm_fp8_fast_panels(a, K, p0, wf, scale, row0, sr, 8, nbc, got, N, M, N, K, 128, 13, 0), 0);
                    assert_int_equal(td_gemm_fp8_fast_panels(a, K, p0, wf, scale, row0, 12, sc, nbc, got, N, M, N, K, 128, 13, 0), 0);
                    assert_int_equal(td_gemm_fp8_fast_panels(a, K, p0, wf, scale, row0 + 1, sr, sc, nbc, got, N - 1, M, N - 1, K, 128, 13, 0), 0);
                    pn[(size_t)row0 * K + 8 * 3 + 2] = fmt ? 0x7D : 0x7F;
                    assert_int_equal(td_gemm_fp8_fast_panels(a, K, p0, wf, scale, row0, sr, sc, nbc, got, N, M, N, K, 128, 13, 0), 0);
                    free(w); free(pn); free(back); free(scale); free(wide); free(a); free(want); free(got);
                }
    /* K = 0: zeros, no scale read (nbc 0) */
    for (int M = 3; M <= 30; M += 27) {
        float a0[30], c0[30 * 5];
        uint8_t p1[8] = {0};
        for (int i = 0; i < 30 * 5; i++) c0[i] = 1.0f;
        if (td_gemm_fp8_fast_panels(a0, 0, p1, TD_E4M3, NULL, 0, 128, 128, 0, c0, 5, M, 5, 0, 128, 13, 1))
            for (int i = 0; i < M * 5; i++) assert_true(c0[i] == 0.0f);
    }
    printf("td_gemm_fp8_fast_panels: %d cases bit-identical to the widened rows, %d declined (%s)\n", checked, declined,
           td_gemm_fp8_panels_apply(TD_E4M3, 128, 128, 128) ? "the AVX2 kernel" : "no kernel here: every call declines");
    if (td_gemm_fp8_panels_apply(TD_E4M3, 128, 128, 128)) assert_true(checked > 0 && declined == 0);
}

/* td_fp8_codes_have_nan (the scan a weight's nan_free flag keeps from its preparation) against
 * td_decode's NaNs: every code of both formats, alone among zeros at the first, a 64-code
 * boundary and the last of 200 places, and in runs of 1..130 codes (the vector tail) */
static void test_fp8_codes_have_nan(void **state)
{
    (void)state;
    const td_format fmts[] = {TD_E4M3, TD_E5M2};
    const int places[] = {0, 63, 64, 199};
    uint8_t buf[200];
    int checked = 0;
    for (int f = 0; f < 2; f++)
        for (int c = 0; c < 256; c++) {
            int nan = isnan(td_decode(fmts[f], (uint32_t)c));
            for (int p = 0; p < 4; p++) {
                memset(buf, 0, sizeof buf);
                buf[places[p]] = (uint8_t)c;
                assert_int_equal(td_fp8_codes_have_nan(buf, sizeof buf, fmts[f]), nan);
                checked++;
            }
            for (int n = 1; n <= 130; n += 43) {
                memset(buf, 0, sizeof buf);
                buf[n - 1] = (uint8_t)c;
                assert_int_equal(td_fp8_codes_have_nan(buf, (size_t)n, fmts[f]), nan);
                assert_int_equal(td_fp8_codes_have_nan(buf, (size_t)n - 1, fmts[f]), 0);   /* past the end */
                checked++;
            }
        }
    printf("td_fp8_codes_have_nan: %d placements of every e4m3 and e5m2 code agree with td_decode's NaNs\n", checked);
}

static void test_fp8_fast_codes_matches_widened(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 77);
    /* M past a decode step's: 16 the AVX2 tile, 25 and 40 the AVX2 packed kernel (codes decoded
     * into its panels; 40 rows declined on AVX-512, whose widened rows take its packed kernel) */
    const int Ks[] = {37, 100, 256, 300}, scs[] = {128, 8, 32, 0 /* = K */}, Ms[] = {1, 4, 7, 16, 25, 40};
    int checked = 0, declined = 0;
    for (int fmt = 0; fmt < 2; fmt++)
        for (size_t ki = 0; ki < 4; ki++)
            for (size_t si = 0; si < 4; si++)
                for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++) {
                    int M = Ms[mi];
                    td_format wf = fmt ? TD_E5M2 : TD_E4M3;
                    int K = Ks[ki], N = 22 + (M & 1), row0 = 5, sc = scs[si] ? scs[si] : K, sr = si == 3 ? 1000 : 16;
                    int nbc = (K + sc - 1) / sc, nbr = (row0 + N + sr - 1) / sr;
                    uint8_t *w = malloc((size_t)N * K);
                    float *scale = malloc((size_t)nbr * nbc * sizeof(float)), *wide = malloc((size_t)N * K * sizeof(float));
                    float *a = randn((size_t)M * K, 90 + ki, 1.0f);
                    float *want = malloc((size_t)M * N * sizeof(float)), *got = malloc((size_t)M * N * sizeof(float));
                    random_codes(&rng, fmt, w, (size_t)N * K, scale, nbr * nbc);
                    widen_codes(wf, w, scale, row0, N, K, sr, sc, nbc, wide);
                    for (int pi = 0; pi < 2; pi++) {
                        int promote = pi ? 65536 : 128;
                        td_gemm_fp8_fast(a, K, wide, K, want, N, M, N, K, promote, 13);
                        if (!td_gemm_fp8_fast_codes(a, K, w, K, wf, scale, row0, sr, sc, nbc, got, N, M, N, K, promote, 13, 0)) {
                            declined++;
                            continue;
                        }
                        if (memcmp(got, want, (size_t)M * N * sizeof(float)))
                            fail_msg("td_gemm_fp8_fast_codes differs (fmt %d K %d sc %d M %d promote %d)", fmt, K, sc, M, promote);
                        checked++;
                    }
                    w[3] = fmt ? 0x7D : 0x7F;   /* a NaN code: declined */
                    assert_int_equal(td_gemm_fp8_fast_codes(a, K, w, K, wf, scale, row0, sr, sc, nbc, got, N, M, N, K, 128, 13, 0), 0);
                    free(w); free(scale); free(wide); free(a); free(want); free(got);
                }
    /* e4m3 block scales at the edges of the AVX2 kernel's exact factor (2^120 x scale, scales <= 2^7):
     * 2^7 and 2^-126 (a subnormal factor's product) run and match; 200 is declined there (the
     * AVX-512 kernel's factor, 256 x scale, takes it) */
    const float edge[] = {0x1p+7f, 0x1p-126f, 200.0f};
    for (int e = 0; e < 3; e++) {
        int M = 4, N = 5, K = 64;
        uint8_t w[5 * 64];
        float scale[1] = {edge[e]}, wide[5 * 64], want[4 * 5], got[4 * 5];
        float *a = randn((size_t)M * K, 97 + e, 1.0f);
        for (int i = 0; i < N * K; i++) w[i] = (uint8_t)(i * 37 % 256 == 0x7F || i * 37 % 256 == 0xFF ? 0 : i * 37 % 256);
        for (int j = 0; j < N; j++) td_fp8_decode_scaled_row(TD_E4M3, w + j * K, edge[e], wide + j * K, (size_t)K);
        td_gemm_fp8_fast(a, K, wide, K, want, N, M, N, K, 128, 13);
        int ran = td_gemm_fp8_fast_codes(a, K, w, K, TD_E4M3, scale, 0, N, K, 1, got, N, M, N, K, 128, 13, 0);
        int avx512 = td_isa_level() >= TD_ISA_AVX512 && td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX512;
        if (td_isa_level() >= TD_ISA_AVX2 && td_gemm_fixed_max_kernel >= TD_GEMM_FIXED_AVX2)
            assert_int_equal(ran, e < 2 || avx512);
        if (ran) {
            if (memcmp(got, want, sizeof want)) fail_msg("td_gemm_fp8_fast_codes differs at block scale %g", (double)edge[e]);
            checked++;
        } else {
            declined++;
        }
        free(a);
    }
    printf("td_gemm_fp8_fast_codes: %d cases bit-identical to the widened rows, %d declined (%s)\n", checked, declined,
           td_isa_level() >= TD_ISA_AVX512 ? "the AVX-512 kernel" : td_isa_level() >= TD_ISA_AVX2 ? "the AVX2 kernel"
           : "no kernel here: every call declines, the widened path runs");
    if (td_isa_level() >= TD_ISA_AVX2) assert_true(checked > 0);
}

static void test_split_k_is_sum_of_halves(void **state)
{
    (void)state;
    td_recipe r = *td_recipe_find_preset("fp32");
    r.split_k = 2;
    int M = 4, K = 64, N = 16;
    float *in = randn((size_t)M * K, 6, 1.0f), *w = randn((size_t)N * K, 7, 1.0f);
    float *out = malloc((size_t)M * N * sizeof(float)), *h = malloc((size_t)M * N * sizeof(float));
    td_gemm_accumulate(&r, in, M, K, w, K, N, out, N, NULL);
    /* first half into h, then second half added with beta = 1, by hand */
    td_recipe one = r;
    one.split_k = 1;
    float *in_a = malloc((size_t)M * 32 * sizeof(float)), *w_a = malloc((size_t)N * 32 * sizeof(float));
    float *h2 = malloc((size_t)M * N * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < M; i++) memcpy(in_a + i * 32, in + i * K + pass * 32, 32 * sizeof(float));
        for (int j = 0; j < N; j++) memcpy(w_a + j * 32, w + j * K + pass * 32, 32 * sizeof(float));
        td_gemm_accumulate(&one, in_a, M, 32, w_a, 32, N, pass ? h2 : h, N, NULL);
    }
    for (int i = 0; i < M * N; i++) assert_true(out[i] == h[i] + h2[i]);
    free(in); free(w); free(out); free(h); free(in_a); free(w_a); free(h2);
}

static void test_weight_and_input_rounding(void **state)
{
    (void)state;
    const td_recipe *bf = td_recipe_find_preset("bf16-train");
    float w[4] = {0.1f, 1.0f / 3, -2.5f, 1e-3f}, out[4];
    td_gemm_prepare_weight(bf, w, 2, 2, out);
    for (int i = 0; i < 4; i++) assert_true(out[i] == td_bf16_to_f32(td_f32_to_bf16(w[i])));
    const td_recipe *f8 = td_recipe_find_preset("fp8-rollout");
    /* a 2x2 weight block: amax 2.5, vLLM scale 2.5/448; every value is a multiple of it */
    td_gemm_prepare_weight(f8, w, 2, 2, out);
    float s = 2.5f / 448.0f;
    for (int i = 0; i < 4; i++) {
        float q = td_e4m3_to_f32(td_f32_to_e4m3(w[i] / s, TD_SATFINITE));
        assert_true(out[i] == q * s);
    }
}

/* batch_invariant: a row computed alone equals the same row computed among 7 others, bit for
 * bit; without it, M = 1 takes GEMV and may differ in the last bits. */
static void test_batch_invariance(void **state)
{
    (void)state;
    td_recipe r = *td_recipe_find_preset("fp32");
    int M = 8, K = 896, N = 64;
    float *in = randn((size_t)M * K, 8, 1.0f), *w = randn((size_t)N * K, 9, 0.05f);
    float *all = malloc((size_t)M * N * sizeof(float)), *one = malloc((size_t)N * sizeof(float));
    for (int inv = 0; inv < 2; inv++) {
        r.batch_invariant = inv;
        td_gemm_accumulate(&r, in, M, K, w, K, N, all, N, NULL);
        size_t differ = 0;
        for (int i = 0; i < M; i++) {
            td_gemm_accumulate(&r, in + (size_t)i * K, 1, K, w, K, N, one, N, NULL);
            for (int j = 0; j < N; j++) differ += one[j] != all[(size_t)i * N + j];
        }
        printf("batch_invariant=%d: %zu of %d outputs differ between a row alone and in a batch of %d\n",
               inv, differ, M * N, M);
        if (inv) assert_int_equal(differ, 0);
    }
    free(in); free(w); free(all); free(one);
}

/* td_gemm_fixed_w16 (weights as bf16 / fp16 codes, widened in registers) against td_gemm_fixed
 * on the decoded weights, bit for bit, on every kernel this CPU has (AVX-512, AVX2, portable):
 * shapes with every row-block and column-block remainder, K with and without a tail, strides
 * wider than the rows, accumulate into C or not; codes include subnormals, Inf and NaN.
 * Tolerance: none, but for NaN results, equal as NaN (payloads follow the FMA's operand form). */
static void test_fixed_w16_matches_fixed(void **state)
{
    (void)state;
    const int Ms[] = {1, 2, 3, 5, 8, 9, 13}, Ns[] = {1, 2, 5, 6, 7, 9, 10, 13}, Ks[] = {1, 7, 8, 9, 64, 100, 257};
    const int kernels[] = {0, 2, 1};   /* td_gemm_w16_force: auto, AVX2, portable */
    td_rng rng;
    td_rng_seed(&rng, 99);
    int checked = 0;
    for (int f = 0; f < 2; f++) {
        td_format wf = f ? TD_F16 : TD_BF16;
        for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
            for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
                for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
                    int M = Ms[mi], N = Ns[ni], K = Ks[ki], lda = K + 3, ldw = K + 5, ldc = N + 2;
                    float *a = randn((size_t)M * lda, 1000 + M * 7 + K, 1.0f);
                    uint16_t *w = malloc((size_t)N * ldw * sizeof(uint16_t));
                    float *wd = malloc((size_t)N * K * sizeof(float));
                    for (size_t i = 0; i < (size_t)N * ldw; i++) {
                        float v = (float)td_rng_normal(&rng) * 0.05f;
                        w[i] = (uint16_t)td_encode(wf, v, TD_SATFINITE);
                        uint64_t u = td_rng_next(&rng) % 1000;   /* a few specials */
                        if (u == 0) w[i] = wf == TD_F16 ? 0x7E01 : 0x7FC1;      /* NaN */
                        else if (u == 1) w[i] = wf == TD_F16 ? 0xFC00 : 0xFF80; /* -Inf */
                        else if (u < 20) w[i] = (uint16_t)(td_rng_next(&rng) & 0x83FF & (wf == TD_F16 ? 0xFFFF : 0x807F)); /* subnormal */
                    }
                    for (int j = 0; j < N; j++) td_decode_row(wf, w + (size_t)j * ldw, wd + (size_t)j * K, (size_t)K);
                    float *want = malloc((size_t)M * ldc * sizeof(float)), *got = malloc((size_t)M * ldc * sizeof(float));
                    for (int add = 0; add < 2; add++) {
                        for (size_t i = 0; i < (size_t)M * ldc; i++) want[i] = (float)i * 0.25f;
                        td_gemm_fixed(a, lda, wd, K, want, ldc, M, N, K, add);
                        for (size_t kk = 0; kk < sizeof kernels / sizeof *kernels; kk++) {
                            td_gemm_w16_force = kernels[kk];
                            for (size_t i = 0; i < (size_t)M * ldc; i++) got[i] = (float)i * 0.25f;
                            td_gemm_fixed_w16(a, lda, w, ldw, wf, got, ldc, M, N, K, add);
                            for (size_t i = 0; i < (size_t)M * ldc; i++) {
                                /* a NaN result is NaN on both sides; which payload an FMA passes on
                                 * depends on the register form the compiler picked (IEEE leaves it open) */
                                if (isnan(got[i]) && isnan(want[i])) continue;
                                if (memcmp(got + i, want + i, 4) != 0)
                                    fail_msg("%s M=%d N=%d K=%d add=%d force=%d: row %zu col %zu %a, td_gemm_fixed %a",
                                             td_format_info(wf)->name, M, N, K, add, kernels[kk], i / ldc,
                                             i % ldc, got[i], want[i]);
                            }
                            checked++;
                        }
                        td_gemm_w16_force = 0;
                    }
                    free(a); free(w); free(wd); free(want); free(got);
                }
    }
    printf("td_gemm_fixed_w16: %d cases bit-identical to td_gemm_fixed (kernel here: %s)\n", checked,
           td_gemm_w16_kernel() == 2 ? "AVX-512" : td_gemm_w16_kernel() == 1 ? "AVX2" : "portable");
}

/* td_gemm_bf16dp's path for K = 1 and 2 (a rank-1/2 LoRA's GEMMs: lane 0 alone, then + 0) against
 * td_gemm_bf16dp_ref over every pair (K = 1) and 20,000 quadruples (K = 2) of 34 bf16 values: both
 * zeros, subnormals (zeros to the instruction), the least normals, products that underflow to
 * subnormals or zero and that overflow, infinities, NaN (compared as NaN), ordinary values */
static void test_bf16dp_small_k(void **state)
{
    (void)state;
    static const float base[] = {0.0f, 1.0f, 1.5f, 3.0f, 0x1p-126f, 0x1.fep-126f, 0x1p-70f, 0x1p-63f, 0x1p-60f,
                                 0x1p64f, 0x1p100f, 7.0e37f, 0.1f, INFINITY, NAN, 0x1p-130f, 2.0f};
    enum { NB = sizeof base / sizeof *base, NV = 2 * NB };
    uint16_t v[NV];
    for (int i = 0; i < NB; i++) {
        v[2 * i] = td_f32_to_bf16(base[i]).bits;
        v[2 * i + 1] = v[2 * i] ^ 0x8000;
    }
    int checked = 0;
    for (int add = 0; add < 2; add++) {
        for (int i = 0; i < NV; i++)   /* K = 1: a row of every value against a column of every value */
            for (int j = 0; j < NV; j++) {
                float want = 0.25f, got = 0.25f;
                td_gemm_bf16dp_ref(&v[i], 1, &v[j], 1, &want, 1, 1, 1, 1, add);
                td_gemm_bf16dp(&v[i], 1, &v[j], 1, &got, 1, 1, 1, 1, add);
                if (!(isnan(want) && isnan(got)) && memcmp(&want, &got, 4))
                    fail_msg("K=1 add=%d: %a x %a: %a, the reference %a", add, td_bf16_to_f32((td_bf16){v[i]}),
                             td_bf16_to_f32((td_bf16){v[j]}), got, want);
                checked++;
            }
        td_rng rng;
        td_rng_seed(&rng, 11);
        for (int t = 0; t < 10000; t++) {   /* K = 2 */
            uint16_t a[2] = {v[td_rng_below(&rng, NV)], v[td_rng_below(&rng, NV)]};
            uint16_t w[2] = {v[td_rng_below(&rng, NV)], v[td_rng_below(&rng, NV)]};
            float want = -0.0f, got = -0.0f;
            td_gemm_bf16dp_ref(a, 2, w, 2, &want, 1, 1, 1, 2, add);
            td_gemm_bf16dp(a, 2, w, 2, &got, 1, 1, 1, 2, add);
            if (!(isnan(want) && isnan(got)) && memcmp(&want, &got, 4))
                fail_msg("K=2 add=%d: %a, the reference %a", add, got, want);
            checked++;
        }
    }
    printf("td_gemm_bf16dp, K = 1 and 2: %d products and pairs bit-identical to the reference\n", checked);
}

/* The flush rule at the edge of the normals: sums whose exact value lies just below 2^-126 but
 * rounds to it (2^-126 - 2^-150, from 2^-63 * 2^-63 and -2^-75 * 2^-75) must become zeros, as the
 * instruction gives; 4 x 4 blocks of such pairs (K = 3, so the kernel runs where the CPU has it) and
 * their mirror images, each row against each column, against the reference */
static void test_bf16dp_tiny(void **state)
{
    (void)state;
    static const float vals[] = {0x1p-63f, -0x1p-63f, 0x1p-75f, -0x1p-75f, 0x1p-126f, -0x1p-126f, 1.0f, -1.0f,
                                 0x1.02p-63f, 0x1p-64f, 0x1.8p-75f, 0x1p-76f, 0.0f, 0x1p-125f, 0x1.fcp-127f, 3.0f};
    enum { NV = sizeof vals / sizeof *vals, K = 3 };
    td_rng rng;
    td_rng_seed(&rng, 19);
    int checked = 0, zeros = 0;
    for (int t = 0; t < 2000; t++) {
        uint16_t a[16 * K], w[16 * K];
        for (int i = 0; i < 16 * K; i++) {
            a[i] = td_f32_to_bf16(vals[td_rng_below(&rng, NV)]).bits;
            w[i] = td_f32_to_bf16(vals[td_rng_below(&rng, NV)]).bits;
        }
        float want[256], got[256];
        td_gemm_bf16dp_ref(a, K, w, K, want, 16, 16, 16, K, 0);
        td_gemm_bf16dp(a, K, w, K, got, 16, 16, 16, K, 0);
        if (memcmp(got, want, sizeof got)) fail_msg("tiny sums: the kernel differs from the reference (trial %d)", t);
        for (int i = 0; i < 256; i++) zeros += want[i] == 0;
        checked += 256;
    }
    /* the case that found the rule: 2^-63 * 2^-63 + (-2^-75) * 2^-75, k1 first */
    uint16_t a1[3] = {td_f32_to_bf16(-0x1p-75f).bits, td_f32_to_bf16(0x1p-63f).bits, 0};
    uint16_t w1[3] = {td_f32_to_bf16(0x1p-75f).bits, td_f32_to_bf16(0x1p-63f).bits, 0};
    float r = 1.0f;
    td_gemm_bf16dp_ref(a1, 3, w1, 3, &r, 1, 1, 1, 3, 0);
    assert_true(r == 0.0f && !signbit(r));
    printf("td_gemm_bf16dp: %d sums at the edge of the normals bit-identical to the reference (%d zeros; kernel %s)\n",
           checked, zeros, td_gemm_bf16dp_kernel_name());
}

/* td_gemm_bf16dp (the CPU's bf16 dot products, where it has them) against td_gemm_bf16dp_ref,
 * the same order in portable C, bit for bit: K with and without a tail of the 32-wide blocks,
 * every row and column remainder, strides, add; operands with subnormals (zeros in that order)
 * and exact cancellations. Then the order against an fp32 GEMM of the same values: the sum
 * differs by summation order only, within K * 2^-23 * sum |products| (the standard bound). */
static void test_bf16dp_matches_ref(void **state)
{
    (void)state;
    const int Ms[] = {1, 3, 4, 9, 17}, Ns[] = {1, 5, 6, 7, 13, 50}, Ks[] = {1, 2, 31, 32, 33, 96, 200, 1600};   /* 1600: the 4 x 6 blocks */
    td_rng rng;
    td_rng_seed(&rng, 7);
    int checked = 0;
    for (size_t mi = 0; mi < sizeof Ms / sizeof *Ms; mi++)
        for (size_t ni = 0; ni < sizeof Ns / sizeof *Ns; ni++)
            for (size_t ki = 0; ki < sizeof Ks / sizeof *Ks; ki++) {
                int M = Ms[mi], N = Ns[ni], K = Ks[ki], lda = K + 2, ldw = K + 33, ldc = N + 1;
                uint16_t *a = malloc((size_t)M * lda * 2), *w = malloc((size_t)N * ldw * 2);
                for (size_t i = 0; i < (size_t)M * lda; i++) {
                    a[i] = td_f32_to_bf16((float)td_rng_normal(&rng)).bits;
                    if (td_rng_below(&rng, 50) == 0) a[i] = (uint16_t)(td_rng_next(&rng) & 0x807F);   /* subnormal */
                }
                for (size_t i = 0; i < (size_t)N * ldw; i++) w[i] = td_f32_to_bf16((float)td_rng_normal(&rng) * 0.1f).bits;
                if (K > 4) w[3] = a[3] ^ 0x8000, a[3] = w[3] ^ 0x8000;   /* a cancelling pair */
                float *want = malloc((size_t)M * ldc * 4), *got = malloc((size_t)M * ldc * 4);
                for (int add = 1; add >= 0; add--) {   /* want ends as the product alone */
                    for (size_t i = 0; i < (size_t)M * ldc; i++) want[i] = got[i] = (float)i;
                    td_gemm_bf16dp_ref(a, lda, w, ldw, want, ldc, M, N, K, add);
                    td_gemm_bf16dp(a, lda, w, ldw, got, ldc, M, N, K, add);
                    if (memcmp(got, want, (size_t)M * ldc * 4))
                        fail_msg("bf16dp M=%d N=%d K=%d add=%d: kernel differs from the reference", M, N, K, add);
                    checked++;
                }
                for (int i = 0; i < M; i++)   /* against the fp32 sum of the same values */
                    for (int j = 0; j < N; j++) {
                        double exact = 0, mag = 0;
                        for (int k = 0; k < K; k++) {
                            float x = td_bf16_to_f32((td_bf16){a[(size_t)i * lda + k]});
                            float y = td_bf16_to_f32((td_bf16){w[(size_t)j * ldw + k]});
                            if (fabsf(x) < 0x1p-126f) x = 0;   /* subnormals count as zeros */
                            exact += (double)x * y;
                            mag += fabs((double)x * y);
                        }
                        assert_true(fabs(want[(size_t)i * ldc + j] - exact) <= K * 0x1p-23 * mag + 1e-30);
                    }
                free(a); free(w); free(want); free(got);
            }
    /* rows past the FMA kernel's chunk of split rows (2 MB: 340 rows at K = 1500): three chunks,
     * the last one short and ending inside a block of 4; then its spans of K (above 1536: 1024
     * products a span, 128 rows a chunk): K = 3072 (three whole spans), 2200 (the last short and
     * masked), rows past two chunks, columns past a panel of 48 */
    const int big[][3] = {{703, 9, 1500}, {270, 53, 3072}, {133, 50, 2200}};
    for (size_t bi = 0; bi < sizeof big / sizeof *big; bi++) {
        int M = big[bi][0], N = big[bi][1], K = big[bi][2], lda = K + 5, ldw = K + 7, ldc = N + 2;
        uint16_t *a = malloc((size_t)M * lda * 2), *w = malloc((size_t)N * ldw * 2);
        float *want = malloc((size_t)M * ldc * 4), *got = malloc((size_t)M * ldc * 4);
        for (size_t i = 0; i < (size_t)M * lda; i++) a[i] = td_f32_to_bf16((float)td_rng_normal(&rng)).bits;
        for (size_t i = 0; i < (size_t)N * ldw; i++) w[i] = td_f32_to_bf16((float)td_rng_normal(&rng)).bits;
        for (size_t i = 0; i < (size_t)M * ldc; i++) want[i] = got[i] = (float)i;
        td_gemm_bf16dp_ref(a, lda, w, ldw, want, ldc, M, N, K, 1);
        td_gemm_bf16dp(a, lda, w, ldw, got, ldc, M, N, K, 1);
        if (memcmp(got, want, (size_t)M * ldc * 4)) fail_msg("bf16dp M=%d N=%d K=%d: kernel differs from the reference", M, N, K);
        checked++;
        free(a); free(w); free(want); free(got);
    }
    printf("td_gemm_bf16dp: %d cases bit-identical to the reference order (kernel on this CPU: %s)\n",
           checked, td_gemm_bf16dp_kernel_name());
    /* in-place packing keeps every code */
    float x[37];
    uint16_t want16[37];
    for (int i = 0; i < 37; i++) {
        x[i] = td_bf16_to_f32(td_f32_to_bf16((float)i * 1.37f - 20.0f));
        want16[i] = td_f32_to_bf16(x[i]).bits;
    }
    assert_memory_equal(td_gemm_pack_bf16(x, 37), want16, sizeof want16);
    /* td_gemm_bf16_codes (16 a step on AVX-512) at every length to 100, in place and not: the
     * upper halves of any pattern */
    for (size_t n = 0; n <= 100; n++) {
        uint32_t u[100];
        uint16_t want[100], out[100];
        for (size_t i = 0; i < n; i++) {
            u[i] = (uint32_t)(i * 2654435761u) ^ (uint32_t)(n << 20);
            want[i] = (uint16_t)(u[i] >> 16);
        }
        if (n) {
            assert_memory_equal(td_gemm_bf16_codes((const float *)u, n, out), want, n * 2);
            assert_memory_equal(td_gemm_bf16_codes((const float *)u, n, (uint16_t *)u), want, n * 2);
        }
    }
}

/* src/backend/cpu_backward.c: bf16 codes transposed (the backward's operands, encoded from fp32
 * values), the 16 x 16 AVX-512 register blocks against the element-by-element form, and both
 * against td_f32_to_bf16 of each element (ties, NaN, Inf, overflow to Inf, subnormals) */
void td_test_codes_transposed(const float *src, size_t rows, size_t cols, uint16_t *dst, int scalar);

static void test_codes_transposed(void **state)
{
    (void)state;
    const size_t shapes[][2] = {{1, 1}, {16, 16}, {17, 33}, {32, 16}, {48, 80}, {15, 64}, {64, 15}, {129, 70},
                                {512, 256}};
    td_rng rng;
    td_rng_seed(&rng, 11);
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        size_t R = shapes[s][0], C = shapes[s][1];
        float *x = malloc(R * C * 4);
        uint16_t *want = malloc(R * C * 2), *got = malloc(R * C * 2);
        for (size_t i = 0; i < R * C; i++) {   /* bf16 values (odd shapes), fp32 ones that round (even) */
            float v = (float)td_rng_normal(&rng);
            x[i] = s % 2 ? td_bf16_to_f32(td_f32_to_bf16(v)) : v;
        }
        if (R * C > 40) {   /* ties both ways, NaN, Inf, a value that rounds to Inf, a subnormal */
            const uint32_t sp[] = {0x3F808000u, 0x3F818000u, 0x7FC00001u, 0xFF800000u, 0x7F7FFFFFu, 0x00000101u, 0xFFA00000u};
            for (size_t k = 0; k < sizeof sp / sizeof *sp; k++) memcpy(x + 3 * k + 1, sp + k, 4);
        }
        td_test_codes_transposed(x, R, C, want, 1);
        td_test_codes_transposed(x, R, C, got, 0);
        if (memcmp(want, got, R * C * 2)) fail_msg("codes_transposed %zu x %zu: the blocked form differs", R, C);
        for (size_t i = 0; i < R; i++)   /* and it is the transpose */
            for (size_t j = 0; j < C; j++) assert_int_equal(got[j * R + i], td_f32_to_bf16(x[i * C + j]).bits);
        free(x); free(want); free(got);
    }
    printf("codes_transposed: %zu shapes, the %s form equals the scalar one\n", sizeof shapes / sizeof *shapes,
           td_isa_level() >= TD_ISA_AVX512 ? "AVX-512" : "portable");
}

/* OpenBLAS's core (src/util/isa.c): where OpenBLAS falls back to an old core (Prescott on a Xeon
 * its table does not know) on a CPU with AVX2 + FMA, every program linking tidal runs with the
 * CPU's family instead, set before main; a core the user names in OPENBLAS_CORETYPE stands. Checked
 * on this program started again without the variable and with it. Reference: OpenBLAS's corename
 * table (driver/others/dynamic.c), the old cores being those without AVX2. */
static int old_core(const char *c)
{
    static const char *const old[] = {"Unknown", "Katmai", "Coppermine", "Northwood", "Prescott", "Banias",
        "Atom", "Core2", "Penryn", "Dunnington", "Nehalem", "Athlon", "Opteron", "Opteron_SSE3",
        "Barcelona", "Nano", "Sandybridge", "Bobcat"};
    for (size_t i = 0; i < sizeof old / sizeof *old; i++)
        if (!strcasecmp(c, old[i])) return 1;
    return 0;
}

static void core_of_self(const char *env, char *out, size_t n)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "env %s /proc/%d/exe --blas-core", env, (int)getpid());
    FILE *p = popen(cmd, "r");
    assert_non_null(p);
    out[0] = 0;
    if (!fgets(out, (int)n, p)) out[0] = 0;
    out[strcspn(out, "\n")] = 0;
    assert_int_equal(pclose(p), 0);
}

static void test_blas_core(void **state)
{
    (void)state;
    if (!td_blas_core()) { printf("blas core: not OpenBLAS, nothing to check\n"); return; }
    char unset[64], named[64];
    core_of_self("-u OPENBLAS_CORETYPE", unset, sizeof unset);
    core_of_self("OPENBLAS_CORETYPE=Prescott", named, sizeof named);
    int modern = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    printf("blas core: %s when unset (CPU %s AVX2 + FMA), %s when the user names Prescott\n", unset,
           modern ? "with" : "without", named);
    if (modern) assert_false(old_core(unset));
    assert_string_equal(named, "Prescott");
    assert_null(td_blas_core_to_force());   /* nothing left to force in this process */
}

int main(int argc, char **argv)
{
    if (argc > 1 && !strcmp(argv[1], "--blas-core")) { printf("%s\n", td_blas_core()); return 0; }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_weight_and_input_rounding),
        cmocka_unit_test(test_fp32_and_bf16_within_bound),
        cmocka_unit_test(test_split_k_is_sum_of_halves),
        cmocka_unit_test(test_fp8_fast_accumulation_bounded),
        cmocka_unit_test(test_fp8_fast_kernel_matches_model),
        cmocka_unit_test(test_fp8_fast_codes_matches_widened),
        cmocka_unit_test(test_fp8_fast_panels_matches_widened),
        cmocka_unit_test(test_fp8_codes_have_nan),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_fixed_w16_matches_fixed),
        cmocka_unit_test(test_bf16dp_matches_ref),
        cmocka_unit_test(test_blas_core),
        cmocka_unit_test(test_bf16dp_small_k),
        cmocka_unit_test(test_bf16dp_tiny),
        cmocka_unit_test(test_codes_transposed),
    };
    return cmocka_run_group_tests_name("gemm", tests, NULL, NULL);
}
