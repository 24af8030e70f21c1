/* FP8 scaling recipes: hand-checked cases and invariants.
 *  - hand-checked: scales and codes worked out by hand for small blocks;
 *  - error bound: every dequantised element is within half a quantum of the format at its
 *    scaled magnitude (relative 2^-(M+1) for normals, s * min_subnormal / 2 below), plus the
 *    rounding of the fp32 product code * s (2^-24 relative) and of the scaling step itself
 *    (x/s or x*k in fp32: another 2^-24 relative);
 *  - all-zero blocks give zeros, never NaN;
 *  - power-of-two scales are powers of two; MX scales are the smallest power of two >= amax/448;
 *  - vLLM (div) and Transformer Engine (mul) arithmetic differ in the last bit of some codes. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <math.h>
#include <string.h>
#include <cmocka.h>

#include "tidal/scaling.h"
#include "tidal/formats.h"
#include "tidal/rng.h"
#include "tidal/isa.h"

static td_fp8_scheme scheme(td_scale_granularity g, td_scale_arith a, bool pow2)
{
    return (td_fp8_scheme){.fmt = TD_E4M3, .gran = g, .arith = a, .pow2 = pow2, .sat = TD_SATFINITE};
}

static void test_hand_checked(void **state)
{
    (void)state;
    /* amax 3.5: vLLM s = 3.5/448 = 2^-7 exactly; TE k = 448/3.5 = 128, s = 1/128 */
    const float x[4] = {1.0f, -2.0f, 3.5f, 0.0f};
    uint8_t q[4];
    float s;
    td_fp8_scheme div = scheme(TD_SCALE_TENSOR, TD_ARITH_DIV, false);
    td_fp8_quantize(&div, x, 1, 4, q, &s);
    assert_true(s == 0x1p-7f);
    /* 1/2^-7 = 128 = 2^7 -> e4m3 0 1110 000 = 0x70; -256 -> 0xF8; 448 -> 0x7E; 0 -> 0 */
    assert_int_equal(q[0], 0x70);
    assert_int_equal(q[1], 0xF8);
    assert_int_equal(q[2], 0x7E);
    assert_int_equal(q[3], 0x00);
    td_fp8_scheme mul = scheme(TD_SCALE_TENSOR, TD_ARITH_MUL, false);
    uint8_t q2[4];
    td_fp8_quantize(&mul, x, 1, 4, q2, &s);
    assert_true(s == 0x1p-7f);
    assert_memory_equal(q, q2, 4);
    /* amax 3: vLLM s = 3/448 rounded; pow2 -> 2^ceil(log2(0.0066964)) = 2^-7 */
    td_fp8_scheme p2 = scheme(TD_SCALE_TENSOR, TD_ARITH_DIV, true);
    assert_true(td_fp8_scale_from_amax(&p2, 3.0f) == 0x1p-7f);
    /* TE pow2: k = 448/3 = 149.33 -> rounded down to 128, s = 2^-7: the same scale */
    td_fp8_scheme m2 = scheme(TD_SCALE_TENSOR, TD_ARITH_MUL, true);
    assert_true(td_fp8_scale_from_amax(&m2, 3.0f) == 0x1p-7f);
    /* vLLM floor: amax 0 -> s = 1e-10/448 (not 0, not NaN) */
    assert_true(td_fp8_scale_from_amax(&div, 0.0f) == 1e-10f / 448.0f);
    /* TE: amax 0 -> k = 1 */
    assert_true(td_fp8_scale_from_amax(&mul, 0.0f) == 1.0f);
    /* MX: amax 3 -> 3/448 -> 2^-7 (E8M0 code 120); amax 448 -> 2^0 */
    td_fp8_scheme mx = scheme(TD_SCALE_MX, TD_ARITH_DIV, true);
    assert_true(td_fp8_scale_from_amax(&mx, 3.0f) == 0x1p-7f);
    assert_true(td_fp8_scale_from_amax(&mx, 448.0f) == 1.0f);
    assert_true(td_fp8_scale_from_amax(&mx, 449.0f) == 2.0f);
}

