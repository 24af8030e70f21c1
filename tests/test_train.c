/* tidal — tests of the training step (include/tidal/train.h) against references of its own:
 *
 * 1. Gradients against fp64 finite differences. This file carries an independent float64
 *    forward of the Llama family (written from HF's modeling code: RMSNorm, q/k/v with Qwen2
 *    biases, Qwen3 per-head q/k-norm, rotate-half RoPE, causal GQA softmax attention, SwiGLU,
 *    tied or untied lm_head) and the mean token cross-entropy over masked targets. For a few
 *    elements of every tensor class, central differences of that float64 loss with h = 1e-5
 *    (truncation ~h^2 * L''' ~ 1e-10, cancellation ~1e-16 * L / h ~ 1e-11) are the reference
 *    for tidal's fp32 analytic gradient. Tolerance |g - fd| <= 2e-5 * max|g of the tensor| +
 *    1e-3 |fd|: fp32 forward and backward over a few hundred terms give relative errors
 *    ~1e-6 of the tensor's gradient scale; a wrong term (a missing bias, a transposed
 *    rotation, a GQA group summed wrongly) is O(1). The float64 loss must also equal tidal's
 *    fp32 loss to 1e-5 relative, which checks the reference forward itself.
 *    Models: Qwen3 layout with qkv biases and q/k-norm, untied; Llama, tied lm_head.
 * 2. The training path's log-probs (the values the loss sees) are bit-identical to
 *    td_forward_logprobs (today's forward) in fp32 and bf16-train, and within 1e-4 of the fp32
 *    inference path (td_session prefill), the project's fp32 tolerance.
 * 3. Gradients are bit-identical with 1 and 2 threads (every reduction has a fixed order).
 * 4. A NaN weight stops the step with a message naming the sequence (non-finite loss).
 * 5. LoRA r=1 on every projection: after a step the saved PEFT adapter reads back through
 *    td_lora_load (the loader tidal-diff uses) with A and B bit-identical to the trained ones,
 *    and only A/B moved (the base masters unchanged).
 * 6. A model whose backend has no backward ops (the CPU table without matmul_backward) is refused
 *    by td_trainer_create with a message naming the backend and what to do; with the CPU table
 *    itself set as the model's backend (its buffers host memory, be->zero a memset) one step's
 *    gradients are bit-identical to the model without a backend.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include "tidal/rng.h"
#include "tidal/train.h"
#include "../src/model/model_internal.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { NSEQ = 3 };
static const int LENS[NSEQ] = {9, 5, 13};

static td_model *make_model(td_arch arch, int tied, int bias, int qk_norm, uint64_t seed)
{
    td_config c = {0};
    c.arch = arch;
    c.vocab_size = 61; c.hidden_size = 24; c.intermediate_size = 40; c.num_layers = 2;
    c.num_heads = 4; c.num_kv_heads = 2; c.head_dim = 8; c.max_position = 128;
    c.rms_norm_eps = 1e-6; c.rope_theta = 10000.0;
    c.tie_word_embeddings = tied; c.qkv_bias = bias; c.qk_norm = qk_norm;
    td_error err;
    td_model *m = td_model_alloc(&c, &err);
    assert_non_null(m);
    size_t n;
    td_param_spec *p = param_table(&c, &n);
    td_rng r;
    td_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++)
        for (size_t k = 0; k < p[i].numel; k++)
            m->owned[p[i].offset + k] = p[i].kind == TD_PARAM_NORM
                ? (float)(1.0 + 0.1 * td_rng_normal(&r))
                : (float)((p[i].kind == TD_PARAM_EMBED ? 0.5 : 0.2) * td_rng_normal(&r));
    free(p);
    return m;
}

/* the batch every test uses: NSEQ sequences of LENS tokens and a loss mask with holes */
typedef struct {
    int tok[NSEQ][16];
    float w[NSEQ][16];
    const int *tokens[NSEQ];
    const float *weights[NSEQ];
} test_batch;

static void make_batch(test_batch *b, int V)
{
    for (int s = 0; s < NSEQ; s++) {
        for (int t = 0; t < 16; t++) {
            b->tok[s][t] = (11 * s + 7 * t + 3) % V;
            b->w[s][t] = (s + t) % 4 != 0;
        }
        b->tokens[s] = b->tok[s];
        b->weights[s] = b->w[s];
    }
}

/* ---------------------------------------------------------------- the float64 reference */

