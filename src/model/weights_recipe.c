/* A recipe's view of the model's weights: every parameter rounded once, at set-up, to what
 * the recipe's kernels would read (see recipe.h):
 *   GEMM weights (q/k/v/o, gate/up/down)   the recipe's weight format (fp8: fake-quantised
 *                                           with its weight scaling, e.g. 128x128 blocks)
 *   embedding, norms, biases                the activations dtype (HF casts the whole model)
 *   lm_head                                 fp32 master weights with lm_head_fp32; else the
 *                                           weight format, but the activations dtype when that
 *                                           is fp8 (engines keep the lm_head out of FP8 GEMMs)
 * The fp32 recipe uses the model's own weights (nothing is copied). */
#include "model_internal.h"
#include "tidal/gemm.h"

#include <stdlib.h>
#include <string.h>

bool recipe_is_plain_fp32(const td_recipe *r)
{
    return !r || (r->weights == TD_F32 && r->activations == TD_F32 && r->gemm_inputs == TD_F32 &&
                  r->accumulate == TD_ACC_FP32 && r->split_k == 1 && r->attention == TD_ATTN_FULL &&
                  r->decode_splits == 1 && r->kv_cache == TD_F32 && !r->batch_invariant);
}

/* The recipe the lm_head GEMM runs with. */
td_recipe recipe_for_head(const td_recipe *r)
{
    td_recipe h = *r;
    if (r->lm_head_fp32) {
        h.weights = h.activations = h.gemm_inputs = TD_F32;
    } else {
        if (h.weights == TD_E4M3 || h.weights == TD_E5M2) h.weights = h.activations;
        h.gemm_inputs = h.activations;
    }
    h.accumulate = TD_ACC_FP32;
    return h;
}

static const float *put(float **p, const float *src, size_t n, td_format f)
{
    float *dst = *p;
    *p += n;
    if (f == TD_F32) memcpy(dst, src, n * sizeof(float));
    else td_round_row(f, src, dst, n, TD_SATFINITE);
    return dst;
}

static const float *put_gemm(float **p, const td_recipe *r, const float *src, int N, int K)
{
    float *dst = *p;
    *p += (size_t)N * K;
    td_gemm_prepare_weight(r, src, N, K, dst);
    return dst;
}

static int weights_prepare(const td_model *m, const td_recipe *r, td_model_weights *w, float **owned,
                    td_error *err)
{
    *owned = NULL;
    if (recipe_is_plain_fp32(r)) { *w = m->w; w->layers = NULL; return 0; }
    const td_config *c = &m->cfg;
    size_t C = c->hidden_size, V = c->vocab_size, F = c->intermediate_size, HD = c->head_dim;
    size_t QD = (size_t)c->num_heads * HD, KVD = (size_t)c->num_kv_heads * HD;
    size_t layer = 2 * C + 2 * QD * C + 2 * KVD * C + 3 * F * C + (c->qkv_bias ? QD + 2 * KVD : 0) +
                   (c->qk_norm ? 2 * HD : 0);
    td_recipe head = recipe_for_head(r);
    int head_copy = head.weights != TD_F32;
    size_t total = V * C + (size_t)c->num_layers * layer + C + (head_copy ? V * C : 0);
    float *buf = malloc(total * sizeof(float));
    if (!buf) return td_fail(err, "recipe %s: out of memory for %zu MB of rounded weights", r->name, total * 4 >> 20);
    td_layer_weights *layers = td_xcalloc((size_t)c->num_layers, sizeof *layers);
    td_format act = r->activations;
    float *p = buf;
    w->embed = put(&p, m->w.embed, V * C, act);
    for (int l = 0; l < c->num_layers; l++) {
        const td_layer_weights *s = &m->w.layers[l];
        td_layer_weights *d = &layers[l];
        d->attn_norm = put(&p, s->attn_norm, C, act);
        d->wq = put_gemm(&p, r, s->wq, (int)QD, (int)C);
        d->wk = put_gemm(&p, r, s->wk, (int)KVD, (int)C);
        d->wv = put_gemm(&p, r, s->wv, (int)KVD, (int)C);
        if (s->bq) { d->bq = put(&p, s->bq, QD, act); d->bk = put(&p, s->bk, KVD, act); d->bv = put(&p, s->bv, KVD, act); }
        if (s->q_norm) { d->q_norm = put(&p, s->q_norm, HD, act); d->k_norm = put(&p, s->k_norm, HD, act); }
        d->wo = put_gemm(&p, r, s->wo, (int)C, (int)QD);
        d->mlp_norm = put(&p, s->mlp_norm, C, act);
        d->w_gate = put_gemm(&p, r, s->w_gate, (int)F, (int)C);
        d->w_up = put_gemm(&p, r, s->w_up, (int)F, (int)C);
        d->w_down = put_gemm(&p, r, s->w_down, (int)C, (int)F);
    }
    w->layers = layers;
    w->final_norm = put(&p, m->w.final_norm, C, act);
    if (head_copy) w->lm_head = put_gemm(&p, &head, m->w.lm_head, (int)V, (int)C);
    else w->lm_head = m->w.lm_head;   /* fp32 head: the master weights themselves */
    *owned = buf;
    return 0;
}

static void weights_release(td_model_weights *w, float *owned)
{
    free(w->layers);
    free(owned);
    memset(w, 0, sizeof *w);
}

void recipe_state_free(td_recipe_state *st)
{
    if (st->w.layers || st->owned) weights_release(&st->w, st->owned);
    free(st->qin);
    free(st->gscratch);
    memset(st, 0, sizeof *st);
}

int recipe_state_set(td_recipe_state *st, td_ops *ops, const td_model *m, const td_recipe *r,
                     int cap, td_error *err)
{
    if (td_recipe_check(r, r->name, err)) return -1;
    recipe_state_free(st);
    ops->recipe = NULL;
    ops->head = NULL;
    ops->w = NULL;
    ops->qin = ops->gscratch = NULL;
    st->recipe = *r;
    st->head = recipe_for_head(r);
    if (recipe_is_plain_fp32(r)) return 0;   /* the fp32 reference ops, the model's weights */
    if (weights_prepare(m, r, &st->w, &st->owned, err)) return -1;
    const td_config *c = &m->cfg;
    size_t width = (size_t)c->hidden_size;
    if ((size_t)c->intermediate_size > width) width = (size_t)c->intermediate_size;
    if ((size_t)c->num_heads * c->head_dim > width) width = (size_t)c->num_heads * c->head_dim;
    st->qin = td_xmalloc((size_t)cap * width * sizeof(float));
    if (r->accumulate == TD_ACC_FP8_FAST) {
        ops->gscratch_per_thread = 2 * (size_t)cap * 256;
        st->gscratch = td_xmalloc((size_t)ops->nthreads * ops->gscratch_per_thread * sizeof(float));
    }
    ops->recipe = &st->recipe;
    ops->head = &st->head;
    ops->w = st->w.layers ? &st->w : NULL;
    ops->qin = st->qin;
    ops->gscratch = st->gscratch;
    return 0;
}
