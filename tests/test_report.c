/* Analysis and pictures of run files (src/analysis, src/render, tidal-report, tidal-heatmap):
 *  - a four-token run with Δlogp = (−ln 2, 0, ln 2, 0) in two sequences, whose summaries,
 *    parity bands and importance weights are worked out by hand below (exact up to the
 *    rounding of ln 2: tolerance 1e-15 relative);
 *  - bad input: missing file, not HDF5, no tidal attribute, unknown schema version, missing
 *    dataset, an empty run, columns of unequal length, a sequence index out of range: each a
 *    message naming the file and the problem; the tools exit 1 (not a crash) on them;
 *  - --is parsing; a missing font file is named with the package to install;
 *  - every plot kind draws and writes a PNG that libpng reads back, with the command line in
 *    a text chunk; the layers plot without /layers/rel_err says that it is absent.
 * The numbers against numpy on large files: tests/py/test_report_numpy.py. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "testutil.h"
#include <gsl/gsl_statistics_double.h>
#include <hdf5.h>
#include <stdint.h>

#include "tidal/analysis.h"
#include "tidal/render.h"
#include "tidal/runfile.h"

static void near(double got, double want)
{
    if (!(fabs(got - want) <= 1e-15 * fabs(want) + 1e-300)) {
        print_error("got %.17g want %.17g\n", got, want);
        fail();
    }
}

/* The hand-worked run: logp_a = −1, dlogp = (−ln 2, 0, ln 2, 0); sequences {0, 1} and {2, 3}.
 * with_layers adds /layers/rel_err (4 x 3). */
static void write_small(const char *path, int with_layers)
{
    td_error err;
    td_runfile *rf = td_runfile_create(path, 1, &err);
    assert_non_null(rf);
    const double L2 = log(2.0);
    int64_t seq[4] = {0, 0, 1, 1};
    int32_t pos[4] = {3, 4, 3, 4}, tok[4] = {5, 6, 7, 8}, plen[2] = {3, 3}, rlen[2] = {2, 2};
    double la[4] = {-1, -1, -1, -1}, d[4] = {-L2, 0, L2, 0}, lb[4], kl[4] = {1e-3, 0, 2e-3, NAN};
    for (int i = 0; i < 4; i++) lb[i] = la[i] + d[i];
    int8_t prm[4] = {0, 0, 0, 0};
    assert_int_equal(td_runfile_set_str(rf, "recipe_a_name", "ra", &err), 0);
    assert_int_equal(td_runfile_set_str(rf, "recipe_b_name", "rb", &err), 0);
    assert_int_equal(td_runfile_append(rf, "/tokens/seq", TD_COL_I64, 1, seq, 4, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/tokens/pos", TD_COL_I32, 1, pos, 4, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/tokens/token", TD_COL_I32, 1, tok, 4, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/tokens/logp_a", TD_COL_F64, 1, la, 4, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/tokens/logp_b", TD_COL_F64, 1, lb, 4, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/tokens/dlogp", TD_COL_F64, 1, d, 4, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/tokens/kl_ba", TD_COL_F64, 1, kl, 4, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/tokens/is_prompt", TD_COL_I8, 1, prm, 4, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/seqs/prompt_len", TD_COL_I32, 1, plen, 2, &err), 0);
    assert_int_equal(td_runfile_append(rf, "/seqs/response_len", TD_COL_I32, 1, rlen, 2, &err), 0);
    if (with_layers) {
        float lay[12];
        for (int i = 0; i < 12; i++) lay[i] = 1e-3f * (float)(1 + i);
        assert_int_equal(td_runfile_append(rf, "/layers/rel_err", TD_COL_F32, 3, lay, 4, &err), 0);
    }
    assert_int_equal(td_runfile_close(rf, &err), 0);
}

