/* tidal — the decoder body shared by both structures: embedding, L pre-norm layers
 *   x += o_proj(attention(rope(q), rope(k), v))      q,k,v = proj(rmsnorm(x)) (+ bias, q/k norm)
 *   x += down(silu(gate(rmsnorm(x))) * up(rmsnorm(x)))
 * and the final norm; then the lm_head with log-softmax. Token rows carry their own position
 * and the place of their sequence's keys/values, so the same code runs whole packed sequences
 * (teacher forcing) and one new token per KV-cache slot (decode). An unmerged LoRA adapter adds
 * its branch right after each projection it adapts (lora_run.c). */
#include "model_internal.h"
#include "tidal/progress.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

static float *acts_buf(td_acts *a, size_t floats)
{
    float *p = a->be->alloc((floats ? floats : 1) * sizeof(float));   /* 0: a model without dense MLPs */
    a->owned[a->nowned++] = p;
    return p;
}

/* a buffer the host reads and writes: the backend's own on the CPU, host memory on a device */
static float *acts_host(td_acts *a, size_t floats)
{
    if (backend_host_memory(a->be)) return acts_buf(a, floats);
    float *p = td_xcalloc(floats ? floats : 1, sizeof(float));
    a->host_owned[a->nhost++] = p;
    return p;
}

/* the host mirror of backend buffer b: b itself on the CPU backend */
static float *acts_mirror(td_acts *a, float *b, size_t floats)
{
    return backend_host_memory(a->be) ? b : acts_host(a, floats);
}

void acts_alloc(td_acts *a, const td_config *c, const td_ops *ops, int cap, int max_keys, int save)
{
    size_t n = (size_t)cap, C = c->hidden_size, F = td_config_dense_mlp_width(c), L = c->num_layers;
    size_t NH = c->num_heads, NKV = c->num_kv_heads;
    size_t QD = NH * c->head_dim, KVD = NKV * c->head_dim;
    size_t per = save == TD_ACTS_ALL ? L : 1;   /* slices of the per-layer buffers */
    memset(a, 0, sizeof *a);
    a->be = ops->be;
    a->cap = cap;
    a->max_keys = max_keys;
    a->L = (int)L;
    a->save = save;
    a->x = acts_buf(a, (save ? L + 1 : 1) * n * C);
    a->xn = acts_buf(a, n * C);
    a->q = acts_buf(a, per * n * QD);
    a->k = acts_buf(a, per * n * KVD);
    a->v = acts_buf(a, per * n * KVD);
    a->att = acts_buf(a, per * n * QD);
    a->proj = acts_buf(a, n * C);
    a->gate = acts_buf(a, per * n * F);
    a->up = acts_buf(a, per * n * F);
    a->scores = acts_buf(a, (size_t)ops->nthreads * ATT_BLOCK * max_keys);
    a->kv_off = td_xmalloc(n * sizeof(size_t));   /* a host table the paths fill (ops copy it) */
    if (c->num_experts > 0) {
        size_t E = c->num_experts, K = c->num_experts_per_tok, FW = c->moe_intermediate_size;
        if ((size_t)c->shared_expert_intermediate_size > FW) FW = c->shared_expert_intermediate_size;
        a->moe_logits = acts_buf(a, n * E);
        a->moe_logits_h = acts_mirror(a, a->moe_logits, n * E);
        a->moe_probs = acts_host(a, n * E);
        a->moe_experts = (int *)acts_host(a, n * K);
        a->moe_weights = acts_host(a, n * K);
        a->moe_rows = (int *)acts_host(a, n * K);
        a->moe_start = (int *)acts_host(a, 2 * E + 1);
        a->moe_rows_b = backend_host_memory(a->be) ? a->moe_rows : (int *)acts_buf(a, n * K);
        a->moe_weights_b = backend_host_memory(a->be) ? NULL : acts_buf(a, n * K);
        a->moe_in = acts_buf(a, n * C);
        a->moe_gate = acts_buf(a, n * FW);
        a->moe_up = acts_buf(a, n * FW);
        a->moe_y = acts_buf(a, n * C);
    }
    if (!save) return;
    if (c->num_experts > 0) {
        a->moe_probs_s = acts_host(a, per * n * c->num_experts);
        a->moe_experts_s = (int *)acts_host(a, per * n * c->num_experts_per_tok);
        a->moe_weights_s = acts_host(a, per * n * c->num_experts_per_tok);
    }
    a->x_mid = acts_buf(a, per * n * C);
    a->xn1 = acts_buf(a, per * n * C);
    a->xn2 = acts_buf(a, per * n * C);
    a->rstd1 = acts_buf(a, per * n);
    a->rstd2 = acts_buf(a, per * n);
    a->rstd_f = acts_buf(a, n);
    a->lse = acts_buf(a, per * n * NH);
    a->act = acts_buf(a, per * n * F);
    if (c->qk_norm) {
        a->q_raw = acts_buf(a, per * n * QD);
        a->k_raw = acts_buf(a, per * n * KVD);
        a->q_rstd = acts_buf(a, per * n * NH);
        a->k_rstd = acts_buf(a, per * n * NKV);
    }
}

