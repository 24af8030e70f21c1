/* Number formats without NVIDIA: hand-checked codes (each from the format's definition, worked
 * out by hand in the comment), and the fast scalar / row / round forms against the reference
 * forms bit for bit on random patterns and rounding ties. The comparison with NVIDIA's own
 * functions is tests/nv/test_nv_formats.cu. Tolerance everywhere: none (bits). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <stdlib.h>
#include <cmocka.h>
#include <omp.h>

#include "tidal/formats.h"
#include "format_inputs.h"

static void test_hand_checked(void **state)
{
    (void)state;
    /* bf16: 1.0 = 0x3F80; 0.1f = 0x3DCCCCCD -> top half 0x3DCC, remainder 0xCCCD > 0x8000 -> 0x3DCD */
    assert_int_equal(td_f32_to_bf16(1.0f).bits, 0x3F80);
    assert_int_equal(td_f32_to_bf16(0.1f).bits, 0x3DCD);
    /* tie: 0x3F808000 is exactly between 0x3F80 and 0x3F81 -> even 0x3F80; 0x3F818000 -> 0x3F82 */
    assert_int_equal(td_f32_to_bf16(ti_bits_f32(0x3F808000u)).bits, 0x3F80);
    assert_int_equal(td_f32_to_bf16(ti_bits_f32(0x3F818000u)).bits, 0x3F82);
    assert_int_equal(td_f32_to_bf16(ti_bits_f32(0x7F7FFFFFu)).bits, 0x7F80);   /* FLT_MAX -> Inf */
    assert_int_equal(td_f32_to_bf16(ti_bits_f32(0xFFC00001u)).bits, 0x7FFF);   /* NaN canonical */
    /* fp16: 65504 = max = 0x7BFF; 65519.99 -> 0x7BFF; 65520 (tie, 0x7BFF odd) -> Inf 0x7C00 */
    assert_int_equal(td_f32_to_f16(65504.0f).bits, 0x7BFF);
    assert_int_equal(td_f32_to_f16(65519.99f).bits, 0x7BFF);
    assert_int_equal(td_f32_to_f16(65520.0f).bits, 0x7C00);
    /* subnormals: 2^-24 = 0x0001; 2^-25 is a tie between 0 and 2^-24 -> 0; 3*2^-26 -> 0x0001 */
    assert_int_equal(td_f32_to_f16(0x1p-24f).bits, 0x0001);
    assert_int_equal(td_f32_to_f16(0x1p-25f).bits, 0x0000);
    assert_int_equal(td_f32_to_f16(0x1.8p-25f).bits, 0x0001);
    assert_int_equal(td_f32_to_f16(-0.0f).bits, 0x8000);
    /* e4m3: 448 = 1.75*2^8 -> 0 1111 110 = 0x7E; 464 ties to even (448); 480 would be 0x7F = NaN */
    assert_int_equal(td_f32_to_e4m3(448.0f, TD_SATFINITE), 0x7E);
    assert_int_equal(td_f32_to_e4m3(464.0f, TD_NOSAT), 0x7E);
    assert_int_equal(td_f32_to_e4m3(465.0f, TD_NOSAT), 0x7F);
    assert_int_equal(td_f32_to_e4m3(-465.0f, TD_NOSAT), 0xFF);
    assert_int_equal(td_f32_to_e4m3(-1e9f, TD_SATFINITE), 0xFE);
    assert_int_equal(td_f32_to_e4m3(-INFINITY, TD_SATFINITE), 0xFE);
    assert_int_equal(td_f32_to_e4m3(NAN, TD_SATFINITE), 0x7F);
    /* e4m3 subnormal quantum 2^-9: 2^-9 -> 0x01; 2^-10 tie -> 0; 3*2^-10 tie between 1 and 2 -> 2 */
    assert_int_equal(td_f32_to_e4m3(0x1p-9f, TD_SATFINITE), 0x01);
    assert_int_equal(td_f32_to_e4m3(0x1p-10f, TD_SATFINITE), 0x00);
    assert_int_equal(td_f32_to_e4m3(0x1.8p-9f, TD_SATFINITE), 0x02);
    /* e5m2: 57344 = 1.75*2^15 -> 0 11110 11 = 0x7B; 61440 ties to even -> 65536 = Inf */
    assert_int_equal(td_f32_to_e5m2(57344.0f, TD_NOSAT), 0x7B);
    assert_int_equal(td_f32_to_e5m2(61440.0f, TD_NOSAT), 0x7C);
    assert_int_equal(td_f32_to_e5m2(61440.0f, TD_SATFINITE), 0x7B);
    assert_int_equal(td_f32_to_e5m2(-INFINITY, TD_NOSAT), 0xFC);
    /* e8m0: 1.0 = 2^0 -> 127; 1.5 rounds up to 2 -> 128, toward zero -> 127; 0 -> 0 (2^-127) */
    assert_int_equal(td_f32_to_e8m0(1.0f, TD_SATFINITE, TD_ROUND_UP), 127);
    assert_int_equal(td_f32_to_e8m0(1.5f, TD_SATFINITE, TD_ROUND_UP), 128);
    assert_int_equal(td_f32_to_e8m0(1.5f, TD_SATFINITE, TD_ROUND_ZERO), 127);
    assert_int_equal(td_f32_to_e8m0(0.0f, TD_SATFINITE, TD_ROUND_UP), 0);
    assert_int_equal(td_f32_to_e8m0(INFINITY, TD_NOSAT, TD_ROUND_UP), 0xFF);
    /* decode */
    assert_true(td_e4m3_to_f32(0x7E) == 448.0f);
    assert_true(td_e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(isnan(td_e4m3_to_f32(0xFF)));
    assert_true(td_e5m2_to_f32(0x7C) == INFINITY);
    assert_true(td_e5m2_to_f32(0x7B) == 57344.0f);
    assert_true(td_e8m0_to_f32(127) == 1.0f);
    assert_true(td_e8m0_to_f32(0) == 0x1p-127f);
}