static void test_block_shapes(void **state)
{
    (void)state;
    size_t br, bc;
    td_fp8_scheme s = scheme(TD_SCALE_BLOCK, TD_ARITH_DIV, false);
    td_fp8_block_shape(&s, 300, 200, &br, &bc);
    assert_int_equal(br, 128); assert_int_equal(bc, 128);
    assert_int_equal(td_fp8_num_scales(&s, 300, 200), 3 * 2);
    s.gran = TD_SCALE_GROUP;
    assert_int_equal(td_fp8_num_scales(&s, 3, 300), 3 * 3);
    s.gran = TD_SCALE_MX;
    assert_int_equal(td_fp8_num_scales(&s, 2, 64), 2 * 2);
    s.gran = TD_SCALE_ROW;
    assert_int_equal(td_fp8_num_scales(&s, 5, 7), 5);
    s.gran = TD_SCALE_TENSOR;
    assert_int_equal(td_fp8_num_scales(&s, 5, 7), 1);
    assert_int_equal(td_scale_granularity_from_name("128x128"), TD_SCALE_BLOCK);
    assert_int_equal(td_scale_granularity_from_name("token"), TD_SCALE_ROW);
    assert_int_equal(td_scale_granularity_from_name("mxfp8"), TD_SCALE_MX);
    assert_int_equal(td_scale_granularity_from_name("bogus"), -1);
}

static bool is_pow2(float s)
{
    int e;
    return s > 0 && frexpf(s, &e) == 0.5f;
}

/* A (rows, cols) matrix with rows of wildly different magnitudes and some all-zero blocks. */
static float *make_matrix(size_t rows, size_t cols, uint64_t seed)
{
    td_rng r;
    td_rng_seed(&r, seed);
    float *x = malloc(rows * cols * sizeof(float));
    for (size_t i = 0; i < rows; i++) {
        float mag = ldexpf(1.0f, (int)td_rng_below(&r, 40) - 20);
        for (size_t j = 0; j < cols; j++) {
            float v = (float)td_rng_normal(&r) * mag;
            if (i % 7 == 3 || (j >= 128 && j < 256 && i < 128)) v = 0.0f;   /* zero blocks */
            if (td_rng_below(&r, 1000) == 0) v *= 1000.0f;                 /* outliers */
            x[i * cols + j] = v;
        }
    }
    return x;
}

static void check_invariants(td_fp8_scheme s, const char *label)
{
    const size_t R = 200, C = 300;
    float *x = make_matrix(R, C, 99);
    uint8_t *q = malloc(R * C);
    size_t ns = td_fp8_num_scales(&s, R, C);
    float *sc = malloc(ns * sizeof(float)), *y = malloc(R * C * sizeof(float));
    td_fp8_quantize(&s, x, R, C, q, sc);
    td_fp8_dequantize(&s, q, sc, R, C, y);
    size_t br, bc;
    td_fp8_block_shape(&s, R, C, &br, &bc);
    size_t nbc = (C + bc - 1) / bc, bad = 0, nonfinite = 0;
    const td_format_traits *t = td_format_info(s.fmt);
    for (size_t i = 0; i < R; i++)
        for (size_t j = 0; j < C; j++) {
            float sb = sc[(i / br) * nbc + j / bc];
            double xv = x[i * C + j], yv = y[i * C + j];
            if (!isfinite(yv)) { nonfinite++; continue; }
            double bound = fmax(fabs(xv) * ldexp(1.0, -(t->man_bits + 1)), sb * t->min_subnormal * 0.5);
            bound += fabs(xv) * 0x1p-22;
            if (fabs(yv - xv) > bound) {
                if (bad++ < 3) fprintf(stderr, "  %s: x=%g y=%g scale=%g bound=%g\n", label, xv, yv, sb, bound);
            }
        }
    size_t zero_nan = 0, not_pow2 = 0;
    for (size_t i = 0; i < R * C; i++) if (x[i] == 0.0f && y[i] != 0.0f) zero_nan++;
    for (size_t b = 0; b < ns; b++) if ((s.pow2 || s.gran == TD_SCALE_MX) && !is_pow2(sc[b])) not_pow2++;
    printf("%s: %zu blocks, %zu elements outside the error bound, %zu non-finite, %zu zeros not kept, %zu non-power-of-two scales\n",
           label, ns, bad, nonfinite, zero_nan, not_pow2);
    assert_int_equal(bad, 0);
    assert_int_equal(nonfinite, 0);
    assert_int_equal(zero_nan, 0);
    assert_int_equal(not_pow2, 0);
    free(x); free(q); free(sc); free(y);
}

