/* Metric collection (src/diff/job.h): the two paths' rows and residual streams come in by
 * position; a finished batch goes out as run-file rows (the schema's columns). */
#include "job.h"

#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Scored positions of a sequence: the response tokens, and prompt tokens 1..P-1 if asked. */
static int scored(const batch_state *b, int s, int pos)
{
    if (pos < 1 || pos >= b->len[s]) return 0;
    return pos >= b->plen[s] || b->score_prompt;
}

/* Training-path rows arrive here: row t predicts the token at t+1. */
void on_row_a(void *user, int s, int t, const float *logp_a)
{
    batch_state *b = user;
    int pos = t + 1;
    if (!scored(b, s, pos)) return;
    int y = b->seq[s][pos];
    td_token_metrics *m = &b->m[s][pos];
    if (b->replay_b) {
        if (b->proc) {        /* the engine reported processed log-probs: compare like with like */
            td_rng rng;
            td_rng_stream(&rng, 0, 0);
            td_sample(b->proc, b->sampling, logp_a, b->seq[s], pos, &rng, b->proc_row);
            logp_a = b->proc_row;
        }
        td_token_metrics_replay(logp_a, b->V, y, b->replay_b[s][pos - b->plen[s]], m);
    } else {
        td_token_metrics_compute(logp_a, b->rows_b[s] + (size_t)pos * b->V, b->V, y, m);
    }
    b->have[s][pos] = 1;
}

/* Inference-path rows from the rollout (prompt rows with --score-prompt, then every generated
 * token's), kept by position until the training path has scored the batch. */
void on_row_b(void *user, int s, int pos, const float *logp_b, float logp_b_proc)
{
    batch_state *b = user;
    memcpy(b->rows_b[s] + (size_t)pos * b->V, logp_b, (size_t)b->V * sizeof(float));
    b->logp_b_proc[s][pos] = logp_b_proc;
}

/* --layers: the inference path's residual stream after each layer, kept by position. */
void on_layer_b(void *user, int l, int N, const int *slot, const int *pos, const float *x)
{
    batch_state *b = user;
    for (int i = 0; i < N; i++)
        memcpy(b->res_b[slot[i]] + ((size_t)pos[i] * b->L + l) * b->C, x + (size_t)i * b->C,
               (size_t)b->C * sizeof(float));
}

/* --layers: the training path's residual at position t against B's: ||h_a - h_b|| / ||h_a||,
 * recorded for the token at t + 1 that this position predicts. */
void on_layer_a(void *user, int l, int N, const int *seq, const int *pos, const float *x)
{
    batch_state *b = user;
    for (int i = 0; i < N; i++) {
        int s = seq[i], t = pos[i];
        if (!scored(b, s, t + 1)) continue;
        const float *ha = x + (size_t)i * b->C, *hb = b->res_b[s] + ((size_t)t * b->L + l) * b->C;
        double num = 0, den = 0;
        for (int c = 0; c < b->C; c++) {
            double d = (double)ha[c] - hb[c];
            num += d * d;
            den += (double)ha[c] * ha[c];
        }
        b->rel[s][(size_t)(t + 1) * b->L + l] = (float)(den > 0 ? sqrt(num / den) : (num > 0 ? INFINITY : 0.0));
    }
}

/* Mixtures of experts: B's experts at each position it routed (prefill and decode rows). */
void on_moe_b(void *user, const td_moe_route *r)
{
    batch_state *b = user;
    for (int i = 0; i < r->N; i++) {
        int s = r->seq[i], t = r->pos[i];
        memcpy(b->rexp_b[s] + ((size_t)t * b->Lm + r->moe_layer) * b->K, r->experts + (size_t)i * r->K,
               (size_t)r->K * sizeof(int));
    }
}

/* --routing-replay r3: A takes B's experts where B routed the position (-1: A routes it itself,
 * the last token, which B sampled but never fed back). */