static void test_traits_consistent(void **state)
{
    (void)state;
    for (int f = TD_BF16; f < TD_FORMAT_COUNT; f++) {
        const td_format_traits *t = td_format_info((td_format)f);
        assert_true(td_decode((td_format)f, t->max_code) == t->max_finite);
        assert_int_equal(td_format_from_name(t->name), f);
        assert_int_equal(td_format_from_name(t->alias), f);
        if (f != TD_E8M0) {
            assert_true(td_decode((td_format)f, 1) == t->min_subnormal);
            assert_true(td_decode((td_format)f, 1u << t->man_bits) == t->min_normal);
        }
    }
    assert_int_equal(td_format_from_name("nonsense"), -1);
    assert_null(td_format_info(TD_FORMAT_COUNT));
}

/* Fast scalar, row-encode, round-row and scalar round (td_round) forms vs the reference, bit
 * for bit, NaN payloads included. */
static void check_fast_vs_ref(td_format f, td_saturation sat, const char *label)
{
    const size_t N = 1000000;
    float *x = malloc(N * 4), *rounded = malloc(N * 4);
    uint32_t *codes = malloc(N * 4);
    for (size_t i = 0; i < N; i++)
        x[i] = (i % 2) ? ti_random_bits(7, i) : ti_tie(f, 7, i);
    td_encode_row(f, x, codes, N, sat);
    td_round_row(f, x, rounded, N, sat);
    size_t agree = 0;
    for (size_t i = 0; i < N; i++) {
        uint32_t ref = td_encode_ref(f, x[i], sat);
        uint32_t row = td_format_info(f)->storage_bits == 16 ? ((uint16_t *)codes)[i] : ((uint8_t *)codes)[i];
        uint32_t want_round = ti_f32_bits(td_decode_ref(f, ref));
        /* the scalar round form (SATFINITE only) must give the row form's bits */
        int scalar_ok = sat != TD_SATFINITE || ti_f32_bits(td_round(f, x[i])) == want_round;
        if (td_encode(f, x[i], sat) == ref && row == ref && ti_f32_bits(rounded[i]) == want_round && scalar_ok) agree++;
        else if (N - agree < 4)
            fprintf(stderr, "  MISMATCH %s %a: ref 0x%x fast 0x%x row 0x%x\n", label, x[i], ref,
                    td_encode(f, x[i], sat), row);
    }
    printf("%s: %zu/%zu fast forms identical to the reference form\n", label, agree, N);
    free(x); free(rounded); free(codes);
    assert_int_equal(agree, N);
}

