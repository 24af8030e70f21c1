/* A recipe's view of the model's weights: every parameter as the recipe's kernels would read it
 * (see recipe.h), prepared once at set-up:
 *   GEMM weights (q/k/v/o, gate/up/down)   the recipe's weight format (fp8: fake-quantised
 *                                           with its weight scaling, e.g. 128x128 blocks)
 *   embedding, norms, biases                the activations dtype (HF casts the whole model);
 *                                           embedding and norms fp32 with residual fp32 (autocast)
 *   lm_head                                 fp32 master weights with lm_head_fp32; else the
 *                                           weight format, but the activations dtype when that
 *                                           is fp8 (engines keep the lm_head out of FP8 GEMMs)
 *
 * Memory: nothing is copied that the rounding leaves as it is. A matrix, embedding or lm_head
 * whose rounding is the identity on its storage (anything under fp32; a bf16 tensor without
 * NaN under a bf16 rounding; fp16 likewise) is the model's own storage, shared by every path
 * whose recipe rounds it that way: a bf16 checkpoint under bf16 recipes copies nothing. What a
 * recipe changes is kept in the narrowest storage that holds the rounded values exactly, never
 * widened: fp8 as 1-byte codes + the weight scaling's block scales (td_fp8_quantize: its
 * dequantisation, lut[code] * scale, is td_fp8_fake_quant's value), bf16/fp16 as 2-byte codes
 * (td_encode_row: decode(encode(x)) is td_round_row's value). The GEMMs widen per tile
 * (src/backend/cpu_wmat.c). Norms and biases are small: fp32 copies. A trainer asks for fp32
 * copies (f32): its backward reads the fp32 view.
 *
 * Merged LoRA: an adapted GEMM weight becomes prepare(W + scale B A), the product and the sum
 * in fp32, then the recipe's rounding, as a rollout engine merges an update into its weights.
 * What survives the rounding is measured against the same rounding without the update:
 *   survival = |prepare(W + dW) - prepare(W)|_F / |dW|_F, changed = #{prepare(W + dW) != prepare(W)},
 *   aligned  = <prepare(W + dW) - prepare(W), dW> / |dW|^2 (the update's own component).
 * Unmerged adapters are set up in lora_run.c.
 *
 * Masters on a device (m->owned_dev: a trainer's, src/train/trainer.c; the backend has prepare):
 * the same copies are allocated on the host but never written; each is a key whose device copy
 * be->prepare makes from the masters there with the same rounding (bf16 / fp16 codes, fp32 copies,
 * norms and biases), the embedding a rounding view of them (be->alias with its format, gathered
 * and rounded by the embedding op), and what a recipe shares with the masters is read through
 * their alias. A merged adapter whose trainer copy is on the device too (lora->owned_dev) is
 * folded there (be->lora_fold: merge_sum's arithmetic and order; four sums per matrix come down).
 * FP8 matrices are quantised there (be->prepare_fp8: td_fp8_quantize's codes and block scales, or
 * td_fp8_fake_quant's fp32 values for a trainer's view). What is left (an FP8 matrix with a merged
 * adapter, a merge without a device adapter, norms under fp8 activations) takes the host path: from
 * the host copy when it is current (m->owned_host_current: a LoRA trainer's frozen base), else from
 * the tensor's masters brought down; recipe_state_free releases the device copies with their keys
 * (dev_be). */
#include "model_internal.h"
#include "tidal/gemm.h"
#include "tidal/progress.h"

#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Running sums of a merge: sum of squares of the kept and of the intended change. */
typedef struct {
    const td_lora *lora;       /* NULL: no merge                                  */
    double kept2, delta2, dot;
    int64_t elements, changed;
} merge_ctx;

static void merge_add(merge_ctx *mc, double kept2, double delta2, double dot, int64_t changed, int64_t elements)
{
    mc->kept2 += kept2;
    mc->delta2 += delta2;
    mc->dot += dot;
    mc->elements += elements;
    mc->changed += changed;
}