static void test_invariants(void **state)
{
    (void)state;
    const char *arith_name[] = {"div", "mul"};
    for (int g = 0; g < TD_SCALE_COUNT; g++)
        for (int a = 0; a < 2; a++)
            for (int p = 0; p < 2; p++) {
                if (g == TD_SCALE_MX && (a || !p)) continue;   /* MX: one arithmetic */
                char label[64];
                snprintf(label, sizeof label, "e4m3 %s %s%s", td_scale_granularity_name(g), arith_name[a], p ? " pow2" : "");
                check_invariants(scheme((td_scale_granularity)g, (td_scale_arith)a, p), label);
            }
    td_fp8_scheme e5 = scheme(TD_SCALE_GROUP, TD_ARITH_DIV, false);
    e5.fmt = TD_E5M2;
    check_invariants(e5, "e5m2 group div");
}

/* MX scale: the smallest power of two s with amax/s <= 448 (up to the fp32 reciprocal). */
static void test_mx_scale_is_smallest(void **state)
{
    (void)state;
    td_fp8_scheme mx = scheme(TD_SCALE_MX, TD_ARITH_DIV, true);
    td_rng r;
    td_rng_seed(&r, 5);
    for (int i = 0; i < 100000; i++) {
        float amax = ldexpf((float)td_rng_uniform(&r) + 0.5f, (int)td_rng_below(&r, 200) - 100);
        float s = td_fp8_scale_from_amax(&mx, amax);
        assert_true(is_pow2(s));
        assert_true(amax / s <= 448.0f * (1 + 0x1p-22f));
        assert_true(amax / (s * 0.5f) > 448.0f * (1 - 0x1p-22f));
    }
}

/* DIV (x / s) and MUL (x * k) are both correctly rounded fp32 operations on different
 * numbers (s = amax/448 vs k = 448/amax), so their scales differ in the last bit for many amax
 * values, and codes differ for inputs near an e4m3 rounding midpoint. Both must be modelled. */
static void test_div_and_mul_differ(void **state)
{
    (void)state;
    td_fp8_scheme d = scheme(TD_SCALE_TENSOR, TD_ARITH_DIV, false), m = scheme(TD_SCALE_TENSOR, TD_ARITH_MUL, false);
    td_rng r;
    td_rng_seed(&r, 11);
    const int N = 100000;
    int scale_differ = 0, scale_far = 0, code_differ = 0, code_far = 0;
    for (int i = 0; i < N; i++) {
        float amax = ldexpf((float)td_rng_uniform(&r) + 1.0f, (int)td_rng_below(&r, 40) - 20);
        float sd = td_fp8_scale_from_amax(&d, amax), sm = td_fp8_scale_from_amax(&m, amax);
        if (sd != sm) scale_differ++;
        if (sd != sm && nextafterf(sd, sm) != sm) scale_far++;
        /* x placed on a midpoint between two e4m3 codes (in scaled units), then both ways */
        uint32_t c = (uint32_t)td_rng_below(&r, 0x7E);
        float mid = (td_e4m3_to_f32((uint8_t)c) + td_e4m3_to_f32((uint8_t)(c + 1))) * 0.5f;
        float x[2] = {mid * sd, amax};      /* amax keeps the block's scale as drawn */
        uint8_t qd[2], qm[2];
        float s1, s2;
        td_fp8_quantize(&d, x, 1, 2, qd, &s1);
        td_fp8_quantize(&m, x, 1, 2, qm, &s2);
        if (qd[0] != qm[0]) code_differ++;
        if (abs((int)qd[0] - (int)qm[0]) > 1) code_far++;
    }
    printf("vLLM div vs TE mul over %d random amax: scales differ in %d (all by one ulp: %s); "
           "codes of midpoint inputs differ in %d (all by one step: %s)\n",
           N, scale_differ, scale_far ? "no" : "yes", code_differ, code_far ? "no" : "yes");
    assert_true(scale_differ > 0);
    assert_int_equal(scale_far, 0);
    assert_true(code_differ > 0);
    assert_int_equal(code_far, 0);
}