static void test_fast_vs_ref(void **state)
{
    (void)state;
    check_fast_vs_ref(TD_BF16, TD_SATFINITE, "bf16");
    check_fast_vs_ref(TD_F16, TD_SATFINITE, "fp16");
    check_fast_vs_ref(TD_E4M3, TD_SATFINITE, "e4m3 satfinite");
    check_fast_vs_ref(TD_E4M3, TD_NOSAT, "e4m3 nosat");
    check_fast_vs_ref(TD_E5M2, TD_SATFINITE, "e5m2 satfinite");
    check_fast_vs_ref(TD_E5M2, TD_NOSAT, "e5m2 nosat");
}

/* The vector rows (F16C for fp16, a table for FP8 decoding; formats.h) against the scalar
 * loops they replace, bit for bit: special values, every code, random patterns and ties, at
 * lengths that leave every tail size, rounding out of place and in place. */
static void test_vector_rows_vs_scalar(void **state)
{
    (void)state;
    const size_t N = 1 << 17;
    float *x = malloc(N * 4), *y_vec = malloc(N * 4), *y_sc = malloc(N * 4), *inplace = malloc(N * 4);
    uint16_t *c_vec = malloc(N * 2), *c_sc = malloc(N * 2), *codes = malloc(65536 * 2);
    uint8_t *codes8 = malloc(256);
    for (size_t i = 0; i < N; i++)
        x[i] = i < TI_N_SPECIAL ? ti_special(i) : (i % 2) ? ti_random_bits(11, i) : ti_tie(TD_F16, 11, i);
    for (int fi = 0; fi < 2; fi++) {       /* fp16 (F16C) and bf16 (AVX2 integer lanes) */
        td_format f = fi ? TD_BF16 : TD_F16;
        for (size_t i = TI_N_SPECIAL; i < N; i += 2) x[i] = ti_tie(f, fi ? 8 : 11, i);
        for (size_t n = N - 16; n <= N; n++) {   /* every tail length 0..15 */
            td_formats_scalar_only = 1;
            td_encode_row(f, x, c_sc, n, TD_SATFINITE);
            td_round_row(f, x, y_sc, n, TD_SATFINITE);
            td_formats_scalar_only = 0;
            td_encode_row(f, x, c_vec, n, TD_SATFINITE);
            td_round_row(f, x, y_vec, n, TD_SATFINITE);
            memcpy(inplace, x, n * 4);
            td_round_row(f, inplace, inplace, n, TD_SATFINITE);
            assert_memory_equal(c_vec, c_sc, n * 2);
            assert_memory_equal(y_vec, y_sc, n * 4);
            assert_memory_equal(inplace, y_sc, n * 4);
        }
    }
    for (uint32_t c = 0; c < 65536; c++) codes[c] = (uint16_t)c;
    for (size_t n = 65536 - 8; n <= 65536; n++) {
        td_formats_scalar_only = 1;
        td_decode_row(TD_F16, codes, y_sc, n);
        td_formats_scalar_only = 0;
        td_decode_row(TD_F16, codes, y_vec, n);
        assert_memory_equal(y_vec, y_sc, n * 4);
    }
    for (uint32_t c = 0; c < 256; c++) codes8[c] = (uint8_t)c;
    for (td_format f = TD_E4M3; f <= TD_E5M2; f++) {
        td_formats_scalar_only = 1;
        td_decode_row(f, codes8, y_sc, 256);
        td_formats_scalar_only = 0;
        td_decode_row(f, codes8, y_vec, 256);
        assert_memory_equal(y_vec, y_sc, 256 * 4);
    }
    printf("fp16 and bf16 rows: F16C/AVX2 %s; vector and scalar rows identical (encode, round, in place, decode of every code)\n",
           td_formats_have_vector_f16() ? "in use" : "off here (no F16C, or TIDAL_ISA=portable): scalar both times");
    free(x); free(y_vec); free(y_sc); free(inplace); free(c_vec); free(c_sc); free(codes); free(codes8);
}