static void test_hand_worked(void **state)
{
    (void)state;
    char path[128];
    test_path(path, sizeof path, "small.h5");
    write_small(path, 1);
    td_run run;
    td_error err;
    assert_int_equal(td_run_load(&run, path, TD_RUN_LAYERS, &err), 0);
    assert_int_equal(run.n, 4);
    assert_int_equal(run.nseq, 2);
    assert_int_equal(run.n_layers, 3);
    assert_string_equal(run.label, "ra vs rb");
    const double L2 = log(2.0);

    /* |Δlogp| sorted (0, 0, ln2, ln2): p50 at index 1.5 → ln2/2; p90 at 2.7 → ln2 */
    double absd[4];
    for (int i = 0; i < 4; i++) absd[i] = fabs(run.dlogp[i]);
    td_summary s;
    td_summary_compute(absd, 4, &s);
    assert_int_equal(s.count, 4);
    near(s.mean, L2 / 2); near(s.p50, L2 / 2); near(s.p90, L2); near(s.p99, L2); near(s.max, L2);
    /* KL: the NaN is left out, count 3; sorted (0, 1e-3, 2e-3): p50 = 1e-3, p90 at 1.8 */
    td_summary_compute(run.kl_ba, 4, &s);
    assert_int_equal(s.count, 3);
    near(s.mean, 1e-3); near(s.p50, 1e-3); near(s.p90, 0.2 * 1e-3 + 0.8 * 2e-3); near(s.max, 2e-3);

    /* token weights ρ = e^{−Δ} = (2, 1, 0.5, 1): mean 1.125, mean ρ² = 1.5625 */
    double *lw;
    size_t n;
    td_is_raw raw;
    td_is_log_weights(&run, TD_IS_TOKEN, &lw, &n);
    assert_int_equal(n, 4);
    td_is_raw_stats(lw, n, TD_IS_TOKEN, &raw);
    near(raw.w_min, 0.5); near(raw.w_max, 2); near(raw.w_mean, 1.125);
    near(raw.chi2, 0.5625); near(raw.ess_frac, 1.125 * 1.125 / 1.5625);
    near(raw.inv_ess_m1, 1.5625 / (1.125 * 1.125) - 1);
    td_is_spec spec;
    td_is_corr c;
    assert_int_equal(td_is_spec_parse("token:truncate:1.5", &spec, &err), 0);
    td_is_apply(lw, n, &spec, &c);  // (1.5, 1, 0.5, 1)
    near(c.frac_lo, 0); near(c.frac_hi, 0.25); near(c.w_mean, 1.0); near(c.ess_frac, 1.0 / ((2.25 + 1 + 0.25 + 1) / 4));
    assert_int_equal(td_is_spec_parse("token:mask:0.75:1.5", &spec, &err), 0);
    td_is_apply(lw, n, &spec, &c);  // (0, 1, 0, 1)
    near(c.frac_lo, 0.25); near(c.frac_hi, 0.25); near(c.w_mean, 0.5); near(c.ess_frac, 0.5);
    free(lw);
    /* sequences: W = 2·1 and 0.5·1; geometric √2 and √0.5 */
    td_is_log_weights(&run, TD_IS_SEQUENCE, &lw, &n);
    assert_int_equal(n, 2);
    td_is_raw_stats(lw, n, TD_IS_SEQUENCE, &raw);
    near(raw.w_min, 0.5); near(raw.w_max, 2); near(raw.w_mean, 1.25); near(raw.chi2, (4 + 0.25) / 2 - 1);
    free(lw);
    td_is_log_weights(&run, TD_IS_GEOMETRIC, &lw, &n);
    td_is_raw_stats(lw, n, TD_IS_GEOMETRIC, &raw);
    /* geometric chi² is self-normalised: mean G² / (mean G)² − 1 = 1.25 / 1.125 − 1 (not the
     * 0.25 that mean G² − 1 would give), equal to 1/ESS − 1 */
    near(raw.w_max, sqrt(2.0)); near(raw.w_min, sqrt(0.5)); near(raw.chi2, 1.25 / 1.125 - 1);
    near(raw.inv_ess_m1, raw.chi2);
    /* weights all 0.9: mean(w²) − 1 would be −0.19; the geometric chi² is 0 */
    double flat[3] = {log(0.9), log(0.9), log(0.9)};
    td_is_raw_stats(flat, 3, TD_IS_GEOMETRIC, &raw);
    assert_true(raw.chi2 == 0.0 && raw.inv_ess_m1 == 0.0);
    td_is_raw_stats(flat, 3, TD_IS_TOKEN, &raw);
    near(raw.chi2, 0.81 - 1);
    free(lw);

    /* the JSON report carries the same numbers, and parity: ±0.1 % holds the two Δ = 0 */
    td_report_opts o = {.n_worst = 2};
    json_t *j = td_report_run(&run, &o, &err);
    assert_non_null(j);
    near(json_real_value(json_object_get(json_object_get(j, "abs_dlogp"), "p50")), L2 / 2);
    near(json_real_value(json_object_get(json_object_get(j, "parity"), "0.1%")), 0.5);
    near(json_real_value(json_object_get(json_object_get(j, "parity"), "5%")), 0.5);
    /* verl's diagnostics: kl = mean Δ = 0; per sequence d = −ln2/2 and +ln2/2 */
    json_t *v = json_object_get(j, "verl");
    /* (the sums of ±ln2 cancel to a rounding of the −1 + Δ log-probs: |x| < 1e-15) */
    assert_true(fabs(json_real_value(json_object_get(v, "kl"))) < 1e-15);
    assert_true(fabs(json_real_value(json_object_get(v, "log_ppl_diff"))) < 1e-15);
    near(json_real_value(json_object_get(v, "log_ppl_abs_diff")), L2 / 2);
    near(json_real_value(json_object_get(v, "log_ppl_diff_max")), L2 / 2);
    near(json_real_value(json_object_get(v, "log_ppl_diff_min")), -L2 / 2);
    near(json_real_value(json_object_get(v, "ppl_ratio")), (sqrt(0.5) + sqrt(2.0)) / 2);
    near(json_real_value(json_object_get(v, "training_ppl")), exp(1.0));
    near(json_real_value(json_object_get(v, "rollout_ppl")), exp(1.0) * (sqrt(2.0) + sqrt(0.5)) / 2);
    near(json_real_value(json_object_get(v, "training_log_ppl")), 1.0);
    json_t *worst = json_object_get(j, "worst_seqs");
    assert_int_equal(json_array_size(worst), 2);
    near(fabs(json_real_value(json_object_get(json_array_get(worst, 0), "log_w"))), L2);
    assert_int_equal(json_integer_value(json_object_get(json_object_get(j, "layers"), "n_layers")), 3);
    json_decref(j);
    td_run_free(&run);
}

