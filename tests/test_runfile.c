/* HDF5 run files (src/record/runfile.c):
 *  - create, append to 1-D and 2-D datasets over several calls (including empty ones), root
 *    attributes (string, int, float); reopen read-only and read back bit for bit; reads with
 *    type conversion and row ranges; rows / width / exists;
 *  - the same file read by h5py (tests/py/runfile_h5py_check.py, run here through .venv's
 *    python when it is there): dtypes, shapes, chunking, compression, values, str/int attrs;
 *  - truncate_group for resume, then appending continues where the cut left off;
 *  - an existing file is not replaced without overwrite;
 *  - missing file, non-HDF5 file, HDF5 file without the tidal attribute, schema version from
 *    the future, mismatched appends, reads outside the rows: errors naming file and problem;
 *  - a reader of a file caught between two writes of a commit's apply (datasets of one group at
 *    different lengths) sees one whole commit: the rows /progress names, in every group.
 * Tolerance: none (stored values are read back exactly). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/wait.h>
#include <cmocka.h>

#include "testutil.h"
#include <hdf5.h>

#include "tidal/runfile.h"

static void ok(int rc, const td_error *err)
{
    if (rc) { print_error("%s\n", err->msg); fail(); }
}

/* The columns of the main file (formulas shared with runfile_h5py_check.py; all exact). */
enum { N_TOK = 12, N_LAYER_ROWS = 7, N_LAYERS = 3 };
static int64_t seq_of(int i) { return (int64_t)i * 3 - 7; }
static int32_t pos_of(int i) { return 100 + i; }
static double logp_of(int i) { return -i / 8.0; }
static int8_t flag_of(int i) { return (int8_t)(i % 3 - 1); }
static float rel_of(int r, int c) { return (float)(r * 0.5 + c / 4.0); }

static const char *CMDLINE = "tidal-score --model m \xc3\xa9t\xc3\xa9";

static void write_main_file(const char *path)
{
    td_error err = {{0}};
    td_runfile *rf = td_runfile_create(path, 0, &err);
    if (!rf) { print_error("%s\n", err.msg); fail(); }
    int64_t seq[N_TOK];
    int32_t pos[N_TOK];
    double logp[N_TOK];
    int8_t flag[N_TOK];
    for (int i = 0; i < N_TOK; i++) { seq[i] = seq_of(i); pos[i] = pos_of(i); logp[i] = logp_of(i); flag[i] = flag_of(i); }
    /* several calls per column, one of them empty (creates nothing new, adds no row) */
    ok(td_runfile_append(rf, "/tokens/seq", TD_COL_I64, 1, seq, 5, &err), &err);
    ok(td_runfile_append(rf, "/tokens/seq", TD_COL_I64, 1, seq + 5, 0, &err), &err);
    ok(td_runfile_append(rf, "/tokens/seq", TD_COL_I64, 1, seq + 5, 7, &err), &err);
    ok(td_runfile_append(rf, "/tokens/pos", TD_COL_I32, 1, pos, 4, &err), &err);
    ok(td_runfile_append(rf, "/tokens/pos", TD_COL_I32, 1, pos + 4, 8, &err), &err);
    for (int i = 0; i < N_TOK; i += 3) ok(td_runfile_append(rf, "/tokens/logp_a", TD_COL_F64, 1, logp + i, 3, &err), &err);
    ok(td_runfile_append(rf, "/tokens/flag", TD_COL_I8, 1, flag, N_TOK, &err), &err);
    float rel[N_LAYER_ROWS][N_LAYERS];
    for (int r = 0; r < N_LAYER_ROWS; r++) for (int c = 0; c < N_LAYERS; c++) rel[r][c] = rel_of(r, c);
    ok(td_runfile_append(rf, "/layers/rel_err", TD_COL_F32, N_LAYERS, rel[0], 3, &err), &err);
    assert_int_equal(td_runfile_rows(rf, "/layers/rel_err"), 3);
    ok(td_runfile_append(rf, "/layers/rel_err", TD_COL_F32, N_LAYERS, rel[3], 4, &err), &err);
    ok(td_runfile_set_str(rf, "command_line", "placeholder", &err), &err);
    ok(td_runfile_set_str(rf, "command_line", CMDLINE, &err), &err);   /* replaces */
    ok(td_runfile_set_i64(rf, "seed", -1234567890123LL, &err), &err);
    ok(td_runfile_set_f64(rf, "temperature", 0.7, &err), &err);
    ok(td_runfile_flush(rf, &err), &err);
    assert_string_equal(td_runfile_path(rf), path);
    ok(td_runfile_close(rf, &err), &err);
}