static void rms64(double *y, const double *x, const float *w, int C, double eps)
{
    double ss = 0;
    for (int c = 0; c < C; c++) ss += x[c] * x[c];
    double rs = 1.0 / sqrt(ss / C + eps);
    for (int c = 0; c < C; c++) y[c] = x[c] * rs * w[c];
}

static void lin64(double *y, const double *x, const float *W, const float *b, int IN, int OUT)
{
    for (int o = 0; o < OUT; o++) {
        double s = b ? b[o] : 0.0;
        for (int i = 0; i < IN; i++) s += (double)W[(size_t)o * IN + i] * x[i];
        y[o] = s;
    }
}

static void rope64(double *x, int pos, const float *inv_freq, int nh, int HD)
{
    for (int h = 0; h < nh; h++)
        for (int k = 0; k < HD / 2; k++) {
            double a = pos * (double)inv_freq[k], c = cos(a), s = sin(a);
            double *xh = x + h * HD, x0 = xh[k], x1 = xh[k + HD / 2];
            xh[k] = x0 * c - x1 * s;
            xh[k + HD / 2] = x1 * c + x0 * s;
        }
}

/* sum over targets of -w log p / Z, Z = sum w, for the model's current weights */
static double loss64(const td_model *m, const int *const *tokens, const float *const *weights)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, F = c->intermediate_size, NH = c->num_heads, NKV = c->num_kv_heads;
    int HD = c->head_dim, QD = NH * HD, KVD = NKV * HD, V = c->vocab_size;
    double eps = c->rms_norm_eps, total = 0, Z = 0;
    const td_model_weights *W = &m->w;
    for (int s = 0; s < NSEQ; s++) {
        int T = LENS[s];
        double *x = calloc((size_t)T * C, 8), *h = calloc(C, 8), *q = calloc((size_t)T * QD, 8);
        double *k = calloc((size_t)T * KVD, 8), *v = calloc((size_t)T * KVD, 8);
        double *o = calloc(QD, 8), *p = calloc(C, 8), *g = calloc(F, 8), *u = calloc(F, 8);
        double *lg = calloc(V, 8), *hn = calloc(C, 8);
        for (int t = 0; t < T; t++)
            for (int i = 0; i < C; i++) x[t * C + i] = W->embed[(size_t)tokens[s][t] * C + i];
        for (int l = 0; l < c->num_layers; l++) {
            const td_layer_weights *w = &W->layers[l];
            for (int t = 0; t < T; t++) {
                rms64(h, x + t * C, w->attn_norm, C, eps);
                lin64(q + t * QD, h, w->wq, w->bq, C, QD);
                lin64(k + t * KVD, h, w->wk, w->bk, C, KVD);
                lin64(v + t * KVD, h, w->wv, w->bv, C, KVD);
                if (w->q_norm) {
                    for (int hh = 0; hh < NH; hh++) rms64(q + t * QD + hh * HD, q + t * QD + hh * HD, w->q_norm, HD, eps);
                    for (int hh = 0; hh < NKV; hh++) rms64(k + t * KVD + hh * HD, k + t * KVD + hh * HD, w->k_norm, HD, eps);
                }
                rope64(q + t * QD, t, m->inv_freq, NH, HD);
                rope64(k + t * KVD, t, m->inv_freq, NKV, HD);
            }
            double *xm = calloc((size_t)T * C, 8);
            for (int t = 0; t < T; t++) {
                for (int hh = 0; hh < NH; hh++) {
                    int kh = hh / (NH / NKV);
                    double sc[64], mx = -INFINITY, sum = 0;
                    for (int j = 0; j <= t; j++) {
                        double d = 0;
                        for (int e = 0; e < HD; e++) d += q[t * QD + hh * HD + e] * k[j * KVD + kh * HD + e];
                        sc[j] = d / sqrt((double)HD);
                        mx = sc[j] > mx ? sc[j] : mx;
                    }
                    for (int j = 0; j <= t; j++) sum += (sc[j] = exp(sc[j] - mx));
                    for (int e = 0; e < HD; e++) {
                        double a = 0;
                        for (int j = 0; j <= t; j++) a += sc[j] / sum * v[j * KVD + kh * HD + e];
                        o[hh * HD + e] = a;
                    }
                }
                lin64(p, o, w->wo, NULL, QD, C);
                for (int i = 0; i < C; i++) xm[t * C + i] = x[t * C + i] + p[i];
            }
            for (int t = 0; t < T; t++) {
                rms64(h, xm + t * C, w->mlp_norm, C, eps);
                lin64(g, h, w->w_gate, NULL, C, F);
                lin64(u, h, w->w_up, NULL, C, F);
                for (int f = 0; f < F; f++) g[f] = g[f] / (1 + exp(-g[f])) * u[f];
                lin64(p, g, w->w_down, NULL, F, C);
                for (int i = 0; i < C; i++) x[t * C + i] = xm[t * C + i] + p[i];
            }
            free(xm);
        }
        for (int t = 0; t + 1 < T; t++) {
            double wt = weights[s][t];
            Z += wt;
            if (wt == 0) continue;
            rms64(hn, x + t * C, W->final_norm, C, eps);
            lin64(lg, hn, W->lm_head, NULL, C, V);
            double mx = -INFINITY, sum = 0;
            for (int j = 0; j < V; j++) mx = lg[j] > mx ? lg[j] : mx;
            for (int j = 0; j < V; j++) sum += exp(lg[j] - mx);
            total -= wt * (lg[tokens[s][t + 1]] - mx - log(sum));
        }
        free(x); free(h); free(q); free(k); free(v); free(o); free(p); free(g); free(u); free(lg); free(hn);
    }
    return total / Z;
}