static void expect_load_error(const char *path, const char *needle)
{
    td_run run;
    td_error err = {{0}};
    assert_int_not_equal(td_run_load(&run, path, TD_RUN_LAYERS, &err), 0);
    assert_msg_has(err.msg, path);
    assert_msg_has(err.msg, needle);
}

static int run_tool(const char *cmdline)
{
    char cmd[1024];
    const char *b = getenv("BUILD") ? getenv("BUILD") : "build";
    snprintf(cmd, sizeof cmd, "%s/bin/%s 2>/dev/null >/dev/null", b, cmdline);
    int st = system(cmd);
    assert_true(WIFEXITED(st));  // a message and an exit, never a signal
    return WEXITSTATUS(st);
}

/* td_average_ranks / td_spearman against a hand-worked case and against GSL's own
 * gsl_stats_spearman (the function they replace) on 20000 pairs with heavy ties, both zeros'
 * signs, negatives and a huge range: equal to 1e-12 (the correlation runs in another order) */
static void test_ranks_spearman(void **state)
{
    (void)state;
    const double x[7] = {3.0, -1.0, 0.0, -0.0, 3.0, 1e300, -2.5};
    double r[7];
    td_average_ranks(x, 7, r);
    const double want[7] = {5.5, 2, 3.5, 3.5, 5.5, 7, 1};
    for (int i = 0; i < 7; i++) assert_true(r[i] == want[i]);
    enum { N = 20000 };
    double *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *work = malloc(2 * N * sizeof *work);
    uint64_t s = 0x243F6A8885A308D3ull;
    for (int i = 0; i < N; i++) {
        s ^= s << 13; s ^= s >> 7; s ^= s << 17;
        a[i] = (double)((int)(s % 41) - 20) * 0.25;                          /* ties, ±0 */
        if (a[i] == 0 && (s >> 40 & 1)) a[i] = -0.0;
        b[i] = a[i] * 0.5 + ldexp((double)(s >> 11) / 9007199254740992.0 - 0.5, (int)(s >> 58) - 30);
    }
    double mine = td_spearman(a, b, N);
    double *a2 = malloc(N * sizeof *a2), *b2 = malloc(N * sizeof *b2);
    memcpy(a2, a, N * sizeof *a);
    memcpy(b2, b, N * sizeof *b);
    double gsl = gsl_stats_spearman(a2, 1, b2, 1, N, work);
    assert_true(fabs(mine - gsl) <= 1e-12);
    assert_true(mine > 0 && mine < 1);   /* a positive association, not a perfect one */
    assert_true(isnan(td_spearman(a, b, 1)));
    free(a); free(b); free(a2); free(b2); free(work);
}

