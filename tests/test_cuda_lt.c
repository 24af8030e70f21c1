/* cuBLASLt is loaded by the CUDA backend when it opens (src/backend/cuda/lt_dl.cu), not at tool
 * start: before tdc_lt_load no libcublasLt is mapped in this process, after it the library is
 * mapped and every function lt.cu calls resolves (one is called: cublasLtGetStatusString, which
 * needs no GPU). Built with the CUDA backend only (TD_HAVE_CUDA); without it the test says so
 * and checks nothing else. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

static int mapped(const char *name)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[1024];
    int found = 0;
    while (f && fgets(line, sizeof line, f))
        if (strstr(line, name)) found = 1;
    if (f) fclose(f);
    return found;
}

#ifdef TD_HAVE_CUDA
int tdc_lt_load(char *why, size_t why_len);
const char *cublasLtGetStatusString(int status);   /* cublasStatus_t is an int-sized enum */

static void lazy_load(void **state)
{
    (void)state;
    assert_false(mapped("libcublasLt"));
    char why[600] = "";
    int rc = tdc_lt_load(why, sizeof why);
    if (rc) fprintf(stderr, "tdc_lt_load: %s\n", why);
    assert_int_equal(rc, 0);
    assert_true(mapped("libcublasLt"));
    const char *ok = cublasLtGetStatusString(0);   /* CUDA 13's cuBLASLt says "success" */
    assert_non_null(ok);
    assert_true(!strcmp(ok, "success") || !strcmp(ok, "CUBLAS_STATUS_SUCCESS"));
    assert_int_equal(tdc_lt_load(NULL, 0), 0);   /* once */
}
#else
static void lazy_load(void **state)
{
    (void)state;
    printf("built without the CUDA backend: nothing to load\n");
    assert_false(mapped("libcublasLt"));
}
#endif

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(lazy_load)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
