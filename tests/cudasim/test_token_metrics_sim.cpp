/* token_metrics_cuda (src/backend/cuda/token_metrics.cu) against td_token_metrics_compute
 * (src/analysis/metrics.c) on the simulator: pairs of log-softmax rows, B = A perturbed by
 * N(0, s^2) with s = 1e-4 (near rows: KL ~ 1e-9), 1e-2 and 1 (far), some entries -inf in one or
 * both rows, rows with tied values; V 100 and 151,936; y random and the argmax:
 *   logp_a, logp_b, k3, top1_a/b, rank_a/b: identical
 *   kl_ba, kl_ab, tv, entropy_a/b: within 1e-9 relative (sums of non-negative terms in another
 *   order: the bound is ~2 V 2^-53, 3.4e-11 at V 151,936)
 * and the same pairs read through row indices from device buffers (tidal-diff's layout): the
 * same bits. A's rows alone (lb NULL: replayed rollouts) against td_token_metrics_replay: logp_a,
 * k3 (B's log-prob set by the caller), top-1, rank identical, entropy_a within 1e-9 relative, the
 * B-side fields NaN / -1. row_logsoftmax_cuda (B's rows kept on the device): raw rows N(0, s^2), s 1 / 4 / 12,
 * ties, -inf entries and an all -inf row, T 1 / 0.7 / 1.3 / 0.6, from host and device memory
 * into scattered rows, with and without the certified shortcut: x / T then td_log_softmax's
 * floats, bit for bit. */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <vector>

extern "C" {
#include "tidal/logprob.h"
#include "tidal/metrics.h"
#include "tidal/rng.h"
void token_metrics_cuda(const td_ops *ctx, td_token_metrics *m, const float *la, const size_t *ia,
                        const float *lb, const size_t *ib, const int *y, int n, int V);   /* token_metrics.cu */
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
    token_metrics_cuda(NULL, g, la.data(), NULL, lb.data(), NULL, y.data(), n, V);
    double worst = 0;
    for (int i = 0; i < n; i++) {
        td_token_metrics c;
        td_token_metrics_compute(la.data() + (size_t)i * V, lb.data() + (size_t)i * V, V, y[i], &c);
        assert_memory_equal(&c.logp_a, &g[i].logp_a, sizeof(double));
        assert_memory_equal(&c.logp_b, &g[i].logp_b, sizeof(double));
#ifdef TD_CUDASIM
        assert_memory_equal(&c.k3, &g[i].k3, sizeof(double));   /* the simulator's expm1 is glibc's */
#else
        /* a GPU's double expm1 is CUDA's (within 1 ulp of the exact result), not glibc's: k3 =
         * expm1(r) - r within 2 ulp of expm1(r) (the H200 of 2026-11-29 differed by 1 ulp) */
        {
            double r = c.logp_a - c.logp_b, em = fabs(expm1(r));
            double ulp = em > 0 && isfinite(em) ? nextafter(em, INFINITY) - em : 0;
            if (!(c.k3 == g[i].k3 || fabs(c.k3 - g[i].k3) <= 2 * ulp))
                fail_msg("token %d: k3 %.17g on the device, %.17g on the CPU (r %.17g): over 2 ulp of expm1(r)", i,
                         g[i].k3, c.k3, r);
        }
#endif
        assert_int_equal(c.top1_a, g[i].top1_a);
        assert_int_equal(c.top1_b, g[i].top1_b);
        assert_int_equal(c.rank_a, g[i].rank_a);
        assert_int_equal(c.rank_b, g[i].rank_b);
        double e[5] = {rel(c.kl_ba, g[i].kl_ba), rel(c.kl_ab, g[i].kl_ab), rel(c.tv, g[i].tv),
                       rel(c.entropy_a, g[i].entropy_a), rel(c.entropy_b, g[i].entropy_b)};
        for (double x : e) { assert_true(x <= 1e-9); worst = x > worst ? x : worst; }
        assert_true(g[i].kl_ba >= 0 && g[i].kl_ab >= 0);
    }
    /* the same pairs read from device buffers through row indices (tidal-diff's layout: A's
     * chunk rows in one order, B's kept rows in another): the same bits */
    const td_backend *be = &td_backend_cuda;
    size_t row = (size_t)V * sizeof(float);
    float *da = (float *)be->alloc((size_t)(n + 2) * row), *db = (float *)be->alloc((size_t)(n + 3) * row);
    std::vector<size_t> ia(n), ib(n);
    for (int i = 0; i < n; i++) {
        ia[i] = (size_t)(n - 1 - i) + 2;
        ib[i] = (size_t)((i * 7) % n);
        if (n % 7 == 0) ib[i] = (size_t)i;   /* keep it a permutation */
        be->upload(da + ia[i] * V, la.data() + (size_t)i * V, row);
        be->upload(db + ib[i] * V, lb.data() + (size_t)i * V, row);
    }
    td_token_metrics *gi = (td_token_metrics *)malloc((size_t)n * sizeof *gi);
    token_metrics_cuda(NULL, gi, da, ia.data(), db, ib.data(), y.data(), n, V);
    assert_memory_equal(g, gi, (size_t)n * sizeof *g);
    /* A's rows alone (lb NULL: a replay) against td_token_metrics_replay, B's log-prob set by the
     * caller (here: B's row at y) as td_forward_metrics_replay sets it */
    td_token_metrics *gr = (td_token_metrics *)malloc((size_t)n * sizeof *gr);
    token_metrics_cuda(NULL, gr, da, ia.data(), NULL, NULL, y.data(), n, V);
    double worst_r = 0;
    for (int i = 0; i < n; i++) {
        td_token_metrics c;
        double lpb = lb[(size_t)i * V + y[i]];
        td_token_metrics_replay(la.data() + (size_t)i * V, V, y[i], lpb, &c);
        assert_true(isnan(gr[i].logp_b) && isnan(gr[i].k3));   /* the caller's */
        gr[i].logp_b = lpb;
        gr[i].k3 = td_k3(gr[i].logp_a, lpb);
        assert_memory_equal(&c.logp_a, &gr[i].logp_a, sizeof(double));
        assert_memory_equal(&c.logp_b, &gr[i].logp_b, sizeof(double));
        assert_memory_equal(&c.k3, &gr[i].k3, sizeof(double));
        assert_int_equal(c.top1_a, gr[i].top1_a);
        assert_int_equal(c.rank_a, gr[i].rank_a);
        assert_int_equal(c.top1_b, gr[i].top1_b);
        assert_int_equal(c.rank_b, gr[i].rank_b);
        assert_true(isnan(gr[i].kl_ba) && isnan(gr[i].kl_ab) && isnan(gr[i].tv) && isnan(gr[i].entropy_b));
        double e = rel(c.entropy_a, gr[i].entropy_a);
        assert_true(e <= 1e-9);
        worst_r = e > worst_r ? e : worst_r;
    }
    be->free(da);
    be->free(db);
    free(gi);
    free(gr);
    free(g);
    printf("V %6d, %d row pairs: logp, k3, top-1, rank identical; KL, TV, entropy max relative difference %.2g; "
           "through row indices from device buffers: identical; A alone (replay): logp, k3, top-1, rank identical, "
           "entropy max relative difference %.2g\n", V, n, worst, worst_r);
}