static void test_bad_input(void **state)
{
    (void)state;
    char p[128], cmd[512];
    td_error err;
    test_path(p, sizeof p, "nothere.h5");
    expect_load_error(p, "no such file");

    test_path(p, sizeof p, "text.h5");
    FILE *f = fopen(p, "w");
    fputs("not hdf5\n", f);
    fclose(f);
    expect_load_error(p, "not an HDF5 file");
    snprintf(cmd, sizeof cmd, "tidal-report %s", p);
    assert_int_equal(run_tool(cmd), 1);
    snprintf(cmd, sizeof cmd, "tidal-heatmap %s -o %s/x.png", p, test_dir);
    assert_int_equal(run_tool(cmd), 1);

    test_path(p, sizeof p, "plain.h5");
    hid_t h = H5Fcreate(p, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    H5Fclose(h);
    expect_load_error(p, "not a tidal run file");

    test_path(p, sizeof p, "future.h5");
    td_runfile *rf = td_runfile_create(p, 1, &err);
    td_runfile_set_i64(rf, "schema_version", 99, &err);
    td_runfile_close(rf, &err);
    expect_load_error(p, "schema version 99");
    snprintf(cmd, sizeof cmd, "tidal-report --json %s", p);
    assert_int_equal(run_tool(cmd), 1);

    test_path(p, sizeof p, "empty.h5");
    rf = td_runfile_create(p, 1, &err);
    td_runfile_close(rf, &err);
    expect_load_error(p, "empty run: no batch or step is committed yet");   /* attributes only: a run before its first commit of rows */
    rf = td_runfile_create(p, 1, &err);
    double none = 0;
    td_runfile_append(rf, "/tokens/logp_a", TD_COL_F64, 1, &none, 0, &err);
    td_runfile_close(rf, &err);
    expect_load_error(p, "empty run");
    snprintf(cmd, sizeof cmd, "tidal-heatmap %s -o %s/x.png", p, test_dir);
    assert_int_equal(run_tool(cmd), 1);
    snprintf(cmd, sizeof cmd, "%s/x.png", test_dir);
    assert_int_not_equal(access(cmd, F_OK), 0);  // nothing written

    /* logp_a only: the first missing required column is named */
    test_path(p, sizeof p, "partial.h5");
    rf = td_runfile_create(p, 1, &err);
    double v[3] = {-1, -2, -3};
    td_runfile_append(rf, "/tokens/logp_a", TD_COL_F64, 1, v, 3, &err);
    td_runfile_close(rf, &err);
    expect_load_error(p, "missing dataset /tokens/seq");

    /* unequal columns and a sequence index out of range */
    test_path(p, sizeof p, "short.h5");
    write_small(p, 0);
    rf = td_runfile_open(p, 1, &err);
    td_runfile_append(rf, "/tokens/logp_b", TD_COL_F64, 1, v, 1, &err);
    td_runfile_close(rf, &err);
    expect_load_error(p, "/tokens/logp_b has 5 rows");
    test_path(p, sizeof p, "badseq.h5");
    write_small(p, 0);
    rf = td_runfile_open(p, 1, &err);
    td_runfile_truncate_group(rf, "/seqs", 1, &err);
    td_runfile_close(rf, &err);
    expect_load_error(p, "is not a row of /seqs");

    /* option errors are usage errors (2), a good file reports (0) */
    test_path(p, sizeof p, "good.h5");
    write_small(p, 0);
    snprintf(cmd, sizeof cmd, "tidal-report %s --is token:clip:2", p);
    assert_int_equal(run_tool(cmd), 2);
    snprintf(cmd, sizeof cmd, "tidal-report %s --markdown", p);
    assert_int_equal(run_tool(cmd), 0);
}

static void test_is_spec_parse(void **state)
{
    (void)state;
    td_is_spec s;
    td_error err;
    assert_int_equal(td_is_spec_parse("sequence:mask:3", &s, &err), 0);
    assert_int_equal(s.level, TD_IS_SEQUENCE);
    assert_int_equal(s.mode, TD_IS_MASK);
    assert_true(s.lo == 0 && s.hi == 3);
    assert_int_equal(td_is_spec_parse("geometric:truncate:0.999:1.001", &s, &err), 0);
    assert_true(s.lo == 0.999 && s.hi == 1.001);
    assert_int_not_equal(td_is_spec_parse("token:mask", &s, &err), 0);
    assert_msg_has(err.msg, "LEVEL:MODE:HI");
    assert_int_not_equal(td_is_spec_parse("tokens:mask:2", &s, &err), 0);
    assert_msg_has(err.msg, "level 'tokens'");
    assert_int_not_equal(td_is_spec_parse("token:mask:5:0.5", &s, &err), 0);
    assert_msg_has(err.msg, "above the lower cap");
}

/* Reads a PNG back: size and the value of the text chunk `key` (caller frees; NULL if none). */
static char *read_png_text(const char *path, int *w, int *h, const char *key)
{
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    png_structp png = png_create_read_struct(PNG_LIBPNG_VER_STRING, NULL, NULL, NULL);
    png_infop info = png_create_info_struct(png);
    if (setjmp(png_jmpbuf(png))) fail_msg("%s: libpng cannot read it", path);
    png_init_io(png, f);
    png_read_png(png, info, PNG_TRANSFORM_IDENTITY, NULL);
    *w = (int)png_get_image_width(png, info);
    *h = (int)png_get_image_height(png, info);
    png_textp text;
    int nt = 0;
    char *out = NULL;
    png_get_text(png, info, &text, &nt);
    for (int i = 0; i < nt; i++)
        if (!strcmp(text[i].key, key)) out = strdup(text[i].text);
    png_destroy_read_struct(&png, &info, NULL);
    fclose(f);
    return out;
}

static void test_pictures(void **state)
{
    (void)state;
    char run_path[128], png[128], cmd[512];
    test_path(run_path, sizeof run_path, "pic.h5");
    write_small(run_path, 1);
    static const char *kinds[] = {"seqpos", "layers", "density", "hist"};
    for (int k = 0; k < 4; k++) {
        snprintf(png, sizeof png, "%s/%s.png", test_dir, kinds[k]);
        snprintf(cmd, sizeof cmd, "tidal-heatmap %s %s --plot %s -o %s", run_path, run_path, kinds[k], png);
        assert_int_equal(run_tool(cmd), 0);
        int w, h;
        char *cl = read_png_text(png, &w, &h, "command_line");
        assert_non_null(cl);
        assert_msg_has(cl, "--plot");
        assert_msg_has(cl, kinds[k]);
        assert_true(w >= 640 && h >= 200);
        free(cl);
    }
    /* layers of a run without them: a message saying so */
    td_run run;
    td_error err;
    test_path(run_path, sizeof run_path, "nolayers.h5");
    write_small(run_path, 0);
    assert_int_equal(td_run_load(&run, run_path, TD_RUN_PLOT | TD_RUN_LAYERS, &err), 0);
    td_font *font = td_font_open(NULL, &err);
    if (!font) fail_msg("%s", err.msg);
    td_plot_opts o = {.kind = TD_PLOT_LAYERS, .log_scale = 1};
    assert_null(td_plot(&run, 1, font, &o, &err));
    assert_msg_has(err.msg, "/layers/rel_err is absent");
    /* on a linear scale from 0, |Δlogp| = 0 cells take the bottom viridis colour and ln 2
     * cells the top one; positions 0..2 (prompt) are grey */
    o.kind = TD_PLOT_SEQPOS;
    o.log_scale = 0;
    td_canvas *c = td_plot(&run, 1, font, &o, &err);
    assert_non_null(c);
    td_rgb lo = td_viridis(0), hi = td_viridis(1);
    int n_lo = 0, n_hi = 0, n_grey = 0;
    for (size_t i = 0; i < (size_t)c->w * (size_t)c->h; i++) {
        const uint8_t *q = c->rgb + 3 * i;
        n_lo += q[0] == lo.r && q[1] == lo.g && q[2] == lo.b;
        n_hi += q[0] == hi.r && q[1] == hi.g && q[2] == hi.b;
        n_grey += q[0] == 214 && q[1] == 214 && q[2] == 214;
    }
    assert_true(n_lo > 100 && n_hi > 100 && n_grey > 100);
    td_canvas_free(c);
    td_font_close(font);
    td_run_free(&run);
    assert_null(td_font_open("/nonexistent/font.ttf", &err));
    assert_msg_has(err.msg, "fonts-dejavu-core");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_worked),
        cmocka_unit_test(test_ranks_spearman),
        cmocka_unit_test(test_bad_input),
        cmocka_unit_test(test_is_spec_parse),
        cmocka_unit_test(test_pictures),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
