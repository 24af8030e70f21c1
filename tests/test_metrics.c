/* Per-token divergence metrics (src/analysis/metrics.c):
 *  - hand-computed cases (V = 3 and 4, worked out in the comments), including rows with
 *    zero-probability (-inf) entries;
 *  - identities: KL(A‖A) = TV(A, A) = k3 = 0; 0 <= TV <= 1 (= 1 for disjoint supports);
 *    Pinsker TV <= sqrt(KL/2); k3 >= 0 and k3 = r²/2 + r³/6 + O(r⁴) for small r;
 *  - random rows against a long-double reference written from the definitions in metrics.h.
 * Tolerances: the hand cases feed float log-probs (log 0.5 rounded to float, relative error
 * 2^-24), which moves every result by < 1e-7, so 1e-6 absolute; the random rows compare double
 * sums over V = 1000 terms with a long-double sum of the same float inputs: 1e-12 relative to
 * the sum of absolute terms. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <cmocka.h>

#include "tidal/metrics.h"
#include "tidal/rng.h"

#define LN2 0.69314718055994530942

static void assert_close(double got, double want, double tol, const char *what)
{
    if (!(fabs(got - want) <= tol)) {
        print_error("%s: got %.17g, want %.17g (tolerance %g)\n", what, got, want, tol);
        fail();
    }
}

static void test_hand_v3(void **state)
{
    (void)state;
    /* p_a = (1/2, 1/4, 1/4), p_b = (1/4, 1/2, 1/4), y = 1.
     *   logp_a(y) = -2 ln2, logp_b(y) = -ln2
     *   KL(B‖A) = 1/4 ln(1/2) + 1/2 ln 2 + 1/4 ln 1 = ln2 / 4; KL(A‖B) = ln2 / 4 likewise
     *   TV = (1/4 + 1/4 + 0) / 2 = 1/4
     *   H = -(1/2 ln 1/2 + 2 · 1/4 ln 1/4) = 3/2 ln2 for both
     *   r = logp_a - logp_b = -ln2, k3 = e^-ln2 - 1 + ln2 = ln2 - 1/2
     *   top1_a = 0, top1_b = 1; rank_a(y) = 2 (only token 0 is above; token 2 ties), rank_b = 1 */
    const float la[3] = {(float)-LN2, (float)(-2 * LN2), (float)(-2 * LN2)};
    const float lb[3] = {(float)(-2 * LN2), (float)-LN2, (float)(-2 * LN2)};
    td_token_metrics m;
    td_token_metrics_compute(la, lb, 3, 1, &m);
    const double tol = 1e-6;
    assert_close(m.logp_a, -2 * LN2, tol, "logp_a");
    assert_close(m.logp_b, -LN2, tol, "logp_b");
    assert_close(m.kl_ba, LN2 / 4, tol, "kl_ba");
    assert_close(m.kl_ab, LN2 / 4, tol, "kl_ab");
    assert_close(m.tv, 0.25, tol, "tv");
    assert_close(m.entropy_a, 1.5 * LN2, tol, "entropy_a");
    assert_close(m.entropy_b, 1.5 * LN2, tol, "entropy_b");
    assert_close(m.k3, LN2 - 0.5, tol, "k3");
    assert_int_equal(m.top1_a, 0);
    assert_int_equal(m.top1_b, 1);
    assert_int_equal(m.rank_a, 2);
    assert_int_equal(m.rank_b, 1);
}

static void test_hand_v4_zero_probabilities(void **state)
{
    (void)state;
    /* p_a = (1/2, 1/2, 0, 0), p_b = (1/2, 1/4, 1/4, 0), y = 0.
     *   KL(A‖B) = 1/2 ln 1 + 1/2 ln(1/2 / 1/4) = ln2 / 2 (tokens with p_a = 0 add nothing)
     *   KL(B‖A) = +inf: token 2 has p_b = 1/4 where p_a = 0
     *   TV = (0 + 1/4 + 1/4 + 0) / 2 = 1/4
     *   H_a = ln2, H_b = 1/2 ln2 + 2 · 1/4 · 2 ln2 = 3/2 ln2; token 3 (both -inf) is no NaN
     *   k3 = 0 (same logp of y); top1_a = 0 (tie with 1: first index), top1_b = 0;
     *   rank_a = 1 (token 1 ties, not above), rank_b = 1 */
    const float la[4] = {(float)-LN2, (float)-LN2, -INFINITY, -INFINITY};
    const float lb[4] = {(float)-LN2, (float)(-2 * LN2), (float)(-2 * LN2), -INFINITY};
    td_token_metrics m;
    td_token_metrics_compute(la, lb, 4, 0, &m);
    const double tol = 1e-6;
    assert_close(m.kl_ab, LN2 / 2, tol, "kl_ab");
    assert_true(isinf(m.kl_ba) && m.kl_ba > 0);
    assert_close(m.tv, 0.25, tol, "tv");
    assert_close(m.entropy_a, LN2, tol, "entropy_a");
    assert_close(m.entropy_b, 1.5 * LN2, tol, "entropy_b");
    assert_true(m.k3 == 0.0);
    assert_int_equal(m.top1_a, 0);
    assert_int_equal(m.top1_b, 0);
    assert_int_equal(m.rank_a, 1);
    assert_int_equal(m.rank_b, 1);
    /* y = 2: p_a(y) = 0 -> r = -inf, k3 = e^-inf - 1 + inf = +inf; rank_a = 3 (tokens 0, 1
     * above; token 3 ties at -inf), rank_b = 2 (token 0 above, token 1 ties) */
    td_token_metrics_compute(la, lb, 4, 2, &m);
    assert_true(isinf(m.k3) && m.k3 > 0);
    assert_int_equal(m.rank_a, 3);
    assert_int_equal(m.rank_b, 2);
    /* the other way round: p_b(y) = 0, p_a(y) > 0 -> r = +inf, k3 = +inf (not inf - inf) */
    td_token_metrics_compute(lb, la, 4, 2, &m);
    assert_true(isinf(m.k3) && m.k3 > 0);
}