typedef struct {
    td_recipe_state *st;
    const td_model *m;
    const td_backend *dev;     /* prepares from m->owned_dev on this backend (NULL: the host)  */
    int panels;                /* the backend takes fp8-fast weights in panels (td_backend's fp8_panels) */
    merge_ctx mc;
    float *scratch;            /* fp32 scratch, grown on demand                   */
    size_t scratch_floats;
    td_error *err;
} prep;

static float *scratch(prep *P, size_t floats)
{
    if (floats > P->scratch_floats) {
        free(P->scratch);
        P->scratch = malloc(floats * sizeof(float));
        P->scratch_floats = P->scratch ? floats : 0;
    }
    return P->scratch;
}

/* A copy's allocation, counted in bytes[storage]. NULL + err when out of memory. */
static void *own(prep *P, size_t bytes, td_format storage)
{
    td_recipe_state *st = P->st;
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        td_fail(P->err, "recipe %s: out of memory for %zu MB of prepared weights (%zu MB held)", st->recipe.name,
                bytes >> 20, (st->bytes[TD_F32] + st->bytes[TD_BF16] + st->bytes[TD_F16] + st->bytes[TD_E4M3] +
                              st->bytes[TD_E5M2]) >> 20);
        return NULL;
    }
    st->owned = td_xrealloc(st->owned, (st->nowned + 1) * sizeof *st->owned);
    st->owned[st->nowned++] = p;
    st->bytes[storage] += bytes;
    return p;
}

/* sum = W + scale B A of the adapted (layer, module) W (n = N*K floats at w), and the merge's
 * statistics; buf: 3n floats of scratch. dW is td_lora_fold_delta's (OpenBLAS's sgemm order made
 * explicit); each row's sums in double in column order, the rows added in order: the order the
 * device fold (be->lora_fold) sums in, so a merge on either gives the same bits. */
static void merge_sum(merge_ctx *mc, const td_recipe *r, const td_lora_pair *p, const float *w, int N,
                      int K, float *sum, float *buf)
{
    size_t n = (size_t)N * K;
    float *dw = buf, *merged = buf + n, *base = buf + 2 * n;
    td_lora_fold_delta(p, mc->lora->rank, mc->lora->scale, dw);
    for (size_t i = 0; i < n; i++) sum[i] = w[i] + dw[i];
    td_gemm_prepare_weight(r, sum, N, K, merged);
    td_gemm_prepare_weight(r, w, N, K, base);
    double kept2 = 0, delta2 = 0, dot = 0;
    int64_t changed = 0;
    for (int row = 0; row < N; row++) {
        double rk = 0, rd = 0, rdot = 0;
        for (size_t i = (size_t)row * K; i < (size_t)(row + 1) * K; i++) {
            double d = (double)merged[i] - base[i];
            rk += d * d;
            rd += (double)dw[i] * dw[i];
            rdot += d * dw[i];
            changed += merged[i] != base[i];
        }
        kept2 += rk;
        delta2 += rd;
        dot += rdot;
    }
    merge_add(mc, kept2, delta2, dot, changed, (int64_t)n);
}

/* Where the current values of host tensor p live when the masters are on a device: its place in
 * m->owned_dev (the host copy is stale); NULL when preparing on the host. */
static const float *dev_src(const prep *P, const void *p)
{
    const td_model *m = P->m;
    const float *f = p;
    if (!P->dev || !f || f < m->owned || f >= m->owned + m->owned_floats) return NULL;
    return m->owned_dev + (f - m->owned);
}

static int prep_wmat_host(prep *P, const td_recipe *r, td_wmat src, int has_nan, const td_lora_pair *ad,
                          size_t rows, size_t cols, td_wmat *out);

/* out: what r's GEMMs multiply for src (rows, cols) — r->weights (fp8 with weight_scaling) —
 * with the adapter pair ad (NULL: none) merged. Shared when the rounding leaves src as it is (on a
 * device: the masters' alias, src/train/trainer.c). From device masters a bf16 / fp16 / fp32 copy
 * is rounded there (be->prepare), merged with a device adapter there (be->lora_fold), an fp8 one
 * quantised there (be->prepare_fp8); an fp8 merge (and a merge whose adapter is on the host)
 * prepares on the host, from the masters brought down unless the host copy is current. */
