/* sample_cuda (src/backend/cuda/sampling.cu) against td_sample (src/sampling/sampling.c) on the
 * simulator: for every processor combination (greedy; T 0.7 / 1 / 1.3; top-k 1, 5, 40 on rows
 * with tied values; top-p 0.9; min-p 0.05; repetition penalty 1.2 with seen tokens; and
 * combinations of them), V 100 (the add model's) and 151,936 (Qwen's), several rows, each with
 * its own seeded stream, several draws per stream:
 *   - the token of every draw is td_sample's, and each row's rng state after the call too
 *   - the processed log-prob of the token and the whole processed row are td_sample's bit for
 *     bit (the device follows the CPU's operations; on the simulator exp/log are glibc's)
 *   - again with sample_cuda_force_exact = 1: every certified shortcut replaced by its fallback
 *     (the sequential log-sum-exp and draw on the device, top-p on the host), same results
 * Rows: N(0, s^2) logits with s = 1, 3 or 8 (flat to peaked), and rows rounded to multiples of
 * 0.5 (many ties, for top-k's tie rule and top-p's token order among equal values). */
#include "cuda_internal.cuh"
#include "simtest.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <vector>

extern "C" {
#include "tidal/sampling.h"
}

/* (plain arrays: nvcc's front end fails on a std::vector of td_sampling / td_rng, anonymous
 * structs, when this file is built for the GPU) */
typedef struct scase { const char *name; td_sampling s; } scase;
enum { NCASES = 16 };
static scase CASES[NCASES];

static void cases(void)
{
    int nc = 0;
    auto add = [&](const char *name, double T, double top_p, int top_k, double min_p, double rep) {
        td_sampling s = td_sampling_default();
        s.temperature = T; s.top_p = top_p; s.top_k = top_k; s.min_p = min_p; s.repetition_penalty = rep;
        CASES[nc].name = name;
        CASES[nc].s = s;
        nc++;
    };
    add("greedy", 0, 1, 0, 0, 1);
    add("greedy+rep1.2", 0, 1, 0, 0, 1.2);
    add("T1", 1, 1, 0, 0, 1);
    add("T0.7", 0.7, 1, 0, 0, 1);
    add("T1.3", 1.3, 1, 0, 0, 1);
    add("top-k1", 1, 1, 1, 0, 1);
    add("top-k5", 1, 1, 5, 0, 1);
    add("top-k40 T0.7", 0.7, 1, 40, 0, 1);
    add("top-p0.9", 1, 0.9, 0, 0, 1);
    add("top-p0.9 T1.3", 1.3, 0.9, 0, 0, 1);
    add("min-p0.05", 1, 1, 0, 0.05, 1);
    add("rep1.2", 1, 1, 0, 0, 1.2);
    add("top-k40 top-p0.9", 1, 0.9, 40, 0, 1);
    add("min-p0.05 top-p0.9 T0.7", 0.7, 0.9, 0, 0.05, 1);
    add("all: T1.3 k5 p0.9 minp0.05 rep1.2", 1.3, 0.9, 5, 0.05, 1.2);
    add("T0.7 top-p0.5 rep1.2", 0.7, 0.5, 0, 0, 1.2);
    if (nc != NCASES) abort();
}

/* rows of kind 0..3: N(0,1), N(0,9), N(0,64), N(0,4) rounded to 0.5 (ties) */
static void fill_rows(float *x, int n, int V, td_rng *r)
{
    for (int i = 0; i < n; i++) {
        int kind = i % 4;
        double sc = kind == 0 ? 1 : kind == 1 ? 3 : kind == 2 ? 8 : 2;
        for (int v = 0; v < V; v++) {
            float f = (float)(sc * td_rng_normal(r));
            if (kind == 3) f = roundf(f * 2.0f) / 2.0f;
            x[(size_t)i * V + v] = f;
        }
    }
}