int replay_moe_b(void *user, int moe_layer, int N, const int *seq, const int *pos, int K, int *experts)
{
    batch_state *b = user;
    for (int i = 0; i < N; i++)
        memcpy(experts + (size_t)i * K, b->rexp_b[seq[i]] + ((size_t)pos[i] * b->Lm + moe_layer) * K,
               (size_t)K * sizeof(int));
    return 1;
}

/* A's routing at position t against B's, recorded for the token at t + 1 that the position
 * predicts: A's own top-k of its probabilities (under replay, what its router would have chosen),
 * the flip code, A's margin between its k-th and (k+1)-th probability, and A's probability on
 * the experts it chose that B did not. */
void on_moe_a(void *user, const td_moe_route *r)
{
    batch_state *b = user;
    int K = r->K, E = r->E;
    int own[64];
    for (int i = 0; i < r->N; i++) {
        int s = r->seq[i], t = r->pos[i];
        if (!scored(b, s, t + 1)) continue;
        const int *eb = b->rexp_b[s] + ((size_t)t * b->Lm + r->moe_layer) * K;
        const float *p = r->probs + (size_t)i * E;
        size_t cell = (size_t)(t + 1) * b->Lm + r->moe_layer;
        if (eb[0] < 0 || K > 63) continue;
        td_moe_top_k(p, E, K < E ? K + 1 : K, own);   /* A's own top-k and the (k+1)-th */
        int same_order = 1, same_set = 1;
        for (int j = 0; j < K; j++) {
            same_order &= own[j] == eb[j];
            int in = 0;
            for (int q = 0; q < K; q++) in |= own[j] == eb[q];
            same_set &= in;
        }
        double moved = 0;
        for (int j = 0; j < K; j++) {
            int in = 0;
            for (int q = 0; q < K; q++) in |= own[j] == eb[q];
            if (!in) moved += p[own[j]];
        }
        b->rflip[s][cell] = (signed char)(same_order ? 0 : same_set ? 1 : 2);
        b->rmargin[s][cell] = K < E ? p[own[K - 1]] - p[own[K]] : NAN;
        b->rmoved[s][cell] = (float)moved;
    }
}

/* One scored token's /tokens row (and its /layers row). */
static void push_token(job *J, const batch_state *b, const size_t *idx, int s, int pos, int64_t seq_row)
{
    const td_token_metrics *m = &b->m[s][pos];
    td_column *c = J->tcols;
    td_columns_push_token(c, seq_row, pos, b->seq[s][pos], m, b->replay_b ? NAN : b->logp_b_proc[s][pos], b->plen[s]);
    if (J->prompts.has_trainer_logp) {
        const float *tr = J->prompts.items[idx[s]].trainer_logp;
        td_column_push_f64(&c[TD_TOK_LOGP_TRAINER], tr && pos >= b->plen[s] ? tr[pos - b->plen[s]] : NAN);
    }
    if (b->L) {
        if (J->n_layer_rows == J->cap_layer_rows) {
            J->cap_layer_rows = J->cap_layer_rows ? 2 * J->cap_layer_rows : 1024;
            J->layer_rows = td_xrealloc(J->layer_rows, J->cap_layer_rows * b->L * sizeof(float));
        }
        memcpy(J->layer_rows + J->n_layer_rows * b->L, b->rel[s] + (size_t)pos * b->L, b->L * sizeof(float));
        J->n_layer_rows++;
    }
    if (b->Lm) {
        size_t Lm = (size_t)b->Lm, r = J->n_route_rows;
        if (r == J->cap_route_rows) {
            J->cap_route_rows = r ? 2 * r : 1024;
            J->route_flip = td_xrealloc(J->route_flip, J->cap_route_rows * Lm);
            J->route_margin = td_xrealloc(J->route_margin, J->cap_route_rows * Lm * sizeof(float));
            J->route_moved = td_xrealloc(J->route_moved, J->cap_route_rows * Lm * sizeof(float));
            J->route_nflips = td_xrealloc(J->route_nflips, J->cap_route_rows * sizeof(int32_t));
            J->route_experts = td_xrealloc(J->route_experts, J->cap_route_rows * Lm * b->K * sizeof(int32_t));
        }
        /* B's experts at the predicting position pos - 1 */
        memcpy(J->route_experts + r * Lm * b->K, b->rexp_b[s] + (size_t)(pos - 1) * Lm * b->K,
               Lm * b->K * sizeof(int32_t));
        const signed char *fl = b->rflip[s] + (size_t)pos * Lm;
        memcpy(J->route_flip + r * Lm, fl, Lm);
        memcpy(J->route_margin + r * Lm, b->rmargin[s] + (size_t)pos * Lm, Lm * sizeof(float));
        memcpy(J->route_moved + r * Lm, b->rmoved[s] + (size_t)pos * Lm, Lm * sizeof(float));
        int32_t nf = 0;
        for (size_t k = 0; k < Lm; k++) {
            nf += fl[k] == 2;
            if (fl[k] >= 0) { J->routed_by_layer[k]++; J->flips_by_layer[k] += fl[k] == 2; }
        }
        J->route_nflips[r] = nf;
        J->n_route_rows++;
    }
}

