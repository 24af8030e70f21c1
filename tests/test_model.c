/* tidal — tests of the Llama-family forward (src/model).
 *
 * 1. Golden: for each fixture in tests/fixtures/<arch>/ (written by tests/py/make_golden.py: a
 *    tiny random HF checkpoint and float64 log-probs from an independent PyTorch forward), the
 *    teacher-forced structure and the prefill+decode structure must both match the golden
 *    next-token log-probs and last-position log-softmax rows within 1e-4 absolute. Why 1e-4:
 *    tidal computes in fp32 (unit roundoff 6e-8) with a summation order of its own, the
 *    reference in float64; over 2 layers and logits of a few nats the observed error is
 *    ~1e-6..1e-5, and a wrong op (RoPE convention, missing bias, norm placement) moves
 *    log-probs by 1e-2 or more.
 * 2. Paths agree: on the same tokens, teacher forcing and KV-cache decoding agree within 1e-5 in
 *    the log-prob of every scored token, and within 3e-5 in every entry of every full
 *    log-softmax row (entries reach -15 nats, where one fp32 ulp is 1e-6; the paths run the
 *    same fp32 ops, but GEMM vs GEMV, blocked vs row-wise attention and different GEMM shapes
 *    sum in different orders) — on the fixtures and on an in-memory random model with several
 *    sequences of different lengths packed into micro-batches.
 * 3. Bad input: out-of-vocabulary tokens, a full slot, a missing directory give errors.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tidal/io.h"
#include "tidal/model.h"
#include "tidal/rng.h"
#include "model_testutil.h"

#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define GOLDEN_TOL 1e-4
#define PATHS_TOL 1e-5      /* scored tokens */
#define PATHS_ROW_TOL 3e-5  /* every entry of the full rows */

/* Rows of log-softmax per (sequence, position), filled by row callbacks. */
typedef struct {
    int V, maxT;
    float *rows;    // (nseq, maxT, V)
    int calls;
} row_sink;

static void sink_row(void *user, int seq, int pos, const float *row)
{
    row_sink *s = user;
    memcpy(s->rows + ((size_t)seq * s->maxT + pos) * s->V, row, (size_t)s->V * sizeof(float));
    s->calls++;
}

static float *sink_at(row_sink *s, int seq, int pos)
{
    return s->rows + ((size_t)seq * s->maxT + pos) * s->V;
}

/* Prefill the first plen[s] tokens of each sequence into slot s, then decode the rest one
 * token per step, batching every slot that still has tokens (slots sit at different
 * positions). Rows land in `out` from position first_row(s, plen) on: even slots get every
 * prefill row through the callback, odd ones only the last prefill row. */
static int first_row(int s, const int *plen) { return s % 2 == 0 ? 0 : plen[s] - 1; }

static void run_decode(const td_model *m, int nseq, int *const *tokens, const int *lens,
                       const int *plen, int chunk, row_sink *out)
{
    td_error err;
    int V = m->cfg.vocab_size;
    td_session *s = td_session_create(m, nseq, out->maxT, chunk, &err);
    assert_non_null(s);
    float *rows = malloc((size_t)nseq * V * sizeof(float));
    int *slots = malloc(nseq * sizeof(int)), *toks = malloc(nseq * sizeof(int));
    for (int q = 0; q < nseq; q++) {
        /* even slots: rows through the callback; odd slots: only the last row */
        if (q % 2 == 0) {
            assert_int_equal(td_session_prefill(s, q, tokens[q], plen[q], rows, sink_row, out,
                                                &err), 0);
            assert_memory_equal(rows, sink_at(out, q, plen[q] - 1), (size_t)V * sizeof(float));
        } else {
            assert_int_equal(td_session_prefill(s, q, tokens[q], plen[q], rows, NULL, NULL,
                                                &err), 0);
            memcpy(sink_at(out, q, plen[q] - 1), rows, (size_t)V * sizeof(float));
        }
        assert_int_equal(td_session_len(s, q), plen[q]);
    }
    for (;;) {
        int n = 0;
        for (int q = 0; q < nseq; q++) {
            int p = td_session_len(s, q);
            if (p < lens[q]) { slots[n] = q; toks[n] = tokens[q][p]; n++; }
        }
        if (!n) break;
        assert_int_equal(td_session_decode(s, n, slots, toks, rows, &err), 0);
        for (int i = 0; i < n; i++)
            memcpy(sink_at(out, slots[i], td_session_len(s, slots[i]) - 1),
                   rows + (size_t)i * V, (size_t)V * sizeof(float));
    }
    free(rows); free(slots); free(toks);
    td_session_free(s);
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double d = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        if (!(e <= d)) d = e;   /* NaN propagates as a failure */
    }
    return d;
}