static void run_case(int V, int n, int draws, int force, const scase *const *cs, int ncs, uint64_t seed)
{
    td_rng data;
    td_rng_seed(&data, seed);
    std::vector<float> logits((size_t)n * V), proc_c((size_t)V), proc_g((size_t)n * V);
    fill_rows(logits.data(), n, V, &data);
    /* seen tokens: 30 per row, with repeats, some out of range (ignored by both) */
    std::vector<std::vector<int>> seen(n);
    std::vector<const int *> seenp(n);
    std::vector<int> nseen(n);
    for (int i = 0; i < n; i++) {
        for (int j = 0; j < 30; j++) seen[i].push_back((int)td_rng_below(&data, (uint64_t)V));
        seen[i].push_back(seen[i][0]);
        seen[i].push_back(seen[i][3]);
        seen[i].push_back(-1);
        seenp[i] = seen[i].data();
        nseen[i] = (int)seen[i].size();
    }
    td_sampler *smp = td_sampler_create(V);
    sample_cuda_force_exact = force;
    td_rng *rc = (td_rng *)malloc((size_t)n * sizeof(td_rng)), *rg = (td_rng *)malloc((size_t)n * sizeof(td_rng));
    for (int ci = 0; ci < ncs; ci++) {
        const scase &c = *cs[ci];
        for (int i = 0; i < n; i++) { td_rng_stream(&rc[i], seed, (uint64_t)i); rg[i] = rc[i]; }
        int ndiff_tok = 0, ndiff_lp = 0, ndiff_row = 0, nhost = 0;
        for (int d = 0; d < draws; d++) {
            std::vector<int> tg(n);
            std::vector<float> lg(n);
            nhost += sample_cuda(NULL, &c.s, logits.data(), n, V, seenp.data(), nseen.data(), rg,
                                 tg.data(), lg.data(), d == 0 ? proc_g.data() : NULL);
            for (int i = 0; i < n; i++) {
                int t = td_sample(smp, &c.s, logits.data() + (size_t)i * V, seenp[i], nseen[i], &rc[i],
                                  proc_c.data());
                if (t != tg[i]) {
                    if (ndiff_tok < 5) printf("  %s V %d row %d draw %d: cpu %d gpu %d\n", c.name, V, i, d, t, tg[i]);
                    ndiff_tok++;
                }
                if (memcmp(&proc_c[t], &lg[i], sizeof(float))) ndiff_lp++;
                if (d == 0 && memcmp(proc_c.data(), proc_g.data() + (size_t)i * V, (size_t)V * sizeof(float))) ndiff_row++;
                if (memcmp(&rc[i], &rg[i], sizeof(td_rng))) ndiff_tok++;
            }
        }
        printf("%-36s V %6d force %d: %d rows x %d draws, token diffs %d, logp diffs %d, row diffs %d, host rows %d\n",
               c.name, V, force, n, draws, ndiff_tok, ndiff_lp, ndiff_row, nhost);
        assert_int_equal(ndiff_tok, 0);
        assert_int_equal(ndiff_lp, 0);
        assert_int_equal(ndiff_row, 0);
        if (force && c.s.temperature != 0 && c.s.top_p < 1) assert_int_equal(nhost, n * draws);
    }
    sample_cuda_force_exact = 0;
    free(rc);
    free(rg);
    td_sampler_free(smp);
}

static void test_small_vocab(void **state)
{
    (void)state;
    const scase *all[NCASES];
    for (int i = 0; i < NCASES; i++) all[i] = &CASES[i];
    run_case(100, 8, 8, 0, all, NCASES, 11);
    run_case(100, 8, 2, 1, all, NCASES, 12);
}

static void test_qwen_vocab(void **state)
{
    (void)state;
    const scase *all[NCASES];
    for (int i = 0; i < NCASES; i++) all[i] = &CASES[i];
    run_case(151936, 4, 1, 0, all, NCASES, 13);
    const scase *some[3] = {&CASES[2], &CASES[8], &CASES[14]};
    run_case(151936, 2, 1, 1, some, 3, 14);
}

/* device-resident logits (what a decode step leaves on the GPU) and a NULL logp */
static void test_device_rows(void **state)
{
    (void)state;
    const int V = 1000, n = 3;
    td_rng data;
    td_rng_seed(&data, 5);
    float *d = NULL;
    std::vector<float> h((size_t)n * V);
    fill_rows(h.data(), n, V, &data);
    assert_int_equal(cudaMalloc(&d, h.size() * sizeof(float)), cudaSuccess);
    assert_int_equal(cudaMemcpy(d, h.data(), h.size() * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    td_sampling s = td_sampling_default();
    s.top_p = 0.9;
    td_sampler *smp = td_sampler_create(V);
    td_rng rg[n], rc[n];
    for (int i = 0; i < n; i++) { td_rng_stream(&rg[i], 9, (uint64_t)i); rc[i] = rg[i]; }
    int tg[n];
    assert_int_equal(sample_cuda(NULL, &s, d, n, V, NULL, NULL, rg, tg, NULL, NULL), 0);
    for (int i = 0; i < n; i++)
        assert_int_equal(td_sample(smp, &s, h.data() + (size_t)i * V, NULL, 0, &rc[i], NULL), tg[i]);
    td_sampler_free(smp);
    cudaFree(d);
}

static int setup(void **state)
{
    (void)state;
    if (!sim_open_gpu()) return -1;
    cases();
    return 0;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_small_vocab),
        cmocka_unit_test(test_device_rows),
        cmocka_unit_test(test_qwen_vocab),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
