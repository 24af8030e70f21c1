/* tidal — tests of the model's memory layout (issue 11: the house for training and the GPU).
 *
 * 1. Parameter table (td_config_params): offsets run end to end in table order, their sum is
 *    td_config_param_elems, and td_model_alloc carves each tensor at its table offset of the
 *    one owned allocation (llm.c's one parameter block; gradients and moments carve the same way).
 * 2. Saved activations: keeping every layer's activations for a backward changes nothing in
 *    the forward — log-probs bit-identical with and without, in fp32 and in bf16-train — and
 *    what is kept is what it claims to be, checked against recomputation from the other saved
 *    tensors in double precision:
 *      rstd of each RMSNorm (sub-blocks, q/k-norm, final) vs 1/sqrt(mean(x^2) + eps) of its
 *      saved input: relative 1e-6 (fp32: the op sums squares in double, rounds once; the only
 *      difference is the summation order of a double sum and the final float rounding);
 *      the fp32 normalised output equals (x * rstd) * w bit for bit (the op's own formula);
 *      attention log-sum-exp vs log sum_j exp(q.k_j / sqrt(HD)) over the row's causal keys from
 *      the saved q and k: absolute 1e-5 (fp32 dot products of 16 terms and an fp32 softmax sum,
 *      values of a few units: a few ulp), in fp32 (materialised attention) and bf16-train (flash:
 *      m + log l of the online softmax, unrounded p);
 *      the stream leaving layer l is the one entering l+1 (x slices), and the forward-only
 *      structure allocates none of the saved-only buffers.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tidal/checkpoint.h"
#include "tidal/rng.h"
#include "../src/model/model_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Qwen3 with q/k-norm and qkv bias (every optional tensor), random weights, norms near 1. */
static td_model *layout_model(void)
{
    td_config c = {0};
    c.arch = TD_ARCH_QWEN3;
    c.vocab_size = 97; c.hidden_size = 32; c.intermediate_size = 56; c.num_layers = 2;
    c.num_heads = 4; c.num_kv_heads = 2; c.head_dim = 16; c.max_position = 128;
    c.rms_norm_eps = 1e-6; c.rope_theta = 10000.0;
    c.qkv_bias = true; c.qk_norm = true;
    td_error err;
    td_model *m = td_model_alloc(&c, &err);
    assert_non_null(m);
    td_rng r;
    td_rng_seed(&r, 5);
    for (size_t i = 0; i < m->owned_floats; i++) m->owned[i] = 0.3f * (float)td_rng_normal(&r);
    return m;
}

static void test_param_table_carves(void **st)
{
    (void)st;
    td_model *m = layout_model();
    size_t n = td_config_params(&m->cfg, NULL, 0);
    td_param_spec *p = calloc(n, sizeof *p);
    td_config_params(&m->cfg, p, n);
    size_t next = 0;
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(p[i].offset, next);
        assert_int_equal(p[i].numel, (size_t)p[i].shape[0] * (p[i].ndim == 2 ? (size_t)p[i].shape[1] : 1));
        assert_int_equal(p[i].dtype, TD_F32);
        const float **slot = param_slot(&m->w, m->cfg.num_layers, &p[i]);
        assert_non_null(slot);
        assert_ptr_equal(*slot, m->owned + p[i].offset);
        next += p[i].numel;
    }
    assert_int_equal(next, td_config_param_elems(&m->cfg));
    assert_int_equal(next, m->owned_floats);
    /* every tensor of the model has an entry: q_norm of the last layer sits 8 from the end */
    assert_ptr_equal(m->w.layers[1].q_norm, m->owned + p[n - 8].offset);
    assert_int_equal(p[n - 8].role, TD_ROLE_Q_NORM);
    free(p);
    td_model_free(m);
}

enum { NSEQ = 3, MAXT = 24 };

/* log-probs of fixed sequences (one micro-batch; 5 rows take the row-wise attention, the
 * longer ones the blocked one) with or without kept activations */
static void run(td_forward *f, const char *recipe, int keep, float logp[NSEQ][MAXT])
{
    static const int lens[NSEQ] = {24, 5, 17};
    int tok[NSEQ][MAXT];
    const int *tokens[NSEQ];
    float *out[NSEQ];
    for (int s = 0; s < NSEQ; s++) {
        for (int t = 0; t < MAXT; t++) tok[s][t] = (7 * s + 13 * t + 3) % 97;
        tokens[s] = tok[s];
        out[s] = logp[s];
    }
    td_error err;
    assert_int_equal(td_forward_set_recipe(f, td_recipe_find_preset(recipe), &err), 0);
    forward_keep_activations(f, keep);
    memset(logp, 0, sizeof(float) * NSEQ * MAXT);
    assert_int_equal(td_forward_logprobs(f, NSEQ, tokens, lens, out, NULL, NULL, &err), 0);
}

