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
 * Under a "fused" recipe (vLLM's fused_moe, recipe.h "moe") the weights stay fp32, expert e's down
 * GEMM output is D(acc * w) from its fp32 accumulator acc (MUL_ROUTED_WEIGHT), and each row's k
 * outputs are summed in top-k order: o = 0; o = D(o + v_j) for j = 0 .. K-1 (moe_sum_kernel's
 * scalar_t accumulator); the shared expert as above.
 *
 * Routing runs on the host, as do the gather of each expert's rows and the combine; the GEMMs and
 * SwiGLU run on the path's backend. On a device backend (CUDA) the layer's input rows, the router
 * logits and each expert's output rows come down (be->download), each expert's gathered rows and
 * the layer's output go up (td_acts' host mirrors); on the CPU backend the mirrors are the buffers.
 * The same host arithmetic on both, so a device changes only what its GEMMs and SwiGLU change.
 * Each layer reports its routing to ops->moe_fn; ops->moe_replay may supply the experts instead
 * (routing replay): they are then weighted by this path's own probabilities, renormalised over
 * them when norm_topk_prob, as R3 defines it. */
#include "model_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* backend buffer d (n floats) on the host: h, its mirror, filled (d itself on the CPU backend) */
static const float *down_rows(const td_ops *ops, float *h, const float *d, size_t n)
{
    if (h == d) return d;
    td_ops_sync(ops);
    ops->be->download(h, d, n * sizeof(float));
    return h;
}

/* host rows h (n floats) into backend buffer d (nothing on the CPU backend, where h is d) */
static void up_rows(const td_ops *ops, float *d, const float *h, size_t n)
{
    if (h != d) ops->be->upload(d, h, n * sizeof(float));
}

/* whether the layer runs as vLLM's fused_moe: a fused recipe over a rounded stream */
static int moe_fused(const td_recipe *r)
{
    return r && r->moe_fused && !r->residual_fp32 && r->activations != TD_F32 && !td_recipe_is_plain_fp32(r);
}

/* o = R(o + X(y * w)) over n values, as rows (td_round_row: td_round's bits); tmp holds n */
static void add_scaled_rounded(td_format X, td_format R, float *o, const float *y, float w, size_t n, float *tmp)
{
    for (size_t h = 0; h < n; h++) tmp[h] = y[h] * w;
    td_round_row(X, tmp, tmp, n, TD_SATFINITE);
    for (size_t h = 0; h < n; h++) tmp[h] = o[h] + tmp[h];
    td_round_row(R, tmp, o, n, TD_SATFINITE);
}

