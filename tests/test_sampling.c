/* Engine-style sampling (src/sampling/sampling.c), each step against its definition in
 * sampling.h (HF generate / vLLM):
 *  - td_sampling_check rejects each bad value and names the flag;
 *  - td_log_softmax rows sum to 1 (and keep differences), an all -inf row stays as it is;
 *  - greedy picks the argmax; top-k = 1 equals greedy; a tiny temperature acts greedy;
 *  - top-k, top-p and min-p keep exactly the tokens the definitions say on hand-made logits:
 *    processed log-probs are -inf outside the kept set and the kept set renormalises to 1;
 *  - repetition penalty: l/p if l > 0 else l·p, for seen tokens only, once per token;
 *  - 200k draws from a 5-token distribution match it (chi-square, fixed seed);
 *  - same seed, same tokens; several threads sampling at once give the serial tokens.
 * Tolerance on processed log-probs: 1e-6 absolute (float rows, log-probs of magnitude < 5). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tidal/sampling.h"

static void assert_msg_has(const char *msg, const char *needle)
{
    if (!strstr(msg, needle)) {
        print_error("message \"%s\" does not contain \"%s\"\n", msg, needle);
        fail();
    }
}

/* The expected processed log-probs: log-softmax (in double) of `l` over the tokens in keep[],
 * -inf elsewhere; compared with the sampler's output. */
static void assert_processed(const float *got, const double *l, const int *keep, int V)
{
    double mx = -INFINITY, z = 0, total = 0;
    for (int v = 0; v < V; v++) if (keep[v] && l[v] > mx) mx = l[v];
    for (int v = 0; v < V; v++) if (keep[v]) z += exp(l[v] - mx);
    for (int v = 0; v < V; v++) {
        if (!keep[v]) {
            if (got[v] != -INFINITY) { print_error("token %d kept (%g), should be filtered\n", v, got[v]); fail(); }
            continue;
        }
        double want = l[v] - mx - log(z);
        if (!(fabs(got[v] - want) <= 1e-6)) {
            print_error("token %d: processed logp %.9g, want %.9g\n", v, got[v], want);
            fail();
        }
        total += exp((double)got[v]);
    }
    if (!(fabs(total - 1) <= 1e-6)) { print_error("kept probabilities sum to %.9g\n", total); fail(); }
}

/* Processes logits with s (temperature != 0) and returns the processed log-probs in out. */
static int process(const td_sampling *s, const float *logits, int V, const int *seen, int n_seen,
                   float *out)
{
    td_sampler *smp = td_sampler_create(V);
    td_rng rng;
    td_rng_seed(&rng, 1);
    int tok = td_sample(smp, s, logits, seen, n_seen, &rng, out);
    td_sampler_free(smp);
    return tok;
}

static void test_check(void **state)
{
    (void)state;
    td_sampling ok = td_sampling_default();
    td_error err = {{0}};
    assert_int_equal(td_sampling_check(&ok, &err), 0);
    ok.temperature = 0;
    ok.top_p = 1e-9;
    ok.min_p = 1;
    ok.repetition_penalty = 0.5;
    assert_int_equal(td_sampling_check(&ok, &err), 0);
    struct { const char *flag; td_sampling s; } bad[10];
    for (int i = 0; i < 10; i++) bad[i].s = td_sampling_default();
    bad[0].flag = "--temperature";        bad[0].s.temperature = -0.1;
    bad[1].flag = "--temperature";        bad[1].s.temperature = NAN;
    bad[2].flag = "--top-p";              bad[2].s.top_p = 0;
    bad[3].flag = "--top-p";              bad[3].s.top_p = 1.5;
    bad[4].flag = "--top-p";              bad[4].s.top_p = NAN;
    bad[5].flag = "--top-k";              bad[5].s.top_k = -1;
    bad[6].flag = "--min-p";              bad[6].s.min_p = -0.01;
    bad[7].flag = "--min-p";              bad[7].s.min_p = 1.01;
    bad[8].flag = "--repetition-penalty"; bad[8].s.repetition_penalty = 0;
    bad[9].flag = "--repetition-penalty"; bad[9].s.repetition_penalty = NAN;
    for (int i = 0; i < 10; i++) {
        assert_int_equal(td_sampling_check(&bad[i].s, &err), -1);
        assert_msg_has(err.msg, bad[i].flag);
    }
}

