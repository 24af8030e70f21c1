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
 * Where it runs: the routing decision on the host, the rows on the path's backend. The router GEMM
 * runs on the backend and its logits (N x E floats) come down (be->download; on the CPU backend the
 * host mirror is the buffer itself); softmax, top-k and the weights are the host's (moe_route), because
 * each layer reports its routing per token to ops->moe_fn (the run file records it) and routing replay
 * supplies the experts through ops->moe_replay, both host callbacks: they then weight this path's own
 * probabilities, renormalised over them when norm_topk_prob, as R3 defines it. The decision goes up
 * once per layer: every expert's pairs in row order, expert after expert (a->moe_rows, the plan), and
 * the routing weights (N x K). Everything else is the backend's op list (ops.h moe_*): the gather of
 * an expert's rows, the GEMMs and SwiGLU, the combines above, and in moe_backward the routing
 * weights' gradient dw (which comes down: N x K floats, for the logits' gradient on the host, which
 * goes up as N x E), the experts' output gradient dy, the scatter-add of their input gradients and the
 * shared expert's gate. The backends do the same arithmetic (the CPU's cpu_moe.c; the CUDA kernels of
 * moe.cu, moe_backward.cu give its bits), so a device changes only what its GEMMs change. */
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
}

/* Qwen2-MoE's shared expert of layer l on n rows (its LoRA slots: the dense MLP's) */
static void shared_forward(const td_ops *ops, td_acts *a, int l, const float *in, float *act, int n, int C, int FS)
{
    const td_wset *ws = ops->ws;
    expert_forward_down(ops, ops, a, wset_moe(ws, l, TD_MOE_SH_GATE), wset_moe(ws, l, TD_MOE_SH_UP),
                        wset_moe(ws, l, TD_MOE_SH_DOWN), in, act, n, C, FS, l, TD_LORA_GATE);
}

/* The layer's routing decision for the backend: a->moe_rows (host) = every pair i * K + j in row
 * order, grouped by expert in expert order (a counting sort: expert e's pairs are [start[e],
 * start[e + 1]), start = a->moe_start, E + 1 ints), the order the rows are gathered and combined in;
 * a pair whose expert is outside 0 .. E-1 (never chosen by top-k) is routed nowhere. The pairs and
 * the routing weights (N * K) go up once (on the CPU backend the host tables are the backend's):
 * *rows_b and *w_b are the backend's copies the ops read. */
static void route_plan(const td_ops *ops, td_acts *a, const int *experts, const float *weights, int N, int K, int E,
                       const int **rows_b, const float **w_b)
{
    int *start = a->moe_start, *next = a->moe_start + E + 1;
    memset(start, 0, (size_t)(E + 1) * sizeof(int));
    for (size_t p = 0; p < (size_t)N * K; p++)
        if (experts[p] >= 0 && experts[p] < E) start[experts[p] + 1]++;
    for (int e = 0; e < E; e++) start[e + 1] += start[e];
    memcpy(next, start, (size_t)E * sizeof(int));
    for (int p = 0; p < N * K; p++)
        if (experts[p] >= 0 && experts[p] < E) a->moe_rows[next[experts[p]]++] = p;
    *rows_b = a->moe_rows_b;
    *w_b = backend_host_memory(ops->be) ? weights : a->moe_weights_b;
    if (backend_host_memory(ops->be)) return;
    ops->be->upload(a->moe_rows_b, a->moe_rows, (size_t)start[E] * sizeof(int));
    ops->be->upload(a->moe_weights_b, weights, (size_t)N * K * sizeof(float));
}

/* Expert e of MoE layer l on the ne = start[e + 1] - start[e] rows that chose it (rows: their pairs,
 * backend memory): gathered from x into a->moe_in, then run (act: silu(gate) * up; a->moe_y the
 * output rows), down: the context of its down GEMM. Returns ne (0: none chose e, nothing runs). */
static int routed_expert_down(const td_ops *ops, const td_ops *down, td_acts *a, const td_config *c, int l, int e,
                              const int *rows, const float *x, int N, float *act)
{
    int C = c->hidden_size, K = c->num_experts_per_tok;
    int ne = a->moe_start[e + 1] - a->moe_start[e];
    if (!ne) return 0;
    moe_gather(ops, a->moe_in, x, rows, N, ne, K, C);
    expert_forward_down(ops, down, a, wset_moe(ops->ws, l, TD_MOE_EXPERTS + 3 * e),
                        wset_moe(ops->ws, l, TD_MOE_EXPERTS + 3 * e + 1), wset_moe(ops->ws, l, TD_MOE_EXPERTS + 3 * e + 2),
                        a->moe_in, act, ne, C, c->moe_intermediate_size, l, TD_LORA_NMOD + 3 * e);
    return ne;
}