void td_moe_top_k(const float *p, int E, int K, int *sel)
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
    if (moe_fused(r)) R = TD_F32;   /* topk_softmax's fp32 weights */
    for (int i = 0; i < N; i++) softmax_row(logits + (size_t)i * E, E, probs + (size_t)i * E);
    int moe_layer = td_config_moe_index(c, l);
    int replayed = ops->moe_replay &&
                   ops->moe_replay(ops->moe_replay_user, moe_layer, N, ops->row_seq, pos, K, experts);
    for (int i = 0; i < N; i++) {
        const float *p = probs + (size_t)i * E;
        int *sel = experts + (size_t)i * K;
        if (!replayed || sel[0] < 0) td_moe_top_k(p, E, K, sel);   /* a position the replay's source never routed */
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

/* The routing buffers of layer l: its saved slices when the forward keeps activations for a
 * backward, else the one layer's scratch. */
static void route_bufs(const td_acts *a, const td_config *c, int l, float **probs, int **experts, float **weights)
{
    size_t E = c->num_experts, K = c->num_experts_per_tok, cap = a->cap;
    if (!a->save) {
        *probs = a->moe_probs;
        *experts = a->moe_experts;
        *weights = a->moe_weights;
        return;
    }
    size_t sl = a->save == TD_ACTS_ALL ? (size_t)l : 0;
    *probs = a->moe_probs_s + sl * cap * E;
    *experts = a->moe_experts_s + sl * cap * K;
    *weights = a->moe_weights_s + sl * cap * K;
}

/* whether the router GEMM runs as Megatron's fp32 router (recipe.h "router": "fp32") */
static int router_fp32(const td_recipe *r)
{
    return r && r->router_fp32 && !td_recipe_is_plain_fp32(r);
}

/* the ops of the router GEMM: the path's, or under "router": "fp32" the same GEMMs with fp32
 * operands (the stream's rows and the prepared weight as they are, widened) and an fp32 output,
 * RouterGatingLinearFunction's linear(x.to(fp32), W.to(fp32)); rr holds that recipe */
static td_ops router_ops(const td_ops *ops, td_recipe *rr)
{
    if (!router_fp32(ops->recipe)) return *ops;
    *rr = *ops->recipe;
    rr->activations = rr->gemm_inputs = rr->weights = TD_F32;
    rr->accumulate = TD_ACC_FP32;
    return td_ops_gemm(ops, rr, ops->qin, ops->gscratch);
}

void moe_route_only(const td_ops *ops, const td_model *m, td_acts *a, int l, const float *x, const int *pos, int N)
{
    const td_config *c = &m->cfg;
    float *probs, *weights;
    int *experts;
    route_bufs(a, c, l, &probs, &experts, &weights);
    td_recipe rr;
    td_ops rops = router_ops(ops, &rr);
    matmul_forward(&rops, a->moe_logits, x, wset_moe(ops->ws, l, TD_MOE_ROUTER), NULL, N, c->hidden_size, c->num_experts);
    td_ops_sync(ops);
    moe_route(ops, c, l, N, pos, down_rows(ops, a->moe_logits_h, a->moe_logits, (size_t)N * c->num_experts), probs,
              experts, weights);
}

/* The rows that chose expert e, in row order, gathered into a->moe_in (from x, host rows);
 * a->moe_rows[q] = i * K + j for the q-th (row i, top-k slot j). Returns their number. */
static int gather(const td_ops *ops, const td_acts *a, const int *experts, const float *x, int N, int K, int C, int e)
{
    int ne = 0;
    for (int i = 0; i < N; i++)
        for (int j = 0; j < K; j++)
            if (experts[(size_t)i * K + j] == e) {
                a->moe_rows[ne] = i * K + j;
                memcpy(a->moe_in_h + (size_t)ne * C, x + (size_t)i * C, (size_t)C * sizeof(float));
                ne++;
            }
    up_rows(ops, a->moe_in, a->moe_in_h, (size_t)ne * C);
    return ne;
}

/* One SwiGLU expert on n rows of in: gate and up into a->moe_gate / a->moe_up, silu(gate) * up into
 * act, down into a->moe_y (the dense MLP's ops, in its order); an unmerged LoRA's branches beside
 * each projection, as in the dense MLP (lo: the LoRA slot of the gate, lora.h, up and down after it). */
static void expert_forward_down(const td_ops *ops, const td_ops *down, td_acts *a, const td_wmat *wg, const td_wmat *wu,
                                const td_wmat *wd, const float *in, float *act, int n, int C, int FI, int l, int lo)
{
    float *gu_out[] = {a->moe_gate, a->moe_up};
    td_wmat gu_w[] = {*wg, *wu};
    int gu_dim[] = {FI, FI};
    matmul_forward_multi(ops, 2, gu_out, in, gu_w, NULL, n, C, gu_dim);
    lora_forward(ops, l, lo, a->moe_gate, in, n);
    lora_forward(ops, l, lo < 0 ? -1 : lo + 1, a->moe_up, in, n);
    swiglu_forward(ops, act, a->moe_gate, a->moe_up, n, FI);
    matmul_forward(down, a->moe_y, act, wd, NULL, n, FI, C);
    lora_forward(ops, l, lo < 0 ? -1 : lo + 2, a->moe_y, act, n);
    td_ops_sync(ops);
}

/* Qwen2-MoE's shared expert of layer l on n rows (its LoRA slots: the dense MLP's) */
static void shared_forward(const td_ops *ops, td_acts *a, int l, const float *in, float *act, int n, int C, int FS)
{
    const td_wset *ws = ops->ws;
    expert_forward_down(ops, ops, a, wset_moe(ws, l, TD_MOE_SH_GATE), wset_moe(ws, l, TD_MOE_SH_UP),
                        wset_moe(ws, l, TD_MOE_SH_DOWN), in, act, n, C, FS, l, TD_LORA_GATE);
}

/* Expert e of MoE layer l on the rows that chose it: gathered (a->moe_rows, a->moe_in) from x (the
 * layer's input rows on the host), then run (act: silu(gate) * up; a->moe_y the output rows, and
 * a->moe_y_h their host copy). Returns the number of rows (0: none chose e). */
static int routed_expert_down(const td_ops *ops, const td_ops *down, td_acts *a, const td_config *c, int l, int e,
                              const int *experts, const float *x, int N, float *act)
{
    int C = c->hidden_size, K = c->num_experts_per_tok;
    int ne = gather(ops, a, experts, x, N, K, C, e);
    if (ne)
        expert_forward_down(ops, down, a, wset_moe(ops->ws, l, TD_MOE_EXPERTS + 3 * e),
                            wset_moe(ops->ws, l, TD_MOE_EXPERTS + 3 * e + 1), wset_moe(ops->ws, l, TD_MOE_EXPERTS + 3 * e + 2),
                            a->moe_in, act, ne, C, c->moe_intermediate_size, l, TD_LORA_NMOD + 3 * e);
    if (ne) down_rows(ops, a->moe_y_h, a->moe_y, (size_t)ne * C);
    return ne;
}

static int routed_expert(const td_ops *ops, td_acts *a, const td_config *c, int l, int e, const int *experts,
                         const float *x, int N, float *act)
{
    return routed_expert_down(ops, ops, a, c, l, e, experts, x, N, act);
}

void moe_forward(const td_ops *ops, const td_model *m, td_acts *a, int l, const float *x, const int *pos, int N,
                 float *out)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    int FS = c->shared_expert_intermediate_size;
    const td_wset *ws = ops->ws;
    const td_recipe *r = ops->recipe;
    td_format D = r ? r->activations : TD_F32, R = !r || r->residual_fp32 ? TD_F32 : D;
    size_t nC = (size_t)N * C;
    float *probs, *weights;
    int *experts;
    route_bufs(a, c, l, &probs, &experts, &weights);
    moe_route_only(ops, m, a, l, x, pos, N);
    /* the host's rows: x and out themselves on the CPU backend, mirrors on a device */
    const float *xh = a->moe_x_h ? down_rows(ops, a->moe_x_h, x, nC) : x;
    float *oh = a->moe_out_h ? a->moe_out_h : out;

    memset(oh, 0, nC * sizeof(float));
    if (moe_fused(r)) {   /* vLLM's fused_moe: D(acc * w) per (row, slot), then moe_sum in top-k order */
        td_recipe acc_r = *r;
        acc_r.activations = TD_F32;   /* the down GEMM's fp32 accumulator, unrounded */
        td_ops down = td_ops_gemm(ops, &acc_r, ops->qin, ops->gscratch);
        float *v = td_xmalloc((size_t)N * K * C * sizeof(float));
        for (int e = 0; e < E; e++) {
            int ne = routed_expert_down(ops, &down, a, c, l, e, experts, xh, N, a->moe_gate);
            for (int q = 0; q < ne; q++) {
                float w = weights[a->moe_rows[q]];
                const float *y = a->moe_y_h + (size_t)q * C;
                float *vq = v + (size_t)a->moe_rows[q] * C;
                for (int h = 0; h < C; h++) vq[h] = y[h] * w;
                td_round_row(D, vq, vq, (size_t)C, TD_SATFINITE);
            }
        }
        moe_sum_topk(D, N, K, C, v, oh);
        free(v);
    }
    float *tmp = td_xmalloc((size_t)C * sizeof(float));
    for (int e = 0; e < E && !moe_fused(r); e++) {
        int ne = routed_expert(ops, a, c, l, e, experts, xh, N, a->moe_gate);
        if (!ne) continue;
        for (int q = 0; q < ne; q++)   /* o = R(o + R(y w)) */
            add_scaled_rounded(R, R, oh + (size_t)(a->moe_rows[q] / K) * C, a->moe_y_h + (size_t)q * C,
                               weights[a->moe_rows[q]], (size_t)C, tmp);
    }
    if (FS > 0) {   /* Qwen2-MoE's shared expert, on every row, behind its sigmoid gate */
        shared_forward(ops, a, l, x, a->moe_gate, N, C, FS);
        matmul_forward(ops, a->moe_logits, x, wset_moe(ws, l, TD_MOE_SH_ROUTE), NULL, N, C, 1);
        td_ops_sync(ops);
        const float *yh = down_rows(ops, a->moe_y_h, a->moe_y, nC);
        const float *zh = down_rows(ops, a->moe_logits_h, a->moe_logits, (size_t)N);
        for (int i = 0; i < N; i++) {   /* o = R(o + D(g y)) */
            float g = td_round(D, 1.0f / (1.0f + expf(-zh[i])));   /* F.sigmoid on the D gate */
            add_scaled_rounded(D, R, oh + (size_t)i * C, yh + (size_t)i * C, g, (size_t)C, tmp);
        }
    }
    free(tmp);
    up_rows(ops, out, oh, nC);
}