static void test_log_softmax(void **state)
{
    (void)state;
    enum { V = 1000 };
    static float row[V], orig[V];
    td_rng rng;
    td_rng_seed(&rng, 5);
    const double offsets[] = {0, 1000, -1000, 30};
    for (int k = 0; k < 4; k++) {
        for (int v = 0; v < V; v++) orig[v] = row[v] = (float)(offsets[k] + 4 * td_rng_normal(&rng));
        td_log_softmax(row, V);
        double sum = 0;
        for (int v = 0; v < V; v++) { assert_true(row[v] <= 0); sum += exp((double)row[v]); }
        /* each log-prob carries one float rounding of the normaliser subtraction: relative
         * 2^-24 of values up to ~|offset|, i.e. p off by ~6e-5 relative at offset 1000 */
        double tol = k == 1 || k == 2 ? 2e-4 : 1e-5;
        if (!(fabs(sum - 1) <= tol)) { print_error("offset %g: sum %.9g\n", offsets[k], sum); fail(); }
        /* differences between entries are those of the logits (same rounding bound) */
        assert_true(fabs((row[1] - row[0]) - (double)(orig[1] - orig[0])) <= 1e-3 * (k == 1 || k == 2 ? 1 : 0.01));
    }
    /* an all -inf row has no distribution: left as it is, no NaN */
    float dead[3] = {-INFINITY, -INFINITY, -INFINITY};
    td_log_softmax(dead, 3);
    for (int v = 0; v < 3; v++) assert_true(dead[v] == -INFINITY);
    /* -inf entries stay -inf among finite ones */
    float part[3] = {0.0f, -INFINITY, 0.0f};
    td_log_softmax(part, 3);
    assert_true(part[1] == -INFINITY);
    assert_true(fabs(part[0] - log(0.5)) <= 1e-7 && part[0] == part[2]);
}

static void test_greedy_and_topk1(void **state)
{
    (void)state;
    enum { V = 257 };
    static float logits[V], lp[V];
    td_rng rng, draw;
    td_rng_seed(&rng, 11);
    td_rng_seed(&draw, 12);
    td_sampler *smp = td_sampler_create(V);
    for (int trial = 0; trial < 50; trial++) {
        int arg = 0;
        for (int v = 0; v < V; v++) {
            logits[v] = (float)(3 * td_rng_normal(&rng));
            if (logits[v] > logits[arg]) arg = v;
        }
        td_sampling g = td_sampling_default();
        g.temperature = 0;
        g.top_k = 5;          /* ignored by greedy */
        assert_int_equal(td_sample(smp, &g, logits, NULL, 0, &draw, lp), arg);
        /* greedy's processed log-probs: the plain log-softmax */
        double sum = 0;
        for (int v = 0; v < V; v++) sum += exp((double)lp[v]);
        assert_true(fabs(sum - 1) <= 1e-5);
        td_sampling k1 = td_sampling_default();
        k1.top_k = 1;
        for (int i = 0; i < 5; i++) {
            assert_int_equal(td_sample(smp, &k1, logits, NULL, 0, &draw, lp), arg);
            assert_true(lp[arg] == 0.0f);
        }
        /* temperature 1e-3 with a gap >= 0.05 to the runner-up: others have p < e^-50 */
        float second = -INFINITY;
        for (int v = 0; v < V; v++) if (v != arg && logits[v] > second) second = logits[v];
        if (logits[arg] - second >= 0.05f) {
            td_sampling cold = td_sampling_default();
            cold.temperature = 1e-3;
            for (int i = 0; i < 5; i++) assert_int_equal(td_sample(smp, &cold, logits, NULL, 0, &draw, NULL), arg);
        }
    }
    td_sampler_free(smp);
}

static void test_temperature(void **state)
{
    (void)state;
    const float logits[4] = {1.0f, -0.5f, 2.0f, 0.25f};
    float lp[4];
    const int all[4] = {1, 1, 1, 1};
    const double Ts[] = {0.5, 1.0, 2.0, 7.0};
    for (int t = 0; t < 4; t++) {
        td_sampling s = td_sampling_default();
        s.temperature = Ts[t];
        process(&s, logits, 4, NULL, 0, lp);
        double l[4];
        for (int v = 0; v < 4; v++) l[v] = logits[v] / Ts[t];
        assert_processed(lp, l, all, 4);
    }
}

