/* tidal — a mixture-of-experts layer's MLP (Qwen2-MoE, Qwen3-MoE, Mixtral), as transformers'
 * eager sparse-MoE blocks compute it (MixtralSparseMoeBlock, Qwen2MoeSparseMoeBlock,
 * Qwen3MoeSparseMoeBlock), with the recipe's rounding points:
 *
 *   logits = router(x)                     a GEMM like any other: output in the GEMM dtype D
 *   p      = softmax(logits) in fp32       F.softmax(router_logits, dim=1, dtype=torch.float)
 *   top-k  of p, largest first             torch.topk; equal values: the lower expert first
 *   w      = p_sel / sum p_sel             when norm_topk_prob (Mixtral: always), in fp32
 *   w      = R(w)                          routing_weights.to(hidden_states.dtype)
 *   out    = 0; for e = 0 .. E-1, for each row i that chose e:
 *            out[i] = R(out[i] + R(expert_e(x[i]) * w))      index_add_ in the stream dtype
 *   Qwen2-MoE: out = R(out + D(D(sigmoid(shared_gate(x))) * shared_expert(x)))
 *
 * where expert_e(x) = down(silu(gate(x)) * up(x)) runs through the same ops as the dense MLP on the
 * rows routed to e (gathered in row order), and R rounds to the stream's dtype: the activations
 * dtype D, or fp32 under an autocast recipe (residual_fp32: the hidden states are fp32 there, so
 * the routing weights stay fp32 and bf16 expert outputs are promoted). Under the fp32 reference
 * every rounding is the identity.
 *
 * Routing runs on the host (host memory on the CPU backend; a device backend refuses MoE models,
 * td_model_set_device). Each layer reports its routing to ops->moe_fn; ops->moe_replay may supply
 * the experts instead (routing replay): they are then weighted by this path's own probabilities,
 * renormalised over them when norm_topk_prob, as R3 defines it. */
#include "model_internal.h"

#include <math.h>
#include <string.h>

/* The K largest of p (E values) into sel, largest first; equal values: the lower index first. */
static void top_k(const float *p, int E, int K, int *sel)
{
    for (int j = 0; j < K; j++) {
        int best = -1;
        for (int e = 0; e < E; e++) {
            int taken = 0;
            for (int q = 0; q < j && !taken; q++) taken = sel[q] == e;
            if (taken) continue;
            if (best < 0 || p[e] > p[best] || (isnan(p[best]) && !isnan(p[e]))) best = e;
        }
        sel[j] = best;
    }
}

/* softmax over one row of E logits in fp32: max, exp of the differences, their sum in order, the
 * quotients (torch's CPU softmax takes the same steps; its exp and its vectorised sum may differ in
 * the last bit) */
static void softmax_row(const float *l, int E, float *p)
{
    float mx = l[0];
    for (int e = 1; e < E; e++) mx = l[e] > mx ? l[e] : mx;
    float sum = 0.0f;
    for (int e = 0; e < E; e++) sum += p[e] = expf(l[e] - mx);
    for (int e = 0; e < E; e++) p[e] = p[e] / sum;
}

void moe_route(const td_ops *ops, const td_config *c, int l, int N, const int *pos, const float *logits,
               float *probs, int *experts, float *weights)
{
    int E = c->num_experts, K = c->num_experts_per_tok;
    const td_recipe *r = ops->recipe;
    td_format R = !r || r->residual_fp32 ? TD_F32 : r->activations;
    for (int i = 0; i < N; i++) softmax_row(logits + (size_t)i * E, E, probs + (size_t)i * E);
    int moe_layer = td_config_moe_index(c, l);
    int replayed = ops->moe_replay &&
                   ops->moe_replay(ops->moe_replay_user, moe_layer, N, ops->row_seq, pos, K, experts);
    for (int i = 0; i < N; i++) {
        const float *p = probs + (size_t)i * E;
        int *sel = experts + (size_t)i * K;
        if (!replayed) top_k(p, E, K, sel);
        float *w = weights + (size_t)i * K, sum = 0.0f;
        for (int j = 0; j < K; j++) sum += w[j] = p[sel[j]];
        for (int j = 0; j < K; j++) {
            if (c->norm_topk_prob) w[j] = w[j] / sum;
            w[j] = td_round(R, w[j]);
        }
    }
    if (ops->moe_fn) {
        td_moe_route rt = {.layer = l, .moe_layer = moe_layer, .N = N, .K = K, .E = E, .seq = ops->row_seq,
                           .pos = pos, .experts = experts, .probs = probs, .replayed = replayed};
        ops->moe_fn(ops->moe_user, &rt);
    }
}