/* The fp8 rounding and encoding rows (td_round_row, td_encode_row for e4m3 and e5m2, both
 * saturation modes) against the scalar encoder and decoder, bit for bit: special values, ties at the formats' quanta and random
 * patterns at every tail length, in place; with TIDAL_EXHAUSTIVE=1 every fp32 pattern. */
static void test_fp8_round_rows_vs_scalar(void **state)
{
    (void)state;
    const size_t N = 1 << 16;
    float *x = malloc(N * 4), *y_vec = malloc(N * 4), *y_sc = malloc(N * 4);
    uint8_t *c_vec = malloc(N), *c_sc = malloc(N);
    int exhaustive = getenv("TIDAL_EXHAUSTIVE") && !strcmp(getenv("TIDAL_EXHAUSTIVE"), "1");
    uint64_t checked = 0;
    for (td_format f = TD_E4M3; f <= TD_E5M2; f++)
        for (int sat = 0; sat < 2; sat++) {
            td_saturation sm = sat ? TD_SATFINITE : TD_NOSAT;
            int m = f == TD_E4M3 ? 3 : 2;
            for (size_t i = 0; i < N; i++)
                x[i] = i < TI_N_SPECIAL ? ti_special(i) : (i % 3 == 0) ? ti_random_bits(m, i)
                     : (i % 3 == 1) ? ti_tie(f, m, i) : ldexpf(ti_random_bits(m, i) , -(int)(i % 40));
            for (size_t n = N - 17; n <= N; n++) {
                td_formats_scalar_only = 1;
                td_round_row(f, x, y_sc, n, sm);
                td_formats_scalar_only = 0;
                memcpy(y_vec, x, n * 4);
                td_round_row(f, y_vec, y_vec, n, sm);
                assert_memory_equal(y_vec, y_sc, n * 4);
                td_formats_scalar_only = 1;
                td_encode_row(f, x, c_sc, n, sm);
                td_formats_scalar_only = 0;
                td_encode_row(f, x, c_vec, n, sm);
                assert_memory_equal(c_vec, c_sc, n);
                checked += n;
            }
            for (uint64_t u0 = 0; exhaustive && u0 < (1ull << 32); u0 += N) {
                for (size_t i = 0; i < N; i++) {
                    uint32_t u = (uint32_t)(u0 + i);
                    memcpy(x + i, &u, 4);
                }
                td_formats_scalar_only = 1;
                td_round_row(f, x, y_sc, N, sm);
                td_formats_scalar_only = 0;
                td_round_row(f, x, y_vec, N, sm);
                td_formats_scalar_only = 1;
                td_encode_row(f, x, c_sc, N, sm);
                td_formats_scalar_only = 0;
                td_encode_row(f, x, c_vec, N, sm);
                if (memcmp(c_vec, c_sc, N))
                    for (size_t i = 0; i < N; i++)
                        if (c_vec[i] != c_sc[i])
                            fail_msg("%s %s: fp32 pattern 0x%08x encodes to 0x%02x (vector) and 0x%02x (scalar)",
                                     f == TD_E4M3 ? "e4m3" : "e5m2", sat ? "satfinite" : "nosat",
                                     (unsigned)(u0 + i), c_vec[i], c_sc[i]);
                if (memcmp(y_vec, y_sc, N * 4))
                    for (size_t i = 0; i < N; i++)
                        if (memcmp(y_vec + i, y_sc + i, 4))
                            fail_msg("%s %s: fp32 pattern 0x%08x rounds to %a (vector) and %a (scalar)",
                                     f == TD_E4M3 ? "e4m3" : "e5m2", sat ? "satfinite" : "nosat",
                                     (unsigned)(u0 + i), y_vec[i], y_sc[i]);
                checked += N;
            }
        }
    printf("fp8 rounding and encoding rows: %llu values, vector and scalar identical%s\n", (unsigned long long)checked,
           exhaustive ? " (every fp32 pattern, both formats, both saturation modes)" : " (TIDAL_EXHAUSTIVE=1: every fp32 pattern)");
    free(x); free(y_vec); free(y_sc); free(c_vec); free(c_sc);
}

