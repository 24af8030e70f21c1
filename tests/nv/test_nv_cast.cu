/* tidal-cast agrees with NVIDIA's host conversions on every input it is given: for each
 * format and saturation mode, 10^6 inputs (random fp32 bit patterns over every exponent,
 * rounding ties of the format and their neighbours, special values) are written as hex-floats,
 * piped through the tidal-cast binary, and each output line's code and decoded value are
 * compared bit for bit with NVIDIA's conversion of the same fp32. Also checks that a bad line
 * is reported with its line number and a non-zero exit. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
extern "C" {
#include <cmocka.h>
}
#include "nv_ref.h"

static char cast_bin[512];

static void check_cast(td_format f, td_saturation sat, const char *flag, const char *label)
{
    const uint64_t N = 1000000;
    char in_path[] = "/tmp/tidal-cast-in-XXXXXX";
    int fd = mkstemp(in_path);
    assert_true(fd >= 0);
    FILE *in = fdopen(fd, "w");
    float *x = (float *)malloc(N * sizeof(float));
    for (uint64_t i = 0; i < N; i++) {
        if (i < TI_N_SPECIAL) x[i] = ti_special(i);
        else if (i % 2) x[i] = ti_random_bits(42, i);
        else x[i] = f == TD_E8M0 ? ti_pow2_neighbour(42, i) : ti_tie(f, 42, i);
        if (isnan(x[i])) fprintf(in, "%snan\n", signbit(x[i]) ? "-" : "");
        else fprintf(in, "%a\n", (double)x[i]);
    }
    fclose(in);
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s --format %s %s < %s", cast_bin, td_format_info(f)->name, flag, in_path);
    FILE *out = popen(cmd, "r");
    assert_non_null(out);
    char line[128];
    uint64_t n = 0, agree = 0;
    while (fgets(line, sizeof line, out) && n < N) {
        unsigned code = 0;
        char val[64] = {0};
        if (sscanf(line, "0x%x %63s", &code, val) == 2) {
            uint32_t want = nv_encode(f, x[n], sat, TD_ROUND_UP);
            float v = strtof(val, NULL);
            uint32_t want_v = nv_decode_bits(f, want);
            bool same_v = isnan(v) ? isnan(ti_bits_f32(want_v)) : ti_f32_bits(v) == want_v;
            if (code == want && same_v) agree++;
            else if (n - agree < 4)
                fprintf(stderr, "  MISMATCH %s input %a: tidal-cast '%s' nvidia 0x%x\n", label, x[n], line, want);
        }
        n++;
    }
    int rc = pclose(out);
    remove(in_path);
    free(x);
    printf("tidal-cast %s: %llu/%llu lines identical to NVIDIA\n", label, (unsigned long long)agree, (unsigned long long)N);
    assert_int_equal(rc, 0);
    assert_int_equal(n, N);
    assert_int_equal(agree, N);
}

static void test_bf16(void **s)       { (void)s; check_cast(TD_BF16, TD_SATFINITE, "", "bf16"); }
static void test_fp16(void **s)       { (void)s; check_cast(TD_F16, TD_SATFINITE, "", "fp16"); }
static void test_e4m3(void **s)       { (void)s; check_cast(TD_E4M3, TD_SATFINITE, "", "e4m3 (default: saturate)"); }
static void test_e4m3_nosat(void **s) { (void)s; check_cast(TD_E4M3, TD_NOSAT, "--no-saturate", "e4m3 --no-saturate"); }
static void test_e5m2(void **s)       { (void)s; check_cast(TD_E5M2, TD_SATFINITE, "--saturate", "e5m2 --saturate"); }
static void test_e5m2_nosat(void **s) { (void)s; check_cast(TD_E5M2, TD_NOSAT, "--no-saturate", "e5m2 --no-saturate"); }
static void test_e8m0(void **s)       { (void)s; check_cast(TD_E8M0, TD_SATFINITE, "", "e8m0"); }

static void test_bad_line(void **state)
{
    (void)state;
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "printf '1\\n2\\nthree\\n4\\n' | %s --format bf16 2>&1", cast_bin);
    FILE *p = popen(cmd, "r");
    char buf[1024] = {0};
    size_t len = fread(buf, 1, sizeof buf - 1, p);
    buf[len] = 0;
    int rc = pclose(p);
    assert_true(WEXITSTATUS(rc) != 0);
    assert_non_null(strstr(buf, "0x3f80 1\n0x4000 2\n"));   /* earlier lines kept */
    assert_non_null(strstr(buf, "stdin:3"));                 /* line number named */
    assert_null(strstr(buf, "0x4080"));                      /* nothing after the bad line */
}

int main(void)
{
    const char *build = getenv("BUILD");
    snprintf(cast_bin, sizeof cast_bin, "%s/bin/tidal-cast", build ? build : "build");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bf16),      cmocka_unit_test(test_fp16),
        cmocka_unit_test(test_e4m3),      cmocka_unit_test(test_e4m3_nosat),
        cmocka_unit_test(test_e5m2),      cmocka_unit_test(test_e5m2_nosat),
        cmocka_unit_test(test_e8m0),      cmocka_unit_test(test_bad_line),
    };
    return cmocka_run_group_tests_name("nv_cast", tests, NULL, NULL);
}
