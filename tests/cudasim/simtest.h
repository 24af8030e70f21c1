/* tidal — the harness of the test programs tests/cudasim/test_*.cpp, built against the
 * simulator (sim.mk) and, for the CUDA backend's tests, by nvcc against a real GPU (Makefile,
 * GPUTESTS): header only, so both builds take it as it is.
 *
 * Every test: cmocka (a C library: its header has no extern "C" of its own) and managed
 * buffers the host reads and writes directly (sim_managed).
 *
 * The CUDA backend's tests (those that include cuda_internal.cuh first) also get:
 *   sim_open_gpu            the backend, or NULL with the reason on stderr (a cmocka setup)
 *   sim_normal, sim_rounded seeded N(0, sd^2) fills from the test's own td_rng; values of D
 *   sim_rcase, sim_preset,  a named recipe case (none: no recipe, the fp32 reference), the CPU
 *   sim_ctx, sim_D          context for it and its activations dtype
 *   sim_bufs, sim_four_ways an op run four ways: host buffers (staged by tdc_in / tdc_out) and
 *                           device buffers (cudaMalloc), each under CUDASIM_ORDER=forward and
 *                           reverse; the four results must be the same bits
 *   sim_compare, sim_exact  differing bits, max |gpu - cpu| and max |cpu|; a bit-exact verdict
 *   sim_ulp                 a unit in the last place of a format
 *   sim_cpu_dot_like_kernels, sim_attention_figures
 *                           whether the CPU sums q.k in the kernels' order, and the attention
 *                           tolerances against the CPU (test_ops_sim.cpp's header states them) */
#ifndef TIDAL_SIMTEST_H
#define TIDAL_SIMTEST_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
extern "C" {
#include <cmocka.h>
}

/* SIM_SANITIZED: 1 in the AddressSanitizer build (make check-asan), where the simulator runs some
 * 10x slower. A test may then run each kernel over fewer recipe cases (every shape and kernel
 * kept: what ASan checks is the indexing); the normal build runs them all. */
#if defined(__SANITIZE_ADDRESS__)
enum { SIM_SANITIZED = 1 };
#else
enum { SIM_SANITIZED = 0 };
#endif

/* n elements of cudaMallocManaged memory (filled with 0xFF bytes, as the sim fills it) */
template <class T> static inline T *sim_managed(size_t n)
{
    T *p = nullptr;
    assert_int_equal(cudaMallocManaged(&p, n * sizeof(T)), cudaSuccess);
    return p;
}

#ifdef TIDAL_CUDA_INTERNAL_CUH   /* the CUDA backend's tests */

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "tidal/recipe.h"
#include "tidal/rng.h"
const td_backend *td_cuda_backend_open(int index, char *desc, size_t desc_len, td_error *err);
}

/* ---- the backend, random inputs, recipes ---------------------------------------------------- */

/* device 0's backend; NULL, with the reason on stderr, where it cannot be opened */
static inline const td_backend *sim_open_gpu(void)
{
    td_error err;
    const td_backend *be = td_cuda_backend_open(0, NULL, 0, &err);
    if (!be) fprintf(stderr, "%s\n", err.msg);
    return be;
}

/* n draws of N(0, sd^2) from rng, as floats */
static inline std::vector<float> sim_normal(td_rng *rng, size_t n, double sd)
{
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)(sd * td_rng_normal(rng));
    return v;
}

/* v rounded to format D (values an op of activations dtype D reads) */
static inline std::vector<float> sim_rounded(std::vector<float> v, int D)
{
    for (float &x : v) x = td_round((td_format)D, x);
    return v;
}

/* a recipe case: a preset or a variant of one; none: no recipe at all (the fp32 reference) */
struct sim_rcase { const char *name; td_recipe r; int none; };

static inline td_recipe sim_preset(const char *name)
{
    const td_recipe *p = td_recipe_find_preset(name);
    if (!p) fail_msg("no preset %s", name);
    return *p;
}

/* a CPU context under the case's recipe (the CUDA ops read only its recipe and flags) */
static inline td_ops sim_ctx(const sim_rcase &rc)
{
    td_ops c;
    td_ops_init(&c, &td_backend_cpu);
    c.recipe = rc.none ? NULL : &rc.r;
    return c;
}

/* the activations dtype */
static inline int sim_D(const sim_rcase &rc) { return rc.none ? TD_F32 : rc.r.activations; }