#define G(p) ((float *)(p))   /* gradient buffers are carved as td_model_weights: writable */

static double dot(const float *x, const float *y, int n)
{
    double s = 0;
    for (int h = 0; h < n; h++) s += (double)x[h] * y[h];
    return s;
}

/* One SwiGLU expert backwards on its n rows (run again first: expert_forward_down): dy (n, C) the
 * gradient of its output rows; the gradient of its input rows into ga->moe_dx (n, C, written);
 * weight gradients into g[0..2] (gate, up, down; NULL = frozen). w: the fp32 weights the GEMMs read.
 * An unmerged LoRA at slots lo, lo + 1, lo + 2 of layer l: its A/B gradients into lg. */
static void expert_backward(const td_ops *ops, td_acts *a, td_grad_acts *ga, const float *const *w, float *const *g,
                            const float *in, int n, int C, int FI, int l, int lo, const lora_grad *lg)
{
    size_t nF = (size_t)n * FI;
    const td_backend *be = ops->be;
    be->zero(ga->moe_dact, nF * sizeof(float));
    matmul_backward(ops, ga->moe_dact, g[2], NULL, ga->moe_dy, ga->moe_act, w[2], n, FI, C);
    lora_backward(ops, l, lo + 2, ga->moe_dact, ga->moe_dy, ga->moe_act, n, lg, ga->lora);
    be->zero(ga->moe_dgate, nF * sizeof(float));
    be->zero(ga->moe_dup, nF * sizeof(float));
    swiglu_backward(ops, ga->moe_dgate, ga->moe_dup, ga->moe_dact, a->moe_gate, a->moe_up, n, FI);
    be->zero(ga->moe_dx, (size_t)n * C * sizeof(float));
    matmul_backward(ops, ga->moe_dx, g[0], NULL, ga->moe_dgate, in, w[0], n, C, FI);
    matmul_backward(ops, ga->moe_dx, g[1], NULL, ga->moe_dup, in, w[1], n, C, FI);
    lora_backward(ops, l, lo, ga->moe_dx, ga->moe_dgate, in, n, lg, ga->lora);
    lora_backward(ops, l, lo + 1, ga->moe_dx, ga->moe_dup, in, n, lg, ga->lora);
}

