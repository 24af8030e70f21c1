/* The collapse detector (src/rl/collapse.c, include/tidal/rl.h) on synthetic metric traces:
 * a clean trace (noisy rising reward, steady grad norm, entropy, mismatch and lengths) fires
 * nothing; each cause, planted at a known step, fires at that step and only that cause; the
 * configuration parser accepts the documented keys and names a wrong one. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tidal/rl.h"
#include "tidal/rng.h"

enum { STEPS = 120 };

/* A healthy run: reward climbing 0.5 -> 0.9 with noise, grad norm ~1, entropy ~0.5 slowly
 * falling, k3 ~1e-5, ESS ~1, no truncation. */
static void clean(double (*m)[TD_RLM_COUNT], int n, uint64_t seed)
{
    td_rng r;
    td_rng_stream(&r, seed, 0);
    for (int k = 0; k < n; k++) {
        for (int i = 0; i < TD_RLM_COUNT; i++) m[k][i] = 0.0;
        m[k][TD_RLM_reward] = 0.5 + 0.4 * (1 - exp(-k / 30.0)) + 0.05 * td_rng_normal(&r);
        m[k][TD_RLM_grad_norm] = 1.0 + 0.2 * td_rng_uniform(&r);
        m[k][TD_RLM_entropy] = 0.5 * (1 - 0.3 * k / n) + 0.01 * td_rng_normal(&r);
        m[k][TD_RLM_k3_kl] = 1e-5 * (1 + 0.3 * td_rng_uniform(&r));
        m[k][TD_RLM_rollout_corr_kl] = 1e-4 * td_rng_normal(&r);
        m[k][TD_RLM_chi2_token] = 2e-5;
        m[k][TD_RLM_rollout_is_eff_sample_size] = 0.999;
        m[k][TD_RLM_response_length_clip_ratio] = 0.0;
    }
}

/* Pushes the trace; returns the detector (caller frees). */
static td_collapse *feed(double (*m)[TD_RLM_COUNT], int n, const td_collapse_cfg *c)
{
    td_collapse_cfg d;
    td_collapse_cfg_defaults(&d);
    td_collapse *det = td_collapse_new(c ? c : &d);
    for (int k = 0; k < n; k++) td_collapse_push(det, m[k]);
    return det;
}

static void expect_only(td_collapse *det, int signal, int step)
{
    for (int s = 0; s < TD_CLP_NSIGNALS; s++) {
        int got = td_collapse_first(det, (td_collapse_signal)s);
        if (s == signal) {
            if (got != step) fail_msg("%s marked at %d, expected %d", td_collapse_signal_names[s], got, step);
        } else if (got != -1) {
            fail_msg("%s marked at %d, expected nothing", td_collapse_signal_names[s], got);
        }
    }
}

static void test_clean_trace_fires_nothing(void **state)
{
    (void)state;
    static double m[STEPS][TD_RLM_COUNT];
    for (uint64_t seed = 1; seed <= 5; seed++) {
        clean(m, STEPS, seed);
        td_collapse *det = feed(m, STEPS, NULL);
        expect_only(det, -1, -1);
        td_collapse_free(det);
    }
}

/* reward: rises to ~0.9, then from step 70 drops to 0.3 and stays: the EMA (alpha 0.1) falls
 * 0.3 below its best after a few steps; the mark is the first of the 10 held steps. Computed
 * here by the definition, independently of the detector's code. */
static void test_reward_drop(void **state)
{
    (void)state;
    static double m[STEPS][TD_RLM_COUNT];
    clean(m, STEPS, 2);
    for (int k = 70; k < STEPS; k++) m[k][TD_RLM_reward] = 0.3;
    double ema = m[0][TD_RLM_reward], best = ema, init = ema;
    int run = 0, expect = -1;
    for (int k = 0; k < STEPS && expect < 0; k++) {
        if (k) ema = 0.1 * m[k][TD_RLM_reward] + 0.9 * ema;
        if (ema > best) best = ema;
        int dropped = best - ema >= 0.3 || (best - init >= 0.1 && best - ema >= 0.5 * (best - init));
        run = dropped ? run + 1 : 0;
        if (run == 10) expect = k - 9;
    }
    assert_true(expect > 70 && expect < 80);
    td_collapse *det = feed(m, STEPS, NULL);
    expect_only(det, TD_CLP_REWARD, expect);
    td_collapse_free(det);
}

/* grad_spike: a single spike does not fire (2 of 3 needed); spikes at 60 and 62 fire at 60;
 * a non-finite norm counts as a spike. */
static void test_grad_spike(void **state)
{
    (void)state;
    static double m[STEPS][TD_RLM_COUNT];
    clean(m, STEPS, 3);
    m[40][TD_RLM_grad_norm] = 50.0;
    td_collapse *det = feed(m, STEPS, NULL);
    expect_only(det, -1, -1);
    td_collapse_free(det);
    m[60][TD_RLM_grad_norm] = 30.0;
    m[62][TD_RLM_grad_norm] = NAN;
    det = feed(m, STEPS, NULL);
    expect_only(det, TD_CLP_GRAD, 60);
    td_collapse_free(det);
}

/* entropy: above 2x its step-0 value from step 50 on: marked at 50 (10 held steps); 9 steps
 * out of the band and back do not fire. */