void acts_free(td_acts *a)
{
    for (int i = 0; i < a->nowned; i++) a->be->free(a->owned[i]);
    for (int i = 0; i < a->nhost; i++) free(a->host_owned[i]);
    free(a->kv_off);
    free(a->x_host);
    memset(a, 0, sizeof *a);
}

td_layer_acts acts_layer(const td_acts *a, const td_config *c, int l)
{
    size_t n = (size_t)a->cap, C = c->hidden_size, F = td_config_dense_mlp_width(c);
    size_t NH = c->num_heads, NKV = c->num_kv_heads, QD = NH * c->head_dim, KVD = NKV * c->head_dim;
    td_layer_acts v;
    if (!a->save) {   /* one set of buffers, updated in place */
        v = (td_layer_acts){.x_in = a->x, .x_mid = a->x, .x_out = a->x, .xn1 = a->xn, .xn2 = a->xn,
                            .q = a->q, .k = a->k, .v = a->v, .q_raw = a->q, .k_raw = a->k,
                            .att = a->att, .gate = a->gate, .up = a->up, .act = a->gate};
        return v;
    }
    size_t L = a->save == TD_ACTS_ALL ? (size_t)l : 0;   /* the layer's slice (one under checkpointing) */
    v = (td_layer_acts){
        .x_in = a->x + (size_t)l * n * C, .x_mid = a->x_mid + L * n * C, .x_out = a->x + ((size_t)l + 1) * n * C,
        .xn1 = a->xn1 + L * n * C, .rstd1 = a->rstd1 + L * n,
        .q = a->q + L * n * QD, .k = a->k + L * n * KVD, .v = a->v + L * n * KVD,
        .att = a->att + L * n * QD, .lse = a->lse + L * n * NH,
        .xn2 = a->xn2 + L * n * C, .rstd2 = a->rstd2 + L * n,
        .gate = a->gate + L * n * F, .up = a->up + L * n * F, .act = a->act + L * n * F};
    v.q_raw = a->q_raw ? a->q_raw + L * n * QD : v.q;
    v.k_raw = a->k_raw ? a->k_raw + L * n * KVD : v.k;
    v.q_rstd = a->q_rstd ? a->q_rstd + L * n * NH : NULL;
    v.k_rstd = a->k_rstd ? a->k_rstd + L * n * NKV : NULL;
    return v;
}

void td_ops_init(td_ops *ctx, const td_backend *be)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->be = be;
    be->init(ctx);
}

/* x_out = x_in + y, then nout = rmsnorm(x_out). Under a recipe whose norm is "fused-add"
 * (FlashInfer's FusedAddRMSNormKernel, recipe.h) the norm reads the fp32 sum and the stream
 * keeps it rounded afterwards (scale by 1: the rounding alone); otherwise the residual op
 * rounds the sum and the norm reads that. */
static void add_then_norm(const td_ops *ops, float *x_out, const float *x_in, const float *y,
                          float *nout, float *rstd, const float *w, int N, int C, float eps)
{
    size_t n = (size_t)N * C;
    const td_recipe *r = ops->recipe;
    if (r && r->norm == TD_NORM_FUSED_ADD && !r->residual_fp32) {
        td_ops f32 = *ops;
        f32.recipe = NULL;
        residual_forward(&f32, x_out, x_in, y, n);
        rmsnorm_forward(ops, nout, rstd, x_out, w, N, C, eps);
        scale_forward(ops, x_out, 1.0f, n);
    } else {
        residual_forward(ops, x_out, x_in, y, n);
        rmsnorm_forward(ops, nout, rstd, x_out, w, N, C, eps);
    }
}

