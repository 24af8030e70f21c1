/* Bit-exact agreement of tidal's number formats with NVIDIA's own host conversion functions
 * from cuda_bf16.h, cuda_fp16.h and cuda_fp8.h. Host code only: built by nvcc, runs on any CPU.
 *
 * For every format and saturation mode, tidal's fast scalar form, row form and reference form
 * are each compared, bit for bit, with NVIDIA's conversion on:
 *   - special values (zeros, Inf, NaNs with payloads, fp32 subnormals, format thresholds),
 *   - 10^7 random fp32 bit patterns (every exponent, NaN and Inf included),
 *   - 3*10^6 rounding ties of the format (exact midpoints and their fp32 neighbours),
 * and every code of every format is decoded and compared. TIDAL_EXHAUSTIVE=1 replaces the
 * random patterns by all 2^32 of them (minutes; not part of make check); TIDAL_NV_ONLY=NAME runs
 * the tests whose name matches (cmocka's filter, e.g. test_fp16).
 * Tolerance: none. A single differing bit fails the test. */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
extern "C" {
#include <cmocka.h>
}

#include "tidal/formats.h"
#include "tidal/isa.h"
#include "../format_inputs.h"
#include "nv_ref.h"

static const uint64_t N_RANDOM = 10000000ull;
static const uint64_t N_TIES = 3000000ull;
static const uint64_t SEED = 20261121ull;

/* ---- tidal's forms ---- */

static uint32_t td_fast(td_format f, float x, td_saturation sat, td_scale_rounding rnd)
{
    return f == TD_E8M0 ? td_f32_to_e8m0(x, sat, rnd) : td_encode(f, x, sat);
}

static uint32_t td_ref(td_format f, float x, td_saturation sat, td_scale_rounding rnd)
{
    return f == TD_E8M0 ? td_encode_e8m0_ref(x, sat, rnd) : td_encode_ref(f, x, sat);
}

enum { SRC_SPECIAL, SRC_RANDOM, SRC_TIES };

static float input(td_format f, int src, uint64_t i)
{
    if (src == SRC_SPECIAL) return ti_special(i);
    if (src == SRC_RANDOM)
        return getenv("TIDAL_EXHAUSTIVE") ? ti_bits_f32((uint32_t)i) : ti_random_bits(SEED, i);
    return f == TD_E8M0 ? ti_pow2_neighbour(SEED, i) : ti_tie(f, SEED, i);
}

/* Compares all three forms with NVIDIA on one input source; returns inputs where all agree. */
static uint64_t compare_source(td_format f, td_saturation sat, td_scale_rounding rnd, int src,
                               uint64_t n, uint64_t *mismatches_shown)
{
    const size_t CH = 1 << 16;
    uint64_t agree = 0;
    #pragma omp parallel for schedule(dynamic) reduction(+:agree)
    for (uint64_t base = 0; base < n; base += CH) {
        size_t m = (size_t)(n - base < CH ? n - base : CH);
        float *x = (float *)malloc(m * sizeof(float));
        uint32_t *row = (uint32_t *)malloc(m * 4);
        float *rounded = (float *)malloc(m * 4);
        uint8_t *row8 = (uint8_t *)row;
        uint16_t *row16 = (uint16_t *)row;
        for (size_t j = 0; j < m; j++) x[j] = input(f, src, base + j);
        bool row_form = !(f == TD_E8M0 && rnd != TD_ROUND_UP);   /* rows scale-encode rounding up */
        if (row_form) {
            td_encode_row(f, x, row, m, sat);
            td_round_row(f, x, rounded, m, sat);
        }
        for (size_t j = 0; j < m; j++) {
            uint32_t want = nv_encode(f, x[j], sat, rnd);
            /* the round row is NVIDIA's decode of NVIDIA's code; td_round (SATFINITE) too */
            if (row_form) {
                uint32_t want_round = nv_decode_bits(f, want);
                if (ti_f32_bits(rounded[j]) != want_round ||
                    (sat == TD_SATFINITE && ti_f32_bits(td_round(f, x[j])) != want_round)) {
                    #pragma omp critical
                    if ((*mismatches_shown)++ < 8)
                        fprintf(stderr, "  MISMATCH round %s x=%a: nvidia 0x%08x row 0x%08x scalar 0x%08x\n",
                                td_format_info(f)->name, x[j], want_round, ti_f32_bits(rounded[j]),
                                ti_f32_bits(td_round(f, x[j])));
                    continue;
                }
            }
            uint32_t fast = td_fast(f, x[j], sat, rnd);
            uint32_t ref = td_ref(f, x[j], sat, rnd);
            uint32_t rw = !row_form ? want : td_format_info(f)->storage_bits == 16 ? row16[j] : row8[j];
            if (fast == want && ref == want && rw == want) { agree++; continue; }
            #pragma omp critical
            if ((*mismatches_shown)++ < 8)
                fprintf(stderr, "  MISMATCH %s x=%a (0x%08x): nvidia 0x%02x fast 0x%02x row 0x%02x ref 0x%02x\n",
                        td_format_info(f)->name, x[j], ti_f32_bits(x[j]), want, fast, rw, ref);
        }
        free(x);
        free(row);
        free(rounded);
    }
    return agree;
}