/* td_fp8_fake_quant (one pass per block, no codes) against td_fp8_quantize + td_fp8_dequantize
 * bit for bit, in place and out of place, on every granularity, both arithmetics, both formats,
 * saturating and not,
 * ragged shapes, with huge, tiny, zero, Inf and NaN inputs; and td_fp8_decode_scaled_row (F16C
 * where the CPU has it) against the table for every code and several scales. */
static void test_fake_quant_is_quantize_dequantize(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 91);
    const size_t shapes[][2] = {{1, 7}, {3, 130}, {130, 257}, {256, 128}};
    int cases = 0;
    for (int fmt = 0; fmt < 2; fmt++)
        for (int g = 0; g < TD_SCALE_COUNT; g++)
            for (int a = 0; a < 4; a++)   /* the two arithmetics, saturating and not */
                for (size_t si = 0; si < 4; si++) {
                    size_t R = shapes[si][0], C = shapes[si][1], n = R * C;
                    td_fp8_scheme sc = scheme((td_scale_granularity)g, a & 1 ? TD_ARITH_MUL : TD_ARITH_DIV, false);
                    sc.fmt = fmt ? TD_E5M2 : TD_E4M3;
                    sc.sat = a & 2 ? TD_NOSAT : TD_SATFINITE;
                    float *x = malloc(n * sizeof(float)), *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
                    for (size_t i = 0; i < n; i++) x[i] = (float)td_rng_normal(&rng) * (i % 97 == 3 ? 1e30f : i % 89 == 5 ? 1e-30f : 3.0f);
                    if (n > 40) { x[7] = 0.0f; x[11] = INFINITY; x[13] = NAN; x[17] = -0.0f; }
                    uint8_t *q = malloc(n);
                    float *scales = malloc(td_fp8_num_scales(&sc, R, C) * sizeof(float));
                    td_fp8_quantize(&sc, x, R, C, q, scales);
                    td_fp8_dequantize(&sc, q, scales, R, C, want);
                    td_fp8_fake_quant(&sc, x, R, C, got);
                    for (size_t i = 0; i < n; i++)
                        if (memcmp(got + i, want + i, 4) && !(isnan(got[i]) && isnan(want[i])))
                            fail_msg("fake_quant differs at %zu (fmt %d gran %d arith %d shape %zux%zu): %a vs %a",
                                     i, fmt, g, a, R, C, got[i], want[i]);
                    memcpy(got, x, n * sizeof(float));
                    td_fp8_fake_quant(&sc, got, R, C, got);   /* in place */
                    for (size_t i = 0; i < n; i++)
                        assert_true(!memcmp(got + i, want + i, 4) || (isnan(got[i]) && isnan(want[i])));
                    cases++;
                    free(x); free(want); free(got); free(q); free(scales);
                }
    /* the decode rows: every code, scales 1, 2^-7, 3.7e-3, 1e30 (overflow), 1e-40 (subnormal) */
    const float scales[] = {1.0f, 0x1p-7f, 3.7e-3f, 1e30f, 1e-40f};
    for (int fmt = 0; fmt < 2; fmt++) {
        td_format f = fmt ? TD_E5M2 : TD_E4M3;
        const float *lut = td_fp8_decode_table(f);
        uint8_t codes[259];
        for (int i = 0; i < 259; i++) codes[i] = (uint8_t)(i * 7 + (i >> 8));   /* every code, a ragged tail */
        for (size_t k = 0; k < sizeof scales / sizeof *scales; k++) {
            float y[259];
            td_fp8_decode_scaled_row(f, codes, scales[k], y, 259);
            for (int i = 0; i < 259; i++) {
                float w = lut[codes[i]] * scales[k];
                assert_true(!memcmp(&w, y + i, 4) || (isnan(w) && isnan(y[i])));
            }
        }
    }
    printf("td_fp8_fake_quant: %d cases bit-identical to quantize + dequantize; fp8 decode rows = table\n", cases);
}