/* The per-layer observer reads the stream on the host: a device backend's rows are copied
 * down first (host memory on the CPU: as it is). */
static void layer_observe(const td_ops *ops, td_acts *a, int l, int N, const int *pos, const float *x,
                          int C)
{
    if (!ops->be->sync) {
        ops->layer_fn(ops->layer_user, l, N, ops->row_seq, pos, x);
        return;
    }
    if (!a->x_host) a->x_host = td_xmalloc((size_t)a->cap * C * sizeof(float));   /* once */
    ops->be->download(a->x_host, x, (size_t)N * C * sizeof(float));
    ops->layer_fn(ops->layer_user, l, N, ops->row_seq, pos, a->x_host);
}

/* Layer l's body from its attention input norm (la.xn1 = rmsnorm(la.x_in) already) to silu(gate)
 * * up; with tail, down_proj, the residual add and the next norm (or the final one), then the
 * observer and the progress. */
static void layer_body(const td_ops *ops, const td_model *m, td_acts *a, int l, const int *pos, int N,
                       const td_kv_store *kv, int tail)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, F = c->intermediate_size, NH = c->num_heads, NKV = c->num_kv_heads;
    int HD = c->head_dim, QD = NH * HD, KVD = NKV * HD;
    float eps = (float)c->rms_norm_eps;
    const td_model_weights *W = ops->w ? ops->w : &m->w;   /* the recipe's norms and biases */
    const td_wset *ws = ops->ws;                            /* its matrices (td_wmat) */
    const td_layer_weights *w = &W->layers[l];
    td_layer_acts la = acts_layer(a, c, l);
    float *kl = (float *)((char *)kv->k + (size_t)l * kv->layer_stride * kv->esize);
    float *vl = (float *)((char *)kv->v + (size_t)l * kv->layer_stride * kv->esize);

    /* attention sub-block */
    float *qkv_out[] = {la.q_raw, la.k_raw, la.v};
    td_wmat qkv_w[] = {*wset_mat(ws, l, TD_LORA_Q), *wset_mat(ws, l, TD_LORA_K), *wset_mat(ws, l, TD_LORA_V)};
    const float *qkv_b[] = {w->bq, w->bk, w->bv};
    int qkv_dim[] = {QD, KVD, KVD};
    matmul_forward_multi(ops, 3, qkv_out, la.xn1, qkv_w, qkv_b, N, C, qkv_dim);
    lora_forward(ops, l, TD_LORA_Q, la.q_raw, la.xn1, N);   /* unmerged adapters, if any */
    lora_forward(ops, l, TD_LORA_K, la.k_raw, la.xn1, N);
    lora_forward(ops, l, TD_LORA_V, la.v, la.xn1, N);
    if (w->q_norm && c->qk_norm_full) {   /* OLMoE: RMSNorm over each row's whole projection, before RoPE */
        rmsnorm_forward(ops, la.q, la.q_rstd, la.q_raw, w->q_norm, N, QD, eps);
        rmsnorm_forward(ops, la.k, la.k_rstd, la.k_raw, w->k_norm, N, KVD, eps);
    } else if (w->q_norm) {   /* Qwen3: RMSNorm over each head's HD values, before RoPE */
        rmsnorm_forward(ops, la.q, la.q_rstd, la.q_raw, w->q_norm, N * NH, HD, eps);
        rmsnorm_forward(ops, la.k, la.k_rstd, la.k_raw, w->k_norm, N * NKV, HD, eps);
    }
    rope_forward(ops, la.q, pos, m->inv_freq, N, NH, HD);
    rope_forward(ops, la.k, pos, m->inv_freq, N, NKV, HD);
    kv_write(ops, kl, la.k, a->kv_off, pos, N, KVD);
    kv_write(ops, vl, la.v, a->kv_off, pos, N, KVD);
    attention_forward(ops, la.att, la.lse, la.q, kl, vl, a->kv_off, pos, N, NH, NKV, HD, a->scores, a->max_keys);
    matmul_forward(ops, a->proj, la.att, wset_mat(ws, l, TD_LORA_O), NULL, N, QD, C);
    lora_forward(ops, l, TD_LORA_O, a->proj, la.att, N);
    add_then_norm(ops, la.x_mid, la.x_in, a->proj, la.xn2, la.rstd2, w->mlp_norm, N, C, eps);

    /* MLP sub-block: a mixture of experts (moe.c), or the dense SwiGLU */
    if (td_config_layer_moe(c, l)) {
        if (!tail) {   /* recomputation for a backward: the routing is what it needs kept */
            moe_route_only(ops, m, a, l, la.xn2, pos, N);
            return;
        }
        moe_forward(ops, m, a, l, la.xn2, pos, N, a->proj);
        goto residual;
    }
    float *gu_out[] = {la.gate, la.up};
    td_wmat gu_w[] = {*wset_mat(ws, l, TD_LORA_GATE), *wset_mat(ws, l, TD_LORA_UP)};
    int gu_dim[] = {F, F};
    matmul_forward_multi(ops, 2, gu_out, la.xn2, gu_w, NULL, N, C, gu_dim);
    lora_forward(ops, l, TD_LORA_GATE, la.gate, la.xn2, N);
    lora_forward(ops, l, TD_LORA_UP, la.up, la.xn2, N);
    swiglu_forward(ops, la.act, la.gate, la.up, N, F);
    if (!tail) return;
    matmul_forward(ops, a->proj, la.act, wset_mat(ws, l, TD_LORA_DOWN), NULL, N, F, C);
    lora_forward(ops, l, TD_LORA_DOWN, a->proj, la.act, N);
