/* tidal — tests of the rollout loop of the inference path (src/paths/rollout.c), as tidal-diff
 * and tidal-rl call it.
 *
 * 1. Against the training path: every log-prob the rollout reports for its own tokens (response
 *    and, with prompt_rows, prompt positions) matches the teacher-forced structure's on the
 *    finished sequences within 1e-5 (fp32 on both paths; tests/test_model.c says why 1e-5), the
 *    row handed to row_fn holds that log-prob bit for bit, and with no sampling processing
 *    (temperature 1, no filters) the processed log-prob is the raw one bit for bit.
 * 2. Seeded per sequence: G completions of one prompt with distinct streams differ; the same
 *    stream in two slots of one batch draws the same tokens; a second run repeats the first.
 * 3. Stops: with a stop set, every sequence ends at its first stop token (finish EOS) and is the
 *    unstopped run's prefix there; without one, at max_new_tokens or max_len (finish LENGTH).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tidal/model.h"
#include "tidal/rng.h"
#include "tidal/rollout.h"
#include "model_testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { NSEQ = 6, MAX_NEW = 14, MAX_LEN = 32 };
static const int PLEN[NSEQ] = {3, 7, 1, 5, 5, 5};
/* sequences 3, 4, 5 are one prompt's completions: 3 and 4 share a stream, 5 has its own */
static const uint64_t STREAM[NSEQ] = {0, 1, 2, 3, 3, 4};

typedef struct {
    int V;
    float *rows[NSEQ];      /* (MAX_LEN, V) rows handed to row_fn, by position */
    int calls;
} seen_rows;

static void on_row(void *user, int s, int pos, const float *logp, float logp_proc)
{
    seen_rows *r = user;
    (void)logp_proc;
    memcpy(r->rows[s] + (size_t)pos * r->V, logp, (size_t)r->V * sizeof(float));
    r->calls++;
}

typedef struct {
    int *tok[NSEQ], len[NSEQ], finish[NSEQ];
    float *logp[NSEQ], *proc[NSEQ];
} result;

static void run(td_session *sess, td_sampler *smp, const td_rollout_opts *o, result *res, seen_rows *rows)
{
    td_rng r;
    td_rng_seed(&r, 99);
    for (int s = 0; s < NSEQ; s++) {
        res->tok[s] = calloc(MAX_LEN, sizeof(int));
        res->logp[s] = calloc(MAX_LEN, sizeof(float));
        res->proc[s] = calloc(MAX_LEN, sizeof(float));
        for (int t = 0; t < PLEN[s]; t++) res->tok[s][t] = s >= 3 ? 10 + 7 * t : (int)(td_rng_next(&r) % 301);
    }
    td_rollout_batch b = {.n = NSEQ, .tokens = res->tok, .prompt_len = PLEN, .stream = STREAM, .len = res->len,
                          .finish = res->finish, .logp = res->logp, .logp_proc = res->proc};
    td_error err;
    assert_int_equal(td_rollout_generate(sess, smp, o, &b, rows ? on_row : NULL, rows, &err), 0);
}

static void result_free(result *res)
{
    for (int s = 0; s < NSEQ; s++) { free(res->tok[s]); free(res->logp[s]); free(res->proc[s]); }
}

static td_rollout_opts opts(void)
{
    td_rollout_opts o = {.sampling = td_sampling_default(), .max_new_tokens = MAX_NEW, .max_len = MAX_LEN,
                         .seed = 5, .prompt_rows = 1};
    return o;
}

static void test_against_training_path(void **st)
{
    (void)st;
    td_model *m = random_model(11);
    int V = m->cfg.vocab_size;
    td_error err;
    td_session *sess = td_session_create(m, NSEQ, MAX_LEN, 0, &err);
    td_sampler *smp = td_sampler_create(V);
    seen_rows rows = {.V = V};
    for (int s = 0; s < NSEQ; s++) rows.rows[s] = calloc((size_t)MAX_LEN * V, sizeof(float));
    td_rollout_opts o = opts();
    result res;
    run(sess, smp, &o, &res, &rows);
    td_forward *f = td_forward_create(m, NSEQ * MAX_LEN, MAX_LEN, 0, &err);
    assert_non_null(f);
    float *ref[NSEQ];
    for (int s = 0; s < NSEQ; s++) ref[s] = calloc(MAX_LEN, sizeof(float));
    assert_int_equal(td_forward_logprobs(f, NSEQ, (const int *const *)res.tok, res.len, ref, NULL, NULL, &err), 0);
    double worst = 0;
    int expected_calls = 0;
    for (int s = 0; s < NSEQ; s++) {
        assert_int_equal(res.len[s], PLEN[s] + MAX_NEW);
        assert_int_equal(res.finish[s], TD_FINISH_LENGTH);
        for (int pos = 1; pos < res.len[s]; pos++) {
            int y = res.tok[s][pos];
            assert_true(y >= 0 && y < V);
            double d = fabs((double)res.logp[s][pos] - ref[s][pos - 1]);
            if (d > worst) worst = d;
            assert_memory_equal(&rows.rows[s][(size_t)pos * V + y], &res.logp[s][pos], sizeof(float));
            assert_memory_equal(&res.proc[s][pos], &res.logp[s][pos], sizeof(float));
            expected_calls++;
        }
    }
    assert_int_equal(rows.calls, expected_calls);
    assert_true(worst <= 1e-5);
    for (int s = 0; s < NSEQ; s++) { free(ref[s]); free(rows.rows[s]); }
    result_free(&res);
    td_forward_free(f);
    td_sampler_free(smp);
    td_session_free(sess);
    td_model_free(m);
}