static void test_top_k(void **state)
{
    (void)state;
    /* k = 3 of (1, 3, 2, 0.5, 2.5): keeps 3, 2.5, 2 = tokens 1, 4, 2 */
    const float logits[5] = {1.0f, 3.0f, 2.0f, 0.5f, 2.5f};
    const double l[5] = {1.0, 3.0, 2.0, 0.5, 2.5};
    float lp[5];
    td_sampling s = td_sampling_default();
    s.top_k = 3;
    process(&s, logits, 5, NULL, 0, lp);
    assert_processed(lp, l, (const int[]){0, 1, 1, 0, 1}, 5);
    /* k >= V keeps everything */
    s.top_k = 5;
    process(&s, logits, 5, NULL, 0, lp);
    assert_processed(lp, l, (const int[]){1, 1, 1, 1, 1}, 5);
    s.top_k = 9;
    process(&s, logits, 5, NULL, 0, lp);
    assert_processed(lp, l, (const int[]){1, 1, 1, 1, 1}, 5);
    /* ties with the k-th value are kept, as HF (scores < topk(k).values[-1] are removed) and
     * vLLM (logits < k-th sorted value are masked) do: k = 2 of (2, 1, 1, 0) keeps 0, 1, 2 */
    const float tied[4] = {2.0f, 1.0f, 1.0f, 0.0f};
    const double lt[4] = {2.0, 1.0, 1.0, 0.0};
    float lp4[4];
    s.top_k = 2;
    process(&s, tied, 4, NULL, 0, lp4);
    assert_processed(lp4, lt, (const int[]){1, 1, 1, 0}, 4);
}