/* ---------------------------------------------------------------- tests */

static td_trainer *trainer_for(const td_model *m, const char *recipe)
{
    td_train_opts o;
    td_train_opts_defaults(&o);
    o.max_tokens = 40;
    o.max_seq_len = 16;
    td_error err;
    td_trainer *tr = td_trainer_create(m, td_recipe_find_preset(recipe), &o, NULL, &err);
    if (!tr) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(tr);
    return tr;
}

/* the gradients of one accumulation of batch b by a fresh trainer of m under recipe: *n floats,
 * malloc'd */
static float *batch_grads(const td_model *m, const char *recipe, const test_batch *b, size_t *n)
{
    td_trainer *tr = trainer_for(m, recipe);
    double loss;
    td_error err;
    assert_int_equal(td_trainer_accumulate_sft(tr, NSEQ, b->tokens, LENS, b->weights, 0, &loss, &err), 0);
    *n = td_trainer_num_params(tr);
    float *g = malloc(*n * sizeof(float));
    memcpy(g, td_trainer_grads(tr), *n * sizeof(float));
    td_trainer_free(tr);
    return g;
}

static void fd_check(td_model *m, const char *what)
{
    test_batch b;
    make_batch(&b, m->cfg.vocab_size);
    const int *const *tokens = b.tokens;
    const float *const *weights = b.weights;
    td_trainer *tr = trainer_for(m, "fp32");
    td_error err;
    double loss;
    assert_int_equal(td_trainer_accumulate_sft(tr, NSEQ, tokens, LENS, weights, 0, &loss, &err), 0);
    const float *g = td_trainer_grads(tr);
    double l64 = loss64(m, tokens, weights);
    printf("%s: loss fp32 %.9f float64 %.9f\n", what, loss, l64);
    assert_true(fabs(loss - l64) <= 1e-5 * fabs(l64));
    size_t n;
    td_param_spec *p = param_table(&m->cfg, &n);
    double worst = 0;
    for (size_t i = 0; i < n; i++) {
        double gmax = 0;
        for (size_t k = 0; k < p[i].numel; k++) gmax = fmax(gmax, fabs(g[p[i].offset + k]));
        for (int pick = 0; pick < 3; pick++) {
            size_t k = (p[i].numel * (2 * pick + 1)) / 7;
            float *x = m->owned + p[i].offset + k, x0 = *x;
            const double h = 1e-5;
            /* the reference perturbs a float64 copy: evaluate with x0 +- h exactly representable
             * enough (h relative to |x| ~ 1 loses ~1e-12 of it in fp32, see below) */
            *x = (float)(x0 + h);
            double hp = (double)*x - x0;
            double lp = loss64(m, tokens, weights);
            *x = (float)(x0 - h);
            double hm = x0 - (double)*x;
            double lm = loss64(m, tokens, weights);
            *x = x0;
            double fd = (lp - lm) / (hp + hm);   /* the fp32 steps actually taken */
            double e = fabs(g[p[i].offset + k] - fd);
            double tol = 2e-5 * gmax + 1e-3 * fabs(fd);
            if (e > tol) printf("  %s[%zu]: tidal %.9g fd %.9g (tol %.3g)\n", p[i].name, k, g[p[i].offset + k], fd, tol);
            assert_true(e <= tol);
            worst = fmax(worst, e / (gmax > 0 ? gmax : 1));
        }
    }
    printf("%s: %zu tensors, 3 elements each: max |g - fd| / max|g| = %.2e\n", what, n, worst);
    free(p);
    td_trainer_free(tr);
}