static void check_encode(td_format f, td_saturation sat, td_scale_rounding rnd, const char *label)
{
    bool exhaustive = getenv("TIDAL_EXHAUSTIVE") != NULL;
    uint64_t n_random = exhaustive ? (1ull << 32) : N_RANDOM;
    uint64_t shown = 0, agree = 0, total = TI_N_SPECIAL + n_random + N_TIES;
    agree += compare_source(f, sat, rnd, SRC_SPECIAL, TI_N_SPECIAL, &shown);
    agree += compare_source(f, sat, rnd, SRC_RANDOM, n_random, &shown);
    agree += compare_source(f, sat, rnd, SRC_TIES, N_TIES, &shown);
    printf("%s: %llu/%llu identical to NVIDIA (fast, row, round-row and reference forms%s; %llu %s + %llu ties + %llu specials)\n",
           label, (unsigned long long)agree, (unsigned long long)total,
           f == TD_F16 && td_formats_have_vector_f16() ? (td_isa_level() >= TD_ISA_AVX512 ? ", rows by F16C, round-row by AVX-512" : ", rows by F16C") : "", (unsigned long long)n_random,
           exhaustive ? "exhaustive" : "random", (unsigned long long)N_TIES,
           (unsigned long long)TI_N_SPECIAL);
    fflush(stdout);
    assert_int_equal(agree, total);
}

static void test_bf16(void **s)           { (void)s; check_encode(TD_BF16, TD_SATFINITE, TD_ROUND_UP, "bf16 rn"); }
static void test_fp16(void **s)           { (void)s; check_encode(TD_F16, TD_SATFINITE, TD_ROUND_UP, "fp16 rn"); }
static void test_e4m3_sat(void **s)       { (void)s; check_encode(TD_E4M3, TD_SATFINITE, TD_ROUND_UP, "e4m3 satfinite"); }
static void test_e4m3_nosat(void **s)     { (void)s; check_encode(TD_E4M3, TD_NOSAT, TD_ROUND_UP, "e4m3 nosat"); }
static void test_e5m2_sat(void **s)       { (void)s; check_encode(TD_E5M2, TD_SATFINITE, TD_ROUND_UP, "e5m2 satfinite"); }
static void test_e5m2_nosat(void **s)     { (void)s; check_encode(TD_E5M2, TD_NOSAT, TD_ROUND_UP, "e5m2 nosat"); }
static void test_e8m0_up_sat(void **s)    { (void)s; check_encode(TD_E8M0, TD_SATFINITE, TD_ROUND_UP, "e8m0 round-up satfinite"); }
static void test_e8m0_up_nosat(void **s)  { (void)s; check_encode(TD_E8M0, TD_NOSAT, TD_ROUND_UP, "e8m0 round-up nosat"); }
static void test_e8m0_rz_sat(void **s)    { (void)s; check_encode(TD_E8M0, TD_SATFINITE, TD_ROUND_ZERO, "e8m0 round-zero satfinite"); }
static void test_e8m0_rz_nosat(void **s)  { (void)s; check_encode(TD_E8M0, TD_NOSAT, TD_ROUND_ZERO, "e8m0 round-zero nosat"); }

/* Every code of every format decoded by the fast scalar, row and reference forms. */
static void test_decode_every_code(void **state)
{
    (void)state;
    const td_format fs[] = {TD_BF16, TD_F16, TD_E4M3, TD_E5M2, TD_E8M0};
    for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
        td_format f = fs[k];
        const td_format_traits *t = td_format_info(f);
        uint32_t ncodes = 1u << t->storage_bits, agree = 0;
        uint16_t *codes = (uint16_t *)malloc(ncodes * 2);
        uint8_t *codes8 = (uint8_t *)malloc(ncodes);
        float *rows = (float *)malloc(ncodes * 4);
        for (uint32_t c = 0; c < ncodes; c++) { codes[c] = (uint16_t)c; codes8[c] = (uint8_t)c; }
        td_decode_row(f, t->storage_bits == 16 ? (const void *)codes : (const void *)codes8, rows, ncodes);
        for (uint32_t c = 0; c < ncodes; c++) {
            uint32_t want = nv_decode_bits(f, c);
            uint32_t fast = ti_f32_bits(td_decode(f, c));
            uint32_t ref = ti_f32_bits(td_decode_ref(f, c));
            uint32_t row = ti_f32_bits(rows[c]);
            if (fast == want && ref == want && row == want) agree++;
            else if (ncodes - agree < 5)
                fprintf(stderr, "  MISMATCH decode %s 0x%x: nvidia %08x fast %08x row %08x ref %08x\n",
                        t->name, c, want, fast, row, ref);
        }
        printf("%s decode: %u/%u codes identical to NVIDIA\n", t->name, agree, ncodes);
        free(codes); free(codes8); free(rows);
        assert_int_equal(agree, ncodes);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_decode_every_code),
        cmocka_unit_test(test_bf16),
        cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_e4m3_sat),
        cmocka_unit_test(test_e4m3_nosat),
        cmocka_unit_test(test_e5m2_sat),
        cmocka_unit_test(test_e5m2_nosat),
        cmocka_unit_test(test_e8m0_up_sat),
        cmocka_unit_test(test_e8m0_up_nosat),
        cmocka_unit_test(test_e8m0_rz_sat),
        cmocka_unit_test(test_e8m0_rz_nosat),
    };
    /* TIDAL_NV_ONLY=test_fp16 runs one test (e.g. the exhaustive fp16 sweep alone, minutes) */
    if (getenv("TIDAL_NV_ONLY")) cmocka_set_test_filter(getenv("TIDAL_NV_ONLY"));
    return cmocka_run_group_tests_name("nv_formats", tests, NULL, NULL);
}