static void test_top_p(void **state)
{
    (void)state;
    /* p = (0.1, 0.4, 0.2, 0.3); descending: token 1 (.4), 3 (.3 -> cum .7), 2 (.2 -> .9), 0.
     * top-p keeps the smallest prefix whose mass is >= p (HF / vLLM: drop a token when the
     * mass of the tokens above it already reaches p). Boundaries kept away from .4/.7/.9. */
    const double probs[4] = {0.1, 0.4, 0.2, 0.3};
    float logits[4];
    double l[4];
    for (int v = 0; v < 4; v++) { l[v] = log(probs[v]) + 1.5; logits[v] = (float)l[v]; l[v] = logits[v]; }
    float lp[4];
    td_sampling s = td_sampling_default();
    struct { double p; int keep[4]; } cases[] = {
        {0.30, {0, 1, 0, 0}}, {0.60, {0, 1, 0, 1}}, {0.75, {0, 1, 1, 1}},
        {0.95, {1, 1, 1, 1}}, {1.00, {1, 1, 1, 1}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        s.top_p = cases[i].p;
        process(&s, logits, 4, NULL, 0, lp);
        assert_processed(lp, l, cases[i].keep, 4);
    }
    /* top-p runs on the top-k-renormalised distribution: k = 2 keeps tokens 1, 3 with
     * .4/.7 = .571 and .3/.7 = .429, so p = 0.5 keeps token 1 alone (p = 0.5 without top-k
     * would keep 1 and 3) */
    s.top_k = 2;
    s.top_p = 0.5;
    process(&s, logits, 4, NULL, 0, lp);
    assert_processed(lp, l, (const int[]){0, 1, 0, 0}, 4);
    /* temperature before top-p: T = 2 flattens p to ∝ sqrt(p) = (.163, .325, .230, .282), so
     * p = 0.62 keeps tokens 1, 3 and 2 (.325 + .282 = .607 < .62), where T = 1 keeps 1, 3 (.7) */
    s.top_k = 0;
    s.top_p = 0.62;
    s.temperature = 2.0;
    process(&s, logits, 4, NULL, 0, lp);
    double l2[4];
    for (int v = 0; v < 4; v++) l2[v] = l[v] / 2.0;
    assert_processed(lp, l2, (const int[]){0, 1, 1, 1}, 4);
}

static void test_min_p(void **state)
{
    (void)state;
    /* p = (.5, .3, .1, .06, .04): min_p = .15 -> threshold .075 keeps 0, 1, 2;
     * min_p = .25 -> .125 keeps 0, 1; min_p = .05 -> .025 keeps all; min_p = 1 keeps the max */
    const double probs[5] = {0.5, 0.3, 0.1, 0.06, 0.04};
    float logits[5];
    double l[5];
    for (int v = 0; v < 5; v++) { logits[v] = (float)(log(probs[v]) - 0.7); l[v] = logits[v]; }
    float lp[5];
    td_sampling s = td_sampling_default();
    struct { double m; int keep[5]; } cases[] = {
        {0.15, {1, 1, 1, 0, 0}}, {0.25, {1, 1, 0, 0, 0}}, {0.05, {1, 1, 1, 1, 1}}, {1.0, {1, 0, 0, 0, 0}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        s.min_p = cases[i].m;
        process(&s, logits, 5, NULL, 0, lp);
        assert_processed(lp, l, cases[i].keep, 5);
    }
}

static void test_repetition_penalty(void **state)
{
    (void)state;
    /* penalty 2 on seen tokens {0, 1, 3} (0 seen three times, ids -1 and 5 outside [0, V)
     * ignored): 2 -> 1 (positive: divided), -1 -> -2 and -0.5 -> -1 (negative: multiplied);
     * tokens 2 and 4 unseen stay. Applied once per token: token 0 is 1, not 2/8 = 0.25. */
    const float logits[5] = {2.0f, -1.0f, 0.5f, -0.5f, 1.0f};
    const int seen[] = {0, 1, 0, -1, 3, 0, 5};
    const double want[5] = {1.0, -2.0, 0.5, -1.0, 1.0};
    const int all[5] = {1, 1, 1, 1, 1};
    float lp[5];
    td_sampling s = td_sampling_default();
    s.repetition_penalty = 2.0;
    td_sampler *smp = td_sampler_create(5);
    td_rng rng;
    td_rng_seed(&rng, 3);
    td_sample(smp, &s, logits, seen, 7, &rng, lp);
    assert_processed(lp, want, all, 5);
    /* the sampler forgets the seen set between calls: no tokens seen -> raw logits */
    const double raw[5] = {2.0, -1.0, 0.5, -0.5, 1.0};
    td_sample(smp, &s, logits, NULL, 0, &rng, lp);
    assert_processed(lp, raw, all, 5);
    td_sample(smp, &s, logits, (const int[]){4}, 1, &rng, lp);
    assert_processed(lp, (const double[]){2.0, -1.0, 0.5, -0.5, 0.5}, all, 5);
    /* a penalty < 1 boosts: 2 / 0.5 = 4, -1 · 0.5 = -0.5 */
    s.repetition_penalty = 0.5;
    td_sample(smp, &s, logits, (const int[]){0, 1}, 2, &rng, lp);
    assert_processed(lp, (const double[]){4.0, -0.5, 0.5, -0.5, 1.0}, all, 5);
    /* greedy sees the penalty: 2 -> 1 falls below token 4's 1.5 */
    s.repetition_penalty = 2.0;
    s.temperature = 0;
    const float lg[5] = {2.0f, -1.0f, 0.5f, -0.5f, 1.5f};
    assert_int_equal(td_sample(smp, &s, lg, (const int[]){0}, 1, &rng, NULL), 4);
    assert_int_equal(td_sample(smp, &s, lg, NULL, 0, &rng, NULL), 0);
    td_sampler_free(smp);
}

/* Draws n tokens and returns the chi-square statistic against probs over the tokens with
 * probs > 0; a draw of a zero-probability token fails the test. */
static double chi_square(const td_sampling *s, const float *logits, const double *probs, int V, int n,
                         uint64_t seed)
{
    td_sampler *smp = td_sampler_create(V);
    td_rng rng;
    td_rng_seed(&rng, seed);
    long count[16] = {0};
    for (int i = 0; i < n; i++) {
        int t = td_sample(smp, s, logits, NULL, 0, &rng, NULL);
        assert_true(t >= 0 && t < V);
        count[t]++;
    }
    td_sampler_free(smp);
    double chi2 = 0;
    for (int v = 0; v < V; v++) {
        if (probs[v] == 0) { assert_int_equal(count[v], 0); continue; }
        double e = probs[v] * n;
        chi2 += (count[v] - e) * (count[v] - e) / e;
    }
    return chi2;
}

static void test_empirical_frequencies(void **state)
{
    (void)state;
    /* 200k draws; chi-square with 4 (then 2) degrees of freedom. Thresholds: the 0.999
     * quantiles, 18.47 (df 4) and 13.82 (df 2). The seed is fixed, so the verdict is
     * deterministic; a wrong sampler (e.g. off by one in the CDF walk) gives chi² in the
     * thousands at this n. */
    const double probs[5] = {0.4, 0.25, 0.2, 0.1, 0.05};
    float logits[5];
    for (int v = 0; v < 5; v++) logits[v] = (float)(log(probs[v]) + 3.0);
    td_sampling s = td_sampling_default();
    double c = chi_square(&s, logits, probs, 5, 200000, 2024);
    if (!(c < 18.47)) { print_error("chi2 = %g (df 4)\n", c); fail(); }
    /* top-k = 3: the three largest renormalised, the others never drawn */
    s.top_k = 3;
    const double pk[5] = {0.4 / 0.85, 0.25 / 0.85, 0.2 / 0.85, 0, 0};
    c = chi_square(&s, logits, pk, 5, 200000, 2025);
    if (!(c < 13.82)) { print_error("chi2 = %g (df 2, top-k 3)\n", c); fail(); }
    /* temperature 2: p ∝ sqrt(p) */
    s.top_k = 0;
    s.temperature = 2.0;
    double pt[5], z = 0;
    for (int v = 0; v < 5; v++) z += sqrt(probs[v]);
    for (int v = 0; v < 5; v++) pt[v] = sqrt(probs[v]) / z;
    c = chi_square(&s, logits, pt, 5, 200000, 2026);
    if (!(c < 18.47)) { print_error("chi2 = %g (df 4, T = 2)\n", c); fail(); }
}

static void test_same_seed_same_tokens(void **state)
{
    (void)state;
    enum { V = 300, N = 1000 };
    static float logits[V];
    static int a[N], b[N], c[N];
    td_rng rng;
    td_rng_seed(&rng, 8);
    for (int v = 0; v < V; v++) logits[v] = (float)(2 * td_rng_normal(&rng));
    td_sampling s = td_sampling_default();
    s.top_p = 0.9;
    s.temperature = 0.8;
    s.repetition_penalty = 1.2;
    int *outs[3] = {a, b, c};
    const uint64_t seeds[3] = {77, 77, 78};
    for (int k = 0; k < 3; k++) {
        td_sampler *smp = td_sampler_create(V);
        td_rng r;
        td_rng_stream(&r, seeds[k], 4);
        for (int i = 0; i < N; i++)
            outs[k][i] = td_sample(smp, &s, logits, outs[k], i < 20 ? i : 20, &r, NULL);
        td_sampler_free(smp);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
}

static void test_threads_match_serial(void **state)
{
    (void)state;
    /* Samplers are per sequence and may run on several threads at once (one per sequence):
     * the tokens must be those of a serial run. Top-p forces the sort path. */
    enum { V = 2000, SEQS = 8, N = 60 };
    static float logits[SEQS][V];
    static int serial[SEQS][N], threaded[SEQS][N];
    td_rng rng;
    td_rng_seed(&rng, 21);
    for (int q = 0; q < SEQS; q++)
        for (int v = 0; v < V; v++) logits[q][v] = (float)(3 * td_rng_normal(&rng));
    td_sampling s = td_sampling_default();
    s.top_p = 0.95;
    s.top_k = 500;
    for (int pass = 0; pass < 2; pass++) {
        int (*out)[N] = pass ? threaded : serial;
        #pragma omp parallel for schedule(static, 1) num_threads(4) if (pass)
        for (int q = 0; q < SEQS; q++) {
            td_sampler *smp = td_sampler_create(V);
            td_rng r;
            td_rng_stream(&r, 5, (uint64_t)q);
            for (int i = 0; i < N; i++) out[q][i] = td_sample(smp, &s, logits[q], NULL, 0, &r, NULL);
            td_sampler_free(smp);
        }
    }
    assert_memory_equal(serial, threaded, sizeof serial);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_check),
        cmocka_unit_test(test_log_softmax),
        cmocka_unit_test(test_greedy_and_topk1),
        cmocka_unit_test(test_temperature),
        cmocka_unit_test(test_top_k),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p),
        cmocka_unit_test(test_repetition_penalty),
        cmocka_unit_test(test_empirical_frequencies),
        cmocka_unit_test(test_same_seed_same_tokens),
        cmocka_unit_test(test_threads_match_serial),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