static void test_fd_qwen3_bias_untied(void **st)
{
    (void)st;
    td_model *m = make_model(TD_ARCH_QWEN3, 0, 1, 1, 7);
    fd_check(m, "qwen3+bias untied");
    td_model_free(m);
}

static void test_fd_llama_tied(void **st)
{
    (void)st;
    td_model *m = make_model(TD_ARCH_LLAMA, 1, 0, 0, 8);
    fd_check(m, "llama tied");
    td_model_free(m);
}

typedef struct {
    float lp[NSEQ][16];
} lp_sink;

static double capture(void *user, int seq, int n, const float *logp, float *dlogp)
{
    lp_sink *k = user;
    for (int t = 0; t < n; t++) { k->lp[seq][t] = logp[t]; dlogp[t] = 0.0f; }
    return 0.0;
}

typedef struct {
    const int *tokens;
    float *out;
} row_sink;

static void session_row(void *user, int seq, int pos, const float *row)
{
    (void)seq;
    row_sink *r = user;
    r->out[pos] = row[r->tokens[pos + 1 < LENS[2] ? pos + 1 : pos]];
}

static void test_logprobs_match_forward(void **st)
{
    (void)st;
    td_model *m = make_model(TD_ARCH_QWEN2, 0, 1, 0, 9);
    test_batch b;
    make_batch(&b, m->cfg.vocab_size);
    const int *const *tokens = b.tokens;
    td_error err;
    const char *recipes[] = {"fp32", "bf16-train"};
    for (int ri = 0; ri < 2; ri++) {
        td_trainer *tr = trainer_for(m, recipes[ri]);
        lp_sink k;
        double loss;
        assert_int_equal(td_trainer_accumulate(tr, NSEQ, tokens, LENS, capture, &k, &loss, &err), 0);
        td_forward *f = td_forward_create(m, 40, 16, 0, &err);
        assert_non_null(f);
        assert_int_equal(td_forward_set_recipe(f, td_recipe_find_preset(recipes[ri]), &err), 0);
        float ref[NSEQ][16];
        float *out[NSEQ] = {ref[0], ref[1], ref[2]};
        assert_int_equal(td_forward_logprobs(f, NSEQ, tokens, LENS, out, NULL, NULL, &err), 0);
        for (int s = 0; s < NSEQ; s++)
            assert_memory_equal(k.lp[s], ref[s], (size_t)(LENS[s] - 1) * sizeof(float));
        if (ri == 0) {   /* the inference path (KV cache, prefill) within 1e-4 */
            td_session *se = td_session_create(m, 1, 16, 4, &err);
            assert_non_null(se);
            float dec[16];
            row_sink rs = {tokens[2], dec};
            assert_int_equal(td_session_prefill(se, 0, tokens[2], LENS[2], NULL, session_row, &rs, &err), 0);
            double d = 0;
            for (int t = 0; t + 1 < LENS[2]; t++) d = fmax(d, fabs(dec[t] - k.lp[2][t]));
            printf("fp32 training path vs inference path: max |dlogp| %.2e\n", d);
            assert_true(d <= 1e-4);
            td_session_free(se);
        }
        td_forward_free(f);
        td_trainer_free(tr);
    }
    td_model_free(m);
}

static void test_threads_bit_identical(void **st)
{
    (void)st;
    td_model *m = make_model(TD_ARCH_QWEN3, 1, 1, 1, 10);
    test_batch b;
    make_batch(&b, m->cfg.vocab_size);
    const char *recipes[] = {"fp32", "bf16-train"};
    for (int ri = 0; ri < 2; ri++) {
        float *g[2];
        size_t n = 0;
        for (int nt = 1; nt <= 2; nt++) {
            omp_set_num_threads(nt);
            g[nt - 1] = batch_grads(m, recipes[ri], &b, &n);
        }
        assert_memory_equal(g[0], g[1], n * sizeof(float));
        free(g[0]); free(g[1]);
    }
    omp_set_num_threads(2);
    td_model_free(m);
}

static void test_nan_weight_stops(void **st)
{
    (void)st;
    td_model *m = make_model(TD_ARCH_LLAMA, 0, 0, 0, 11);
    m->owned[td_config_param_elems(&m->cfg) / 2] = NAN;
    test_batch b;
    make_batch(&b, m->cfg.vocab_size);
    const int *const *tokens = b.tokens;
    const float *const *weights = b.weights;
    td_trainer *tr = trainer_for(m, "fp32");
    td_error err;
    double loss;
    assert_int_equal(td_trainer_accumulate_sft(tr, NSEQ, tokens, LENS, weights, 0, &loss, &err), -1);
    assert_non_null(strstr(err.msg, "loss of sequence 0"));
    td_trainer_free(tr);
    td_model_free(m);
}