static void golden_check(const char *arch)
{
    char dir[512], path[600];
    const char *root = getenv("TIDAL_FIXTURES");
    snprintf(dir, sizeof dir, "%s/%s", root ? root : "tests/fixtures", arch);
    snprintf(path, sizeof path, "%s/golden.json", dir);
    td_error err;
    td_model *m = td_model_load(dir, &err);
    if (!m) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(m);
    /* F32 fixtures are used in place (nothing owned); the BF16 one (mistral) is converted */
    bool bf16 = strcmp(arch, "mistral") == 0;
    assert_true(bf16 ? m->owned_floats > 0 : m->owned == NULL);
    json_t *g = td_json_load_file(path, &err);
    if (!g) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(g);
    json_t *jseq = json_object_get(g, "sequences"), *jlp = json_object_get(g, "logprobs");
    json_t *jlast = json_object_get(g, "last_row");
    int nseq = (int)json_array_size(jseq), V = m->cfg.vocab_size, maxT = 0;
    assert_true(nseq >= 2);
    int **tokens = calloc(nseq, sizeof *tokens), *lens = calloc(nseq, sizeof(int));
    float **logp = calloc(nseq, sizeof *logp);
    for (int s = 0; s < nseq; s++) {
        json_t *a = json_array_get(jseq, s);
        lens[s] = (int)json_array_size(a);
        if (lens[s] > maxT) maxT = lens[s];
        tokens[s] = malloc(lens[s] * sizeof(int));
        logp[s] = malloc(lens[s] * sizeof(float));
        for (int t = 0; t < lens[s]; t++)
            tokens[s][t] = (int)json_integer_value(json_array_get(a, t));
        assert_int_equal((int)json_array_size(json_array_get(jlp, s)), lens[s] - 1);
        assert_int_equal((int)json_array_size(json_array_get(jlast, s)), V);
    }

    /* teacher forcing; max_tokens = maxT + 8 forces more than one micro-batch */
    row_sink tf = {V, maxT, calloc((size_t)nseq * maxT * V, sizeof(float)), 0};
    td_forward *f = td_forward_create(m, maxT + 8, maxT, 5, &err);
    assert_non_null(f);
    assert_int_equal(td_forward_logprobs(f, nseq, (const int *const *)tokens, lens, logp,
                                         sink_row, &tf, &err), 0);
    double d_tf = 0, d_last = 0, d_dec = 0, d_paths = 0, d_paths_tok = 0;
    for (int s = 0; s < nseq; s++) {
        for (int t = 0; t + 1 < lens[s]; t++) {
            double ref = json_real_value(json_array_get(json_array_get(jlp, s), t));
            double e = fabs(logp[s][t] - ref);
            if (!(e <= d_tf)) d_tf = e;
            /* the row callback saw the same value */
            assert_true(sink_at(&tf, s, t)[tokens[s][t + 1]] == logp[s][t]);
        }
        const float *last = sink_at(&tf, s, lens[s] - 1);
        for (int v = 0; v < V; v++) {
            double e = fabs(last[v] - json_real_value(json_array_get(json_array_get(jlast, s), v)));
            if (!(e <= d_last)) d_last = e;
        }
    }
    int total = 0;
    for (int s = 0; s < nseq; s++) total += lens[s];
    assert_int_equal(tf.calls, total);   /* one row per position, the last ones included */

    /* prefill (chunks of 4) + batched decode */
    row_sink dec = {V, maxT, calloc((size_t)nseq * maxT * V, sizeof(float)), 0};
    int *plen = calloc(nseq, sizeof(int));
    for (int s = 0; s < nseq; s++) plen[s] = 1 + (5 * s) % lens[s];
    run_decode(m, nseq, tokens, lens, plen, 4, &dec);
    for (int s = 0; s < nseq; s++) {
        int t0 = first_row(s, plen);
        for (int t = t0; t + 1 < lens[s]; t++) {
            double ref = json_real_value(json_array_get(json_array_get(jlp, s), t));
            double e = fabs(sink_at(&dec, s, t)[tokens[s][t + 1]] - ref);
            if (!(e <= d_dec)) d_dec = e;
            e = fabs(sink_at(&dec, s, t)[tokens[s][t + 1]] - logp[s][t]);
            if (!(e <= d_paths_tok)) d_paths_tok = e;
        }
        double e = max_abs_diff(sink_at(&tf, s, t0), sink_at(&dec, s, t0),
                                (size_t)(lens[s] - t0) * V);
        if (!(e <= d_paths)) d_paths = e;
    }
    printf("golden %-8s max|dlogp| teacher-forced %.2e (last rows %.2e), decode %.2e; "
           "teacher-forced vs decode %.2e (all rows %.2e)\n", arch, d_tf, d_last, d_dec,
           d_paths_tok, d_paths);
    assert_true(d_tf <= GOLDEN_TOL);
    assert_true(d_last <= GOLDEN_TOL);
    assert_true(d_dec <= GOLDEN_TOL);
    assert_true(d_paths_tok <= PATHS_TOL);
    assert_true(d_paths <= PATHS_ROW_TOL);

    for (int s = 0; s < nseq; s++) { free(tokens[s]); free(logp[s]); }
    free(tokens); free(lens); free(logp); free(plen); free(tf.rows); free(dec.rows);
    td_forward_free(f);
    json_decref(g);
    td_model_free(m);
}