/* Runs the h5py check on path if .venv's python and the script are there (tests run from the
 * repository root); otherwise says why it is skipped. */
static void h5py_check(const char *path)
{
    const char *py = ".venv/bin/python", *script = "tests/py/runfile_h5py_check.py";
    if (access(py, X_OK) != 0 || access(script, R_OK) != 0) {
        printf("note: h5py cross-check skipped (%s or %s not found from %s)\n", py, script, getcwd((char[512]){0}, 512));
        return;
    }
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s %s '%s'", py, script, path);
    int st = system(cmd);
    assert_true(st != -1 && WIFEXITED(st));
    if (WEXITSTATUS(st) == 77) { printf("note: h5py cross-check skipped (h5py not importable)\n"); return; }
    assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_write_and_read_back(void **state)
{
    (void)state;
    char path[128];
    test_path(path, sizeof path, "run.h5");
    write_main_file(path);

    td_error err = {{0}};
    td_runfile *rf = td_runfile_open(path, 0, &err);
    if (!rf) { print_error("%s\n", err.msg); fail(); }
    assert_int_equal(td_runfile_rows(rf, "/tokens/seq"), N_TOK);
    assert_int_equal(td_runfile_rows(rf, "/tokens/pos"), N_TOK);
    assert_int_equal(td_runfile_rows(rf, "/tokens/logp_a"), N_TOK);
    assert_int_equal(td_runfile_rows(rf, "/layers/rel_err"), N_LAYER_ROWS);
    assert_int_equal(td_runfile_width(rf, "/tokens/seq"), 1);
    assert_int_equal(td_runfile_width(rf, "/layers/rel_err"), N_LAYERS);
    assert_int_equal(td_runfile_rows(rf, "/tokens/nothing"), 0);
    assert_int_equal(td_runfile_width(rf, "/nogroup/nothing"), 0);
    assert_true(td_runfile_exists(rf, "/tokens/seq"));
    assert_true(td_runfile_exists(rf, "/tokens"));
    assert_false(td_runfile_exists(rf, "/tokens/nothing"));
    assert_false(td_runfile_exists(rf, "/nogroup/x"));

    int64_t seq[N_TOK];
    int32_t pos[N_TOK];
    double logp[N_TOK], posd[N_TOK];
    int8_t flag[N_TOK];
    float rel[N_LAYER_ROWS][N_LAYERS];
    ok(td_runfile_read(rf, "/tokens/seq", TD_COL_I64, 0, N_TOK, seq, &err), &err);
    ok(td_runfile_read(rf, "/tokens/pos", TD_COL_I32, 0, N_TOK, pos, &err), &err);
    ok(td_runfile_read(rf, "/tokens/logp_a", TD_COL_F64, 0, N_TOK, logp, &err), &err);
    ok(td_runfile_read(rf, "/tokens/flag", TD_COL_I8, 0, N_TOK, flag, &err), &err);
    ok(td_runfile_read(rf, "/layers/rel_err", TD_COL_F32, 0, N_LAYER_ROWS, rel[0], &err), &err);
    ok(td_runfile_read(rf, "/tokens/pos", TD_COL_F64, 0, N_TOK, posd, &err), &err);   /* converted */
    for (int i = 0; i < N_TOK; i++) {
        assert_int_equal(seq[i], seq_of(i));
        assert_int_equal(pos[i], pos_of(i));
        assert_true(logp[i] == logp_of(i));
        assert_int_equal(flag[i], flag_of(i));
        assert_true(posd[i] == (double)pos_of(i));
    }
    for (int r = 0; r < N_LAYER_ROWS; r++)
        for (int c = 0; c < N_LAYERS; c++) assert_true(rel[r][c] == rel_of(r, c));
    /* a row range: rows 4..8 of a 2-D dataset, and 0 rows */
    float part[4][N_LAYERS];
    ok(td_runfile_read(rf, "/layers/rel_err", TD_COL_F32, 3, 4, part[0], &err), &err);
    assert_memory_equal(part, rel[3], sizeof part);
    ok(td_runfile_read(rf, "/tokens/seq", TD_COL_I64, N_TOK, 0, seq, &err), &err);

    /* attributes */
    char *s = td_runfile_get_str(rf, "command_line", &err);
    assert_non_null(s);
    assert_string_equal(s, CMDLINE);
    free(s);
    s = td_runfile_get_str(rf, "tool_version", &err);
    assert_string_equal(s, TD_VERSION);
    free(s);
    int64_t v = 0;
    ok(td_runfile_get_i64(rf, "seed", &v, &err), &err);
    assert_true(v == -1234567890123LL);
    ok(td_runfile_get_i64(rf, "schema_version", &v, &err), &err);
    assert_int_equal(v, TD_SCHEMA_VERSION);
    assert_null(td_runfile_get_str(rf, "nothing", &err));
    assert_msg_has(err.msg, path);
    assert_msg_has(err.msg, "nothing");
    assert_null(td_runfile_get_str(rf, "seed", &err));              /* an int is not a string */
    assert_msg_has(err.msg, "seed");
    assert_int_equal(td_runfile_get_i64(rf, "command_line", &v, &err), -1);
    assert_msg_has(err.msg, "command_line");
    assert_int_equal(td_runfile_get_i64(rf, "temperature", &v, &err), -1);

    /* reads outside the data */
    assert_int_equal(td_runfile_read(rf, "/tokens/seq", TD_COL_I64, 10, 3, seq, &err), -1);
    assert_msg_has(err.msg, "/tokens/seq");
    assert_int_equal(td_runfile_read(rf, "/tokens/seq", TD_COL_I64, -1, 1, seq, &err), -1);
    assert_int_equal(td_runfile_read(rf, "/tokens/nothing", TD_COL_I64, 0, 1, seq, &err), -1);
    assert_msg_has(err.msg, "/tokens/nothing");
    assert_msg_has(err.msg, path);

    /* read-only: writes are refused with an error, not a crash */
    assert_int_equal(td_runfile_append(rf, "/tokens/seq", TD_COL_I64, 1, seq, 1, &err), -1);
    assert_msg_has(err.msg, path);
    assert_int_equal(td_runfile_append(rf, "/new/col", TD_COL_I64, 1, seq, 1, &err), -1);
    assert_int_equal(td_runfile_set_i64(rf, "seed", 1, &err), -1);
    ok(td_runfile_close(rf, &err), &err);

    h5py_check(path);
}

static void test_truncate_and_resume(void **state)
{
    (void)state;
    char path[128];
    test_path(path, sizeof path, "resume.h5");
    td_error err = {{0}};
    td_runfile *rf = td_runfile_create(path, 0, &err);
    assert_non_null(rf);
    int32_t a[10];
    double b[10];
    float l[10][2];
    for (int i = 0; i < 10; i++) { a[i] = i; b[i] = i + 0.5; l[i][0] = (float)i; l[i][1] = (float)-i; }
    ok(td_runfile_append(rf, "/tokens/a", TD_COL_I32, 1, a, 10, &err), &err);
    ok(td_runfile_append(rf, "/tokens/b", TD_COL_F64, 1, b, 10, &err), &err);
    ok(td_runfile_append(rf, "/tokens/sub/c", TD_COL_I32, 1, a, 10, &err), &err);   /* a nested group */
    ok(td_runfile_append(rf, "/layers/rel_err", TD_COL_F32, 2, l[0], 10, &err), &err);
    ok(td_runfile_append(rf, "/seqs/n", TD_COL_I32, 1, a, 3, &err), &err);
    ok(td_runfile_close(rf, &err), &err);

    /* resume: reopen writable, drop the half-written unit (rows 6..9) */
    rf = td_runfile_open(path, 1, &err);
    assert_non_null(rf);
    ok(td_runfile_truncate_group(rf, "/tokens", 6, &err), &err);
    ok(td_runfile_truncate_group(rf, "/layers", 6, &err), &err);
    assert_int_equal(td_runfile_rows(rf, "/tokens/a"), 6);
    assert_int_equal(td_runfile_rows(rf, "/tokens/b"), 6);
    assert_int_equal(td_runfile_rows(rf, "/tokens/sub/c"), 10);   /* datasets of the group only */
    assert_int_equal(td_runfile_rows(rf, "/layers/rel_err"), 6);
    assert_int_equal(td_runfile_width(rf, "/layers/rel_err"), 2);
    assert_int_equal(td_runfile_rows(rf, "/seqs/n"), 3);
    /* more rows than there are: nothing changes; a missing group is no error */
    ok(td_runfile_truncate_group(rf, "/seqs", 5, &err), &err);
    assert_int_equal(td_runfile_rows(rf, "/seqs/n"), 3);
    ok(td_runfile_truncate_group(rf, "/steps", 0, &err), &err);
    /* appending continues at row 6 */
    int32_t more[2] = {60, 70};
    ok(td_runfile_append(rf, "/tokens/a", TD_COL_I32, 1, more, 2, &err), &err);
    ok(td_runfile_close(rf, &err), &err);

    rf = td_runfile_open(path, 0, &err);
    int32_t got[8];
    ok(td_runfile_read(rf, "/tokens/a", TD_COL_I32, 0, 8, got, &err), &err);
    const int32_t want[8] = {0, 1, 2, 3, 4, 5, 60, 70};
    assert_memory_equal(got, want, sizeof want);
    float lg[6][2];
    ok(td_runfile_read(rf, "/layers/rel_err", TD_COL_F32, 0, 6, lg[0], &err), &err);
    assert_memory_equal(lg, l, sizeof lg);
    ok(td_runfile_close(rf, &err), &err);
}

static void test_overwrite_refused(void **state)
{
    (void)state;
    char path[128];
    test_path(path, sizeof path, "keep.h5");
    td_error err = {{0}};
    td_runfile *rf = td_runfile_create(path, 0, &err);
    int64_t x[3] = {1, 2, 3};
    ok(td_runfile_append(rf, "/seqs/x", TD_COL_I64, 1, x, 3, &err), &err);
    ok(td_runfile_close(rf, &err), &err);

    assert_null(td_runfile_create(path, 0, &err));
    assert_msg_has(err.msg, path);
    assert_msg_has(err.msg, "already exists");
    /* the refused create left the file as it was */
    rf = td_runfile_open(path, 0, &err);
    assert_non_null(rf);
    assert_int_equal(td_runfile_rows(rf, "/seqs/x"), 3);
    ok(td_runfile_close(rf, &err), &err);
    /* any existing path counts, not only HDF5 files */
    char other[128];
    test_path(other, sizeof other, "notes.txt");
    FILE *f = fopen(other, "w");
    fputs("mine\n", f);
    fclose(f);
    assert_null(td_runfile_create(other, 0, &err));
    /* with overwrite: a fresh, empty run file */
    rf = td_runfile_create(path, 1, &err);
    assert_non_null(rf);
    assert_int_equal(td_runfile_rows(rf, "/seqs/x"), 0);
    ok(td_runfile_close(rf, &err), &err);
    /* a directory that is not there */
    assert_null(td_runfile_create("/nonexistent/dir/run.h5", 0, &err));
    assert_msg_has(err.msg, "/nonexistent/dir/run.h5");
}

static void test_open_errors(void **state)
{
    (void)state;
    char path[128];
    td_error err = {{0}};
    test_path(path, sizeof path, "missing.h5");
    assert_null(td_runfile_open(path, 0, &err));
    assert_msg_has(err.msg, path);

    test_path(path, sizeof path, "text.h5");
    FILE *f = fopen(path, "w");
    fputs("this is not HDF5, just text that is long enough to have a superblock's worth\n", f);
    fclose(f);
    assert_null(td_runfile_open(path, 0, &err));
    assert_msg_has(err.msg, path);
    assert_msg_has(err.msg, "not an HDF5 file");

    /* an HDF5 file some other program wrote: no format attribute */
    test_path(path, sizeof path, "foreign.h5");
    hid_t h = H5Fcreate(path, H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
    assert_true(h >= 0);
    H5Fclose(h);
    assert_null(td_runfile_open(path, 1, &err));
    assert_msg_has(err.msg, path);
    assert_msg_has(err.msg, "not a tidal run file");

    /* schema versions this build does not read: the future (2) and nonsense (0) */
    const int64_t bad_versions[2] = {TD_SCHEMA_VERSION + 1, 0};
    for (int k = 0; k < 2; k++) {
        test_path(path, sizeof path, k ? "zero.h5" : "future.h5");
        td_runfile *rf = td_runfile_create(path, 0, &err);
        ok(td_runfile_set_i64(rf, "schema_version", bad_versions[k], &err), &err);
        ok(td_runfile_close(rf, &err), &err);
        assert_null(td_runfile_open(path, 0, &err));
        assert_msg_has(err.msg, path);
        char want[64];
        snprintf(want, sizeof want, "schema version %lld", (long long)bad_versions[k]);
        assert_msg_has(err.msg, want);
    }
}

/* Root string attributes written by other programs: fixed-length ASCII and UTF-8 (h5py's
 * np.bytes_, older files) and variable-length ASCII all read back through td_runfile_get_str. */
static void test_foreign_string_attributes(void **state)
{
    (void)state;
    char path[128];
    test_path(path, sizeof path, "attrs.h5");
    td_error err = {{0}};
    td_runfile *rf = td_runfile_create(path, 0, &err);
    ok(td_runfile_close(rf, &err), &err);
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    assert_true(f >= 0);
    const char *names[3] = {"fixed_ascii", "fixed_utf8", "vlen_ascii"};
    const char *value = "abc";
    for (int k = 0; k < 3; k++) {
        hid_t t = H5Tcopy(H5T_C_S1);
        H5Tset_size(t, k == 2 ? H5T_VARIABLE : 4);
        H5Tset_cset(t, k == 1 ? H5T_CSET_UTF8 : H5T_CSET_ASCII);
        hid_t sp = H5Screate(H5S_SCALAR);
        hid_t a = H5Acreate2(f, names[k], t, sp, H5P_DEFAULT, H5P_DEFAULT);
        assert_true(H5Awrite(a, t, k == 2 ? (const void *)&value : (const void *)value) >= 0);
        H5Aclose(a);
        H5Sclose(sp);
        H5Tclose(t);
    }
    H5Fclose(f);
    rf = td_runfile_open(path, 0, &err);
    assert_non_null(rf);
    for (int k = 0; k < 3; k++) {
        char *s = td_runfile_get_str(rf, names[k], &err);
        if (!s) { print_error("%s: %s\n", names[k], err.msg); fail(); }
        assert_string_equal(s, "abc");
        free(s);
    }
    ok(td_runfile_close(rf, &err), &err);
}

static void test_append_mismatch(void **state)
{
    (void)state;
    char path[128];
    test_path(path, sizeof path, "mismatch.h5");
    td_error err = {{0}};
    td_runfile *rf = td_runfile_create(path, 0, &err);
    double d[4] = {1, 2, 3, 4};
    int64_t i64[4] = {1, 2, 3, 4};
    int32_t i32[4] = {1, 2, 3, 4};
    float f32[8] = {0};
    ok(td_runfile_append(rf, "/tokens/x", TD_COL_F64, 1, d, 4, &err), &err);
    /* same size, other class (int64 vs float64), and other size (float32) */
    assert_int_equal(td_runfile_append(rf, "/tokens/x", TD_COL_I64, 1, i64, 4, &err), -1);
    assert_msg_has(err.msg, path);
    assert_msg_has(err.msg, "/tokens/x");
    assert_int_equal(td_runfile_append(rf, "/tokens/x", TD_COL_F32, 1, f32, 4, &err), -1);
    ok(td_runfile_append(rf, "/tokens/i", TD_COL_I32, 1, i32, 4, &err), &err);
    assert_int_equal(td_runfile_append(rf, "/tokens/i", TD_COL_F32, 1, f32, 4, &err), -1);   /* 4 bytes both */
    assert_int_equal(td_runfile_append(rf, "/tokens/i", TD_COL_I64, 1, i64, 4, &err), -1);
    /* widths: 1-D vs 2-D, 2 vs 4 columns */
    assert_int_equal(td_runfile_append(rf, "/tokens/x", TD_COL_F64, 2, d, 2, &err), -1);
    ok(td_runfile_append(rf, "/layers/w", TD_COL_F32, 2, f32, 4, &err), &err);
    assert_int_equal(td_runfile_append(rf, "/layers/w", TD_COL_F32, 4, f32, 2, &err), -1);
    assert_msg_has(err.msg, "/layers/w");
    assert_int_equal(td_runfile_append(rf, "/layers/w", TD_COL_F32, 1, f32, 8, &err), -1);
    /* the refused appends added nothing */
    assert_int_equal(td_runfile_rows(rf, "/tokens/x"), 4);
    assert_int_equal(td_runfile_rows(rf, "/tokens/i"), 4);
    assert_int_equal(td_runfile_rows(rf, "/layers/w"), 4);
    /* a dataset path through an existing dataset cannot be created */
    assert_int_equal(td_runfile_append(rf, "/tokens/x/y", TD_COL_F64, 1, d, 1, &err), -1);
    assert_msg_has(err.msg, path);
    ok(td_runfile_close(rf, &err), &err);
}

/* A file as a reader finds it while tidal-rl applies the commit of its second step: the apply
 * writes the datasets' extents one by one, so some columns hold 2 steps and others 1 (and
 * /progress itself may be half-way). A reader must see the first step whole, in every group:
 * /progress row 1, its row counts in /tokens and /seqs, one /steps row; a writer (resume) sees the
 * file as it is. Without /progress (a merged file, tidal-sft's) nothing is cut. */
static void test_committed_cut(void **state)
{
    (void)state;
    char path[128];
    test_path(path, sizeof path, "skew.h5");
    td_error err = {{0}};
    td_runfile *rf = td_runfile_create(path, 0, &err);
    assert_non_null(rf);
    const int64_t batch[2] = {0, 1}, seq_rows[2] = {2, 4}, tok_rows[2] = {6, 12}, prm_rows[2] = {10, 20};
    double v[20];
    for (int i = 0; i < 20; i++) v[i] = i + 0.25;
    ok(td_runfile_append(rf, "/progress/batch", TD_COL_I64, 1, batch, 2, &err), &err);
    ok(td_runfile_append(rf, "/progress/seq_rows", TD_COL_I64, 1, seq_rows, 2, &err), &err);
    ok(td_runfile_append(rf, "/progress/token_rows", TD_COL_I64, 1, tok_rows, 1, &err), &err);   /* half-way */
    ok(td_runfile_append(rf, "/progress/prompt_rows", TD_COL_I64, 1, prm_rows, 2, &err), &err);
    ok(td_runfile_append(rf, "/tokens/logp_a", TD_COL_F64, 1, v, 12, &err), &err);               /* new extent */
    ok(td_runfile_append(rf, "/tokens/logp_b", TD_COL_F64, 1, v, 6, &err), &err);                /* old */
    ok(td_runfile_append(rf, "/seqs/n", TD_COL_F64, 1, v, 4, &err), &err);
    ok(td_runfile_append(rf, "/prompts/tokens", TD_COL_F64, 1, v, 20, &err), &err);
    ok(td_runfile_append(rf, "/steps/reward", TD_COL_F64, 1, v, 2, &err), &err);
    ok(td_runfile_append(rf, "/steps/loss", TD_COL_F64, 1, v, 1, &err), &err);
    ok(td_runfile_close(rf, &err), &err);

    rf = td_runfile_open(path, 0, &err);
    assert_non_null(rf);
    assert_int_equal(td_runfile_rows(rf, "/progress/batch"), 1);
    assert_int_equal(td_runfile_rows(rf, "/progress/token_rows"), 1);
    assert_int_equal(td_runfile_rows(rf, "/tokens/logp_a"), 6);
    assert_int_equal(td_runfile_rows(rf, "/tokens/logp_b"), 6);
    assert_int_equal(td_runfile_rows(rf, "/seqs/n"), 2);
    assert_int_equal(td_runfile_rows(rf, "/prompts/tokens"), 10);
    assert_int_equal(td_runfile_rows(rf, "/steps/reward"), 1);
    assert_int_equal(td_runfile_rows(rf, "/steps/loss"), 1);
    double got[12];
    ok(td_runfile_read(rf, "/tokens/logp_a", TD_COL_F64, 0, 6, got, &err), &err);
    assert_memory_equal(got, v, 6 * sizeof(double));
    assert_int_equal(td_runfile_read(rf, "/tokens/logp_a", TD_COL_F64, 0, 12, got, &err), -1);   /* past the commit */
    assert_msg_has(err.msg, "/tokens/logp_a");
    ok(td_runfile_close(rf, &err), &err);

    /* the writer's own view (resume): every row there is */
    rf = td_runfile_open(path, 1, &err);
    assert_non_null(rf);
    assert_int_equal(td_runfile_rows(rf, "/tokens/logp_a"), 12);
    assert_int_equal(td_runfile_rows(rf, "/steps/reward"), 2);
    /* the commit completes: every column at 2 steps, and a reader sees them all */
    ok(td_runfile_append(rf, "/progress/token_rows", TD_COL_I64, 1, tok_rows + 1, 1, &err), &err);
    ok(td_runfile_append(rf, "/tokens/logp_b", TD_COL_F64, 1, v + 6, 6, &err), &err);
    ok(td_runfile_append(rf, "/steps/loss", TD_COL_F64, 1, v + 1, 1, &err), &err);
    ok(td_runfile_close(rf, &err), &err);
    rf = td_runfile_open(path, 0, &err);
    assert_int_equal(td_runfile_rows(rf, "/progress/batch"), 2);
    assert_int_equal(td_runfile_rows(rf, "/tokens/logp_b"), 12);
    assert_int_equal(td_runfile_rows(rf, "/seqs/n"), 4);
    assert_int_equal(td_runfile_rows(rf, "/steps/loss"), 2);
    ok(td_runfile_close(rf, &err), &err);

    /* a reader that finds no whole commit (the first one's rows not all there) sees none */
    test_path(path, sizeof path, "skew0.h5");
    rf = td_runfile_create(path, 0, &err);
    ok(td_runfile_append(rf, "/progress/batch", TD_COL_I64, 1, batch, 1, &err), &err);
    ok(td_runfile_append(rf, "/progress/token_rows", TD_COL_I64, 1, tok_rows, 1, &err), &err);
    ok(td_runfile_append(rf, "/tokens/logp_a", TD_COL_F64, 1, v, 6, &err), &err);
    ok(td_runfile_append(rf, "/tokens/logp_b", TD_COL_F64, 1, v, 0, &err), &err);
    ok(td_runfile_append(rf, "/tokens/logp_b", TD_COL_F64, 1, v, 3, &err), &err);
    ok(td_runfile_close(rf, &err), &err);
    rf = td_runfile_open(path, 0, &err);
    assert_int_equal(td_runfile_rows(rf, "/progress/batch"), 0);
    assert_int_equal(td_runfile_rows(rf, "/tokens/logp_a"), 0);
    ok(td_runfile_close(rf, &err), &err);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_write_and_read_back),
        cmocka_unit_test(test_truncate_and_resume),
        cmocka_unit_test(test_overwrite_refused),
        cmocka_unit_test(test_open_errors),
        cmocka_unit_test(test_foreign_string_attributes),
        cmocka_unit_test(test_append_mismatch),
        cmocka_unit_test(test_committed_cut),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