/* ---- an op run four ways ------------------------------------------------------------------- */

/* copies of inputs for one run: host (malloc) or device (cudaMalloc), freed at the end */
struct sim_bufs {
    int dev;
    std::vector<void *> host, devp;
    explicit sim_bufs(int d) : dev(d) {}
    ~sim_bufs()
    {
        for (void *p : host) free(p);
        for (void *p : devp) CUDA_CHECK(cudaFree(p));
    }
    template <class T> T *copy(const T *h, size_t n)
    {
        size_t bytes = n ? n * sizeof(T) : 1;
        if (!dev) {
            T *p = (T *)malloc(bytes);
            memcpy(p, h, n * sizeof(T));
            host.push_back(p);
            return p;
        }
        T *p = NULL;
        CUDA_CHECK(cudaMalloc((void **)&p, bytes));
        CUDA_CHECK(cudaMemcpy(p, h, n * sizeof(T), cudaMemcpyHostToDevice));
        devp.push_back(p);
        return p;
    }
    template <class T> T *copy(const std::vector<T> &v) { return copy(v.data(), v.size()); }
    float *zeros(size_t n) { std::vector<float> z(n, 0.0f); return copy(z); }
    void get(float *dst, const float *src, size_t n)
    {
        CUDA_CHECK(cudaDeviceSynchronize());
        if (dev) CUDA_CHECK(cudaMemcpy(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost));
        else memcpy(dst, src, n * sizeof(float));
    }
};

/* run(b, dst) runs the CUDA op on buffers of b and leaves its n result floats in dst; done four
 * ways (host / device buffers x forward / reverse order), which must agree bit for bit; the
 * first way's result is returned */
template <class F> static inline std::vector<float> sim_four_ways(const char *what, size_t n, F run)
{
    static const char *ORDER[2] = {"forward", "reverse"};
    std::vector<float> first(n), other(n);
    for (int w = 0; w < 4; w++) {
        setenv("CUDASIM_ORDER", ORDER[w & 1], 1);
        sim_bufs b(w >> 1);
        run(b, w ? other.data() : first.data());
        if (w && memcmp(first.data(), other.data(), n * sizeof(float)))
            fail_msg("%s: %s buffers under CUDASIM_ORDER=%s differ from host buffers, forward", what,
                     w >> 1 ? "device" : "host", ORDER[w & 1]);
    }
    setenv("CUDASIM_ORDER", "forward", 1);
    td_backend_forget(&td_backend_cuda);   /* the weights' device copies: the host arrays are freed next */
    return first;
}

/* ---- comparisons with the CPU -------------------------------------------------------------- */

/* over n values: how many differ in any bit, max |gpu - cpu| (NaN where both are) and max |cpu|;
 * a NaN on one side only fails */
struct sim_diff { double max_abs, max_ref; long ndiff; };

static inline sim_diff sim_compare(const float *g, const float *c, size_t n)
{
    sim_diff d = {0, 0, 0};
    for (size_t i = 0; i < n; i++) {
        if (isnan(g[i]) != isnan(c[i])) fail_msg("element %zu: gpu %g cpu %g", i, g[i], c[i]);
        double e = isnan(c[i]) ? 0 : fabs((double)g[i] - c[i]);
        if (memcmp(&g[i], &c[i], 4)) d.ndiff++;
        d.max_abs = e > d.max_abs ? e : d.max_abs;
        d.max_ref = fabs(c[i]) > d.max_ref ? fabs(c[i]) : d.max_ref;
    }
    return d;
}

/* bit for bit, or fail; prints "  OP RECIPE n values, k differ ..." (columns w_op, w_recipe wide) */
static inline void sim_exact(int w_op, int w_recipe, const char *op, const char *rname, const float *g,
                             const float *c, size_t n)
{
    sim_diff d = sim_compare(g, c, n);
    printf("  %-*s %-*s %7zu values, %ld differ (bit-exact required), max |d| %.3g\n", w_op, op,
           w_recipe, rname, n, d.ndiff, d.max_abs);
    if (d.ndiff) fail_msg("%s under %s: %ld of %zu values differ from the CPU", op, rname, d.ndiff, n);
}

/* a unit in the last place of format D (bf16, fp16, else fp32) at magnitude x > 0 */
static inline double sim_ulp(int D, double x)
{
    int m = D == TD_BF16 ? 7 : D == TD_F16 ? 10 : 23;
    int e;
    frexp(x, &e);
    return ldexp(1.0, e - 1 - m);
}