static void test_golden_llama(void **st) { (void)st; golden_check("llama"); }
static void test_golden_mistral(void **st) { (void)st; golden_check("mistral"); }
static void test_golden_qwen2(void **st) { (void)st; golden_check("qwen2"); }
static void test_golden_qwen3(void **st) { (void)st; golden_check("qwen3"); }


static void test_paths_agree_random(void **st)
{
    (void)st;
    td_model *m = random_model(7);
    int V = m->cfg.vocab_size, nseq = 5, lens[] = {1, 40, 17, 64, 9}, maxT = 64;
    int *tokens[5];
    td_rng r;
    td_rng_seed(&r, 11);
    for (int s = 0; s < nseq; s++) {
        tokens[s] = malloc(lens[s] * sizeof(int));
        for (int t = 0; t < lens[s]; t++) tokens[s][t] = (int)td_rng_below(&r, V);
    }
    td_error err;
    row_sink tf = {V, maxT, calloc((size_t)nseq * maxT * V, sizeof(float)), 0};
    td_forward *f = td_forward_create(m, 80, maxT, 0, &err);  /* 80: three micro-batches */
    assert_non_null(f);
    assert_int_equal(td_forward_logprobs(f, nseq, (const int *const *)tokens, lens, NULL,
                                         sink_row, &tf, &err), 0);
    row_sink dec = {V, maxT, calloc((size_t)nseq * maxT * V, sizeof(float)), 0};
    int plen[] = {1, 13, 1, 30, 9};
    run_decode(m, nseq, tokens, lens, plen, 7, &dec);
    double d = 0, d_tok = 0, lo = 0;
    for (int s = 0; s < nseq; s++) {
        for (int t = first_row(s, plen); t + 1 < lens[s]; t++) {
            int y = tokens[s][t + 1];
            d_tok = fmax(d_tok, fabs(sink_at(&tf, s, t)[y] - sink_at(&dec, s, t)[y]));
        }
        int t0 = first_row(s, plen);
        double e = max_abs_diff(sink_at(&tf, s, t0), sink_at(&dec, s, t0),
                                (size_t)(lens[s] - t0) * V);
        if (e > d) d = e;
        for (int i = 0; i < lens[s] * V; i++) lo = fmin(lo, sink_at(&tf, s, 0)[i]);
    }
    printf("random model: teacher-forced vs decode max|dlogp| %.2e on scored tokens, %.2e "
           "over all rows (log-probs down to %.1f)\n", d_tok, d, lo);
    assert_true(d_tok <= PATHS_TOL);
    assert_true(d <= PATHS_ROW_TOL);
    assert_true(lo < -5.0);   /* the distributions are not flat: the check has teeth */
    /* rows are normalised: logsumexp == 0 */
    for (int t = 0; t < lens[3]; t++) {
        double z = 0;
        for (int v = 0; v < V; v++) z += exp(sink_at(&tf, 3, t)[v]);
        assert_true(fabs(z - 1.0) < 1e-5);
    }
    for (int s = 0; s < nseq; s++) free(tokens[s]);
    free(tf.rows); free(dec.rows);
    td_forward_free(f);
    td_model_free(m);
}

/* td_forward_set_rows_parallel: row_fn called from OpenMP threads gets every row exactly once, with
 * the same floats as the serial calls (and logp the same), over three micro-batches */
typedef struct {
    row_sink rows;
    int *hits;   /* (nseq, maxT): calls per row, each slot written by its own row only */
} counted_sink;