/* A sequence's prompt and response, each decoded on its own (special tokens kept, as the
 * model saw them), to /text; where they are to its /seqs row. */
static void push_text(job *J, const batch_state *b, int s)
{
    td_column *c = J->scols;
    td_column_push_i64(&c[TD_SEQ_TEXT_OFFSET], J->rows[TD_GROUP_TEXT] + (int64_t)J->xcols[TD_TXT_UTF8].n);
    const int32_t *ids[2] = {b->seq[s], b->seq[s] + b->plen[s]};
    size_t n[2] = {(size_t)b->plen[s], (size_t)(b->len[s] - b->plen[s])};
    for (int k = 0; k < 2; k++) {
        size_t len = 0;
        char *text = td_tokenizer_decode(J->tok, ids[k], n[k], false, &len);
        if (!text) len = 0;
        if (len > INT32_MAX) len = INT32_MAX;
        td_column_push_n(&J->xcols[TD_TXT_UTF8], text, len);
        td_column_push_i32(&c[k ? TD_SEQ_RESPONSE_TEXT_LEN : TD_SEQ_PROMPT_TEXT_LEN], (int32_t)len);
        free(text);
    }
}

/* Appends a finished batch's rows to the column buffers. */
void collect(job *J, batch_state *b, const size_t *idx, int64_t batch_no)
{
    for (int s = 0; s < b->n; s++) {
        int64_t seq_row = J->rows[TD_GROUP_SEQS] + s;
        int64_t first = J->rows[TD_GROUP_TOKENS] + (int64_t)J->tcols[TD_TOK_SEQ].n;
        double sum = 0, sum_abs = 0, mx = 0, kl = 0, log_ratio = 0;
        int ns = 0;
        for (int pos = 1; pos < b->len[s]; pos++) {
            if (!b->have[s][pos]) continue;
            const td_token_metrics *m = &b->m[s][pos];
            double d = m->logp_b - m->logp_a;
            push_token(J, b, idx, s, pos, seq_row);
            sum += d;
            sum_abs += fabs(d);
            if (fabs(d) > mx) mx = fabs(d);
            kl += m->kl_ba;
            if (pos >= b->plen[s]) log_ratio += m->logp_a - m->logp_b;
            ns++;
        }
        td_seq_row row = {(int64_t)idx[s], batch_no, first,
                          J->rows[TD_GROUP_PROMPTS] + (int64_t)J->pcols[TD_PRM_TOKENS].n, b->plen[s],
                          b->len[s] - b->plen[s], ns, (int8_t)b->finish[s], sum, ns ? sum_abs / ns : NAN, mx,
                          ns ? kl / ns : NAN, log_ratio};
        td_columns_push_seq(J->scols, &row);
        for (int t = 0; t < b->len[s]; t++) td_column_push_i32(&J->pcols[TD_PRM_TOKENS], b->seq[s][t]);
        if (J->has_text) push_text(J, b, s);
    }
}