/* ---- attention against the CPU -------------------------------------------------------------- */

/* Whether this build of cpu.c sums q.k as the kernels do (GCC's 4-lane SSE reduction at -O2;
 * -O1, as check-asan builds it, sums in order: then the bits are not compared, only the
 * normalised error and lse). Probed once, with draws from rng, through the CPU's own flash
 * attention of one row over one key, whose lse is q.k scale; prints what it found. */
static inline int sim_cpu_dot_like_kernels(td_rng *rng)
{
    static int known = -1;
    if (known >= 0) return known;
    td_recipe r = sim_preset("bf16-train");
    r.activations = TD_F32;
    sim_rcase rc = {"probe", r, 0};
    td_ops ctx = sim_ctx(rc);
    const int HD = 64;
    const size_t off = 0;
    const int pos = 0;
    int same = 0, n = 20;
    for (int t = 0; t < n; t++) {
        std::vector<float> q = sim_normal(rng, HD, 1.0), k = sim_normal(rng, HD, 1.0);
        std::vector<float> v = sim_normal(rng, HD, 1.0), out(HD);
        std::vector<float> scratch((size_t)ctx.nthreads * ATT_BLOCK);
        float lse;
        td_backend_cpu.attention_forward(&ctx, out.data(), &lse, q.data(), k.data(), v.data(), &off,
                                         &pos, 1, 1, 1, HD, scratch.data(), 1);
        float p[4] = {0, 0, 0, 0};
        for (int c = 0; c < HD; c++) p[c % 4] += q[c] * k[c];
        float d = (((0.0f + p[0]) + p[1]) + p[2]) + p[3];
        same += d * (1.0f / sqrtf((float)HD)) == lse;
    }
    known = same == n;
    printf("  the CPU's q.k order is %s\n", known ? "the kernels' (4-lane SSE): bits compared"
                                                   : "another (not vectorised?): bits not compared");
    return known;
}

/* The attention output (no values) then lse (nl values) of the GPU and the CPU, measured against
 * test_ops_sim.cpp's tolerances: normalised error nerr = max|gpu - cpu| / max|cpu| <= lim (1e-5
 * in fp32, two units of D at max|cpu| under D); lse within llim (1e-5, or two units of D at
 * |lse| under D); the fraction of outputs differing in any bit frac <= flim (the reference's
 * sgemm order: any; else 5% in fp32, 0.5% under bf16 / fp16). flim does not know the CPU's q.k
 * order: the caller lifts it to 1 where sim_cpu_dot_like_kernels says no. */
struct sim_att_figures { sim_diff out, lse; double nerr, lim, llim, frac, flim; };

static inline sim_att_figures sim_attention_figures(const sim_rcase &rc, const float *gpu, const float *cpu,
                                                    size_t no, size_t nl)
{
    sim_att_figures f;
    int D = sim_D(rc);
    f.out = sim_compare(gpu, cpu, no);
    f.lse = sim_compare(gpu + no, cpu + no, nl);
    f.nerr = f.out.max_abs / f.out.max_ref;
    f.lim = D == TD_F32 ? 1e-5 : 2 * sim_ulp(D, f.out.max_ref) / f.out.max_ref;
    f.llim = 1e-5;   /* lse: scores O(1); a score moved by one unit of D moves it as much */
    for (size_t j = 0; D != TD_F32 && j < nl; j++) {
        double u = 2 * sim_ulp(D, fabs(cpu[no + j]) > 1 ? fabs(cpu[no + j]) : 1.0);
        f.llim = u > f.llim ? u : f.llim;
    }
    /* bits: every form but the reference (sgemm order) is the CPU's arithmetic, expf aside */
    int reference = rc.none || (rc.r.attention == TD_ATTN_FULL && D == TD_F32 && !rc.r.batch_invariant);
    f.frac = (double)f.out.ndiff / no;
    f.flim = reference ? 1.0 : D == TD_F32 ? 0.05 : 0.005;
    return f;
}

static inline int sim_attention_within(const sim_att_figures &f)
{
    return !(f.nerr > f.lim || f.lse.max_abs > f.llim || f.frac > f.flim);
}

#endif /* TIDAL_CUDA_INTERNAL_CUH */

#endif