/* row_logsoftmax_cuda: n rows of raw logits (host, as a rollout's first step has them, or
 * device) divided by T and log-softmaxed into scattered device rows, against the host's
 * x / T then td_log_softmax: bit for bit, with the certified shortcut and without it. */
static void run_lsm(int V, int n, float T, uint64_t seed, int force)
{
    td_rng r;
    td_rng_seed(&r, seed);
    std::vector<float> x((size_t)n * V), want((size_t)n * V), got((size_t)n * V);
    for (int i = 0; i < n; i++) {
        float *a = x.data() + (size_t)i * V;
        double sd = i % 3 == 0 ? 1.0 : i % 3 == 1 ? 4.0 : 12.0;
        for (int v = 0; v < V; v++) {
            a[v] = (float)(sd * td_rng_normal(&r));
            if (i % 4 == 3) a[v] = roundf(a[v]);   /* ties */
        }
        if (i % 5 == 4)
            for (int k = 0; k < V / 3; k++) a[td_rng_below(&r, (uint64_t)V)] = -INFINITY;
        if (i == n - 1 && n > 2)   /* every entry filtered: td_log_sum_exp's 0 */
            for (int v = 0; v < V; v++) a[v] = -INFINITY;
        float *w = want.data() + (size_t)i * V;
        for (int v = 0; v < V; v++) w[v] = T > 0 && T != 1.0f ? a[v] / T : a[v];
        td_log_softmax(w, V);
    }
    const td_backend *be = &td_backend_cuda;
    size_t row = (size_t)V * sizeof(float);
    float *dst = (float *)be->alloc((size_t)(2 * n + 1) * row), *src = (float *)be->alloc((size_t)n * row);
    be->upload(src, x.data(), (size_t)n * row);
    std::vector<size_t> at(n);
    for (int i = 0; i < n; i++) at[i] = (size_t)(2 * (n - 1 - i) + 1);
    row_logsoftmax_cuda_force_exact = force;
    for (int from_host = 0; from_host < 2; from_host++) {
        row_logsoftmax_cuda(NULL, dst, at.data(), from_host ? x.data() : src, n, V, T);
        for (int i = 0; i < n; i++) be->download(got.data() + (size_t)i * V, dst + at[i] * V, row);
        assert_memory_equal(want.data(), got.data(), (size_t)n * row);
    }
    row_logsoftmax_cuda_force_exact = 0;
    be->free(dst);
    be->free(src);
    printf("row_logsoftmax: V %6d, %d rows, T %.2f%s: td_log_softmax's floats bit for bit (from host and device rows)\n",
           V, n, (double)T, force ? ", sequential sums only" : "");
}

static void test_row_logsoftmax(void **state)
{
    (void)state;
    float Ts[3] = {1.0f, 0.7f, 1.3f};
    for (int k = 0; k < 3; k++) run_lsm(100, 40, Ts[k], 10 + k, 0);
    run_lsm(100, 12, 0.7f, 20, 1);
    run_lsm(151936, 6, 1.0f, 30, 0);
    run_lsm(151936, 6, 0.6f, 31, 0);
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
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_metrics), cmocka_unit_test(test_row_logsoftmax)};
    return cmocka_run_group_tests(tests, setup, NULL);
}