/* Every block's scale from td_fp8_quantize against td_fp8_scale_from_amax of the block's amax
 * taken here element by element (fmaxf over |x|, which ignores NaN): on every granularity, ragged
 * shapes whose row pieces are not multiples of the kernel's vector width, a NaN or an Inf at
 * random places, a block's largest value at every position of a 37-column row (the vector lanes
 * and the tail). */
static void test_block_scales_from_amax(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 17);
    const size_t shapes[][2] = {{1, 37}, {5, 300}, {131, 129}, {256, 96}, {2, 1000}};
    int blocks = 0;
    for (int g = 0; g < TD_SCALE_COUNT; g++)
        for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
            for (int special = 0; special < 3; special++) {
                size_t R = shapes[si][0], C = shapes[si][1], n = R * C, br, bc;
                td_fp8_scheme sc = scheme((td_scale_granularity)g, TD_ARITH_DIV, false);
                td_fp8_block_shape(&sc, R, C, &br, &bc);
                float *x = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++) x[i] = (float)td_rng_normal(&rng);
                if (special == 1) x[td_rng_below(&rng, (uint32_t)n)] = NAN;
                if (special == 2) x[td_rng_below(&rng, (uint32_t)n)] = -INFINITY;
                size_t nb = td_fp8_num_scales(&sc, R, C), nbc = (C + bc - 1) / bc;
                uint8_t *q = malloc(n);
                float *scales = malloc(nb * sizeof(float));
                for (size_t pos = 0; pos < (si == 0 ? C : 1); pos++) {
                    if (si == 0) x[pos] = 50.0f + (float)pos;   /* the largest, at every column */
                    td_fp8_quantize(&sc, x, R, C, q, scales);
                    for (size_t b = 0; b < nb; b++) {
                        size_t r0 = (b / nbc) * br, c0 = (b % nbc) * bc;
                        float amax = 0.0f;
                        for (size_t r = r0; r < R && r < r0 + br; r++)
                            for (size_t c = c0; c < C && c < c0 + bc; c++) amax = fmaxf(amax, fabsf(x[r * C + c]));
                        float want = td_fp8_scale_from_amax(&sc, amax);
                        if (memcmp(&want, scales + b, 4))
                            fail_msg("gran %d shape %zux%zu block %zu: scale %a, amax %a gives %a", g, R, C, b,
                                     scales[b], amax, want);
                        blocks++;
                    }
                    if (si == 0) x[pos] = 0.0f;
                }
                free(x); free(q); free(scales);
            }
    printf("block scales = td_fp8_scale_from_amax(element-by-element amax) on %d blocks\n", blocks);
}

/* td_fp8_fake_quant_cols (x quantised down its columns, no transpose) against a transpose, then
 * td_fp8_fake_quant, then a transpose back, bit for bit: groups of 128 and 64, MX (32), per row;
 * both arithmetics, saturating and not, both formats; huge, tiny, zero, Inf and NaN inputs; rows
 * not a multiple of the group (a short last band), columns not of the vector width (a scalar
 * tail), more columns than one chunk (1,100); in place too. Tensor scales (blocks of more than one
 * row of x^T) are declined with y untouched; without AVX2 and F16C (or with TIDAL_ISA=portable)
 * every call declines. */