static void test_disjoint_support(void **state)
{
    (void)state;
    /* all mass on token 0 under A, on token 1 under B: TV = 1, both KLs infinite */
    const float la[3] = {0.0f, -INFINITY, -INFINITY};
    const float lb[3] = {-INFINITY, 0.0f, -INFINITY};
    td_token_metrics m;
    td_token_metrics_compute(la, lb, 3, 1, &m);
    assert_true(m.tv == 1.0);
    assert_true(isinf(m.kl_ab) && isinf(m.kl_ba));
    assert_true(m.entropy_a == 0.0 && m.entropy_b == 0.0);
    assert_int_equal(m.top1_a, 0);
    assert_int_equal(m.top1_b, 1);
}

/* A random log-softmax row (V) in float: logits N(0, scale²), normalised in double. */
static void random_row(td_rng *rng, float *row, int V, double scale)
{
    double mx = -INFINITY, z = 0;
    double *l = malloc((size_t)V * sizeof *l);
    for (int v = 0; v < V; v++) { l[v] = scale * td_rng_normal(rng); mx = l[v] > mx ? l[v] : mx; }
    for (int v = 0; v < V; v++) z += exp(l[v] - mx);
    for (int v = 0; v < V; v++) row[v] = (float)(l[v] - mx - log(z));
    free(l);
}

/* The definitions of metrics.h in long double, over the same float inputs renormalised (in
 * long double) to sum to 1, the plain Σ p (log p - log q) form. */
typedef struct { long double kl_ba, kl_ab, tv, ha, hb, abs_kl_ba, abs_kl_ab; } ref_metrics;
static ref_metrics reference(const float *la, const float *lb, int V)
{
    ref_metrics r = {0};
    long double za = 0, zb = 0;
    for (int v = 0; v < V; v++) { za += expl(la[v]); zb += expl(lb[v]); }
    za = logl(za);
    zb = logl(zb);
    for (int v = 0; v < V; v++) {
        long double a = la[v] - za, b = lb[v] - zb, pa = expl(a), pb = expl(b);
        r.kl_ba += pb * (b - a);
        r.kl_ab += pa * (a - b);
        r.abs_kl_ba += fabsl(pb * (b - a));
        r.abs_kl_ab += fabsl(pa * (a - b));
        r.tv += fabsl(pa - pb) / 2;
        r.ha -= pa * a;
        r.hb -= pb * b;
    }
    return r;
}

static void test_random_rows_vs_reference(void **state)
{
    (void)state;
    enum { V = 1000 };
    static float la[V], lb[V];
    td_rng rng;
    td_rng_seed(&rng, 1234);
    for (int trial = 0; trial < 200; trial++) {
        double scale = trial % 2 ? 3.0 : 0.5;
        random_row(&rng, la, V, scale);
        if (trial % 3 == 0) {
            /* B near A: A's logits perturbed by 1e-3, the precision-mismatch regime */
            for (int v = 0; v < V; v++) lb[v] = la[v] + (float)(1e-3 * td_rng_normal(&rng));
            double mx = -INFINITY, z = 0;
            for (int v = 0; v < V; v++) mx = lb[v] > mx ? lb[v] : mx;
            for (int v = 0; v < V; v++) z += exp(lb[v] - mx);
            for (int v = 0; v < V; v++) lb[v] = (float)(lb[v] - mx - log(z));
        } else {
            random_row(&rng, lb, V, scale);
        }
        int y = (int)td_rng_below(&rng, V);
        td_token_metrics m;
        td_token_metrics_compute(la, lb, V, y, &m);
        ref_metrics r = reference(la, lb, V);
        assert_close(m.kl_ba, (double)r.kl_ba, 1e-12 * (double)r.abs_kl_ba + 1e-300, "kl_ba");
        assert_close(m.kl_ab, (double)r.kl_ab, 1e-12 * (double)r.abs_kl_ab + 1e-300, "kl_ab");
        assert_close(m.tv, (double)r.tv, 1e-12, "tv");
        assert_close(m.entropy_a, (double)r.ha, 1e-12 * (double)r.ha, "entropy_a");
        assert_close(m.entropy_b, (double)r.hb, 1e-12 * (double)r.hb, "entropy_b");
        assert_true(m.logp_a == la[y] && m.logp_b == lb[y]);
        /* identities: KL >= 0 exactly (no rounding slack: the rows are renormalised and the
         * sum is termwise non-negative), and Pinsker TV <= sqrt(KL/2) on every row, the near
         * ones (KL ~ 1e-7) included, which float rows summing to 1 +- 1e-8 used to break */
        assert_true(m.kl_ba >= 0 && m.kl_ab >= 0);
        assert_true(m.tv >= 0 && m.tv <= 1);
        assert_true(m.tv <= sqrt(m.kl_ab / 2) * (1 + 1e-9));
        assert_true(m.tv <= sqrt(m.kl_ba / 2) * (1 + 1e-9));
        assert_true(m.k3 >= 0);
        assert_true(m.k3 == td_k3(m.logp_a, m.logp_b));
        /* top1 and ranks by counting */
        int top_a = 0, top_b = 0, rank_a = 1, rank_b = 1;
        for (int v = 0; v < V; v++) {
            if (la[v] > la[top_a]) top_a = v;
            if (lb[v] > lb[top_b]) top_b = v;
            rank_a += la[v] > la[y];
            rank_b += lb[v] > lb[y];
        }
        assert_int_equal(m.top1_a, top_a);
        assert_int_equal(m.top1_b, top_b);
        assert_int_equal(m.rank_a, rank_a);
        assert_int_equal(m.rank_b, rank_b);
        /* scoring the argmax gives rank 1 */
        td_token_metrics_compute(la, lb, V, top_a, &m);
        assert_int_equal(m.rank_a, 1);
    }
}

