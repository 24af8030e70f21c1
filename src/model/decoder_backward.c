/* tidal — the backward of the decoder body (decoder.c), layer by layer in reverse, over the
 * op list's backward ops and the activations the forward kept (td_acts with save = 1):
 *
 *   final norm     dx  = rmsnorm_backward(dxn)                            (d of the last stream)
 *   per layer l = L-1 .. 0, with dx the gradient of the stream leaving the layer:
 *     MLP          dact = down^T dx;  dgate, dup = swiglu_backward(dact)
 *                  dxn2 = gate^T dgate + up^T dup;  dx += rmsnorm_backward(dxn2)   (dx of x_mid)
 *     attention    datt = o^T dx;  dq, dk, dv = attention_backward(datt)  (P from q, k, lse)
 *                  dq, dk = rope_backward;  (Qwen3) dq_raw, dk_raw = rmsnorm_backward per head
 *                  dxn1 = q^T dq + k^T dk + v^T dv (+ bias gradients);  dx += rmsnorm_backward(dxn1)
 *   embedding      dembed[tok] += dx
 * Weight gradients accumulate into the buffers given (NULL entries are frozen: not computed);
 * an unmerged LoRA adapter's A/B gradients come from lora_backward beside each projection.
 * The weights read are the ones the forward multiplied (the recipe's rounded copy). Under
 * gradient checkpointing (TD_ACTS_CHECKPOINT) each layer's activations are recomputed from the
 * stream that entered it just before its backward, bit for bit the forward's. */
#include "model_internal.h"

#include <stdlib.h>
#include <string.h>

#define G(p) ((float *)(p))   /* gradient buffers are carved as td_model_weights: writable */

static float *gbuf(td_grad_acts *g, size_t floats)
{
    float *p = g->be->alloc((floats ? floats : 1) * sizeof(float));   /* 0: a model without dense MLPs */
    g->owned[g->nowned++] = p;
    return p;
}

/* host memory on a device backend (NULL on the CPU backend, whose buffers are host memory) */
static float *ghost(td_grad_acts *g, size_t floats)
{
    if (backend_host_memory(g->be)) return NULL;
    float *p = td_xcalloc(floats ? floats : 1, sizeof(float));
    g->host_owned[g->nhost++] = p;
    return p;
}

/* a host mirror of backend buffer b (b itself on the CPU backend) */
static float *gmirror(td_grad_acts *g, float *b, size_t floats)
{
    float *h = ghost(g, floats);
    return h ? h : b;
}

void grad_acts_alloc(td_grad_acts *g, const td_config *c, const td_ops *ops, int cap, int max_keys,
                     int lora_rank)
{
    size_t n = (size_t)cap, C = c->hidden_size, F = td_config_dense_mlp_width(c);
    size_t QD = (size_t)c->num_heads * c->head_dim, KVD = (size_t)c->num_kv_heads * c->head_dim;
    memset(g, 0, sizeof *g);
    g->be = ops->be;
    g->dx = gbuf(g, n * C);
    g->dxn = gbuf(g, n * C);
    g->dq = gbuf(g, n * QD);
    g->dq_raw = gbuf(g, n * QD);
    g->dk = gbuf(g, n * KVD);
    g->dk_raw = gbuf(g, n * KVD);
    g->dv = gbuf(g, n * KVD);
    g->datt = gbuf(g, n * QD);
    g->dact = gbuf(g, n * F);
    g->dgate = gbuf(g, n * F);
    g->dup = gbuf(g, n * F);
    g->att_scratch = gbuf(g, (size_t)ops->nthreads * 2 * ATT_BLOCK * max_keys);
    if (c->num_experts > 0) {
        size_t FW = (size_t)c->moe_intermediate_size, E = c->num_experts, K = c->num_experts_per_tok;
        if ((size_t)c->shared_expert_intermediate_size > FW) FW = c->shared_expert_intermediate_size;
        g->moe_act = gbuf(g, n * FW);
        g->moe_dy = gbuf(g, n * C);
        g->moe_dact = gbuf(g, n * FW);
        g->moe_dgate = gbuf(g, n * FW);
        g->moe_dup = gbuf(g, n * FW);
        g->moe_dx = gbuf(g, n * C);
        g->moe_dlogits = gbuf(g, n * E);
        g->moe_dw = gbuf(g, n * K);
        g->moe_dw_h = gmirror(g, g->moe_dw, n * K);
        g->moe_dlogits_h = gmirror(g, g->moe_dlogits, n * E);
    }
    if (lora_rank > 0) {
        size_t wide = C > F ? C : F;
        if (QD > wide) wide = QD;
        if ((size_t)c->moe_intermediate_size > wide) wide = c->moe_intermediate_size;
        if ((size_t)c->shared_expert_intermediate_size > wide) wide = c->shared_expert_intermediate_size;
        g->lora = gbuf(g, n * (2 * (size_t)lora_rank + wide));
    }
}

void grad_acts_free(td_grad_acts *g)
{
    for (int i = 0; i < g->nowned; i++) g->be->free(g->owned[i]);
    for (int i = 0; i < g->nhost; i++) free(g->host_owned[i]);
    memset(g, 0, sizeof *g);
}

/* gradient buffers are the backend's (be->alloc: device memory on a GPU), zeroed there */
static void zero(const td_ops *ops, float *p, size_t n) { ops->be->zero(p, n * sizeof(float)); }