/* rstd rows (rows of width C at x) against 1/sqrt(mean(x^2) + eps) in double */
static void check_rstd(const float *x, const float *rstd, int rows, int C, double eps)
{
    for (int i = 0; i < rows; i++) {
        double ss = 0;
        for (int c = 0; c < C; c++) ss += (double)x[(size_t)i * C + c] * x[(size_t)i * C + c];
        double want = 1.0 / sqrt(ss / C + eps);
        assert_true(fabs(rstd[i] - want) <= 1e-6 * want);
    }
}

static void check_saved(const td_model *m, const td_acts *a, int N, const char *recipe)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, NH = c->num_heads, NKV = c->num_kv_heads, HD = c->head_dim;
    int QD = NH * HD, KVD = NKV * HD, group = NH / NKV;
    static const int lens[NSEQ] = {24, 5, 17};
    double worst_lse = 0;
    for (int l = 0; l < c->num_layers; l++) {
        td_layer_acts la = acts_layer(a, c, l);
        if (l + 1 < c->num_layers) assert_ptr_equal(la.x_out, acts_layer(a, c, l + 1).x_in);
        check_rstd(la.x_in, la.rstd1, N, C, c->rms_norm_eps);
        check_rstd(la.x_mid, la.rstd2, N, C, c->rms_norm_eps);
        check_rstd(la.q_raw, la.q_rstd, N * NH, HD, c->rms_norm_eps);
        check_rstd(la.k_raw, la.k_rstd, N * NKV, HD, c->rms_norm_eps);
        if (!strcmp(recipe, "fp32"))   /* the op's own formula, bit for bit */
            for (int i = 0; i < N; i++)
                for (int j = 0; j < C; j++)
                    assert_true(la.xn1[(size_t)i * C + j] ==
                                (la.x_in[(size_t)i * C + j] * la.rstd1[i]) * m->w.layers[l].attn_norm[j]);
        /* log-sum-exp of each row and head over its causal keys, from the saved q and k */
        for (int s = 0, row0 = 0; s < NSEQ; row0 += lens[s], s++)
            for (int t = 0; t < lens[s]; t++)
                for (int h = 0; h < NH; h++) {
                    const float *q = la.q + (size_t)(row0 + t) * QD + (size_t)h * HD;
                    double mx = -INFINITY, sc[MAXT], sum = 0;
                    for (int j = 0; j <= t; j++) {
                        const float *k = la.k + (size_t)(row0 + j) * KVD + (size_t)(h / group) * HD;
                        double d = 0;
                        for (int e = 0; e < HD; e++) d += (double)q[e] * k[e];
                        sc[j] = d / sqrt((double)HD);
                        if (sc[j] > mx) mx = sc[j];
                    }
                    for (int j = 0; j <= t; j++) sum += exp(sc[j] - mx);
                    double err = fabs(la.lse[(size_t)(row0 + t) * NH + h] - (mx + log(sum)));
                    if (err > worst_lse) worst_lse = err;
                }
    }
    check_rstd(a->x + (size_t)c->num_layers * a->cap * C, a->rstd_f, N, C, c->rms_norm_eps);
    printf("%s: saved rstd within 1e-6 relative, attention lse within %.2g of the float64 recomputation\n",
           recipe, worst_lse);
    assert_true(worst_lse <= 1e-5);
}

static void test_saved_activations(void **st)
{
    (void)st;
    td_model *m = layout_model();
    td_error err;
    td_forward *f = td_forward_create(m, 64, MAXT, 0, &err);
    assert_non_null(f);
    const td_acts *a = forward_acts(f);
    /* the forward-only structure keeps nothing for a backward */
    assert_null(a->rstd1);
    assert_null(a->lse);
    assert_null(a->x_mid);
    assert_null(a->act);
    const char *recipes[] = {"fp32", "bf16-train"};
    for (int r = 0; r < 2; r++) {
        float plain[NSEQ][MAXT], kept[NSEQ][MAXT];
        run(f, recipes[r], 0, plain);
        run(f, recipes[r], 1, kept);
        assert_memory_equal(plain, kept, sizeof plain);
        check_saved(m, forward_acts(f), 24 + 5 + 17, recipes[r]);
    }
    td_forward_free(f);
    td_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_param_table_carves),
        cmocka_unit_test(test_saved_activations),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