/* Round-tripping: every non-NaN code decodes to a value that encodes back to the same code. */
static void test_every_code_round_trips(void **state)
{
    (void)state;
    for (int f = TD_BF16; f <= TD_E5M2; f++) {
        const td_format_traits *t = td_format_info((td_format)f);
        uint32_t n = 1u << t->storage_bits, ok = 0, nan = 0;
        for (uint32_t c = 0; c < n; c++) {
            float v = td_decode((td_format)f, c);
            if (isnan(v)) { nan++; continue; }
            if (td_encode((td_format)f, v, TD_NOSAT) == c) ok++;
        }
        assert_int_equal(ok + nan, n);
    }
}

/* td_expf_row against the C library's expf, bit for bit (NaN as NaN), on every 61st fp32 pattern
 * at every offset a 16-wide tail can take, in place; TIDAL_EXHAUSTIVE=1: every fp32 pattern */
static void test_expf_row_vs_libm(void **state)
{
    (void)state;
    int exhaustive = getenv("TIDAL_EXHAUSTIVE") && !strcmp(getenv("TIDAL_EXHAUSTIVE"), "1");
    uint32_t stride = exhaustive ? 1 : 61;
    enum { B = 1 << 20 };
    float *x = malloc(B * sizeof(float)), *a = malloc(B * sizeof(float)), *b = malloc(B * sizeof(float));
    uint64_t checked = 0, bad = 0;
    for (uint64_t base = 0; base < (1ull << 32); base += (uint64_t)B * stride) {
        size_t n = B;
        for (size_t i = 0; i < n; i++) {
            uint32_t u = (uint32_t)(base + i * stride);
            memcpy(&x[i], &u, 4);
        }
        size_t tail = (size_t)(base / ((uint64_t)B * stride)) % 17;   /* rows ending mid-vector too */
        n -= tail;
        td_expf_row_scalar(x, a, n);
        memcpy(b, x, n * sizeof(float));
        td_expf_row(b, b, n);
        for (size_t i = 0; i < n; i++)
            if (memcmp(&a[i], &b[i], 4) && !(isnan(a[i]) && isnan(b[i]))) {
                if (bad++ < 5) print_error("expf(%a): libm %a, td_expf_row %a\n", x[i], a[i], b[i]);
            }
        checked += n;
    }
    free(x); free(a); free(b);
    printf("td_expf_row: %llu values bit-identical to libm's expf (vector form %s)%s\n", (unsigned long long)checked,
           td_expf_row_vector() ? "on" : "off: the scalar loop both times",
           exhaustive ? " (every fp32 pattern)" : " (TIDAL_EXHAUSTIVE=1: every fp32 pattern)");
    assert_int_equal(bad, 0);
}