void decoder_backward(const td_ops *ops, const td_model *m, const td_acts *a, td_grad_acts *ga,
                      td_model_weights *grads, const lora_grad *lg, const int *tokens,
                      const int *pos, int N)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, F = c->intermediate_size, NH = c->num_heads, NKV = c->num_kv_heads;
    int HD = c->head_dim, QD = NH * HD, KVD = NKV * HD, L = c->num_layers;
    const td_model_weights *W = ops->w ? ops->w : &m->w;
    size_t nC = (size_t)N * C, nF = (size_t)N * F, nQ = (size_t)N * QD, nK = (size_t)N * KVD;
    float *dx = ga->dx, *dxn = ga->dxn;

    /* the final norm: dxn holds the gradient of its output (the lm_head's input) */
    zero(ops, dx, nC);
    rmsnorm_backward(ops, dx, G(grads->final_norm), dxn, a->x + (size_t)L * a->cap * C, W->final_norm,
                     a->rstd_f, N, C);
    for (int l = L - 1; l >= 0; l--) {
        const td_layer_weights *w = &W->layers[l];
        const td_layer_weights *gw = &grads->layers[l];
        if (a->save == TD_ACTS_CHECKPOINT)   /* gradient checkpointing: the layer's activations again */
            decoder_recompute_layer(ops, m, (td_acts *)a, l, pos, N);
        td_layer_acts la = acts_layer(a, c, l);

        if (td_config_layer_moe(c, l)) {   /* x_out = x_mid + moe(xn2) */
            zero(ops, dxn, nC);
            moe_backward(ops, m, (td_acts *)a, ga, gw, lg, l, la.xn2, dx, dxn, N);
            rmsnorm_backward(ops, dx, G(gw->mlp_norm), dxn, la.x_mid, w->mlp_norm, la.rstd2, N, C);
            goto attention;
        }
        /* MLP sub-block: x_out = x_mid + down(silu(gate(xn2)) * up(xn2)) */
        zero(ops, ga->dact, nF);
        matmul_backward(ops, ga->dact, G(gw->w_down), NULL, dx, la.act, w->w_down, N, F, C);
        lora_backward(ops, l, TD_LORA_DOWN, ga->dact, dx, la.act, N, lg, ga->lora);
        zero(ops, ga->dgate, nF);
        zero(ops, ga->dup, nF);
        swiglu_backward(ops, ga->dgate, ga->dup, ga->dact, la.gate, la.up, N, F);
        zero(ops, dxn, nC);
        matmul_backward(ops, dxn, G(gw->w_gate), NULL, ga->dgate, la.xn2, w->w_gate, N, C, F);
        matmul_backward(ops, dxn, G(gw->w_up), NULL, ga->dup, la.xn2, w->w_up, N, C, F);
        lora_backward(ops, l, TD_LORA_GATE, dxn, ga->dgate, la.xn2, N, lg, ga->lora);
        lora_backward(ops, l, TD_LORA_UP, dxn, ga->dup, la.xn2, N, lg, ga->lora);
        rmsnorm_backward(ops, dx, G(gw->mlp_norm), dxn, la.x_mid, w->mlp_norm, la.rstd2, N, C);

    attention:
        /* attention sub-block: x_mid = x_in + o(attention(rope(q), rope(k), v)) */
        zero(ops, ga->datt, nQ);
        matmul_backward(ops, ga->datt, G(gw->wo), NULL, dx, la.att, w->wo, N, QD, C);
        lora_backward(ops, l, TD_LORA_O, ga->datt, dx, la.att, N, lg, ga->lora);
        zero(ops, ga->dq, nQ);
        zero(ops, ga->dk, nK);
        zero(ops, ga->dv, nK);
        attention_backward(ops, ga->dq, ga->dk, ga->dv, ga->datt, la.q, la.k, la.v, la.att, la.lse,
                           pos, N, NH, NKV, HD, ga->att_scratch, a->max_keys);
        rope_backward(ops, ga->dq, pos, m->inv_freq, N, NH, HD);
        rope_backward(ops, ga->dk, pos, m->inv_freq, N, NKV, HD);
        float *dq = ga->dq, *dk = ga->dk;
        if (w->q_norm) {   /* Qwen3: per-head RMSNorm of the projections; OLMoE: over each whole row */
            int full = c->qk_norm_full;
            zero(ops, ga->dq_raw, nQ);
            zero(ops, ga->dk_raw, nK);
            rmsnorm_backward(ops, ga->dq_raw, G(gw->q_norm), dq, la.q_raw, w->q_norm, la.q_rstd,
                             full ? N : N * NH, full ? QD : HD);
            rmsnorm_backward(ops, ga->dk_raw, G(gw->k_norm), dk, la.k_raw, w->k_norm, la.k_rstd,
                             full ? N : N * NKV, full ? KVD : HD);
            dq = ga->dq_raw;
            dk = ga->dk_raw;
        }
        zero(ops, dxn, nC);
        matmul_backward(ops, dxn, G(gw->wq), G(gw->bq), dq, la.xn1, w->wq, N, C, QD);
        matmul_backward(ops, dxn, G(gw->wk), G(gw->bk), dk, la.xn1, w->wk, N, C, KVD);
        matmul_backward(ops, dxn, G(gw->wv), G(gw->bv), ga->dv, la.xn1, w->wv, N, C, KVD);
        lora_backward(ops, l, TD_LORA_Q, dxn, dq, la.xn1, N, lg, ga->lora);
        lora_backward(ops, l, TD_LORA_K, dxn, dk, la.xn1, N, lg, ga->lora);
        lora_backward(ops, l, TD_LORA_V, dxn, ga->dv, la.xn1, N, lg, ga->lora);
        rmsnorm_backward(ops, dx, G(gw->attn_norm), dxn, la.x_in, w->attn_norm, la.rstd1, N, C);
    }
    if (grads->embed) embedding_backward(ops, G(grads->embed), dx, tokens, N, C);
}