static void test_self_divergence_is_zero(void **state)
{
    (void)state;
    enum { V = 512 };
    static float la[V];
    td_rng rng;
    td_rng_seed(&rng, 99);
    for (int trial = 0; trial < 20; trial++) {
        random_row(&rng, la, V, 2.0);
        la[trial] = -INFINITY;                      /* zero-probability entries too */
        td_token_metrics m;
        td_token_metrics_compute(la, la, V, V - 1, &m);
        /* every term is p · 0 or |p - p|: exactly zero, not merely small */
        assert_true(m.kl_ba == 0.0 && m.kl_ab == 0.0 && m.tv == 0.0 && m.k3 == 0.0);
        assert_true(m.entropy_a == m.entropy_b && m.entropy_a > 0);
        assert_int_equal(m.top1_a, m.top1_b);
        assert_int_equal(m.rank_a, m.rank_b);
    }
}

static void test_k3(void **state)
{
    (void)state;
    /* k3(r) = e^r - 1 - r >= 0 with equality only at r = 0 */
    assert_true(td_k3(-1.5, -1.5) == 0.0);
    for (double r = -20; r <= 20; r += 0.37) assert_true(td_k3(r - 2.0, -2.0) >= 0);
    /* exact values: r = ln2 -> 2 - 1 - ln2 = 1 - ln2; r = -ln2 -> ln2 - 1/2 */
    assert_close(td_k3(LN2, 0), 1 - LN2, 1e-15, "k3(ln2)");
    assert_close(td_k3(0, LN2), LN2 - 0.5, 1e-15, "k3(-ln2)");
    /* small r: k3 = r²/2 + r³/6 + r⁴/24 + ...; relative remainder r²/12 < 1e-9 for |r| <= 1e-4.
     * Rounding: expm1 has relative error ~eps, so k3 carries ~eps·|r| absolute, i.e.
     * 2·eps/|r| relative (2e-10 at r = 1e-6). Tolerance 1e-6 relative; the naive
     * exp(r) - 1 - r would be off by ~eps/(r²/2) = 2e-4 at r = 1e-6 and fail. */
    const double rs[] = {1e-4, -1e-4, 3e-5, -3e-5, 1e-6, -1e-6};
    for (size_t i = 0; i < sizeof rs / sizeof *rs; i++) {
        /* k3(-1 + r, -1): the difference the function forms rounds, so the series uses the
         * r it actually sees */
        double r = (-1.0 + rs[i]) - (-1.0);
        double k = td_k3(-1.0 + rs[i], -1.0);
        double series = r * r / 2 + r * r * r / 6;
        if (!(fabs(k / series - 1) <= 1e-6)) {
            print_error("k3(r=%g) = %.17g, series %.17g\n", r, k, series);
            fail();
        }
        assert_true(k > 0);
    }
    /* infinite arguments: r = -inf -> +inf; r = +inf -> +inf (not inf - inf = NaN) */
    assert_true(isinf(td_k3(-INFINITY, -1.0)) && td_k3(-INFINITY, -1.0) > 0);
    assert_true(isinf(td_k3(-1.0, -INFINITY)) && td_k3(-1.0, -INFINITY) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hand_v3),
        cmocka_unit_test(test_hand_v4_zero_probabilities),
        cmocka_unit_test(test_disjoint_support),
        cmocka_unit_test(test_random_rows_vs_reference),
        cmocka_unit_test(test_self_divergence_is_zero),
        cmocka_unit_test(test_k3),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