void moe_forward(const td_ops *ops, const td_model *m, td_acts *a, int l, const float *x, const int *pos, int N,
                 float *out)
{
    const td_config *c = &m->cfg;
    int C = c->hidden_size, E = c->num_experts, K = c->num_experts_per_tok;
    int FS = c->shared_expert_intermediate_size;
    const td_wset *ws = ops->ws;
    const td_recipe *r = ops->recipe;
    size_t nC = (size_t)N * C;
    float *probs, *weights;
    int *experts;
    const int *rows;
    const float *w;
    route_bufs(a, c, l, &probs, &experts, &weights);
    moe_route_only(ops, m, a, l, x, pos, N);
    route_plan(ops, a, experts, weights, N, K, E, &rows, &w);

    if (moe_fused(r)) {   /* vLLM's fused_moe: D(acc * w) per (row, slot), then moe_sum in top-k order */
        td_recipe acc_r = *r;
        acc_r.activations = TD_F32;   /* the down GEMM's fp32 accumulator, unrounded */
        td_ops down = td_ops_gemm(ops, &acc_r, ops->qin, ops->gscratch);
        if (!a->moe_v) {   /* (N * K, C): allocated on a fused recipe's first layer */
            a->moe_v = a->be->alloc((size_t)a->cap * K * C * sizeof(float));
            a->owned[a->nowned++] = a->moe_v;
        }
        ops->be->zero(a->moe_v, (size_t)N * K * C * sizeof(float));
        for (int e = 0; e < E; e++) {
            int ne = routed_expert_down(ops, &down, a, c, l, e, rows + a->moe_start[e], x, N, a->moe_gate);
            if (ne) moe_scatter(ops, a->moe_v, a->moe_y, rows + a->moe_start[e], w, N, ne, K, C);
        }
        moe_sum(ops, out, a->moe_v, N, K, C);
    } else {   /* index_add_ of each expert's rows, expert after expert */
        ops->be->zero(out, nC * sizeof(float));
        for (int e = 0; e < E; e++) {
            int ne = routed_expert_down(ops, ops, a, c, l, e, rows + a->moe_start[e], x, N, a->moe_gate);
            if (ne) moe_combine(ops, out, a->moe_y, rows + a->moe_start[e], w, N, ne, K, C);
        }
    }
    if (FS > 0) {   /* Qwen2-MoE's shared expert, on every row, behind its sigmoid gate */
        shared_forward(ops, a, l, x, a->moe_gate, N, C, FS);
        matmul_forward(ops, a->moe_logits, x, wset_moe(ws, l, TD_MOE_SH_ROUTE), NULL, N, C, 1);
        moe_shared_combine(ops, out, a->moe_y, a->moe_logits, N, C);
    }
}

#define G(p) ((float *)(p))   /* gradient buffers are carved as td_model_weights: writable */

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
    const int *rows;
    const float *wb;
    route_bufs(a, c, l, &probs, &experts, &weights);
    route_plan(ops, a, experts, weights, N, K, E, &rows, &wb);

    /* out_i = sum_j w_ij expert_{e_ij}(x_i): each expert's rows again, then backwards */
    ops->be->zero(ga->moe_dw, (size_t)N * K * sizeof(float));
    for (int e = 0; e < E; e++) {
        const int *re = rows + a->moe_start[e];
        int ne = routed_expert_down(ops, ops, a, c, l, e, re, xn2, N, ga->moe_act);
        if (!ne) continue;
        moe_combine_backward(ops, ga->moe_dw, ga->moe_dy, dout, a->moe_y, re, wb, N, ne, K, C);   /* dw, dy = w dout */
        const float *ew[3] = {w->w_experts[3 * e], w->w_experts[3 * e + 1], w->w_experts[3 * e + 2]};
        float *eg[3] = {NULL, NULL, NULL};
        if (gw->w_experts)
            for (int k = 0; k < 3; k++) eg[k] = G(gw->w_experts[3 * e + k]);
        expert_backward(ops, a, ga, ew, eg, a->moe_in, ne, C, FE, l, TD_LORA_NMOD + 3 * e, lg);
        moe_scatter_add(ops, dxn, ga->moe_dx, re, N, ne, K, C, 0);   /* back to the rows the expert read */
    }
    /* w_j = p_ej (/ S = sum_k p_ek when norm_topk_prob), p = softmax(logits): back to the logits on
     * the host; the trainer's load-balancing loss adds its d/dp (ga->moe_aux_dp, src/train/aux_loss.c) */
    const float *dwh = down_rows(ops, ga->moe_dw_h, ga->moe_dw, (size_t)N * K);
    for (int i = 0; i < N; i++) {
        const float *p = probs + (size_t)i * E;
        const int *sel = experts + (size_t)i * K;
        const float *dw = dwh + (size_t)i * K;
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
        moe_scatter_add(ops, dxn, ga->moe_dx, NULL, N, N, K, C, 1);   /* X(dx + X(g)), X the router input's dtype */
    } else {
        matmul_backward(ops, dxn, G(gw->w_router), NULL, ga->moe_dlogits, xn2, w->w_router, N, C, E);
    }
    if (FS > 0) {   /* out_i += s_i shared(x_i), s_i = sigmoid(z_i), z_i = <x_i, w_route> */
        shared_forward(ops, a, l, xn2, ga->moe_act, N, C, FS);
        matmul_forward(ops, a->moe_logits, xn2, wset_moe(ops->ws, l, TD_MOE_SH_ROUTE), NULL, N, C, 1);
        /* dz (the gate's logit, a GEMM operand: into moe_dlogits) and dy = D(s) dout */
        moe_shared_combine_backward(ops, ga->moe_dlogits, ga->moe_dy, dout, a->moe_y, a->moe_logits, N, C);
        const float *sw[3] = {w->ws_gate, w->ws_up, w->ws_down};
        float *sgr[3] = {G(gw->ws_gate), G(gw->ws_up), G(gw->ws_down)};
        expert_backward(ops, a, ga, sw, sgr, xn2, N, C, FS, l, TD_LORA_GATE, lg);
        moe_scatter_add(ops, dxn, ga->moe_dx, NULL, N, N, K, C, 0);
        matmul_backward(ops, dxn, G(gw->ws_route), NULL, ga->moe_dlogits, xn2, w->ws_route, N, C, 1);
    }
}
