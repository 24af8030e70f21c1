/* tidal — the decoder body shared by both structures: embedding, L pre-norm layers
 *   x += o_proj(attention(rope(q), rope(k), v))      q,k,v = proj(rmsnorm(x)) (+ bias, q/k norm)
 *   x += down(silu(gate(rmsnorm(x))) * up(rmsnorm(x)))
 * and the final norm; then the lm_head with log-softmax. Token rows carry their own position
 * and the place of their sequence's keys/values, so the same code runs whole packed sequences
 * (teacher forcing) and one new token per KV-cache slot (decode). An unmerged LoRA adapter adds
 * its branch right after each projection it adapts (lora_run.c). */
#include "model_internal.h"

#include <omp.h>
#include <stdlib.h>
#include <string.h>

void acts_alloc(td_acts *a, const td_config *c, const td_ops *ops, int cap, int max_keys)
{
    size_t n = (size_t)cap, C = c->hidden_size, F = c->intermediate_size;
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    a->cap = cap;
    a->max_keys = max_keys;
    a->x = td_xmalloc(n * C * sizeof(float));
    a->xn = td_xmalloc(n * C * sizeof(float));
    a->q = td_xmalloc(n * QD * sizeof(float));
    a->k = td_xmalloc(n * KVD * sizeof(float));
    a->v = td_xmalloc(n * KVD * sizeof(float));
    a->att = td_xmalloc(n * QD * sizeof(float));
    a->proj = td_xmalloc(n * C * sizeof(float));
    a->gate = td_xmalloc(n * F * sizeof(float));
    a->up = td_xmalloc(n * F * sizeof(float));
    a->scores = td_xmalloc((size_t)ops->nthreads * ATT_BLOCK * max_keys * sizeof(float));
    a->kv_off = td_xmalloc(n * sizeof(size_t));
}

void acts_free(td_acts *a)
{
    free(a->x); free(a->xn); free(a->q); free(a->k); free(a->v); free(a->att);
    free(a->proj); free(a->gate); free(a->up); free(a->scores); free(a->kv_off);
    memset(a, 0, sizeof *a);
}

void td_ops_init(td_ops *ctx, const td_backend *be)
{
    memset(ctx, 0, sizeof *ctx);
    ctx->be = be;
    be->init(ctx);
}

void decoder_forward(const td_ops *ops, const td_model *m, td_acts *a, const int *tokens,
                     const int *pos, int N, const td_kv_store *kv)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, F = c->intermediate_size, NH = c->num_heads, NKV = c->num_kv_heads;
    int HD = c->head_dim, QD = NH * HD, KVD = NKV * HD;
    float eps = (float)c->rms_norm_eps;

    const td_model_weights *W = ops->w ? ops->w : &m->w;   /* the recipe's rounded weights */
    embedding_forward(ops, a->x, tokens, W->embed, N, C);
    for (int l = 0; l < c->num_layers; l++) {
        const td_layer_weights *w = &W->layers[l];
        float *kl = kv->k + (size_t)l * kv->layer_stride;
        float *vl = kv->v + (size_t)l * kv->layer_stride;

        /* attention sub-block */
        rmsnorm_forward(ops, a->xn, NULL, a->x, w->attn_norm, N, C, eps);
        float *qkv_out[] = {a->q, a->k, a->v};
        const float *qkv_w[] = {w->wq, w->wk, w->wv}, *qkv_b[] = {w->bq, w->bk, w->bv};
        int qkv_dim[] = {QD, KVD, KVD};
        matmul_forward_multi(ops, 3, qkv_out, a->xn, qkv_w, qkv_b, N, C, qkv_dim);
        lora_forward(ops, l, TD_LORA_Q, a->q, a->xn, N);   /* unmerged adapters, if any */
        lora_forward(ops, l, TD_LORA_K, a->k, a->xn, N);
        lora_forward(ops, l, TD_LORA_V, a->v, a->xn, N);
        if (w->q_norm) {  /* Qwen3: RMSNorm over each head's HD values, before RoPE */
            rmsnorm_forward(ops, a->q, NULL, a->q, w->q_norm, N * NH, HD, eps);
            rmsnorm_forward(ops, a->k, NULL, a->k, w->k_norm, N * NKV, HD, eps);
        }
        rope_forward(ops, a->q, pos, m->inv_freq, N, NH, HD);
        rope_forward(ops, a->k, pos, m->inv_freq, N, NKV, HD);
        kv_write(ops, kl, a->k, a->kv_off, pos, N, KVD);
        kv_write(ops, vl, a->v, a->kv_off, pos, N, KVD);
        attention_forward(ops, a->att, NULL, a->q, kl, vl, a->kv_off, pos, N, NH, NKV, HD,
                          a->scores, a->max_keys);
        matmul_forward(ops, a->proj, a->att, w->wo, NULL, N, QD, C);
        lora_forward(ops, l, TD_LORA_O, a->proj, a->att, N);
        residual_forward(ops, a->x, a->x, a->proj, (size_t)N * C);

        /* MLP sub-block */
        rmsnorm_forward(ops, a->xn, NULL, a->x, w->mlp_norm, N, C, eps);
        float *gu_out[] = {a->gate, a->up};
        const float *gu_w[] = {w->w_gate, w->w_up};
        int gu_dim[] = {F, F};
        matmul_forward_multi(ops, 2, gu_out, a->xn, gu_w, NULL, N, C, gu_dim);
        lora_forward(ops, l, TD_LORA_GATE, a->gate, a->xn, N);
        lora_forward(ops, l, TD_LORA_UP, a->up, a->xn, N);
        swiglu_forward(ops, a->gate, a->gate, a->up, N, F);
        matmul_forward(ops, a->proj, a->gate, w->w_down, NULL, N, F, C);
        lora_forward(ops, l, TD_LORA_DOWN, a->proj, a->gate, N);
        residual_forward(ops, a->x, a->x, a->proj, (size_t)N * C);
        if (ops->layer_fn) ops->layer_fn(ops->layer_user, l, N, ops->row_seq, pos, a->x);
    }
    rmsnorm_forward(ops, a->xn, NULL, a->x, W->final_norm, N, C, eps);
}

void head_forward(const td_ops *ops, const td_model *m, float *logits, const float *h, int N,
                  int raw)
{
    const td_model_weights *W = ops->w ? ops->w : &m->w;
    td_ops head = td_ops_gemm(ops, ops->head, ops->qin, ops->gscratch);   /* the lm_head's recipe */
    matmul_forward(&head, logits, h, W->lm_head, NULL, N, m->cfg.hidden_size, m->cfg.vocab_size);
    if (!raw) logsoftmax_forward(ops, logits, N, m->cfg.vocab_size);
}