static int prep_wmat(prep *P, const td_recipe *r, td_wmat src, int has_nan, const td_lora_pair *ad,
                     size_t rows, size_t cols, td_wmat *out)
{
    td_format f = r->weights;
    const float *dsrc = src.dtype == TD_F32 ? dev_src(P, src.data) : NULL;
    if (!dsrc || (!ad && (f == TD_F32 || (f == src.dtype && !has_nan)) && (!P->st->f32 || src.dtype == TD_F32)))
        return prep_wmat_host(P, r, src, has_nan, ad, rows, cols, out);
    size_t n = rows * cols;
    const td_lora *lo = P->mc.lora;
    int fold = ad && lo->owned_dev && P->dev->lora_fold;   /* the adapter's current values there */
    if ((!ad || fold) && f != TD_E4M3 && f != TD_E5M2) {
        td_format storage = P->st->f32 || f == TD_F32 ? TD_F32 : f;
        void *dst = own(P, n * (storage == TD_F32 ? 4 : 2), storage);
        if (!dst) return -1;
        if (ad) {   /* merge_sum on the device: the weight and four sums, nothing else comes down */
            double s[4];
            P->dev->lora_fold(dst, storage, dsrc, lo->owned_dev + (ad->a - lo->owned),
                              lo->owned_dev + (ad->b - lo->owned), (int)rows, (int)cols, lo->rank, lo->scale, f, s);
            merge_add(&P->mc, s[0], s[1], s[2], (int64_t)s[3], (int64_t)n);
        } else {
            P->dev->prepare(dst, storage, dsrc, n, f, 1.0f);
        }
        *out = (td_wmat){.data = dst, .dtype = storage};
        return 0;
    }
    if (!ad && P->dev->prepare_fp8) {   /* fp8: quantised there (td_fp8_quantize's codes and scales) */
        td_fp8_scheme s = r->weight_scaling;
        s.fmt = f;
        if (P->st->f32) {   /* the fake-quantised values, an fp32 copy */
            float *dst = own(P, n * sizeof(float), TD_F32);
            if (!dst) return -1;
            P->dev->prepare_fp8(NULL, NULL, dst, &s, dsrc, (int)rows, (int)cols);
            *out = td_wmat_f32(dst);
            return 0;
        }
        size_t br, bc, ns = td_fp8_num_scales(&s, rows, cols);
        td_fp8_block_shape(&s, rows, cols, &br, &bc);
        uint8_t *codes = own(P, n, f);
        float *scales = codes ? own(P, ns * sizeof(float), f) : NULL;
        if (!scales) return -1;
        P->dev->prepare_fp8(codes, scales, NULL, &s, dsrc, (int)rows, (int)cols);
        *out = (td_wmat){.data = codes, .dtype = f, .scale = scales, .sr = (int)br, .sc = (int)bc,
                         .nbc = (int)((cols + bc - 1) / bc)};
        return 0;
    }
    if (P->m->owned_host_current) return prep_wmat_host(P, r, src, has_nan, ad, rows, cols, out);
    float *down = malloc(n * sizeof(float));
    if (!down) return td_fail(P->err, "recipe %s: out of memory for %zu MB of masters", r->name, n * 4 >> 20);
    P->dev->download(down, dsrc, n * sizeof(float));
    int rc = prep_wmat_host(P, r, td_wmat_f32(down), 0, ad, rows, cols, out);
    free(down);
    return rc;
}

/* The embedding under r (emb: its weights the activations dtype, or fp32): from device masters a
 * bf16 / fp16 table is a rounding view of them (be->alias with the format), which the embedding's
 * gather rounds row by row: the device holds no copy (embedding.cu); else prep_wmat. */
static int prep_embed(prep *P, const td_recipe *r, td_wmat src, int has_nan, size_t rows, size_t cols, td_wmat *out)
{
    td_format f = r->weights;
    const float *dsrc = src.dtype == TD_F32 ? dev_src(P, src.data) : NULL;
    if (!dsrc || (f != TD_BF16 && f != TD_F16)) return prep_wmat(P, r, src, has_nan, NULL, rows, cols, out);
    td_format storage = P->st->f32 ? TD_F32 : f;
    size_t bytes = rows * cols * (storage == TD_F32 ? 4 : 2);
    void *key = own(P, bytes, storage);   /* never written: the view's host key */
    if (!key) return -1;
    P->dev->alias(key, dsrc, bytes, f);
    *out = (td_wmat){.data = key, .dtype = storage};
    return 0;
}

