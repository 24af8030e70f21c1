/* A recipe's view of the model's weights: every parameter rounded once, at set-up, to what
 * the recipe's kernels would read (see recipe.h):
 *   GEMM weights (q/k/v/o, gate/up/down)   the recipe's weight format (fp8: fake-quantised
 *                                           with its weight scaling, e.g. 128x128 blocks)
 *   embedding, norms, biases                the activations dtype (HF casts the whole model);
 *                                           embedding and norms fp32 with residual fp32 (autocast)
 *   lm_head                                 fp32 master weights with lm_head_fp32; else the
 *                                           weight format, but the activations dtype when that
 *                                           is fp8 (engines keep the lm_head out of FP8 GEMMs)
 * The fp32 recipe uses the model's own weights (nothing is copied), except the matrices a
 * merged LoRA adapter changes.
 *
 * Merged LoRA: an adapted GEMM weight becomes prepare(W + scale B A), the product and the sum
 * in fp32, then the recipe's rounding, as a rollout engine merges an update into its weights.
 * What survives the rounding is measured against the same rounding without the update:
 *   survival = |prepare(W + dW) - prepare(W)|_F / |dW|_F, changed = #{prepare(W + dW) != prepare(W)},
 *   aligned  = <prepare(W + dW) - prepare(W), dW> / |dW|^2 (the update's own component). 
 * Unmerged adapters are set up in lora_run.c. */
#include "model_internal.h"
#include "tidal/gemm.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Running sums of a merge: sum of squares of the kept and of the intended change. */
typedef struct {
    const td_lora *lora;       /* NULL: no merge                                  */
    float *scratch;            /* 2 * the largest adapted matrix                  */
    double kept2, delta2, dot;
    int64_t elements, changed;
} merge_ctx;

/* dst (N, K) = prepare(W + scale B A) when (layer, module) is adapted, else prepare(W). */
static void prepare_merged(merge_ctx *mc, const td_recipe *r, const float *W, int layer, int module,
                           int N, int K, float *dst)
{
    const td_lora_pair *p = mc->lora ? &mc->lora->pairs[layer * TD_LORA_NMOD + module] : NULL;
    if (!p || !p->a) { td_gemm_prepare_weight(r, W, N, K, dst); return; }
    size_t n = (size_t)N * K;
    float *dw = mc->scratch, *base = mc->scratch + n;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, K, mc->lora->rank, mc->lora->scale,
                p->b, mc->lora->rank, p->a, K, 0.0f, dw, K);
    for (size_t i = 0; i < n; i++) dst[i] = W[i] + dw[i];
    td_gemm_prepare_weight(r, dst, N, K, dst);
    td_gemm_prepare_weight(r, W, N, K, base);
    double kept2 = 0, delta2 = 0, dot = 0;
    int64_t changed = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)dst[i] - base[i];
        kept2 += d * d;
        delta2 += (double)dw[i] * dw[i];
        dot += d * dw[i];
        changed += dst[i] != base[i];
    }
    mc->kept2 += kept2;
    mc->delta2 += delta2;
    mc->dot += dot;
    mc->elements += (int64_t)n;
    mc->changed += changed;
}

/* Embedding and norm weights an autocast trainer keeps in fp32 (residual fp32: they are no
 * operands of autocast's linear, which casts biases with the weights). */
static int param_keeps_fp32(const td_recipe *r, int role)
{
    return r->residual_fp32 && (role == TD_ROLE_EMBED || role == TD_ROLE_ATTN_NORM ||
                                role == TD_ROLE_MLP_NORM || role == TD_ROLE_FINAL_NORM ||
                                role == TD_ROLE_Q_NORM || role == TD_ROLE_K_NORM);
}

static void put(float *dst, const float *src, size_t n, td_format f)
{
    if (f == TD_F32) memcpy(dst, src, n * sizeof(float));
    else td_round_row(f, src, dst, n, TD_SATFINITE);
}

/* fp32 with a merged adapter: the model's weights, but each adapted matrix a merged copy,
 * the copies end to end in table order. */
static int weights_merge_fp32(const td_model *m, const td_recipe *r, merge_ctx *mc, td_model_weights *w,
                              float **owned, td_error *err)
{
    const td_lora *lo = mc->lora;
    int L = m->cfg.num_layers;
    size_t n, total = 0;
    td_param_spec *specs = param_table(&m->cfg, &n);
    for (size_t i = 0; i < n; i++) {
        int mo = param_lora_module(specs[i].role);
        if (mo >= 0 && lo->pairs[specs[i].layer * TD_LORA_NMOD + mo].a) total += specs[i].numel;
    }
    float *buf = malloc((total ? total : 1) * sizeof(float));
    if (!buf) {
        free(specs);
        return td_fail(err, "recipe %s: out of memory for %zu MB of merged weights", r->name, total * 4 >> 20);
    }
    *w = m->w;
    w->layers = td_xmalloc((size_t)L * sizeof *w->layers);
    memcpy(w->layers, m->w.layers, (size_t)L * sizeof *w->layers);
    float *p = buf;
    for (size_t i = 0; i < n; i++) {
        int mo = param_lora_module(specs[i].role);
        if (mo < 0 || !lo->pairs[specs[i].layer * TD_LORA_NMOD + mo].a) continue;
        const float **slot = param_slot(w, L, &specs[i]);
        prepare_merged(mc, r, *slot, specs[i].layer, mo, (int)specs[i].shape[0], (int)specs[i].shape[1], p);
        *slot = p;
        p += specs[i].numel;
    }
    free(specs);
    *owned = buf;
    return 0;
}

