/* Run files against crashes and hostile files (src/record/runfile.c):
 *  - td_runfile_compact: a file appended in 40 flushed steps (each leaving dead space behind,
 *    as run files never reuse freed space) is rewritten smaller, with every value, dtype, width
 *    and root attribute (string, int, float) identical, and stays appendable;
 *  - a dataset whose extent claims 2^40 rows in a few KB (HDF5 allows that for chunked data):
 *    td_runfile_rows says -1 and td_runfile_read refuses, so no reader sizes a buffer by it;
 *  - compaction of a missing file fails with the file named and creates nothing.
 * Tolerance: none (values are compared bit for bit). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "testutil.h"
#include <hdf5.h>

#include "tidal/runfile.h"

static long file_size(const char *p)
{
    struct stat st;
    return stat(p, &st) == 0 ? (long)st.st_size : -1;
}

enum { STEPS = 40, ROWS = 50 };

static void test_compact(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/c.h5", test_dir);
    td_error err;
    td_runfile *rf = td_runfile_create(path, 0, &err);
    assert_non_null(rf);
    assert_int_equal(td_runfile_set_str(rf, "recipe_a", "{\"name\": \"bf16-train\"}", &err), 0);
    assert_int_equal(td_runfile_set_i64(rf, "seed", -7, &err), 0);
    assert_int_equal(td_runfile_set_f64(rf, "x", 0.1, &err), 0);
    for (int s = 0; s < STEPS; s++) {   /* one flushed commit per step, as tidal-diff does */
        double d[ROWS];
        int32_t w[ROWS * 3];
        for (int i = 0; i < ROWS; i++) {
            d[i] = (s * ROWS + i) * 1e-3 + 1.0 / (i + 1);
            for (int j = 0; j < 3; j++) w[i * 3 + j] = s * 1000 + i * 3 + j;
        }
        assert_int_equal(td_runfile_append(rf, "/tokens/d", TD_COL_F64, 1, d, ROWS, &err), 0);
        assert_int_equal(td_runfile_append(rf, "/layers/w", TD_COL_I32, 3, w, ROWS, &err), 0);
        assert_int_equal(td_runfile_flush(rf, &err), 0);
    }
    assert_int_equal(td_runfile_close(rf, &err), 0);
    long before = file_size(path);
    assert_int_equal(td_runfile_compact(path, &err), 0);
    long after = file_size(path);
    char tmp[160];
    snprintf(tmp, sizeof tmp, "%s.compact.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1);
    printf("compact: %ld -> %ld bytes\n", before, after);
    assert_true(after > 0 && after < before / 2);   /* 40 rewrites of each tail chunk were dead */

    rf = td_runfile_open(path, 1, &err);
    assert_non_null(rf);
    char *s = td_runfile_get_str(rf, "recipe_a", &err);
    assert_string_equal(s, "{\"name\": \"bf16-train\"}");
    free(s);
    int64_t seed = 0;
    assert_int_equal(td_runfile_get_i64(rf, "seed", &seed, &err), 0);
    assert_int_equal(seed, -7);
    assert_int_equal(td_runfile_rows(rf, "/tokens/d"), STEPS * ROWS);
    assert_int_equal(td_runfile_width(rf, "/layers/w"), 3);
    double *d = malloc(STEPS * ROWS * sizeof *d);
    int32_t *w = malloc(STEPS * ROWS * 3 * sizeof *w);
    assert_int_equal(td_runfile_read(rf, "/tokens/d", TD_COL_F64, 0, STEPS * ROWS, d, &err), 0);
    assert_int_equal(td_runfile_read(rf, "/layers/w", TD_COL_I32, 0, STEPS * ROWS, w, &err), 0);
    for (int r = 0; r < STEPS * ROWS; r++) {
        int st = r / ROWS, i = r % ROWS;
        double want = (st * ROWS + i) * 1e-3 + 1.0 / (i + 1);
        assert_memory_equal(&d[r], &want, sizeof want);
        for (int j = 0; j < 3; j++) assert_int_equal(w[r * 3 + j], st * 1000 + i * 3 + j);
    }
    /* still a run file that takes appends */
    assert_int_equal(td_runfile_append(rf, "/tokens/d", TD_COL_F64, 1, d, 5, &err), 0);
    assert_int_equal(td_runfile_rows(rf, "/tokens/d"), STEPS * ROWS + 5);
    assert_int_equal(td_runfile_close(rf, &err), 0);
    free(d);
    free(w);
}

static void test_unbacked_extent(void **state)
{
    (void)state;
    char path[128];
    snprintf(path, sizeof path, "%s/u.h5", test_dir);
    td_error err;
    td_runfile *rf = td_runfile_create(path, 0, &err);
    assert_non_null(rf);
    double d[4] = {1, 2, 3, 4};
    assert_int_equal(td_runfile_append(rf, "/tokens/d", TD_COL_F64, 1, d, 4, &err), 0);
    assert_int_equal(td_runfile_close(rf, &err), 0);
    /* what a corrupt or hostile file can say: 2^40 rows, never written */
    hid_t f = H5Fopen(path, H5F_ACC_RDWR, H5P_DEFAULT);
    hid_t ds = H5Dopen2(f, "/tokens/d", H5P_DEFAULT);
    hsize_t dims[1] = {(hsize_t)1 << 40};
    assert_true(H5Dset_extent(ds, dims) >= 0);
    H5Dclose(ds);
    H5Fclose(f);
    assert_true(file_size(path) < 1 << 20);

    rf = td_runfile_open(path, 0, &err);
    assert_non_null(rf);
    assert_int_equal(td_runfile_rows(rf, "/tokens/d"), -1);
    double out[4];
    assert_int_not_equal(td_runfile_read(rf, "/tokens/d", TD_COL_F64, 0, 4, out, &err), 0);
    assert_non_null(strstr(err.msg, "storage cannot hold"));
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(td_runfile_close(rf, &err), 0);
}

static void test_compact_missing(void **state)
{
    (void)state;
    char path[128], tmp[160];
    snprintf(path, sizeof path, "%s/none.h5", test_dir);
    snprintf(tmp, sizeof tmp, "%s.compact.tmp", path);
    td_error err;
    assert_int_not_equal(td_runfile_compact(path, &err), 0);
    assert_non_null(strstr(err.msg, path));
    assert_int_equal(access(tmp, F_OK), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compact),
        cmocka_unit_test(test_unbacked_extent),
        cmocka_unit_test(test_compact_missing),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