static void test_backend_without_backward(void **st)
{
    (void)st;
    td_model *m = make_model(TD_ARCH_QWEN2, 0, 1, 0, 12);
    td_backend fwd_only = td_backend_cpu;
    fwd_only.name = "forward-only";
    fwd_only.matmul_backward = NULL;
    m->backend = &fwd_only;
    td_train_opts o;
    td_train_opts_defaults(&o);
    o.max_tokens = 40;
    o.max_seq_len = 16;
    td_error err;
    td_trainer *tr = td_trainer_create(m, NULL, &o, NULL, &err);
    assert_null(tr);
    assert_non_null(strstr(err.msg, "the forward-only backend lacks backward ops (matmul_backward)"));
    assert_non_null(strstr(err.msg, "--device cpu"));

    /* the CPU table as an explicit backend: the same gradients as no backend */
    test_batch b;
    make_batch(&b, m->cfg.vocab_size);
    float *g[2];
    size_t n = 0;
    for (int k = 0; k < 2; k++) {
        m->backend = k ? &td_backend_cpu : NULL;
        g[k] = batch_grads(m, "fp32", &b, &n);
    }
    assert_memory_equal(g[0], g[1], n * sizeof(float));
    free(g[0]);
    free(g[1]);
    m->backend = NULL;
    td_model_free(m);
}

static void test_lora_save_roundtrip(void **st)
{
    (void)st;
    td_model *m = make_model(TD_ARCH_QWEN2, 0, 1, 0, 12);
    test_batch b;
    make_batch(&b, m->cfg.vocab_size);
    const int *const *tokens = b.tokens;
    const float *const *weights = b.weights;
    td_train_opts o;
    td_train_opts_defaults(&o);
    o.max_tokens = 40; o.max_seq_len = 16; o.lora_r = 1; o.lora_alpha = 4; o.lr = 1e-2;
    o.lora_modules = (1u << TD_LORA_NMOD) - 1;
    td_error err;
    td_trainer *tr = td_trainer_create(m, NULL, &o, NULL, &err);
    assert_non_null(tr);
    for (int k = 0; k < 2; k++) {
        double loss;
        assert_int_equal(td_trainer_accumulate_sft(tr, NSEQ, tokens, LENS, weights, 0, &loss, &err), 0);
        assert_int_equal(td_trainer_step(tr, NULL, &err), 0);
    }
    char dir[4096];
    const char *tmp = getenv("TMPDIR");
    snprintf(dir, sizeof dir, "%s/tidal-lora-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    assert_non_null(mkdtemp(dir));
    assert_int_equal(td_trainer_save(tr, dir, TD_DT_F32, "test_train", &err), 0);
    td_lora *back = td_lora_load(dir, &m->cfg, &err);
    if (!back) fprintf(stderr, "%s\n", err.msg);
    assert_non_null(back);
    const td_lora *lo = td_trainer_lora(tr);
    assert_int_equal(back->rank, 1);
    assert_int_equal(back->n_adapted, 2 * TD_LORA_NMOD);
    assert_true(back->scale == 4.0f);
    for (int i = 0; i < 2 * TD_LORA_NMOD; i++) {
        const td_lora_pair *a = &lo->pairs[i], *rb = &back->pairs[i];
        assert_memory_equal(a->a, rb->a, (size_t)a->in * sizeof(float));
        assert_memory_equal(a->b, rb->b, (size_t)a->out * sizeof(float));
        float bmax = 0;
        for (int k = 0; k < a->out; k++) bmax = fmaxf(bmax, fabsf(a->b[k]));
        assert_true(bmax > 0);   /* B left zero: trained */
    }
    assert_memory_equal(td_trainer_model(tr)->owned, m->owned, m->owned_floats * sizeof(float));
    td_lora_free(back);
    char cmd[4200];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    td_trainer_free(tr);
    td_model_free(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fd_qwen3_bias_untied),
        cmocka_unit_test(test_fd_llama_tied),
        cmocka_unit_test(test_logprobs_match_forward),
        cmocka_unit_test(test_threads_bit_identical),
        cmocka_unit_test(test_nan_weight_stops),
        cmocka_unit_test(test_lora_save_roundtrip),
        cmocka_unit_test(test_backend_without_backward),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