static void test_entropy(void **state)
{
    (void)state;
    static double m[STEPS][TD_RLM_COUNT];
    clean(m, STEPS, 4);
    for (int k = 30; k < 39; k++) m[k][TD_RLM_entropy] = 0.05;
    td_collapse *det = feed(m, STEPS, NULL);
    expect_only(det, -1, -1);
    td_collapse_free(det);
    for (int k = 50; k < STEPS; k++) m[k][TD_RLM_entropy] = 1.2;
    det = feed(m, STEPS, NULL);
    expect_only(det, TD_CLP_ENTROPY, 50);
    td_collapse_free(det);
}

/* mismatch: k3 at 12x its early median from step 45 (quiet with a k3_min floor above it); separately, verl's alarms each fire at
 * their step: chi2_token > 1, ESS < 0.3, |kl| > 0.1. */
static void test_mismatch(void **state)
{
    (void)state;
    static double m[STEPS][TD_RLM_COUNT];
    clean(m, STEPS, 5);
    for (int k = 45; k < STEPS; k++) m[k][TD_RLM_k3_kl] = 1.5e-4;
    td_collapse *det = feed(m, STEPS, NULL);
    expect_only(det, TD_CLP_MISMATCH, 45);
    td_collapse_free(det);
    td_collapse_cfg floor;   /* an absolute floor above the planted k3: the relative rule is quiet */
    td_collapse_cfg_defaults(&floor);
    floor.k3_min = 1e-3;
    det = feed(m, STEPS, &floor);
    expect_only(det, -1, -1);
    td_collapse_free(det);
    const int col[3] = {TD_RLM_chi2_token, TD_RLM_rollout_is_eff_sample_size, TD_RLM_rollout_corr_kl};
    const double val[3] = {1.5, 0.2, -0.15};
    for (int i = 0; i < 3; i++) {
        clean(m, STEPS, 6);
        m[33 + i][col[i]] = val[i];
        det = feed(m, STEPS, NULL);
        expect_only(det, TD_CLP_MISMATCH, 33 + i);
        td_collapse_free(det);
    }
}

static void test_length(void **state)
{
    (void)state;
    static double m[STEPS][TD_RLM_COUNT];
    clean(m, STEPS, 7);
    m[20][TD_RLM_response_length_clip_ratio] = 0.5;   /* not above 50 % */
    m[77][TD_RLM_response_length_clip_ratio] = 0.75;
    td_collapse *det = feed(m, STEPS, NULL);
    expect_only(det, TD_CLP_LENGTH, 77);
    td_collapse_free(det);
}

/* dead: every completion truncated from step 30 (and the frac_reward_zero_std route from 90)
 * marks the first of dead_hold (5) steps; 4 such steps in a row mark nothing */
static void test_dead(void **state)
{
    (void)state;
    static double m[STEPS][TD_RLM_COUNT];
    clean(m, STEPS, 9);
    for (int k = 10; k < 14; k++) m[k][TD_RLM_response_length_clip_ratio] = 1.0;
    td_collapse *det = feed(m, STEPS, NULL);
    assert_int_equal(td_collapse_first(det, TD_CLP_DEAD), -1);
    td_collapse_free(det);
    for (int k = 30; k < 40; k++) m[k][TD_RLM_response_length_clip_ratio] = 1.0;
    det = feed(m, STEPS, NULL);
    assert_int_equal(td_collapse_first(det, TD_CLP_DEAD), 30);
    assert_int_equal(td_collapse_first(det, TD_CLP_LENGTH), 10);   /* the length precursor, earlier */
    td_collapse_free(det);
    clean(m, STEPS, 9);
    for (int k = 90; k < STEPS; k++) m[k][TD_RLM_frac_reward_zero_std] = 1.0;
    det = feed(m, STEPS, NULL);
    expect_only(det, TD_CLP_DEAD, 90);
    td_collapse_free(det);
}

/* a configured threshold changes the mark: hold 3 confirms the reward drop earlier */
static void test_config(void **state)
{
    (void)state;
    td_collapse_cfg c;
    td_collapse_cfg_defaults(&c);
    td_error err;
    assert_int_equal(td_collapse_cfg_parse(&c, "hold=3,drop_abs=0.2", &err), 0);
    assert_int_equal(c.hold, 3);
    assert_true(c.drop_abs == 0.2);
    assert_int_equal(td_collapse_cfg_parse(&c, "hodl=3", &err), -1);
    assert_non_null(strstr(err.msg, "hodl"));
    assert_non_null(strstr(err.msg, "hold"));
    assert_int_equal(td_collapse_cfg_parse(&c, "hold=2.5", &err), -1);
    char *js = td_collapse_cfg_json(&c);
    assert_non_null(strstr(js, "\"drop_abs\":0.2"));
    free(js);
    static double m[STEPS][TD_RLM_COUNT];
    clean(m, STEPS, 2);
    for (int k = 70; k < STEPS; k++) m[k][TD_RLM_reward] = 0.3;
    td_collapse_cfg def;
    td_collapse_cfg_defaults(&def);
    td_collapse *a = feed(m, STEPS, &def), *b = feed(m, STEPS, &c);
    assert_true(td_collapse_first(b, TD_CLP_REWARD) >= 70);
    assert_true(td_collapse_first(b, TD_CLP_REWARD) <= td_collapse_first(a, TD_CLP_REWARD));
    td_collapse_free(a);
    td_collapse_free(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_clean_trace_fires_nothing), cmocka_unit_test(test_reward_drop),
        cmocka_unit_test(test_grad_spike), cmocka_unit_test(test_entropy), cmocka_unit_test(test_mismatch),
        cmocka_unit_test(test_length),
        cmocka_unit_test(test_dead), cmocka_unit_test(test_config),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