void moe_forward(const td_ops *ops, const td_model *m, td_acts *a, int l, const float *x, const int *pos, int N,
                 float *out)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, FE = c->moe_intermediate_size;
    int FS = c->shared_expert_intermediate_size;
    const td_wset *ws = ops->ws;
    const td_recipe *r = ops->recipe;
    td_format D = r ? r->activations : TD_F32, R = !r || r->residual_fp32 ? TD_F32 : D;

    matmul_forward(ops, a->moe_logits, x, wset_moe(ws, l, TD_MOE_ROUTER), NULL, N, C, E);
    td_ops_sync(ops);
    moe_route(ops, c, l, N, pos, a->moe_logits, a->moe_probs, a->moe_experts, a->moe_weights);

    memset(a->moe_acc, 0, (size_t)N * C * sizeof(float));
    for (int e = 0; e < E; e++) {
        int ne = 0;   /* the rows that chose e, in row order, and which of their k slots */
        for (int i = 0; i < N; i++)
            for (int j = 0; j < K; j++)
                if (a->moe_experts[(size_t)i * K + j] == e) {
                    a->moe_rows[ne] = i * K + j;
                    memcpy(a->moe_in + (size_t)ne * C, x + (size_t)i * C, (size_t)C * sizeof(float));
                    ne++;
                }
        if (!ne) continue;
        float *gu_out[] = {a->moe_gate, a->moe_up};
        td_wmat gu_w[] = {*wset_moe(ws, l, TD_MOE_EXPERTS + 3 * e), *wset_moe(ws, l, TD_MOE_EXPERTS + 3 * e + 1)};
        int gu_dim[] = {FE, FE};
        matmul_forward_multi(ops, 2, gu_out, a->moe_in, gu_w, NULL, ne, C, gu_dim);
        swiglu_forward(ops, a->moe_gate, a->moe_gate, a->moe_up, ne, FE);
        matmul_forward(ops, a->moe_y, a->moe_gate, wset_moe(ws, l, TD_MOE_EXPERTS + 3 * e + 2), NULL, ne, FE, C);
        td_ops_sync(ops);
        for (int q = 0; q < ne; q++) {
            int i = a->moe_rows[q] / K;
            float w = a->moe_weights[a->moe_rows[q]];
            const float *y = a->moe_y + (size_t)q * C;
            float *o = a->moe_acc + (size_t)i * C;
            for (int h = 0; h < C; h++) o[h] = td_round(R, o[h] + td_round(R, y[h] * w));
        }
    }
    if (FS > 0) {   /* Qwen2-MoE's shared expert, on every row, behind its sigmoid gate */
        float *gu_out[] = {a->moe_gate, a->moe_up};
        td_wmat gu_w[] = {*wset_moe(ws, l, TD_MOE_SH_GATE), *wset_moe(ws, l, TD_MOE_SH_UP)};
        int gu_dim[] = {FS, FS};
        matmul_forward_multi(ops, 2, gu_out, x, gu_w, NULL, N, C, gu_dim);
        swiglu_forward(ops, a->moe_gate, a->moe_gate, a->moe_up, N, FS);
        matmul_forward(ops, a->moe_y, a->moe_gate, wset_moe(ws, l, TD_MOE_SH_DOWN), NULL, N, FS, C);
        matmul_forward(ops, a->moe_logits, x, wset_moe(ws, l, TD_MOE_SH_ROUTE), NULL, N, C, 1);
        td_ops_sync(ops);
        for (int i = 0; i < N; i++) {
            float g = td_round(D, 1.0f / (1.0f + expf(-a->moe_logits[i])));   /* F.sigmoid on the D gate */
            const float *y = a->moe_y + (size_t)i * C;
            float *o = a->moe_acc + (size_t)i * C;
            for (int h = 0; h < C; h++) o[h] = td_round(R, o[h] + td_round(D, g * y[h]));
        }
    }
    memcpy(out, a->moe_acc, (size_t)N * C * sizeof(float));
}
