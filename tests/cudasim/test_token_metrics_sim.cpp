/* token_metrics_cuda (src/backend/cuda/token_metrics.cu) against td_token_metrics_compute
 * (src/analysis/metrics.c) on the simulator: pairs of log-softmax rows, B = A perturbed by
 * N(0, s^2) with s = 1e-4 (near rows: KL ~ 1e-9), 1e-2 and 1 (far), some entries -inf in one or
 * both rows, rows with tied values; V 100 and 151,936; y random and the argmax:
 *   logp_a, logp_b, k3, top1_a/b, rank_a/b: identical
 *   kl_ba, kl_ab, tv, entropy_a/b: within 1e-9 relative (sums of non-negative terms in another
 *   order: the bound is ~2 V 2^-53, 3.4e-11 at V 151,936) */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

extern "C" {
#include "tidal/logprob.h"
#include "tidal/metrics.h"
void token_metrics_cuda(const td_ops *ctx, td_token_metrics *m, const float *la, const float *lb,
                        const int *y, int n, int V);   /* token_metrics.cu */
}

static double rel(double a, double b)
{
    if (a == b) return 0;
    return fabs(a - b) / fmax(fabs(a), fabs(b));
}

static void run(int V, int n, uint64_t seed)
{
    td_rng r;
    td_rng_seed(&r, seed);
    std::vector<float> la((size_t)n * V), lb((size_t)n * V);
    std::vector<int> y(n);
    for (int i = 0; i < n; i++) {
        float *a = la.data() + (size_t)i * V, *b = lb.data() + (size_t)i * V;
        double s = i % 3 == 0 ? 1e-4 : i % 3 == 1 ? 1e-2 : 1.0;
        for (int v = 0; v < V; v++) {
            a[v] = (float)(3 * td_rng_normal(&r));
            if (i % 4 == 3) a[v] = roundf(a[v]);   /* ties */
            b[v] = a[v] + (float)(s * td_rng_normal(&r));
        }
        if (i % 2) {   /* filtered entries: -inf in both, or in one only */
            for (int k = 0; k < V / 10; k++) {
                int v = (int)td_rng_below(&r, (uint64_t)V);
                a[v] = -INFINITY;
                if (k % 2) b[v] = -INFINITY;
            }
        }
        td_log_softmax(a, V);
        td_log_softmax(b, V);
        y[i] = (int)td_rng_below(&r, (uint64_t)V);
        if (i % 5 == 4) { int t = 0; for (int v = 1; v < V; v++) if (a[v] > a[t]) t = v; y[i] = t; }
        if (a[y[i]] == -INFINITY && b[y[i]] == -INFINITY) y[i] = 0;
    }
    /* malloc: nvcc's front end fails on a std::vector of an anonymous struct (GPU build) */
    td_token_metrics *g = (td_token_metrics *)malloc((size_t)n * sizeof *g);
    token_metrics_cuda(NULL, g, la.data(), lb.data(), y.data(), n, V);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        td_token_metrics c;
        td_token_metrics_compute(la.data() + (size_t)i * V, lb.data() + (size_t)i * V, V, y[i], &c);
        assert_memory_equal(&c.logp_a, &g[i].logp_a, sizeof(double));
        assert_memory_equal(&c.logp_b, &g[i].logp_b, sizeof(double));
        assert_memory_equal(&c.k3, &g[i].k3, sizeof(double));
        assert_int_equal(c.top1_a, g[i].top1_a);
        assert_int_equal(c.top1_b, g[i].top1_b);
        assert_int_equal(c.rank_a, g[i].rank_a);
        assert_int_equal(c.rank_b, g[i].rank_b);
        double e[5] = {rel(c.kl_ba, g[i].kl_ba), rel(c.kl_ab, g[i].kl_ab), rel(c.tv, g[i].tv),
                       rel(c.entropy_a, g[i].entropy_a), rel(c.entropy_b, g[i].entropy_b)};
        for (double x : e) { assert_true(x <= 1e-9); worst = x > worst ? x : worst; }
        assert_true(g[i].kl_ba >= 0 && g[i].kl_ab >= 0);
    }
    free(g);
    printf("V %6d, %d row pairs: logp, k3, top-1, rank identical; KL, TV, entropy max relative difference %.2g\n",
           V, n, worst);
}

static void test_metrics(void **state)
{
    (void)state;
    run(100, 24, 1);
    run(151936, 6, 2);
}

static int setup(void **state)
{
    (void)state;
    return sim_open_gpu() ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_metrics)};
    return cmocka_run_group_tests(tests, setup, NULL);
}
