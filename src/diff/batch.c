/* One batch's buffers (src/diff/job.h): the sequences, B's rows, the metrics by position. */
#include "job.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void batch_alloc(batch_state *b, const job *J, const size_t *idx, int n)
{
    const td_diff_opts *o = J->o;
    memset(b, 0, sizeof *b);
    b->n = n;
    b->V = J->model->cfg.vocab_size;
    b->score_prompt = o->score_prompt;
    int maxl = J->max_len;
    b->seq = td_xcalloc((size_t)n, sizeof(int *));
    b->len = td_xcalloc((size_t)n, sizeof(int));
    b->plen = td_xcalloc((size_t)n, sizeof(int));
    b->finish = td_xcalloc((size_t)n, sizeof(int));
    b->rows_b = td_xcalloc((size_t)n, sizeof(float *));
    b->logp_b_proc = td_xcalloc((size_t)n, sizeof(float *));
    b->m = td_xcalloc((size_t)n, sizeof(td_token_metrics *));
    b->have = td_xcalloc((size_t)n, sizeof(unsigned char *));
    int replay = J->prompts.has_rollouts;
    if (J->rows_dev) {
        b->keep_from = td_xcalloc((size_t)n, sizeof(int));
        b->keep_base = td_xcalloc((size_t)n, sizeof(size_t));
    }
    if (replay) b->replay_b = td_xcalloc((size_t)n, sizeof(float *));
    if (replay && o->rollout_logprobs && !strcmp(o->rollout_logprobs, "processed")) {
        b->proc = td_sampler_create(b->V);
        b->sampling = &o->sampling;
        b->proc_row = td_xmalloc((size_t)b->V * sizeof(float));
    }
    if (o->layers) {
        b->L = J->model->cfg.num_layers;
        b->C = J->model->cfg.hidden_size;
        b->res_b = td_xcalloc((size_t)n, sizeof(float *));
        b->rel = td_xcalloc((size_t)n, sizeof(float *));
    }
    const td_config *cfg = &J->model->cfg;
    if (cfg->num_experts > 0) {
        b->Lm = td_config_num_moe_layers(cfg);
        b->K = cfg->num_experts_per_tok;
        b->norm_topk = cfg->norm_topk_prob;
        b->replay = o->routing_replay;
        b->rexp_b = td_xcalloc((size_t)n, sizeof(int *));
        b->rflip = td_xcalloc((size_t)n, sizeof(signed char *));
        b->rmargin = td_xcalloc((size_t)n, sizeof(float *));
        b->rmoved = td_xcalloc((size_t)n, sizeof(float *));
    }
    for (int s = 0; s < n; s++) {
        const td_prompt *p = &J->prompts.items[idx[s]];
        if (b->Lm) {
            size_t cells = (size_t)maxl * b->Lm;
            b->rexp_b[s] = td_xmalloc(cells * b->K * sizeof(int));
            for (size_t i = 0; i < cells * b->K; i++) b->rexp_b[s][i] = -1;
            b->rflip[s] = td_xmalloc(cells);
            memset(b->rflip[s], -1, cells);
            b->rmargin[s] = td_xmalloc(cells * sizeof(float));
            b->rmoved[s] = td_xmalloc(cells * sizeof(float));
            for (size_t i = 0; i < cells; i++) b->rmargin[s][i] = b->rmoved[s][i] = NAN;
        }
        b->seq[s] = td_xmalloc((size_t)maxl * sizeof(int));
        for (int t = 0; t < p->n_prompt; t++) b->seq[s][t] = p->prompt[t];
        b->plen[s] = b->len[s] = p->n_prompt;
        b->finish[s] = -1;
        if (replay) {
            for (int t = 0; t < p->n_response; t++) b->seq[s][p->n_prompt + t] = p->response[t];
            b->len[s] += p->n_response;
            b->finish[s] = TD_FINISH_REPLAY;
            b->replay_b[s] = p->rollout_logp;
        } else {
            if (J->rows_dev) {   /* B's scored rows wait on the device: slot s's block */
                b->keep_from[s] = o->score_prompt ? 1 : p->n_prompt;
                b->keep_base[s] = (size_t)s * (size_t)J->keep_rows;
            } else {
                b->rows_b[s] = td_xmalloc((size_t)maxl * b->V * sizeof(float));
            }
            b->logp_b_proc[s] = td_xmalloc((size_t)maxl * sizeof(float));
        }
        b->m[s] = td_xcalloc((size_t)maxl, sizeof(td_token_metrics));
        if (b->L) {
            b->res_b[s] = td_xmalloc((size_t)maxl * b->L * b->C * sizeof(float));
            b->rel[s] = td_xcalloc((size_t)maxl * b->L, sizeof(float));
        }
        b->have[s] = td_xcalloc((size_t)maxl, 1);
    }
}

void batch_free(batch_state *b)
{
    for (int s = 0; s < b->n; s++) {
        free(b->seq[s]); free(b->rows_b[s]); free(b->logp_b_proc[s]); free(b->m[s]); free(b->have[s]);
        if (b->L) { free(b->res_b[s]); free(b->rel[s]); }
        if (b->Lm) { free(b->rexp_b[s]); free(b->rflip[s]); free(b->rmargin[s]); free(b->rmoved[s]); }
    }
    free(b->rexp_b); free(b->rflip); free(b->rmargin); free(b->rmoved);
    free(b->res_b); free(b->rel);
    free(b->seq); free(b->len); free(b->plen); free(b->finish); free(b->rows_b); free(b->logp_b_proc);
    free(b->m); free(b->have); free(b->replay_b); free(b->keep_from); free(b->keep_base);
    td_sampler_free(b->proc);
    free(b->proc_row);
    memset(b, 0, sizeof *b);
}