/* 1 when an fp8 matrix goes into panels of 8 rows (td_fp8_codes_to_panels): the backend takes
 * them (the CPU's), the recipe accumulates fp8-fast, the panel kernel runs here for its block
 * shape (every panel inside one row block of scales), and the CPU has no AVX-512 codes kernel
 * (there the row-major kernels were measured and stay: gemm_fp8fast512.c). On one Zen 3 core the panel
 * kernel ran 1.41-1.65x the row kernel on 1-8 rows. */
static int fp8_panels_wanted(const prep *P, const td_recipe *r, td_format f, size_t br, size_t bc, size_t rows,
                             size_t cols)
{
    return P->panels && r->accumulate == TD_ACC_FP8_FAST && rows <= INT_MAX && cols <= INT_MAX && br <= INT_MAX &&
           bc <= INT_MAX && td_gemm_fp8_panels_preferred(f, (int)br, (int)bc, r->promote_every) &&
           (br % 8 == 0 || br >= rows);
}

static int prep_wmat_host(prep *P, const td_recipe *r, td_wmat src, int has_nan, const td_lora_pair *ad,
                          size_t rows, size_t cols, td_wmat *out)
{
    td_recipe_state *st = P->st;
    td_format f = r->weights;
    int fp8 = f == TD_E4M3 || f == TD_E5M2;
    size_t n = rows * cols;
    if (!ad && (f == TD_F32 || (f == src.dtype && !has_nan)) && (!st->f32 || src.dtype == TD_F32)) {
        *out = src;   /* already on the recipe's grid */
        return 0;
    }
    td_format storage = st->f32 || f == TD_F32 ? TD_F32 : f;
    const float *vals = NULL;   /* the values before rounding, when a whole-matrix pass needs them */
    if (ad || storage == TD_F32 || fp8) {
        float *buf = scratch(P, (ad ? 5 : 1) * n);
        if (!buf) return td_fail(P->err, "recipe %s: out of memory for %zu MB of scratch", r->name, (ad ? 5 : 1) * n * 4 >> 20);
        const float *w = wmat_rows(&src, 0, (long)rows, (int)cols, buf);
        if (ad) {
            merge_sum(&P->mc, r, ad, w, (int)rows, (int)cols, buf + n, buf + 2 * n);
            vals = buf + n;
        } else {
            vals = w;
        }
    }
    if (storage == TD_F32) {
        float *dst = own(P, n * sizeof(float), TD_F32);
        if (!dst) return -1;
        td_gemm_prepare_weight(r, vals, (int)rows, (int)cols, dst);
        *out = td_wmat_f32(dst);
    } else if (fp8) {
        td_fp8_scheme s = r->weight_scaling;
        s.fmt = f;
        size_t br, bc, ns = td_fp8_num_scales(&s, rows, cols);
        td_fp8_block_shape(&s, rows, cols, &br, &bc);
        int panels = fp8_panels_wanted(P, r, f, br, bc, rows, cols);
        uint8_t *codes = own(P, panels ? (rows + 7) / 8 * 8 * cols : n, f);
        float *scales = codes ? own(P, ns * sizeof(float), f) : NULL;
        uint8_t *rowmajor = panels && scales ? malloc(n) : codes;
        if (!rowmajor)
            return scales ? td_fail(P->err, "recipe %s: out of memory for %zu MB of codes", r->name, n >> 20) : -1;
        td_fp8_quantize(&s, vals, rows, cols, rowmajor, scales);
        /* checked once here: the decode kernel scanned every code for NaNs on every call, a
         * second read of the weights per decode step */
        int nan_free = !td_fp8_codes_have_nan(rowmajor, n, f);
        if (panels) {
            td_fp8_codes_to_panels(rowmajor, rows, cols, codes);
            free(rowmajor);
        }
        *out = (td_wmat){.data = codes, .dtype = f, .scale = scales, .sr = (int)br, .sc = (int)bc,
                         .nbc = (int)((cols + bc - 1) / bc), .nan_free = nan_free, .panels = panels};
    } else {   /* bf16 / fp16 codes */
        uint16_t *codes = own(P, n * 2, f);
        if (!codes) return -1;
        if (vals) {
            td_encode_row(f, vals, codes, n, TD_SATFINITE);
        } else {   /* row chunks of ~1M values, widened then encoded */
            size_t step = cols < (1u << 20) ? (1u << 20) / cols : 1;
            float *buf = scratch(P, step * cols);
            if (!buf) return td_fail(P->err, "recipe %s: out of memory for scratch", r->name);
            for (size_t r0 = 0; r0 < rows; r0 += step) {
                size_t nr = rows - r0 < step ? rows - r0 : step;
                const float *w = wmat_rows(&src, (long)r0, (long)nr, (int)cols, buf);
                td_encode_row(f, w, codes + r0 * cols, nr * cols, TD_SATFINITE);
            }
        }
        *out = (td_wmat){.data = codes, .dtype = f};
    }
    return 0;
}