static void test_seeded_per_sequence(void **st)
{
    (void)st;
    td_model *m = random_model(12);
    td_error err;
    td_session *sess = td_session_create(m, NSEQ, MAX_LEN, 0, &err);
    td_sampler *smp = td_sampler_create(m->cfg.vocab_size);
    td_rollout_opts o = opts();
    o.sampling.temperature = 1.5;   /* spread the draws */
    result a, b;
    run(sess, smp, &o, &a, NULL);
    run(sess, smp, &o, &b, NULL);
    for (int s = 0; s < NSEQ; s++) {
        assert_int_equal(a.len[s], b.len[s]);
        assert_memory_equal(a.tok[s], b.tok[s], (size_t)a.len[s] * sizeof(int));
        assert_memory_equal(a.logp[s], b.logp[s], (size_t)a.len[s] * sizeof(float));
    }
    assert_memory_equal(a.tok[3], a.tok[4], (size_t)a.len[3] * sizeof(int));              /* one stream */
    assert_memory_not_equal(a.tok[3] + PLEN[3], a.tok[5] + PLEN[5], MAX_NEW * sizeof(int)); /* two */
    /* processed log-probs: temperature 1.5 flattens the distribution, so a drawn token's
     * processed log-prob differs from its raw one */
    int differ = 0;
    for (int pos = PLEN[0]; pos < a.len[0]; pos++) differ += a.proc[0][pos] != a.logp[0][pos];
    assert_true(differ > 0);
    result_free(&a);
    result_free(&b);
    td_sampler_free(smp);
    td_session_free(sess);
    td_model_free(m);
}

static void test_stops(void **st)
{
    (void)st;
    td_model *m = random_model(13);
    td_error err;
    td_session *sess = td_session_create(m, NSEQ, MAX_LEN, 0, &err);
    td_sampler *smp = td_sampler_create(m->cfg.vocab_size);
    td_rollout_opts o = opts();
    o.sampling.temperature = 0.8;
    result free_run, stopped, capped;
    run(sess, smp, &o, &free_run, NULL);
    /* stop set: sequence 0's 4th response token and sequence 1's 2nd */
    int eos[2] = {free_run.tok[0][PLEN[0] + 3], free_run.tok[1][PLEN[1] + 1]};
    o.eos = eos;
    o.n_eos = 2;
    o.stop_at_eos = 1;
    run(sess, smp, &o, &stopped, NULL);
    for (int s = 0; s < NSEQ; s++) {
        int first = -1;
        for (int pos = PLEN[s]; pos < free_run.len[s] && first < 0; pos++)
            if (free_run.tok[s][pos] == eos[0] || free_run.tok[s][pos] == eos[1]) first = pos;
        int want_len = first >= 0 ? first + 1 : free_run.len[s];
        assert_int_equal(stopped.len[s], want_len);
        assert_int_equal(stopped.finish[s], first >= 0 ? TD_FINISH_EOS : TD_FINISH_LENGTH);
        assert_memory_equal(stopped.tok[s], free_run.tok[s], (size_t)want_len * sizeof(int));
    }
    assert_true(stopped.len[0] <= PLEN[0] + 4 && stopped.finish[0] == TD_FINISH_EOS);
    /* a buffer of 9 positions: sequences stop at 9 tokens, or at MAX_NEW if that is sooner */
    o = opts();
    o.sampling.temperature = 0.8;
    o.max_len = 9;
    run(sess, smp, &o, &capped, NULL);
    for (int s = 0; s < NSEQ; s++) {
        int want = PLEN[s] + MAX_NEW < 9 ? PLEN[s] + MAX_NEW : 9;
        assert_int_equal(capped.len[s], want);
        assert_int_equal(capped.finish[s], TD_FINISH_LENGTH);
        assert_memory_equal(capped.tok[s], free_run.tok[s], (size_t)want * sizeof(int));
    }
    result_free(&free_run);
    result_free(&stopped);
    result_free(&capped);
    td_sampler_free(smp);
    td_session_free(sess);
    td_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_against_training_path),
        cmocka_unit_test(test_seeded_per_sequence),
        cmocka_unit_test(test_stops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
