/* The trainer's device-side steps (src/backend/cuda/optim.cu, logprob_gather.cu) against the CPU
 * table's (src/backend/cpu_optim.c, cpu.c), through the backend tables as the trainer calls
 * them, on device buffers (be->alloc / upload / download):
 *   optim_adamw     AdamW over 70001 elements (not a multiple of any block), weight decay on and
 *                   off, steps 1 and 7, lr 1e-3 and 3e-2: param, m1 and m2 bit-identical to the
 *                   CPU's (the same uncontracted fp32 operations in the same order)
 *   optim_scale     g *= k: bit-identical
 *   optim_sumsq     within 1e-12 relative of the CPU's double sum (another summation order: a
 *                   fixed grid of double partial sums, not the CPU's vector lanes), the same on
 *                   a second run (fixed order), and not finite when one element is Inf or NaN
 *   logprob_gather  37 rows of V = 1000 log-probs with ties planted at the maximum (the first
 *                   column must win) and a row whose maximum is its last column: target
 *                   log-probs and top tokens equal to the CPU's
 * Simulator here; the same source on a GPU in tests/gpu/run.sh check. */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <vector>

static td_rng RNG;
static const td_backend *GPU;

static float *dev(const std::vector<float> &h)
{
    float *d = (float *)GPU->alloc(h.size() * sizeof(float));
    GPU->upload(d, h.data(), h.size() * sizeof(float));
    return d;
}

static std::vector<float> host(const float *d, size_t n)
{
    std::vector<float> h(n);
    GPU->sync();
    GPU->download(h.data(), d, n * sizeof(float));
    return h;
}

static td_adamw_k scalars(double lr, double wd, int step)
{
    double b1 = 0.9, b2 = 0.999, bc1 = 1.0 - pow(b1, step), bc2 = 1.0 - pow(b2, step);
    td_adamw_k k = {(float)(1.0 - lr * wd), (float)b1, (float)b2, (float)(1.0 - b1), (float)(1.0 - b2),
                    (float)sqrt(bc2), 1e-8f, (float)(-(lr / bc1)), wd != 0.0};
    return k;
}

static void test_adamw(void **state)
{
    (void)state;
    const size_t n = 70001;
    const double cases[][3] = {{1e-3, 0.0, 1}, {1e-3, 0.01, 7}, {3e-2, 0.1, 1}};
    for (const auto &c : cases) {
        std::vector<float> p = sim_normal(&RNG, n, 0.05), g = sim_normal(&RNG, n, 1e-3), m1 = sim_normal(&RNG, n, 1e-3), m2(n);
        for (size_t i = 0; i < n; i++) m2[i] = (float)(1e-6 * fabs(td_rng_normal(&RNG)));
        g[5] = 0.0f;   /* a zero gradient: the update is the moments' alone */
        float *dp = dev(p), *dg = dev(g), *dm1 = dev(m1), *dm2 = dev(m2);
        td_adamw_k k = scalars(c[0], c[1], (int)c[2]);
        GPU->optim_adamw(dp, dg, dm1, dm2, n, &k);
        td_backend_cpu.optim_adamw(p.data(), g.data(), m1.data(), m2.data(), n, &k);
        std::vector<float> gp = host(dp, n), gm1 = host(dm1, n), gm2 = host(dm2, n);
        assert_memory_equal(gp.data(), p.data(), n * sizeof(float));
        assert_memory_equal(gm1.data(), m1.data(), n * sizeof(float));
        assert_memory_equal(gm2.data(), m2.data(), n * sizeof(float));
        for (float *d : {dp, dg, dm1, dm2}) GPU->free(d);
    }
}

static void test_scale_sumsq(void **state)
{
    (void)state;
    const size_t n = 70001;
    std::vector<float> g = sim_normal(&RNG, n, 0.3);
    float *dg = dev(g);
    GPU->optim_scale(dg, n, 0.37f);
    td_backend_cpu.optim_scale(g.data(), n, 0.37f);
    std::vector<float> gg = host(dg, n);
    assert_memory_equal(gg.data(), g.data(), n * sizeof(float));
    for (size_t len : {(size_t)1, (size_t)255, (size_t)4097, n}) {
        double c = td_backend_cpu.optim_sumsq(g.data(), len), d = GPU->optim_sumsq(dg, len);
        printf("sumsq of %zu: CPU %.17g, device %.17g (relative %.2g)\n", len, c, d, fabs(d - c) / c);
        assert_true(fabs(d - c) <= 1e-12 * c);
        assert_true(GPU->optim_sumsq(dg, len) == d);   /* a fixed order */
    }
    float bad[2] = {INFINITY, NAN};
    for (float b : bad) {
        GPU->upload(dg + 4000, &b, sizeof b);
        assert_false(isfinite(GPU->optim_sumsq(dg, n)));
    }
    GPU->free(dg);
}

static void test_logprob_gather(void **state)
{
    (void)state;
    const int N = 37, V = 1000;
    std::vector<float> lp = sim_normal(&RNG, (size_t)N * V, 2.0);
    std::vector<int> target(N);
    for (int i = 0; i < N; i++) {
        target[i] = (int)td_rng_below(&RNG, V);
        float *row = lp.data() + (size_t)i * V;
        if (i % 3 == 0) {   /* ties at the maximum: the first column wins */
            int a = (int)td_rng_below(&RNG, V), b = (int)td_rng_below(&RNG, V);
            row[a] = row[b] = 50.0f;
        }
    }
    lp[(size_t)N * V - 1] = 99.0f;   /* the last row's maximum in its last column */
    float *d = dev(lp);
    std::vector<float> tl_c(N), tl_g(N);
    std::vector<int> top_c(N), top_g(N);
    td_ops cpu, gpu;
    td_ops_init(&cpu, &td_backend_cpu);
    td_ops_init(&gpu, GPU);
    logprob_gather(&cpu, tl_c.data(), top_c.data(), lp.data(), target.data(), N, V);
    logprob_gather(&gpu, tl_g.data(), top_g.data(), d, target.data(), N, V);   /* host outputs */
    assert_memory_equal(tl_g.data(), tl_c.data(), N * sizeof(float));
    assert_memory_equal(top_g.data(), top_c.data(), N * sizeof(int));
    assert_int_equal(top_g[N - 1], V - 1);
    GPU->free(d);
}

static int setup(void **state)
{
    (void)state;
    td_rng_seed(&RNG, 20261126);
    GPU = sim_open_gpu();
    return GPU ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_adamw),
        cmocka_unit_test(test_scale_sumsq),
        cmocka_unit_test(test_logprob_gather),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
