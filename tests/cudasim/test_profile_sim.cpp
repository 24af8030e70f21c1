/* The CUDA backend's profiler (src/backend/cuda/profile.cu): with TIDAL_CUDA_PROFILE=FILE set
 * before the backend opens, a few ops (a kernel of this file, residual_forward_cuda on host
 * buffers, be->upload / be->download) must each get a line in the table written to FILE, with
 * their call counts and copied bytes, and the table its wall time lines; every line starts with
 * "tidal-cuda-profile: ". With the variable unset again, profiling is off (tdc_prof_on 0) and
 * nothing is added. Runs under the simulator and, as a GPU test, on the device. */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

__global__ void profile_fill(float *x, int n, float v)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] = v;
}

static char path[256];

/* the table's line for label: its call count (and bytes in MiB, when asked); -1 when absent */
static long calls_of(const char *table, const char *label, double *mib)
{
    char head[160];
    snprintf(head, sizeof head, "tidal-cuda-profile: %s ", label);
    const char *l = strstr(table, head);
    if (!l) return -1;
    char *end;
    long calls = strtol(l + strlen(head), &end, 10);
    if (mib) {
        double total, mean, pct;
        *mib = sscanf(end, "%lf %lf %lf %lf", &total, &mean, &pct, mib) == 4 ? *mib : -1;
    }
    return calls;
}

static std::vector<char> slurp(const char *p)
{
    std::vector<char> t;
    FILE *f = fopen(p, "r");
    if (!f) return t;
    char buf[4096];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, f)) > 0) t.insert(t.end(), buf, buf + k);
    fclose(f);
    t.push_back(0);
    return t;
}

static void table_names_the_ops(void **state)
{
    (void)state;
    snprintf(path, sizeof path, "/tmp/tidal-profile-test-%d.txt", (int)getpid());
    remove(path);
    setenv("TIDAL_CUDA_PROFILE", path, 1);
    const td_backend *be = sim_open_gpu();   /* reads the variable again (tdc_prof_setup) */
    assert_non_null(be);
    assert_int_equal(tdc_prof_on, 1);

    const int n = 1000;
    float *d = (float *)be->alloc(n * sizeof(float));
    for (int r = 0; r < 3; r++) TD_LAUNCH(profile_fill, (n + 255) / 256, 256, 0, tdc_stream(), d, n, 1.0f + r);
    std::vector<float> h(n), a(n, 1.0f), b(n, 2.0f), out(n);
    be->download(h.data(), d, n * sizeof(float));
    assert_true(h[0] == 3.0f && h[n - 1] == 3.0f);
    const size_t big = (size_t)1 << 20;   /* 1 MiB zeroed and brought down */
    void *z = be->alloc(big);
    be->zero(z, big);
    std::vector<char> hz(big, 1);
    be->download(hz.data(), z, big);
    assert_true(hz[0] == 0 && hz[big - 1] == 0);
    be->free(z);
    be->upload(d, a.data(), n * sizeof(float));
    be->upload(d, b.data(), n * sizeof(float));
    sim_rcase rc = {"fp32", td_recipe{}, 1};
    td_ops ctx = sim_ctx(rc);
    residual_forward_cuda(&ctx, out.data(), a.data(), b.data(), n);   /* host buffers: staged */
    assert_true(out[0] == 3.0f);
    tdc_prof_report();

    std::vector<char> t = slurp(path);
    assert_true(t.size() > 1);
    const char *s = t.data();
    printf("%s", s);
    double mib;
    assert_int_equal(calls_of(s, "profile_fill (test_profile_sim.cpp)", NULL), 3);
    assert_int_equal(calls_of(s, "residual_elems (residual.cu)", NULL), 1);
    assert_int_equal(calls_of(s, "download", &mib), 2);
    assert_true(mib >= 1.0 && mib < 1.01);   /* 1 MiB + 4000 bytes, to two decimals */
    assert_int_equal(calls_of(s, "zero (cudaMemsetAsync)", NULL), 1);
    assert_int_equal(calls_of(s, "upload", NULL), 2);
    assert_true(calls_of(s, "stage in (tdc_in, tdc_out)", NULL) >= 2);
    assert_int_equal(calls_of(s, "stage out (tdc_done)", NULL), 1);
    assert_true(calls_of(s, "cudaMalloc", NULL) >= 1);
    assert_non_null(strstr(s, "tidal-cuda-profile: not in any op"));
    assert_non_null(strstr(s, "tidal-cuda-profile: profiled wall time"));
    for (const char *l = s; *l; l = strchr(l, '\n') + 1) {   /* every line prefixed */
        assert_int_equal(strncmp(l, "tidal-cuda-profile: ", 20), 0);
        if (!strchr(l, '\n')) break;
    }

    /* off again: nothing counted, nothing written at exit */
    unsetenv("TIDAL_CUDA_PROFILE");
    tdc_prof_setup();
    assert_int_equal(tdc_prof_on, 0);
    remove(path);
    TD_LAUNCH(profile_fill, (n + 255) / 256, 256, 0, tdc_stream(), d, n, 4.0f);
    be->download(h.data(), d, n * sizeof(float));
    assert_true(h[0] == 4.0f);
    be->free(d);
    tdc_prof_report();
    assert_null(fopen(path, "r"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(table_names_the_ops)};
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    if (path[0]) remove(path);   /* also where an assertion stopped the test */
    return failed;
}