static void test_fake_quant_cols(void **state)
{
    (void)state;
    td_rng rng;
    td_rng_seed(&rng, 23);
    const size_t shapes[][2] = {{512, 256}, {128, 48}, {256, 32}, {130, 32}, {128, 40}, {96, 1100}};
    enum { NSHAPES = sizeof shapes / sizeof *shapes };
    const struct { td_scale_granularity g; int group; } grans[] = {
        {TD_SCALE_GROUP, 128}, {TD_SCALE_GROUP, 64}, {TD_SCALE_MX, 0}, {TD_SCALE_ROW, 0}, {TD_SCALE_TENSOR, 0}};
    int taken = 0, declined = 0;
    for (size_t gi = 0; gi < sizeof grans / sizeof *grans; gi++)
        for (int v = 0; v < 8; v++)   /* arithmetic, saturation, format */
            for (size_t si = 0; si < NSHAPES; si++) {
                size_t R = shapes[si][0], C = shapes[si][1], n = R * C;
                td_fp8_scheme sc = scheme(grans[gi].g, v & 1 ? TD_ARITH_MUL : TD_ARITH_DIV, false);
                sc.group = grans[gi].group;
                sc.sat = v & 2 ? TD_NOSAT : TD_SATFINITE;
                sc.fmt = v & 4 ? TD_E5M2 : TD_E4M3;
                float *x = malloc(n * sizeof(float)), *t = malloc(n * sizeof(float));
                float *want = malloc(n * sizeof(float)), *got = malloc(n * sizeof(float));
                for (size_t i = 0; i < n; i++) x[i] = (float)td_rng_normal(&rng) * (i % 97 == 3 ? 1e30f : i % 89 == 5 ? 1e-30f : 3.0f);
                x[7] = 0.0f; x[C + 11] = INFINITY; x[2 * C + 13] = NAN; x[17] = -0.0f;
                for (size_t i = 0; i < R; i++)
                    for (size_t j = 0; j < C; j++) t[j * R + i] = x[i * C + j];
                td_fp8_fake_quant(&sc, t, C, R, t);
                for (size_t i = 0; i < R; i++)
                    for (size_t j = 0; j < C; j++) want[i * C + j] = t[j * R + i];
                for (size_t i = 0; i < n; i++) got[i] = -1.0f;
                if (!td_fp8_fake_quant_cols(&sc, x, R, C, got)) {
                    for (size_t i = 0; i < n; i++) assert_true(got[i] == -1.0f);
                    declined++;
                } else {
                    memcpy(t, x, n * sizeof(float));   /* in place */
                    assert_int_equal(td_fp8_fake_quant_cols(&sc, t, R, C, t), 1);
                    for (size_t i = 0; i < n; i++)
                        if ((memcmp(got + i, want + i, 4) || memcmp(t + i, want + i, 4)) && !(isnan(got[i]) && isnan(want[i]) && isnan(t[i])))
                            fail_msg("column fake quant differs at %zu (gran %d group %d variant %d shape %zux%zu): %a (in place %a) vs %a",
                                     i, (int)grans[gi].g, grans[gi].group, v, R, C, got[i], t[i], want[i]);
                    taken++;
                }
                free(x); free(t); free(want); free(got);
            }
    printf("td_fp8_fake_quant_cols: %d cases = transpose + td_fp8_fake_quant + transpose, %d declined\n", taken, declined);
    if (td_isa_level() >= TD_ISA_AVX2 && td_formats_have_vector_f16()) {
        assert_int_equal(taken, 4 * 8 * NSHAPES);
        assert_int_equal(declined, 8 * NSHAPES);
    } else {
        assert_int_equal(taken, 0);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_checked),
        cmocka_unit_test(test_block_shapes),
        cmocka_unit_test(test_invariants),
        cmocka_unit_test(test_mx_scale_is_smallest),
        cmocka_unit_test(test_div_and_mul_differ),
        cmocka_unit_test(test_fake_quant_is_quantize_dequantize),
        cmocka_unit_test(test_block_scales_from_amax),
        cmocka_unit_test(test_fake_quant_cols),
    };
    return cmocka_run_group_tests_name("scaling", tests, NULL, NULL);
}