void moe_backward(const td_ops *ops, const td_model *m, td_acts *a, td_grad_acts *ga, const td_layer_weights *gw,
                  const lora_grad *lg, int l, const float *xn2, const float *dout, float *dxn, int N)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok, FE = c->moe_intermediate_size;
    int FS = c->shared_expert_intermediate_size;
    const td_model_weights *W = ops->w ? ops->w : &m->w;
    const td_layer_weights *w = &W->layers[l];
    const td_recipe *r = ops->recipe;
    td_format D = r ? r->activations : TD_F32;
    size_t nC = (size_t)N * C;
    float *probs, *weights;
    int *experts;
    route_bufs(a, c, l, &probs, &experts, &weights);
    td_ops_sync(ops);
    /* the host's rows (the buffers themselves on the CPU backend) */
    const float *xh = ga->moe_xn_h ? down_rows(ops, ga->moe_xn_h, xn2, nC) : xn2;
    const float *douth = ga->moe_dout_h ? down_rows(ops, ga->moe_dout_h, dout, nC) : dout;
    float *dxnh = ga->moe_dxn_h ? (float *)down_rows(ops, ga->moe_dxn_h, dxn, nC) : dxn;

    /* out_i = sum_j w_ij expert_{e_ij}(x_i): each expert's rows again, then backwards */
    memset(ga->moe_dw, 0, (size_t)N * K * sizeof(float));
    for (int e = 0; e < E; e++) {
        int ne = routed_expert(ops, a, c, l, e, experts, xh, N, ga->moe_act);
        if (!ne) continue;
        for (int q = 0; q < ne; q++) {   /* dw_ij = <dout_i, y>, dy = w_ij dout_i */
            int pr = a->moe_rows[q], i = pr / K;
            const float *d = douth + (size_t)i * C;
            ga->moe_dw[pr] = (float)dot(d, a->moe_y_h + (size_t)q * C, C);
            float *dy = ga->moe_dy_h + (size_t)q * C;
            for (int h = 0; h < C; h++) dy[h] = td_round(D, weights[pr] * d[h]);
        }
        up_rows(ops, ga->moe_dy, ga->moe_dy_h, (size_t)ne * C);
        const float *ew[3] = {w->w_experts[3 * e], w->w_experts[3 * e + 1], w->w_experts[3 * e + 2]};
        float *eg[3] = {NULL, NULL, NULL};
        if (gw->w_experts)
            for (int k = 0; k < 3; k++) eg[k] = G(gw->w_experts[3 * e + k]);
        expert_backward(ops, a, ga, ew, eg, a->moe_in, ne, C, FE, l, TD_LORA_NMOD + 3 * e, lg);
        td_ops_sync(ops);
        const float *dxe = down_rows(ops, ga->moe_dx_h, ga->moe_dx, (size_t)ne * C);
        for (int q = 0; q < ne; q++) {   /* back to the rows the expert read */
            float *d = dxnh + (size_t)(a->moe_rows[q] / K) * C;
            const float *s = dxe + (size_t)q * C;
            for (int h = 0; h < C; h++) d[h] += s[h];
        }
    }
    /* w_j = p_ej (/ S = sum_k p_ek when norm_topk_prob), p = softmax(logits): back to the logits;
     * the trainer's load-balancing loss adds its d/dp (ga->moe_aux_dp, src/train/aux_loss.c) */
    for (int i = 0; i < N; i++) {
        const float *p = probs + (size_t)i * E;
        const int *sel = experts + (size_t)i * K;
        const float *dw = ga->moe_dw + (size_t)i * K;
        float *dl = ga->moe_dlogits_h + (size_t)i * E;
        double dp[E > 0 ? E : 1];
        for (int e = 0; e < E; e++) dp[e] = ga->moe_aux_dp ? ga->moe_aux_dp[e] : 0;
        double S = 0, dws = 0;
        for (int j = 0; j < K; j++) S += p[sel[j]];
        for (int j = 0; j < K; j++) dws += (double)dw[j] * p[sel[j]] / S;
        for (int j = 0; j < K; j++) dp[sel[j]] += c->norm_topk_prob ? (dw[j] - dws) / S : dw[j];
        double pdp = 0;
        for (int e = 0; e < E; e++) pdp += p[e] * dp[e];
        for (int e = 0; e < E; e++) {   /* the logits' gradient in their dtype: D, or fp32 (router "fp32") */
            float g = (float)(p[e] * (dp[e] - pdp));
            dl[e] = router_fp32(r) ? g : td_round(D, g);
        }
    }
    up_rows(ops, ga->moe_dlogits, ga->moe_dlogits_h, (size_t)N * E);
    if (router_fp32(r)) {   /* grad_input = (dlogits @ W).to(x's dtype), then added to the rest of x's */
        td_recipe rr;
        td_ops rops = router_ops(ops, &rr);
        ops->be->zero(ga->moe_dx, nC * sizeof(float));
        matmul_backward(&rops, ga->moe_dx, G(gw->w_router), NULL, ga->moe_dlogits, xn2, w->w_router, N, C, E);
        td_ops_sync(ops);
        const float *gx = down_rows(ops, ga->moe_dx_h, ga->moe_dx, nC);
        td_format X = r->residual_fp32 ? TD_F32 : D;   /* the dtype of the router's input */
        for (size_t k = 0; k < nC; k++) dxnh[k] = td_round(X, dxnh[k] + td_round(X, gx[k]));
        up_rows(ops, dxn, dxnh, nC);
    } else {
        up_rows(ops, dxn, dxnh, nC);
        matmul_backward(ops, dxn, G(gw->w_router), NULL, ga->moe_dlogits, xn2, w->w_router, N, C, E);
    }
    if (FS > 0) {   /* out_i += s_i shared(x_i), s_i = sigmoid(z_i), z_i = <x_i, w_route> */
        shared_forward(ops, a, l, xn2, ga->moe_act, N, C, FS);
        matmul_forward(ops, a->moe_logits, xn2, wset_moe(ops->ws, l, TD_MOE_SH_ROUTE), NULL, N, C, 1);
        td_ops_sync(ops);
        const float *yh = down_rows(ops, a->moe_y_h, a->moe_y, nC);
        const float *zh = down_rows(ops, a->moe_logits_h, a->moe_logits, (size_t)N);
        float *dz = ga->moe_dw;   /* (N), host */
        for (int i = 0; i < N; i++) {
            float sg = 1.0f / (1.0f + expf(-zh[i])), s = td_round(D, sg);
            const float *d = douth + (size_t)i * C;
            dz[i] = td_round(D, (float)(dot(d, yh + (size_t)i * C, C) * sg * (1.0f - sg)));
            float *dy = ga->moe_dy_h + (size_t)i * C;
            for (int h = 0; h < C; h++) dy[h] = td_round(D, s * d[h]);
        }
        up_rows(ops, ga->moe_dy, ga->moe_dy_h, nC);
        const float *sw[3] = {w->ws_gate, w->ws_up, w->ws_down};
        float *sgr[3] = {G(gw->ws_gate), G(gw->ws_up), G(gw->ws_down)};
        expert_backward(ops, a, ga, sw, sgr, xn2, N, C, FS, l, TD_LORA_GATE, lg);
        td_ops_sync(ops);
        const float *dxs = down_rows(ops, ga->moe_dx_h, ga->moe_dx, nC);
        dxnh = ga->moe_dxn_h ? (float *)down_rows(ops, ga->moe_dxn_h, dxn, nC) : dxn;
        for (size_t k = 0; k < nC; k++) dxnh[k] += dxs[k];
        up_rows(ops, dxn, dxnh, nC);
        /* the gate's z gradient as a GEMM operand: in the backend's memory */
        memcpy(ga->moe_dlogits_h, dz, (size_t)N * sizeof(float));
        up_rows(ops, ga->moe_dlogits, ga->moe_dlogits_h, (size_t)N);
        matmul_backward(ops, dxn, G(gw->ws_route), NULL, ga->moe_dlogits, xn2, w->ws_route, N, C, 1);
    }
}