static int weights_prepare(const td_model *m, const td_recipe *r, merge_ctx *mc, td_model_weights *w,
                           float **owned, td_error *err)
{
    *owned = NULL;
    if (td_recipe_is_plain_fp32(r)) {
        if (mc->lora) return weights_merge_fp32(m, r, mc, w, owned, err);
        *w = m->w;
        w->layers = NULL;
        return 0;
    }
    /* Carved by the parameter table: every tensor at its table offset, rounded; the lm_head
     * (last in the table, or absent when tied) right after model.norm, and only when the head
     * recipe rounds it; an fp32 head reads the master weights themselves. */
    const td_config *c = &m->cfg;
    size_t n;
    td_param_spec *specs = param_table(c, &n);
    td_recipe head = td_recipe_for_head(r);
    int head_copy = head.weights != TD_F32;
    size_t VC = (size_t)c->vocab_size * c->hidden_size;
    size_t head_at = specs[n - 1].offset + (c->tie_word_embeddings ? specs[n - 1].numel : 0);
    size_t total = head_at + (head_copy ? VC : 0);
    float *buf = malloc(total * sizeof(float));
    if (!buf) {
        free(specs);
        return td_fail(err, "recipe %s: out of memory for %zu MB of rounded weights", r->name, total * 4 >> 20);
    }
    w->layers = td_xcalloc((size_t)c->num_layers, sizeof *w->layers);
    for (size_t i = 0; i < n; i++) {
        const td_param_spec *p = &specs[i];
        if (p->role == TD_ROLE_LM_HEAD) continue;
        const float *src = *param_slot((td_model_weights *)&m->w, c->num_layers, p);
        float *dst = buf + p->offset;
        int module = param_lora_module(p->role);
        if (module >= 0) prepare_merged(mc, r, src, p->layer, module, (int)p->shape[0], (int)p->shape[1], dst);
        else put(dst, src, p->numel, param_keeps_fp32(r, p->role) ? TD_F32 : r->activations);
        *param_slot(w, c->num_layers, p) = dst;
    }
    free(specs);
    if (head_copy) {
        merge_ctx none = {0};
        prepare_merged(&none, &head, m->w.lm_head, -1, 0, c->vocab_size, c->hidden_size, buf + head_at);
        w->lm_head = buf + head_at;
    } else {
        w->lm_head = m->w.lm_head;   /* fp32 head: the master weights themselves */
    }
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
    lora_rt_free(st->lora);
    free(st->qin);
    free(st->gscratch);
    memset(st, 0, sizeof *st);
}

/* Scratch of a merge: the update and the unmerged rounding of the largest adapted matrix. */
static float *merge_scratch(const td_lora *lo)
{
    size_t mx = 1;
    for (int i = 0; i < lo->num_layers * TD_LORA_NMOD; i++)
        if (lo->pairs[i].a && (size_t)lo->pairs[i].out * lo->pairs[i].in > mx) mx = (size_t)lo->pairs[i].out * lo->pairs[i].in;
    return td_xmalloc(2 * mx * sizeof(float));
}

int recipe_state_set(td_recipe_state *st, td_ops *ops, const td_model *m, const td_recipe *r,
                     const td_lora *lora, int merged, int cap, td_error *err)
{
    if (td_recipe_check(r, r->name, err)) return -1;
    if (lora && lora->num_layers != m->cfg.num_layers)
        return td_fail(err, "%s: adapter for %d layers, model has %d", lora->dir, lora->num_layers, m->cfg.num_layers);
    for (int i = 0; lora && i < lora->num_layers * TD_LORA_NMOD; i++) {
        int out, in;
        td_lora_module_shape(&m->cfg, i % TD_LORA_NMOD, &out, &in);
        if (lora->pairs[i].a && (lora->pairs[i].out != out || lora->pairs[i].in != in))
            return td_fail(err, "%s: layer %d %s is (%d, %d), the model's is (%d, %d)", lora->dir, i / TD_LORA_NMOD,
                           td_lora_module_name(i % TD_LORA_NMOD), lora->pairs[i].out, lora->pairs[i].in, out, in);
    }
    recipe_state_free(st);
    ops->recipe = NULL;
    ops->head = NULL;
    ops->w = NULL;
    ops->qin = ops->gscratch = NULL;
    ops->lora = NULL;
    st->recipe = *r;
    st->head = td_recipe_for_head(r);
    if (lora && !merged) {
        st->lora = lora_rt_create(lora, r, cap);
        ops->lora = st->lora;
    }
    merge_ctx mc = {0};
    if (lora && merged) {
        mc.lora = lora;
        mc.scratch = merge_scratch(lora);
    }
    int prep = weights_prepare(m, r, &mc, &st->w, &st->owned, err);
    free(mc.scratch);
    if (prep) {
        recipe_state_free(st);
        ops->lora = NULL;
        return -1;
    }
    if (mc.lora) {
        st->merge.merged = 1;
        st->merge.survival = mc.delta2 > 0 ? sqrt(mc.kept2 / mc.delta2) : 1.0;
        st->merge.aligned = mc.delta2 > 0 ? mc.dot / mc.delta2 : 1.0;
        st->merge.elements = mc.elements;
        st->merge.changed = mc.changed;
        st->merge.changed_frac = mc.elements ? (double)mc.changed / mc.elements : 0.0;
    }
    ops->w = st->w.layers ? &st->w : NULL;
    if (td_recipe_is_plain_fp32(r)) return 0;   /* the fp32 reference ops (model's weights unless merged) */
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