/* td_exp_row and td_expm1_row against the C library's exp and expm1, bit for bit (NaN as NaN), in
 * place, on 2^26 patterns each: a stride over all 2^64 (every exponent, both signs), the range
 * log-softmax rows take (x in [-256, 0] at steps of 2^-17, low bits varied), expm1's unreduced
 * range (|x| <= 0.4: the metrics' log-prob differences), and rows of every length 0-9 */
static void test_exp_row_vs_libm(void **state)
{
    (void)state;
    enum { B = 1 << 20 };
    double *x = malloc(B * sizeof(double)), *a = malloc(B * sizeof(double)), *b = malloc(B * sizeof(double));
    uint64_t checked = 0, bad = 0;
    for (int f = 0; f < 2; f++) {
        void (*row)(const double *, double *, size_t) = f ? td_expm1_row : td_exp_row;
        void (*ref)(const double *, double *, size_t) = f ? td_expm1_row_scalar : td_exp_row_scalar;
        for (int chunk = 0; chunk < 64; chunk++) {
            size_t n = B - (size_t)chunk % 5;
            for (size_t i = 0; i < n; i++) {
                uint64_t k = (uint64_t)chunk * B + i;
                if (chunk % 2) {
                    uint64_t u = k * 0x9E3779B97F4A7C15ull;
                    memcpy(&x[i], &u, 8);
                } else if (chunk % 4 == 0) {
                    x[i] = -(double)(k / 2) * 0x1p-17 - (double)(k % 7) * 0x1p-40;
                } else {
                    x[i] = ((double)k * 0x1p-26 - 0.5) * 0.8 + (double)(k % 11) * 0x1p-50;
                }
            }
            ref(x, a, n);
            memcpy(b, x, n * sizeof(double));
            row(b, b, n);
            for (size_t i = 0; i < n; i++)
                if (memcmp(&a[i], &b[i], 8) && !(isnan(a[i]) && isnan(b[i])))
                    if (bad++ < 5) print_error("%s(%a): libm %a, tidal %a\n", f ? "expm1" : "exp", x[i], a[i], b[i]);
            checked += n;
        }
        for (size_t n = 0; n < 10; n++) {   /* short rows: the padded tail */
            for (size_t i = 0; i < n; i++) x[i] = -0.3 * (double)i - 0.05;
            ref(x, a, n);
            row(x, b, n);
            bad += n && memcmp(a, b, n * sizeof(double)) != 0;
        }
    }
    free(x); free(a); free(b);
    printf("td_exp_row, td_expm1_row: %llu values bit-identical to libm's exp and expm1 (vector forms %s)\n",
           (unsigned long long)checked, td_exp_row_vector() ? "on" : "off: the scalar loops both times");
    assert_int_equal(bad, 0);
}

/* td_argmax_first against the scan that defines it (td_argmax_first_scalar) on rows built to
 * hit its edges: NaN first, NaNs elsewhere, ties, -0 against +0, +-Inf, all-equal rows, the
 * largest value in the tail, lengths 0-200 and 4096 */
