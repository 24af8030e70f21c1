/* tidal — a mixture of experts' auxiliary load-balancing loss, as transformers adds it to the loss
 * of Mixtral, Qwen2-MoE and Qwen3-MoE when output_router_logits is on (load_balancing_loss_func,
 * Switch Transformer eqs. 4-6; include/tidal/train.h):
 *
 *   the router logits of every MoE layer concatenated: Z = L * N rows (N tokens, L MoE layers)
 *   p       = softmax(logits)                         (tidal: the fp32 probabilities the routing used)
 *   f_e     = (1/Z) sum_{rows} [e in top-k(p)]         tokens_per_expert summed over the k slots
 *   P_e     = (1/Z) sum_{rows} p_e                     router_prob_per_expert
 *   aux     = E * sum_e f_e P_e                        loss += router_aux_loss_coef * aux
 *
 * The pooling is over the layers together (transformers' concatenation), not per layer. top-k has
 * no gradient, so d aux / d p_e of any row is E f_e / Z: one vector of E numbers for every row
 * and layer of the micro-batch, handed to moe_backward (ga.moe_aux_dp), which adds it to the
 * routing weights' gradient before the softmax backward. It needs every layer's f first: the
 * forward's routing observer (the path's moe_fn) counts them; the backward's recompute under
 * gradient checkpointing runs with the observer off.
 *
 * tidal packs whole sequences without padding, so every row counts (transformers' attention
 * mask leaves out only padding). */
#include "train_internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void train_aux_observe(void *user, const td_moe_route *r)
{
    td_trainer *tr = user;
    for (int i = 0; i < r->N; i++) {
        const float *p = r->probs + (size_t)i * r->E;
        td_moe_top_k(p, r->E, r->K, tr->aux_sel);   /* the path's own choice, replayed or not */
        for (int j = 0; j < r->K; j++) tr->aux_cnt[tr->aux_sel[j]] += 1.0;
        for (int e = 0; e < r->E; e++) tr->aux_psum[e] += p[e];
    }
    tr->aux_cells += r->N;
}

void train_aux_init(td_trainer *tr)
{
    const td_config *c = &tr->m->cfg;
    if (!tr->o.output_router_logits || c->num_experts <= 0) return;
    tr->aux_cnt = td_xcalloc((size_t)c->num_experts, sizeof(double));
    tr->aux_psum = td_xcalloc((size_t)c->num_experts, sizeof(double));
    tr->aux_dp = td_xcalloc((size_t)c->num_experts, sizeof(float));
    tr->aux_sel = td_xcalloc((size_t)c->num_experts_per_tok, sizeof(int));
}

void train_aux_begin(td_trainer *tr)
{
    tr->ga.moe_aux_dp = NULL;
    if (!tr->aux_cnt) return;
    size_t E = (size_t)tr->m->cfg.num_experts;
    memset(tr->aux_cnt, 0, E * sizeof(double));
    memset(tr->aux_psum, 0, E * sizeof(double));
    tr->aux_cells = 0;
    td_forward_set_moe_fn(tr->f, train_aux_observe, tr);
}

void train_aux_end(td_trainer *tr, int N, double scale)
{
    if (!tr->aux_cnt) return;
    td_forward_set_moe_fn(tr->f, NULL, NULL);
    int E = tr->m->cfg.num_experts;
    double Z = (double)tr->aux_cells, aux = 0.0;
    if (!(Z > 0)) return;
    long rows = tr->aux_rows_step > 0 ? tr->aux_rows_step : tr->aux_rows_call;
    double share = rows > 0 ? (double)N / (double)rows : 1.0;   /* this forward's weight in the step */
    for (int e = 0; e < E; e++) {
        double f = tr->aux_cnt[e] / Z;
        aux += f * (tr->aux_psum[e] / Z);
        tr->aux_dp[e] = (float)(share * scale * tr->o.router_aux_loss_coef * E * f / Z);
    }
    aux *= E;
    tr->aux_value += share * aux;
    tr->ga.moe_aux_dp = tr->aux_dp;
}

void train_aux_free(td_trainer *tr)
{
    free(tr->aux_cnt);
    free(tr->aux_psum);
    free(tr->aux_dp);
    free(tr->aux_sel);
}

void td_trainer_set_aux_rows(td_trainer *tr, long rows) { tr->aux_rows_step = rows > 0 ? rows : 0; }

double td_trainer_aux_loss(td_trainer *tr, int reset)
{
    if (!tr->aux_cnt) return NAN;
    double v = tr->aux_value;
    if (reset) tr->aux_value = 0.0;
    return v;
}