static void counted_row(void *user, int seq, int pos, const float *row)
{
    counted_sink *c = user;
    memcpy(sink_at(&c->rows, seq, pos), row, (size_t)c->rows.V * sizeof(float));
    c->hits[seq * c->rows.maxT + pos]++;
}

static void test_rows_parallel(void **st)
{
    (void)st;
    td_model *m = random_model(7);
    int V = m->cfg.vocab_size, nseq = 5, lens[] = {1, 40, 17, 64, 9}, maxT = 64;
    int *tokens[5];
    float *logp[2][5];
    td_rng r;
    td_rng_seed(&r, 12);
    for (int s = 0; s < nseq; s++) {
        tokens[s] = malloc(lens[s] * sizeof(int));
        for (int t = 0; t < lens[s]; t++) tokens[s][t] = (int)td_rng_below(&r, V);
        for (int k = 0; k < 2; k++) logp[k][s] = calloc((size_t)lens[s], sizeof(float));
    }
    td_error err;
    counted_sink c[2];
    td_forward *f = td_forward_create(m, 80, maxT, 0, &err);
    assert_non_null(f);
    for (int k = 0; k < 2; k++) {
        c[k] = (counted_sink){{V, maxT, calloc((size_t)nseq * maxT * V, sizeof(float)), 0},
                              calloc((size_t)nseq * maxT, sizeof(int))};
        td_forward_set_rows_parallel(f, k);
        assert_int_equal(td_forward_logprobs(f, nseq, (const int *const *)tokens, lens, logp[k], counted_row,
                                             &c[k], &err), 0);
    }
    for (int s = 0; s < nseq; s++) {
        for (int t = 0; t < maxT; t++) assert_int_equal(c[1].hits[s * maxT + t], t < lens[s]);
        assert_memory_equal(sink_at(&c[0].rows, s, 0), sink_at(&c[1].rows, s, 0), (size_t)lens[s] * V * sizeof(float));
        assert_memory_equal(logp[0][s], logp[1][s], (size_t)lens[s] * sizeof(float));
    }
    for (int s = 0; s < nseq; s++) { free(tokens[s]); free(logp[0][s]); free(logp[1][s]); }
    for (int k = 0; k < 2; k++) { free(c[k].rows.rows); free(c[k].hits); }
    td_forward_free(f);
    td_model_free(m);
}

static void test_bad_input(void **st)
{
    (void)st;
    td_error err;
    assert_null(td_model_load("tests/fixtures/no-such-model", &err));
    assert_non_null(strstr(err.msg, "no-such-model"));
    td_model *m = random_model(3);
    int V = m->cfg.vocab_size;
    td_forward *f = td_forward_create(m, 16, 8, 0, &err);
    int bad[] = {1, V, 2}, len = 3;
    const int *seqs[] = {bad};
    assert_int_not_equal(td_forward_logprobs(f, 1, seqs, &len, NULL, NULL, NULL, &err), 0);
    assert_non_null(strstr(err.msg, "outside the vocabulary"));
    int longlen = 9;
    assert_int_not_equal(td_forward_logprobs(f, 1, seqs, &longlen, NULL, NULL, NULL, &err), 0);
    td_session *s = td_session_create(m, 2, 4, 0, &err);
    float *row = malloc((size_t)2 * V * sizeof(float));
    int ok[] = {1, 2, 3, 4, 5};
    assert_int_not_equal(td_session_prefill(s, 0, ok, 5, row, NULL, NULL, &err), 0);
    assert_int_equal(td_session_prefill(s, 0, ok, 4, row, NULL, NULL, &err), 0);
    int slot = 0, tok = 1;
    assert_int_not_equal(td_session_decode(s, 1, &slot, &tok, row, &err), 0);
    assert_non_null(strstr(err.msg, "full"));
    int two[] = {1, 1}, toks[] = {1, 1};
    assert_int_not_equal(td_session_decode(s, 2, two, toks, row, &err), 0);
    td_session_reset(s, 0);
    assert_int_equal(td_session_decode(s, 1, &slot, &tok, row, &err), 0);
    free(row);
    td_session_free(s);
    td_forward_free(f);
    td_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_golden_llama),
        cmocka_unit_test(test_golden_mistral),
        cmocka_unit_test(test_golden_qwen2),
        cmocka_unit_test(test_golden_qwen3),
        cmocka_unit_test(test_paths_agree_random),
        cmocka_unit_test(test_rows_parallel),
        cmocka_unit_test(test_bad_input),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