/* Embedding and norm weights an autocast trainer keeps in fp32 (residual fp32: they are no
 * operands of autocast's linear, which casts biases with the weights). */
static int param_keeps_fp32(const td_recipe *r, int role)
{
    return r->residual_fp32 && (role == TD_ROLE_EMBED || role == TD_ROLE_ATTN_NORM ||
                                role == TD_ROLE_MLP_NORM || role == TD_ROLE_FINAL_NORM ||
                                role == TD_ROLE_Q_NORM || role == TD_ROLE_K_NORM);
}

static int weights_prepare(prep *P, const td_recipe *r)
{
    const td_model *m = P->m;
    td_recipe_state *st = P->st;
    const td_config *c = &m->cfg;
    int L = c->num_layers, plain = td_recipe_is_plain_fp32(r);
    size_t n;
    td_param_spec *specs = param_table(c, &n);
    td_recipe head = td_recipe_for_head(r), emb = *r;
    emb.weights = plain || param_keeps_fp32(r, TD_ROLE_EMBED) ? TD_F32 : r->activations;
    /* the fp32 view starts as the model's (norms, biases, fp32 tensors) */
    st->w = m->w;
    td_model_weights_layers(&st->w, c, &m->w);
    st->ws.mat = td_xcalloc((size_t)L * TD_LORA_NMOD, sizeof *st->ws.mat);
    if (c->num_experts > 0) {
        st->ws.moe_per = TD_MOE_EXPERTS + 3 * c->num_experts;
        st->ws.moe = td_xcalloc((size_t)L * st->ws.moe_per, sizeof *st->ws.moe);
    }
    td_progress pr;
    td_progress_start(&pr, m->progress, "preparing weights");
    size_t total = 0, done = 0, embed_i = 0;
    for (size_t i = 0; i < n; i++) total += specs[i].numel;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const td_param_spec *p = &specs[i];
        const float **slot = param_slot(&st->w, L, p);
        int nan;
        td_wmat src = model_param_wmat(m, i, p, &nan), *out = NULL;
        if (p->kind == TD_PARAM_NORM || p->kind == TD_PARAM_BIAS) {
            if (!plain) {   /* small: an fp32 copy rounded to the activations dtype */
                float *dst = own(P, p->numel * sizeof(float), TD_F32);
                if (!dst) { rc = -1; break; }
                td_format fmt = param_keeps_fp32(r, p->role) ? TD_F32 : r->activations;
                const float *d = dev_src(P, *slot);
                if (d && fmt != TD_E4M3 && fmt != TD_E5M2) {
                    P->dev->prepare(dst, TD_F32, d, p->numel, fmt, 1.0f);
                } else if (d && !m->owned_host_current) {   /* fp8 activations: the host form, from the masters brought down */
                    P->dev->download(dst, d, p->numel * sizeof(float));
                    td_round_row(fmt, dst, dst, p->numel, TD_SATFINITE);
                } else {
                    td_round_row(fmt, *slot, dst, p->numel, TD_SATFINITE);
                }
                *slot = dst;
            }
            continue;
        }
        size_t rows = (size_t)p->shape[0], cols = (size_t)p->shape[1];
        if (p->role == TD_ROLE_EMBED) {
            out = &st->ws.embed;
            embed_i = i;
            rc = prep_embed(P, &emb, src, nan, rows, cols, out);
        } else if (p->role == TD_ROLE_LM_HEAD) {
            out = &st->ws.lm_head;
            rc = prep_wmat(P, &head, src, nan, NULL, rows, cols, out);
        } else {   /* a projection; in an MoE the router, experts, shared expert: GEMMs like any other */
            int ls = param_lora_slot(p);
            const td_lora_pair *ad = P->mc.lora && ls >= 0 ? &P->mc.lora->pairs[(size_t)p->layer * P->mc.lora->slots + ls] : NULL;
            out = param_moe_slot(p) >= 0 ? wset_moe(&st->ws, p->layer, param_moe_slot(p))
                                         : wset_mat(&st->ws, p->layer, param_lora_module(p->role));
            rc = prep_wmat(P, r, src, nan, ad && ad->a ? ad : NULL, rows, cols, out);
        }
        if (!rc) *slot = out->dtype == TD_F32 ? out->data : NULL;
        done += p->numel;
        td_progress_update(&pr, (double)done / 1e9, (double)total / 1e9, "G weights");
    }
    if (!rc && c->tie_word_embeddings) {   /* the lm_head is the embedding, under the head's rounding */
        int nan;
        td_wmat src = model_param_wmat(m, embed_i, &specs[embed_i], &nan);
        rc = prep_wmat(P, &head, src, nan, NULL, (size_t)c->vocab_size, (size_t)c->hidden_size, &st->ws.lm_head);
        if (!rc) st->w.lm_head = st->ws.lm_head.dtype == TD_F32 ? st->ws.lm_head.data : NULL;
    }
    td_progress_end(&pr);
    free(specs);
    return rc;
}