static void test_argmax_first_vs_scan(void **state)
{
    (void)state;
    enum { NMAX = 4096 };
    float *x = malloc(NMAX * sizeof(float));
    uint64_t rng = 0x9e3779b97f4a7c15ull;
    const float specials[] = {NAN, -NAN, INFINITY, -INFINITY, 0.0f, -0.0f, 1.0f, -1.0f, 3.5f, FLT_MAX, -FLT_MAX};
    int checked = 0;
    for (int trial = 0; trial < 20000; trial++) {
        size_t n = trial % 5 == 4 ? NMAX : (size_t)(trial % 201);
        int kind = (trial / 201) % 6;
        for (size_t i = 0; i < n; i++) {
            rng = rng * 6364136223846793005ull + 1442695040888963407ull;
            uint32_t r = (uint32_t)(rng >> 33);
            switch (kind) {
            case 0: x[i] = (float)(r % 1000) / 7.0f - 70.0f; break;           /* many ties */
            case 1: x[i] = (r % 9 == 0) ? specials[r % 11] : (float)(r % 50); break;
            case 2: x[i] = (r % 3 == 0) ? NAN : (float)(int)(r % 100) - 50.0f; break;
            case 3: x[i] = (r & 1) ? 0.0f : -0.0f; break;
            case 4: x[i] = -INFINITY; break;
            default: { uint32_t u = r * 2654435761u; memcpy(&x[i], &u, 4); } break;   /* any pattern */
            }
        }
        if (n && trial % 7 == 0) x[trial % n] = NAN;
        if (n && trial % 11 == 0) x[n - 1] = INFINITY;   /* the largest in the tail */
        size_t want = td_argmax_first_scalar(x, n), got = td_argmax_first(x, n);
        if (want != got) print_error("n %zu kind %d: scan %zu, td_argmax_first %zu\n", n, kind, want, got);
        assert_int_equal(want, got);
        checked++;
    }
    free(x);
    printf("td_argmax_first: %d rows, the scan's index every time\n", checked);
}

/* Long rows go to the OpenMP threads in chunks (src/numerics/formats.c): each value is its own, so
 * encode, decode and round on 2 threads must give the one-thread bits, out of place and in place,
 * at a length with a short last chunk. Reference: the same call on one thread (the serial path). */
static void test_long_rows_threads(void **state)
{
    (void)state;
    const size_t N = 3 * (1u << 18) + 5;
    float *x = malloc(N * 4), *y1 = malloc(N * 4), *y2 = malloc(N * 4), *d1 = malloc(N * 4), *d2 = malloc(N * 4);
    uint8_t *c1 = malloc(N * 4), *c2 = malloc(N * 4);
    for (size_t i = 0; i < N; i++) x[i] = i < TI_N_SPECIAL ? ti_special(i) : ti_random_bits(17, i);
    const td_format fs[] = {TD_BF16, TD_F16, TD_E4M3, TD_E5M2};
    for (int t = 0; t < 4; t++) {
        td_format f = fs[t];
        size_t es = f == TD_BF16 || f == TD_F16 ? 2 : 1;
        omp_set_num_threads(1);
        td_encode_row(f, x, c1, N, TD_SATFINITE);
        td_decode_row(f, c1, d1, N);
        td_round_row(f, x, y1, N, TD_SATFINITE);
        omp_set_num_threads(2);
        td_encode_row(f, x, c2, N, TD_SATFINITE);
        td_decode_row(f, c1, d2, N);
        td_round_row(f, x, y2, N, TD_SATFINITE);
        assert_memory_equal(c1, c2, N * es);
        assert_memory_equal(d1, d2, N * 4);
        assert_memory_equal(y1, y2, N * 4);
        memcpy(y2, x, N * 4);
        td_round_row(f, y2, y2, N, TD_SATFINITE);
        assert_memory_equal(y1, y2, N * 4);
    }
    printf("rows of %zu values: 2 threads give the one-thread bits (encode, decode, round, in place)\n", N);
    free(x); free(y1); free(y2); free(d1); free(d2); free(c1); free(c2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_checked),
        cmocka_unit_test(test_traits_consistent),
        cmocka_unit_test(test_every_code_round_trips),
        cmocka_unit_test(test_fast_vs_ref),
        cmocka_unit_test(test_vector_rows_vs_scalar),
        cmocka_unit_test(test_fp8_round_rows_vs_scalar),
        cmocka_unit_test(test_long_rows_threads),
        cmocka_unit_test(test_expf_row_vs_libm),
        cmocka_unit_test(test_exp_row_vs_libm),
        cmocka_unit_test(test_argmax_first_vs_scan),
    };
    return cmocka_run_group_tests_name("formats", tests, NULL, NULL);
}