residual:
    if (l + 1 < c->num_layers) {   /* the next layer's first norm */
        td_layer_acts nx = acts_layer(a, c, l + 1);
        add_then_norm(ops, la.x_out, la.x_mid, a->proj, nx.xn1, nx.rstd1, W->layers[l + 1].attn_norm, N, C, eps);
    } else {                       /* the final norm */
        add_then_norm(ops, la.x_out, la.x_mid, a->proj, a->xn, a->rstd_f, W->final_norm, N, C, eps);
    }
    if (ops->layer_fn) layer_observe(ops, a, l, N, pos, la.x_out, C);
    if (ops->progress) td_progress_add(ops->progress, N, "token-layers");
}

void decoder_forward(const td_ops *ops, const td_model *m, td_acts *a, const int *tokens,
                     const int *pos, int N, const td_kv_store *kv)
{
    const td_config *c = &m->cfg;
    const td_model_weights *W = ops->w ? ops->w : &m->w;
    embedding_forward(ops, a->x, tokens, &ops->ws->embed, N, c->hidden_size);
    /* each layer's first norm is done by the previous layer's last residual add (or here) */
    td_layer_acts first = acts_layer(a, c, 0);
    rmsnorm_forward(ops, first.xn1, first.rstd1, first.x_in, W->layers[0].attn_norm, N, c->hidden_size,
                    (float)c->rms_norm_eps);
    for (int l = 0; l < c->num_layers; l++) layer_body(ops, m, a, l, pos, N, kv, 1);
    td_ops_sync(ops);   /* the host writes the row tables of the next step after this */
}

void decoder_recompute_layer(const td_ops *ops, const td_model *m, td_acts *a, int l, const int *pos, int N)
{
    const td_config *c = &m->cfg;
    const td_model_weights *W = ops->w ? ops->w : &m->w;
    td_layer_acts la = acts_layer(a, c, l);
    td_kv_store kv = {a->k, a->v, 0, sizeof(float)};   /* teacher forcing: the rows' own projections are the store */
    rmsnorm_forward(ops, la.xn1, la.rstd1, la.x_in, W->layers[l].attn_norm, N, c->hidden_size,
                    (float)c->rms_norm_eps);
    layer_body(ops, m, a, l, pos, N, &kv, 0);
}

void head_forward(const td_ops *ops, const td_model *m, float *logits, const float *h, int N,
                  int raw)
{
    td_ops head = td_ops_gemm(ops, ops->head, ops->qin, ops->gscratch);   /* the lm_head's recipe */
    matmul_forward(&head, logits, h, &ops->ws->lm_head, NULL, N, m->cfg.hidden_size, m->cfg.vocab_size);
    if (!raw) logsoftmax_forward(&head, logits, N, m->cfg.vocab_size);   /* in the logits' dtype */
    td_ops_sync(ops);   /* the caller reads the rows on the host */
}