void recipe_state_free(td_recipe_state *st)
{
    for (size_t i = 0; i < st->nowned; i++) {
        if (st->dev_be) st->dev_be->release(st->owned[i]);   /* its device copy, if prepared there */
        free(st->owned[i]);
    }
    free(st->owned);
    td_model_weights_free_layers(&st->w);
    free(st->ws.mat);
    free(st->ws.moe);
    lora_rt_free(st->lora);
    free(st->qin);
    free(st->gscratch);
    free(st->wtile);
    memset(st, 0, sizeof *st);
}

/* Whether any weight the forward reads is stored narrower than fp32 (GEMMs then widen tiles). */
static int wset_narrow(const td_wset *ws, int L)
{
    if (ws->embed.dtype != TD_F32 || ws->lm_head.dtype != TD_F32) return 1;
    for (int i = 0; i < L * TD_LORA_NMOD; i++)
        if (ws->mat[i].data && ws->mat[i].dtype != TD_F32) return 1;
    for (int i = 0; ws->moe && i < L * ws->moe_per; i++)
        if (ws->moe[i].data && ws->moe[i].dtype != TD_F32) return 1;
    return 0;
}

int recipe_state_set(td_recipe_state *st, td_ops *ops, const td_model *m, const td_recipe *r,
                     const td_lora *lora, int mode, int cap, int f32, td_error *err)
{
    if (td_recipe_check(r, r->name, err)) return -1;
    if (lora && (lora->num_layers != m->cfg.num_layers || lora->slots != td_lora_slots(&m->cfg)))
        return td_fail(err, "%s: adapter for %d layers of %d projections, the model has %d of %d", lora->dir,
                       lora->num_layers, lora->slots, m->cfg.num_layers, td_lora_slots(&m->cfg));
    for (int i = 0; lora && i < lora->num_layers * lora->slots; i++) {
        int out = 0, in = 0, l = i / lora->slots, s = i % lora->slots;
        char path[128];
        if (!lora->pairs[i].a) continue;
        td_lora_slot_path(&m->cfg, l, s, path, sizeof path);
        if (td_lora_slot_shape(&m->cfg, l, s, &out, &in) || lora->pairs[i].out != out || lora->pairs[i].in != in)
            return td_fail(err, "%s: %s is (%d, %d), the model's is (%d, %d)", lora->dir, path, lora->pairs[i].out,
                           lora->pairs[i].in, out, in);
        /* vLLM's fused_moe runs an adapter's expert branches inside its kernel (fused_moe_lora), with
         * roundings tidal has not modelled: merged adapters fold into the weights and run */
        if (s >= TD_LORA_NMOD && mode != TD_LORA_MERGED && r->moe_fused)
            return td_fail(err, "%s: %s: an unmerged LoRA on an expert under recipe %s (vLLM's fused_moe) is not "
                           "modelled; merge it (lora sync \"merged\") or use an unfused recipe", lora->dir, path, r->name);
    }
    td_recipe rc = *r;   /* r may be st->recipe itself */
    recipe_state_free(st);
    td_backend_forget(ops->be);   /* device copies of the weights just freed (CUDA) */
    ops->recipe = NULL;
    ops->head = NULL;
    ops->w = NULL;
    ops->ws = NULL;
    ops->qin = ops->gscratch = ops->wtile = NULL;
    ops->lora = NULL;
    st->recipe = rc;
    st->head = td_recipe_for_head(&rc);
    st->f32 = f32;
    st->dev_be = m->owned_dev && ops->be->prepare ? ops->be : NULL;
    if (lora && mode != TD_LORA_MERGED) {
        st->lora = lora_rt_create(lora, &rc, cap, mode == TD_LORA_PUNICA, ops->be);
        ops->lora = st->lora;
    }
    prep P = {.st = st, .m = m, .dev = st->dev_be, .panels = ops->be->fp8_panels, .err = err};
    if (lora && mode == TD_LORA_MERGED) P.mc.lora = lora;
    int bad = weights_prepare(&P, &rc);
    free(P.scratch);
    if (bad) {
        recipe_state_free(st);
        ops->lora = NULL;
        return -1;
    }
    if (P.mc.lora) {
        merge_ctx *mc = &P.mc;
        st->merge.merged = 1;
        st->merge.survival = mc->delta2 > 0 ? sqrt(mc->kept2 / mc->delta2) : 1.0;
        st->merge.aligned = mc->delta2 > 0 ? mc->dot / mc->delta2 : 1.0;
        st->merge.elements = mc->elements;
        st->merge.changed = mc->changed;
        st->merge.changed_frac = mc->elements ? (double)mc->changed / mc->elements : 0.0;
    }
    const td_config *c = &m->cfg;
    size_t width = (size_t)c->hidden_size;
    if ((size_t)c->intermediate_size > width) width = (size_t)c->intermediate_size;
    if ((size_t)c->num_heads * c->head_dim > width) width = (size_t)c->num_heads * c->head_dim;
    if ((size_t)c->moe_intermediate_size > width) width = (size_t)c->moe_intermediate_size;   /* experts' down */
    if ((size_t)c->shared_expert_intermediate_size > width) width = (size_t)c->shared_expert_intermediate_size;
    ops->w = &st->w;
    ops->ws = &st->ws;
    /* one tile of the widest GEMM input per thread: 16-bit and fp8 weights are widened into it,
     * fp32 copies under bf16 dot products (gemm.h) packed into it as bf16 codes */
    if (wset_narrow(&st->ws, c->num_layers) || td_gemm_bf16dp_applies(&rc) ||
        td_gemm_bf16dp_applies(&st->head)) {
        ops->wtile_per_thread = (size_t)TD_GEMM_TILE * width;
        st->wtile = td_xmalloc((size_t)ops->nthreads * ops->wtile_per_thread * sizeof(float));
        ops->wtile = st->wtile;
    }
    if (td_recipe_is_plain_fp32(&rc)) return 0;   /* the fp32 reference ops */
    st->qin = td_xmalloc((size_t)cap * width * sizeof(float));
    ops->recipe = &st->recipe;
    ops->head = &st->head;
    ops->qin = st->qin;
    ops->gscratch = st->gscratch;
    return 0;
}
