/* tidal — one tidal-rl step (include/tidal/rl.h has the sequence and the formulas). */
#include "rl_internal.h"
#include "../model/model_internal.h"
#include "tidal/analysis.h"
#include "tidal/checkpoint.h"
#include "tidal/logprob.h"
#include "tidal/formats.h"
#include "tidal/memplan.h"
#include "tidal/metrics.h"
#include "tidal/sft.h"

#include <gsl/gsl_statistics_double.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A per-step seed from the run's seed: rollouts of step k are the same whatever ran before. */
static uint64_t step_seed(uint64_t seed, int k, uint64_t salt)
{
    uint64_t h = seed ^ 0x9e3779b97f4a7c15ull * (uint64_t)(k + 1) ^ salt * 0xbf58476d1ce4e5b9ull;
    h ^= h >> 31;
    h *= 0x94d049bb133111ebull;
    return h ^ (h >> 29);
}

/* Prompts: epoch e visits the dataset in a permutation drawn from td_rng_stream(seed, e). */
size_t rl_prompt_of(const rl_run *R, int k, int j, int *epoch)
{
    size_t n = R->n_items, i = (size_t)k * (size_t)R->P + (size_t)j, e = i / n, pos = i % n;
    if (epoch) *epoch = (int)e;
    td_rng r;
    td_rng_stream(&r, R->o->seed, 1000003u + e);
    size_t *perm = td_xmalloc(n * sizeof *perm);
    for (size_t a = 0; a < n; a++) perm[a] = a;
    for (size_t a = n - 1; a > 0; a--) {
        size_t b = (size_t)td_rng_below(&r, a + 1), t = perm[a];
        perm[a] = perm[b];
        perm[b] = t;
    }
    size_t out = perm[pos];
    free(perm);
    return out;
}

/* rollout rows of the logged sequences (at the training temperature, so A and B compare) */
static void on_rollout_row(void *user, int seq, int pos, const float *logp, float logp_proc)
{
    rl_run *R = user;
    if (seq >= R->nlog) return;
    float *dst = R->rows_b + ((size_t)seq * R->max_len + pos) * R->V;
    double T = R->o->temperature;
    for (int v = 0; v < R->V; v++) dst[v] = T == 1.0 ? logp[v] : (float)(logp[v] / T);
    if (T != 1.0) td_log_softmax(dst, R->V);
}

/* pi_old rows: entropy over response positions; the logged sequences' token metrics */
static void on_old_row(void *user, int seq, int pos, const float *row)
{
    rl_run *R = user;
    if (pos + 1 < R->plen[seq] || pos + 1 >= R->len[seq]) return;
    R->entropy_sum += td_logp_entropy(row, R->V);
    R->entropy_n += 1;
    if (seq < R->nlog) {
        float *b = R->rows_b + ((size_t)seq * R->max_len + pos + 1) * R->V;
        if (R->o->exact_match) memcpy(b, row, (size_t)R->V * sizeof(float));
        td_token_metrics_compute(row, b, R->V, R->tok[seq][pos + 1], &R->tm[(size_t)seq * R->max_len + pos + 1]);
    }
}

/* pi_old's log-prob of response token o; under --exact-match it is mu's too */
static void set_old(rl_run *R, int64_t o, float v)
{
    R->old[o] = v;
    if (R->o->exact_match) R->mu[o] = v;
}

static double loss_fn(void *user, int s, int n, const float *logp, float *dlogp)
{
    rl_run *R = user;
    int P = R->plen[s];
    for (int t = 0; t < P - 1; t++) dlogp[t] = 0.0f;
    int64_t o = R->off[s];
    int T = (int)(R->off[s + 1] - o);
    if (R->old_in_update)   /* pi_old is this forward (TRL: per_token_logps.detach()) */
        for (int t = 0; t < T; t++) set_old(R, o + t, logp[P - 1 + t]);
    for (int t = 0; t < T; t++) if (!isfinite(logp[P - 1 + t])) R->nonfinite++;
    double l = td_rl_seq_loss(&R->lc, T, logp + P - 1, R->old + o, R->lc.beta > 0 ? R->ref + o : NULL, R->w + o,
                              R->m + o, R->adv[s], R->coef[s], dlogp + P - 1, &R->clip);
    if (R->dump_logp) {
        memcpy(R->dump_logp + o, logp + P - 1, (size_t)T * sizeof(float));
        memcpy(R->dump_dlogp + o, dlogp + P - 1, (size_t)T * sizeof(float));
    }
    return l;
    (void)n;
}

static int *route_cell(int *base, const rl_run *R, int s, int t, int m);

static void response_metrics(rl_run *R, double *M)
{
    int64_t N = R->off[R->B];
    double *la = td_xmalloc((size_t)(N ? N : 1) * sizeof(double)), *lb = td_xmalloc((size_t)(N ? N : 1) * sizeof(double));
    double *dl = td_xmalloc((size_t)(N ? N : 1) * sizeof(double)), *k3 = td_xmalloc((size_t)(N ? N : 1) * sizeof(double));
    double *pa = td_xmalloc((size_t)(N ? N : 1) * sizeof(double)), *pb = td_xmalloc((size_t)(N ? N : 1) * sizeof(double));
    int64_t *seq = td_xmalloc((size_t)(N ? N : 1) * sizeof(int64_t));
    int8_t *isp = td_xcalloc((size_t)(N ? N : 1), 1);
    double dmax = 0, dsum = 0, pmax = 0, psum = 0;
    for (int s = 0; s < R->B; s++)
        for (int64_t t = R->off[s]; t < R->off[s + 1]; t++) {
            la[t] = R->old[t];
            lb[t] = R->mu[t];
            dl[t] = lb[t] - la[t];
            k3[t] = td_k3(la[t], lb[t]);
            pa[t] = exp(la[t]);
            pb[t] = exp(lb[t]);
            seq[t] = s;
            dsum += fabs(dl[t]);
            dmax = fmax(dmax, fabs(dl[t]));
            psum += fabs(pa[t] - pb[t]);
            pmax = fmax(pmax, fabs(pa[t] - pb[t]));
            if (!isfinite(dl[t])) R->nonfinite++;
        }
    td_run run;
    memset(&run, 0, sizeof run);
    run.n = (size_t)N;
    run.nseq = (size_t)R->B;
    run.logp_a = la; run.logp_b = lb; run.dlogp = dl; run.k3 = k3; run.seq = seq; run.is_prompt = isp;
    td_verl_metrics v;
    td_verl_metrics_compute(&run, &v);
    M[TD_RLM_rollout_corr_kl] = v.kl;
    M[TD_RLM_k3_kl] = v.k3_kl;
    M[TD_RLM_training_ppl] = v.training_ppl;
    M[TD_RLM_rollout_ppl] = v.rollout_ppl;
    M[TD_RLM_ppl_ratio] = v.ppl_ratio;
    M[TD_RLM_log_ppl_abs_diff] = v.log_ppl_abs_diff;
    M[TD_RLM_logp_diff_mean] = N ? dsum / N : NAN;
    M[TD_RLM_logp_diff_max] = dmax;
    M[TD_RLM_routing_flip_rate] = M[TD_RLM_routing_tokens_flipped] = NAN;
    M[TD_RLM_routing_mismatch_flipped] = M[TD_RLM_routing_mismatch_unflipped] = M[TD_RLM_routing_expert_load] = NAN;
    for (int m = 0; m < R->Lm; m++) R->flip_rate_l[m] = NAN;
    if (R->Lm && !R->o->exact_match) {
        M[TD_RLM_routing_flip_rate] = R->route_routed ? (double)R->route_flips / R->route_routed : NAN;
        for (int m = 0; m < R->Lm; m++)
            R->flip_rate_l[m] = R->route_routed_l[m] ? (double)R->route_flips_l[m] / R->route_routed_l[m] : NAN;
        int64_t flipped = 0;
        for (int s = 0; s < R->B; s++)
            for (int t = R->plen[s] - 1; t <= R->len[s] - 2; t++) flipped += R->route_tok_flip[(size_t)s * R->max_len + t];
        M[TD_RLM_routing_tokens_flipped] = N ? (double)flipped / N : NAN;
        double sf = 0, su = 0;
        int64_t nf = 0, nu = 0;
        for (int s = 0; s < R->B; s++)
            for (int64_t o = R->off[s]; o < R->off[s + 1]; o++) {
                int t = R->plen[s] + (int)(o - R->off[s]);   /* the token's position; t - 1 predicted it */
                if (R->route_tok_flip[(size_t)s * R->max_len + t - 1]) { sf += fabs(dl[o]); nf++; }
                else { su += fabs(dl[o]); nu++; }
            }
        M[TD_RLM_routing_mismatch_flipped] = nf ? sf / nf : NAN;
        M[TD_RLM_routing_mismatch_unflipped] = nu ? su / nu : NAN;
        int E = R->model->cfg.num_experts;
        int64_t *cnt = td_xcalloc((size_t)E, sizeof(int64_t));
        double load = NAN;
        for (int m = 0; m < R->Lm; m++) {
            memset(cnt, 0, (size_t)E * sizeof(int64_t));
            int64_t tot = 0, mx = 0;
            for (int s = 0; s < R->B; s++)
                for (int t = R->plen[s] - 1; t <= R->len[s] - 2; t++) {
                    const int *ex = route_cell(R->route_b, R, s, t, m);
                    for (int k = 0; k < R->K; k++)
                        if (ex[k] >= 0 && ex[k] < E) { cnt[ex[k]]++; tot++; }
                }
            for (int e = 0; e < E; e++) mx = cnt[e] > mx ? cnt[e] : mx;
            if (tot > 0 && (isnan(load) || (double)mx * E / tot > load)) load = (double)mx * E / tot;
        }
        free(cnt);
        M[TD_RLM_routing_expert_load] = load;
    }
    M[TD_RLM_probs_diff_mean] = N ? psum / N : NAN;
    M[TD_RLM_probs_diff_max] = pmax;
    M[TD_RLM_probs_pearson] = N > 1 ? gsl_stats_correlation(pa, 1, pb, 1, (size_t)N) : NAN;
    for (int level = 0; level < 2; level++) {
        double *lw;
        size_t n;
        td_is_log_weights(&run, level ? TD_IS_SEQUENCE : TD_IS_TOKEN, &lw, &n);
        td_is_raw r;
        td_is_raw_stats(lw, n, level ? TD_IS_SEQUENCE : TD_IS_TOKEN, &r);
        if (!level) {
            double s2 = 0;
            for (size_t i = 0; i < n; i++) {
                double x = exp(fmax(fmin(lw[i], TD_RL_LOG_CLAMP), -TD_RL_LOG_CLAMP)) - r.w_mean;
                s2 += x * x;
            }
            M[TD_RLM_chi2_token] = r.chi2;
            M[TD_RLM_rollout_is_mean] = r.w_mean;
            M[TD_RLM_rollout_is_std] = n > 1 ? sqrt(s2 / (double)(n - 1)) : NAN;
            M[TD_RLM_rollout_is_min] = r.w_min;
            M[TD_RLM_rollout_is_max] = r.w_max;
            M[TD_RLM_rollout_is_eff_sample_size] = r.ess_frac;
        } else {
            M[TD_RLM_chi2_seq] = r.chi2;
            M[TD_RLM_rollout_is_seq_mean] = r.w_mean;
            M[TD_RLM_rollout_is_seq_min] = r.w_min;
            M[TD_RLM_rollout_is_seq_max] = r.w_max;
            M[TD_RLM_rollout_is_seq_eff_sample_size] = r.ess_frac;
        }
        free(lw);
    }
    free(la); free(lb); free(dl); free(k3); free(pa); free(pb); free(seq); free(isp);
}

/* ---- mixtures of experts: the rollout's routing, pi_old's against it, and routing replay ---- */

static int *route_cell(int *base, const rl_run *R, int s, int t, int m)
{
    return base + (((size_t)s * R->max_len + t) * R->Lm + m) * R->K;
}

void rl_moe_on_rollout(void *user, const td_moe_route *r)
{
    rl_run *R = user;
    for (int i = 0; i < r->N; i++)
        memcpy(route_cell(R->route_b, R, r->seq[i], r->pos[i], r->moe_layer), r->experts + (size_t)i * r->K,
               (size_t)r->K * sizeof(int));
}

/* pi_old's routing: kept (R2 replays it in the update) and, at the positions that predict response
 * tokens, its own top-k set (what its router chose, or would have chosen under replay) against the
 * rollout's */
void rl_moe_on_old(void *user, const td_moe_route *r)
{
    rl_run *R = user;
    int K = r->K, E = r->E, own[64];
    for (int i = 0; i < r->N; i++) {
        int s = r->seq[i], t = r->pos[i];
        memcpy(route_cell(R->route_old, R, s, t, r->moe_layer), r->experts + (size_t)i * K, (size_t)K * sizeof(int));
        if (t < R->plen[s] - 1 || t > R->len[s] - 2 || K > 64) continue;
        const int *eb = route_cell(R->route_b, R, s, t, r->moe_layer);
        if (eb[0] < 0) continue;
        const float *p = r->probs + (size_t)i * E;
        td_moe_top_k(p, E, K, own);   /* its own top-k */
        int same = 1;
        for (int j = 0; j < K && same; j++) {
            int in = 0;
            for (int q = 0; q < K; q++) in |= own[j] == eb[q];
            same = in;
        }
        R->route_routed++;
        R->route_routed_l[r->moe_layer]++;
        if (!same) {
            R->route_flips++;
            R->route_flips_l[r->moe_layer]++;
            R->route_tok_flip[(size_t)s * R->max_len + t] = 1;
        }
    }
}

static int replay_from(const rl_run *R, int *base, int moe_layer, int N, const int *seq, const int *pos, int K,
                       int *experts)
{
    for (int i = 0; i < N; i++)   /* -1 where the source never routed the position: routed afresh */
        memcpy(experts + (size_t)i * K, route_cell(base, R, seq[i], pos[i], moe_layer), (size_t)K * sizeof(int));
    return 1;
}

int rl_moe_replay_rollout(void *user, int moe_layer, int N, const int *seq, const int *pos, int K, int *experts)
{
    rl_run *R = user;
    return replay_from(R, R->route_b, moe_layer, N, seq, pos, K, experts);
}

int rl_moe_replay_old(void *user, int moe_layer, int N, const int *seq, const int *pos, int K, int *experts)
{
    rl_run *R = user;
    return replay_from(R, R->route_old, moe_layer, N, seq, pos, K, experts);
}

/* generation: the step's prompts, G completions each, on the inference path */
static int rollout(rl_run *R, int k, double *M, td_error *err)
{
    const td_rl_opts *o = R->o;
    int epoch0 = 0;
    for (int j = 0; j < R->P; j++) {
        int ep;
        size_t it = rl_prompt_of(R, k, j, &ep);
        if (j == 0) epoch0 = ep;
        for (int g = 0; g < R->G; g++) {
            int s = j * R->G + g;
            R->item[s] = it;
            R->plen[s] = R->prompt_len[it];
            memcpy(R->tok[s], R->prompt_ids[it], (size_t)R->plen[s] * sizeof(int));
        }
    }
    M[TD_RLM_epoch] = epoch0;
    uint64_t *stream = td_xmalloc((size_t)R->B * sizeof(uint64_t));
    for (int s = 0; s < R->B; s++) stream[s] = (uint64_t)s;
    td_rollout_opts ro = {.sampling = {.temperature = o->temperature, .top_p = o->top_p, .top_k = o->top_k,
                                       .min_p = 0.0, .repetition_penalty = o->repetition_penalty},
                          .max_new_tokens = o->max_completion_length, .max_len = R->max_len,
                          .eos = R->eos, .n_eos = R->n_eos, .stop_at_eos = 1,
                          .seed = step_seed(o->seed, k, 1), .logit_noise = o->rollout_logit_noise,
                          .noise_seed = step_seed(o->seed, k, 2)};
    td_rollout_batch b = {.n = R->B, .tokens = R->tok, .prompt_len = R->plen, .stream = stream,
                          .len = R->len, .finish = R->finish, .logp_proc = R->mu_pos};
    if (R->Lm) {   /* this step's routing: nothing routed yet */
        size_t cells = (size_t)R->B * R->max_len * R->Lm * R->K;
        memset(R->route_b, 0xFF, cells * sizeof(int));
        memset(R->route_old, 0xFF, cells * sizeof(int));
        memset(R->route_tok_flip, 0, (size_t)R->B * R->max_len);
        R->route_flips = R->route_routed = 0;
        memset(R->route_flips_l, 0, (size_t)R->Lm * sizeof(int64_t));
        memset(R->route_routed_l, 0, (size_t)R->Lm * sizeof(int64_t));
    }
    int rc = td_rollout_generate(R->sess, R->smp, &ro, &b, R->nlog ? on_rollout_row : NULL, R, err);
    free(stream);
    return rc;
}

/* Valid UTF-8 of n bytes of s, each invalid byte replaced by U+FFFD (as Python decodes with
 * errors="replace"), for the JSON the reward command reads. */
static json_t *json_text(const char *s, size_t n)
{
    json_t *j = json_stringn(s, n);
    if (j) return j;
    char *out = td_xmalloc(3 * n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n;) {
        unsigned char c = (unsigned char)s[i];
        int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
        json_t *one = len && i + (size_t)len <= n ? json_stringn(s + i, (size_t)len) : NULL;
        if (one) { memcpy(out + k, s + i, (size_t)len); k += (size_t)len; i += (size_t)len; json_decref(one); }
        else { memcpy(out + k, "\xEF\xBF\xBD", 3); k += 3; i++; }
    }
    j = json_stringn(out, k);
    free(out);
    return j;
}

/* The reward command's input line (include/tidal/rl.h, "Rewards") for a completion of record rec
 * (chat: its prompt is a conversation): tok holds prompt (plen tokens) + completion (len). */
static char *reward_request(const rl_run *R, json_t *rec, int chat, const int *tok, int plen, int len)
{
    json_t *q = json_object();
    json_object_update(q, rec);
    json_t *msgs = json_object_get(rec, "messages"), *prompt = json_object_get(rec, "prompt");
    if (!prompt && msgs) json_object_set(q, "prompt", msgs);
    int T = len - plen;
    int32_t *ids = td_xmalloc((size_t)(T ? T : 1) * sizeof(int32_t));
    json_t *jids = json_array();
    for (int t = 0; t < T; t++) {
        ids[t] = tok[plen + t];
        json_array_append_new(jids, json_integer(ids[t]));
    }
    size_t n;
    char *text = td_tokenizer_decode(R->tkz, ids, (size_t)T, true, &n);   /* TRL: skip_special_tokens */
    free(ids);
    json_t *comp;
    if (chat) {                                 /* TRL: [{"role": "assistant", "content": ...}] */
        json_t *conv = prompt ? prompt : msgs, *last = json_array_get(conv, json_array_size(conv) - 1);
        const char *role = json_string_value(json_object_get(last, "role"));
        json_t *pre = json_object_get(last, "content");
        {
            size_t pl = role && !strcmp(role, "assistant") && json_is_string(pre) ? json_string_length(pre) : 0;
            char *both = td_xmalloc(pl + n + 1);
            if (pl) memcpy(both, json_string_value(pre), pl);
            memcpy(both + pl, text, n);
            comp = json_pack("[{s:s, s:o}]", "role", "assistant", "content", json_text(both, pl + n));
            free(both);
        }
    } else {
        comp = json_text(text, n);
    }
    free(text);
    json_object_set_new(q, "completion", comp);
    json_object_set_new(q, "completion_ids", jids);
    char *line = json_dumps(q, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(q);
    return line;
}

/* A built-in task's grade of the completion in tok (prompt plen tokens, len in all): the decoded
 * response with its special tokens (the grader cuts at the first <eos>). */
static int task_grade(const rl_run *R, const td_task_item *it, const int *tok, int plen, int len, double *r,
                      td_reward_info *info, td_error *err)
{
    size_t n;
    int32_t *ids = td_xmalloc((size_t)(len - plen + 1) * sizeof(int32_t));
    for (int t = plen; t < len; t++) ids[t - plen] = tok[t];
    char *text = td_tokenizer_decode(R->tkz, ids, (size_t)(len - plen), false, &n);
    free(ids);
    int rc = td_task_reward(it->task, it->prompt, it->answer, text, n, r, info, err);
    free(text);
    return rc;
}

/* Rewards: the task's grader on the decoded response (special tokens kept: the grader cuts at
 * the first <eos>), or the user's reward command for every completion (it then gets the whole
 * batch at once). accuracy counts the built-in task records. */
static int rewards(rl_run *R, int k, double *M, td_error *err)
{
    double sum = 0, sum2 = 0, acc = 0;
    int n_task = 0, rc = 0;
    char **req = R->reward_proc ? td_xcalloc((size_t)R->B, sizeof *req) : NULL;
    char **where = R->reward_proc ? td_xcalloc((size_t)R->B, sizeof *where) : NULL;
    for (int s = 0; s < R->B && !rc; s++) {
        const td_task_item *it = &R->items[R->item[s]];
        if (it->task) {
            td_reward_info info;
            double r;
            rc = task_grade(R, it, R->tok[s], R->plen[s], R->len[s], &r, &info, err);
            if (!R->reward_proc) R->reward[s] = r;
            R->exact[s] = info.exact;
            acc += info.exact;
            n_task++;
        }
        if (req) {
            req[s] = reward_request(R, R->records[R->item[s]], R->chat[R->item[s]], R->tok[s], R->plen[s], R->len[s]);
            char w[4400];
            snprintf(w, sizeof w, "completion %d of step %d (record %s:%ld, id %s)", s, k, R->o->dataset_path, it->line,
                     it->id ? it->id : "-");
            where[s] = strdup(w);
        }
    }
    if (!rc && R->reward_proc)
        rc = rl_reward_score(R->reward_proc, R->B, req, R->reward, R->comp, (const char *const *)where, err);
    for (int s = 0; req && s < R->B; s++) { free(req[s]); free(where[s]); }
    free(req);
    free(where);
    if (rc) return -1;
    for (int s = 0; s < R->B; s++) {
        sum += R->reward[s];
        sum2 += R->reward[s] * R->reward[s];
    }
    double mean = sum / R->B;
    M[TD_RLM_reward] = mean;
    M[TD_RLM_reward_std] = R->B > 1 ? sqrt(fmax(0.0, (sum2 - R->B * mean * mean) / (R->B - 1))) : 0.0;
    M[TD_RLM_accuracy] = n_task ? acc / n_task : NAN;
    return 0;
}

/* pi_old (and the reference): the training path over prompt + response, no gradient */
static int score_old(rl_run *R, td_error *err)
{
    const td_lora *lora = td_trainer_lora(R->tr);
    R->entropy_sum = R->entropy_n = 0;
    if (!R->old_in_update) {   /* else the update's forward is pi_old's (run.c): observed there */
        if (R->fold_set && lora && lora->owned_dev && R->o->lora_sync != TD_RL_SYNC_MERGE_UNMERGE) {
            forward_refresh_lora(R->fold);   /* the adapter re-rounded on the device, the base kept */
        } else {
            if (td_forward_set_recipe_lora(R->fold, &R->rtrain, lora, 0, err)) return -1;
            R->fold_set = 1;
        }
        if (td_forward_logprobs(R->fold, R->B, (const int *const *)R->tok, R->len, R->old_pos, on_old_row, R, err))
            return -1;
    }
    int64_t o = 0;
    for (int s = 0; s < R->B; s++) {
        R->off[s] = o;
        for (int t = R->plen[s]; t < R->len[s]; t++, o++) {
            if (!R->o->exact_match) R->mu[o] = R->mu_pos[s][t];
            if (!R->old_in_update) set_old(R, o, R->old_pos[s][t - 1]);   /* else loss_fn sets it */
            R->mask[o] = R->o->mask_truncated && R->finish[s] != TD_FINISH_EOS ? 0.0f : 1.0f;
        }
    }
    R->off[R->B] = o;
    if (R->fref) {
        td_forward_set_moe_fn(R->fref, NULL, NULL);   /* the reference routes itself, unobserved */
        if (td_forward_logprobs(R->fref, R->B, (const int *const *)R->tok, R->len, R->old_pos, NULL, NULL, err))
            return -1;
        for (int s = 0; s < R->B; s++)
            for (int t = R->plen[s]; t < R->len[s]; t++) R->ref[R->off[s] + t - R->plen[s]] = R->old_pos[s][t - 1];
    }
    return 0;
}

/* verl: a non-finite gradient norm skips the optimiser step; with loss scaling the trainer
 * does it itself (GradScaler) */
static int grads_finite(const rl_run *R)
{
    return td_trainer_grads_finite(R->tr);
}

static int update(rl_run *R, double *M, td_error *err)
{
    td_rl_batch b = {R->B, R->off, R->old, R->mu, R->mask, R->reward};
    td_rl_prep p = {.adv = R->adv, .w = R->w, .m = R->m, .coef = R->coef};
    td_rl_prepare(&R->lc, &b, &p);
    memset(&R->clip, 0, sizeof R->clip);
    double loss = 0;
    if (R->old_in_update) td_trainer_set_observers(R->tr, on_old_row, R->Lm ? rl_moe_on_old : NULL, R);
    int arc = td_trainer_accumulate(R->tr, R->B, (const int *const *)R->tok, R->len, loss_fn, R, &loss, err);
    td_trainer_set_observers(R->tr, NULL, NULL, NULL);
    if (arc) return -1;
    td_step_info info;
    double scaled = td_trainer_loss_scale(R->tr);
    if (scaled == 1.0 && !grads_finite(R)) {
        td_trainer_zero_grads(R->tr);
        info = (td_step_info){.grad_norm = NAN, .loss_scale = 1.0, .skipped = 1, .lr = NAN};
        R->nonfinite++;
        R->skipped_extra++;
        info.skipped_total = R->skipped_extra;
    } else {
        if (td_trainer_step(R->tr, &info, err)) return -1;
        info.skipped_total += R->skipped_extra;
    }
    double G = (double)R->B / R->G, nt = R->clip.n_tokens;
    M[TD_RLM_loss] = loss;
    M[TD_RLM_aux_loss] = td_trainer_aux_loss(R->tr, 1);
    M[TD_RLM_lr] = info.lr;
    M[TD_RLM_grad_norm] = info.grad_norm;
    M[TD_RLM_loss_scale] = info.loss_scale;
    M[TD_RLM_skipped] = info.skipped;
    M[TD_RLM_skipped_total] = (double)info.skipped_total;
    M[TD_RLM_zero_std_groups] = p.zero_std_groups;
    M[TD_RLM_frac_reward_zero_std] = p.zero_std_groups / G;
    M[TD_RLM_pg_clipfrac] = nt > 0 ? R->clip.clipped / nt : 0.0;
    M[TD_RLM_pg_clipfrac_lower] = nt > 0 ? R->clip.clipped_lower / nt : 0.0;
    M[TD_RLM_ppo_kl] = nt > 0 ? R->clip.ratio_log_sum / nt : 0.0;
    if (R->lc.beta > 0) {   /* TRL: (per_token_kl * mask).sum() / mask.sum(), at pi_theta = pi_old */
        double ks = 0, ms = 0;
        for (int64_t t = 0; t < R->off[R->B]; t++)
            if (R->m[t] > 0) { ks += R->m[t] * td_k3(R->ref[t], R->old[t]); ms += R->m[t]; }
        M[TD_RLM_kl] = ms > 0 ? ks / ms : NAN;
    }
    double lt = (double)p.n_loss_tokens;
    M[TD_RLM_rollout_is_clipped_fraction] = lt > 0 ? p.n_clipped / lt : 0.0;
    M[TD_RLM_rollout_rs_masked_fraction] = lt > 0 ? p.n_masked / lt : 0.0;
    M[TD_RLM_rollout_rs_seq_masked_fraction] = (double)p.n_seq_masked / R->B;
    return 0;
}

/* A mixture of experts' routing of the step in the layout of TRL's input_ids = cat(prompt_ids,
 * completion_ids): (B, P + T, Lm, K), each token's experts as the input at its position, -1 on
 * padding and where the source did not route it */
static int dump_routing(const rl_run *R, td_st_writer *w, const char *name, const int *src, int P, int T, td_error *err)
{
    size_t row = (size_t)R->Lm * R->K, n = (size_t)R->B * (P + T) * row;
    int64_t *x = td_xmalloc(n * sizeof(int64_t));
    for (size_t i = 0; i < n; i++) x[i] = -1;
    for (int s = 0; s < R->B; s++)
        for (int t = 0; t < R->len[s]; t++) {   /* prompt position t at column P - plen + t, completion at P + t - plen */
            int j = t < R->plen[s] ? P - R->plen[s] + t : P + t - R->plen[s];
            const int *e = route_cell((int *)src, R, s, t, 0);
            for (size_t q = 0; q < row; q++) x[((size_t)s * (P + T) + j) * row + q] = e[q];
        }
    int rc = td_st_writer_write_raw(w, name, x, n * sizeof(int64_t), err);
    free(x);
    return rc;
}

/* --dump-step: one step's tensors as TRL holds them in _compute_loss (include/tidal/rl.h) */
static int dump_step(rl_run *R, int k, double loss, td_error *err)
{
    const td_rl_opts *o = R->o;
    int B = R->B, T = 0, P = 0;
    for (int s = 0; s < B; s++) {
        T = R->len[s] - R->plen[s] > T ? R->len[s] - R->plen[s] : T;
        P = R->plen[s] > P ? R->plen[s] : P;
    }
    T = T ? T : 1;
    size_t BT = (size_t)B * T, BP = (size_t)B * P;
    const char *tok_names[] = {"per_token_logps", "old_per_token_logps", "sampling_per_token_logps",
                               "ref_per_token_logps", "completion_mask", "importance_sampling_ratio", "loss_mask",
                               "per_token_loss_grad"};
    const float *tok_src[] = {R->dump_logp, R->old, R->mu, R->lc.beta > 0 ? R->ref : NULL, R->mask, R->w, R->m,
                              R->dump_dlogp};
    enum { NT = sizeof tok_names / sizeof *tok_names };
    float *pad = td_xmalloc(BT * sizeof(float)), *seqv = td_xmalloc((size_t)B * sizeof(float));
    int64_t *ids = td_xmalloc((BT > BP ? BT : BP) * sizeof(int64_t));
    char path[4200], buf[64];
    snprintf(path, sizeof path, "%s/dump-step-%d.safetensors", o->output_dir, k + 1);
    td_st_writer *w = td_st_writer_new(path);
    int64_t shp[2] = {B, T}, shpp[2] = {B, P}, shb[1] = {B};
    int rc = !w ? td_fail(err, "%s: out of memory", path) : 0;
    if (!rc) {
        snprintf(buf, sizeof buf, "%d", k + 1);
        rc = td_st_writer_meta(w, "step", buf, err);
        snprintf(buf, sizeof buf, "%.17g", loss);
        rc = rc || td_st_writer_meta(w, "loss", buf, err);
        rc = rc || td_st_writer_meta(w, "loss_type", td_rl_loss_type_name(R->lc.loss_type), err);
        snprintf(buf, sizeof buf, "%.17g", R->lc.epsilon);
        rc = rc || td_st_writer_meta(w, "epsilon", buf, err);
        snprintf(buf, sizeof buf, "%.17g", R->lc.epsilon_high);
        rc = rc || td_st_writer_meta(w, "epsilon_high", buf, err);
        snprintf(buf, sizeof buf, "%.17g", R->lc.beta);
        rc = rc || td_st_writer_meta(w, "beta", buf, err);
        rc = rc || (o->command_line && td_st_writer_meta(w, "command_line", o->command_line, err));
        rc = rc || td_st_writer_declare(w, "prompt_ids", TD_DT_I64, 2, shpp, err) ||
             td_st_writer_declare(w, "prompt_mask", TD_DT_F32, 2, shpp, err) ||
             td_st_writer_declare(w, "completion_ids", TD_DT_I64, 2, shp, err) ||
             td_st_writer_declare(w, "advantages", TD_DT_F32, 1, shb, err) ||
             td_st_writer_declare(w, "rewards", TD_DT_F32, 1, shb, err);
        for (int i = 0; i < NT && !rc; i++)
            if (tok_src[i]) rc = td_st_writer_declare(w, tok_names[i], TD_DT_F32, 2, shp, err);
        if (R->Lm && !rc) {   /* the routing: the rollout's (what R3 replays) and pi_old's forward's */
            int64_t shr[4] = {B, P + T, R->Lm, R->K};
            char layers[1024] = "";
            const td_config *c = &R->model->cfg;
            size_t n = 0;
            for (int l = 0; l < c->num_layers && n + 16 < sizeof layers; l++)   /* "0,1,2,3": which layers */
                if (td_config_layer_moe(c, l)) n += (size_t)snprintf(layers + n, sizeof layers - n, "%s%d", n ? "," : "", l);
            rc = td_st_writer_meta(w, "moe_layers", layers, err) ||
                 td_st_writer_declare(w, "sampling_routed_experts", TD_DT_I64, 4, shr, err) ||
                 td_st_writer_declare(w, "old_routed_experts", TD_DT_I64, 4, shr, err);
        }
        rc = rc || td_st_writer_begin(w, err);
    }
    if (!rc) {   /* prompts left-padded with 0, as TRL's processor pads them */
        for (int s = 0; s < B; s++)
            for (int p = 0; p < P; p++) {
                int q = p - (P - R->plen[s]);
                ids[(size_t)s * P + p] = q >= 0 ? R->tok[s][q] : 0;
                pad[(size_t)s * P + p] = q >= 0 ? 1.0f : 0.0f;
            }
        rc = td_st_writer_write_raw(w, "prompt_ids", ids, BP * sizeof(int64_t), err) ||
             td_st_writer_write_f32(w, "prompt_mask", pad, BP, err);
    }
    if (!rc) {
        for (int s = 0; s < B; s++)
            for (int t = 0; t < T; t++)
                ids[(size_t)s * T + t] = t < R->len[s] - R->plen[s] ? R->tok[s][R->plen[s] + t] : 0;
        rc = td_st_writer_write_raw(w, "completion_ids", ids, BT * sizeof(int64_t), err);
        for (int s = 0; s < B; s++) seqv[s] = (float)R->adv[s];
        rc = rc || td_st_writer_write_f32(w, "advantages", seqv, (size_t)B, err);
        for (int s = 0; s < B; s++) seqv[s] = (float)R->reward[s];
        rc = rc || td_st_writer_write_f32(w, "rewards", seqv, (size_t)B, err);
    }
    for (int i = 0; i < NT && !rc; i++) {   /* flattened response tokens -> [B, T], 0 on padding */
        if (!tok_src[i]) continue;
        memset(pad, 0, BT * sizeof(float));
        for (int s = 0; s < B; s++)
            memcpy(pad + (size_t)s * T, tok_src[i] + R->off[s], (size_t)(R->off[s + 1] - R->off[s]) * sizeof(float));
        rc = td_st_writer_write_f32(w, tok_names[i], pad, BT, err);
    }
    if (R->Lm && !rc)
        rc = dump_routing(R, w, "sampling_routed_experts", R->route_b, P, T, err) ||
             dump_routing(R, w, "old_routed_experts", R->route_old, P, T, err);
    rc = rc || td_st_writer_finish(w, err);
    td_st_writer_free(w);
    free(pad); free(seqv); free(ids);
    if (!rc && !o->quiet) fprintf(stderr, "tidal-rl: step %d's tensors -> %s\n", k + 1, path);
    return rc ? -1 : 0;
}

/* --eval-steps on the user's own records: one greedy completion each, its reward request kept;
 * built-in task records graded by their task as well */
typedef struct {
    rl_run *R;
    char **req;
    double exact;
    int n_task;
} eval_ctx;

static int eval_one(void *user, size_t i, const int *tok, int plen, int len, td_error *err)
{
    eval_ctx *c = user;
    rl_run *R = c->R;
    const td_task_item *it = &R->ev.items[i];
    if (it->task) {
        td_reward_info info;
        double r;
        if (task_grade(R, it, tok, plen, len, &r, &info, err)) return -1;
        c->exact += info.exact;
        c->n_task++;
    }
    c->req[i] = reward_request(R, R->ev.records[i], R->ev.chat[i], tok, plen, len);
    return 0;
}

/* --eval-steps: the trainer's own policy (its weights, the adapter unmerged as PEFT runs it) on
 * the training recipe, greedy on the KV-cache path: no logit noise, no engine sync. Built-in task
 * records without a reward command: the task's grade (td_sft_evaluate, as tidal-sft). With
 * --reward-command: eval_reward is the command's reward, eval_accuracy the share of built-in
 * records answered exactly, or, when every record is the user's own, the share whose reward is at
 * least 1 (a verifiable reward's full marks). */
static int evaluate(rl_run *R, double *M, td_error *err)
{
    const size_t n = R->n_eval;
    if (!R->reward_proc) {
        td_sft_eval_opts eo = {.recipe = &R->rtrain, .max_new_tokens = R->o->max_completion_length, .batch = R->B};
        double acc, rew;
        td_error why;
        if (td_sft_evaluate(td_trainer_model(R->tr), td_trainer_lora(R->tr), R->tkz, R->ev.items, n, &eo, &acc, &rew,
                            NULL, &why))
            return td_fail(err, "%s: %s", R->eval_path, why.msg);
        M[TD_RLM_eval_reward] = rew;
        M[TD_RLM_eval_accuracy] = acc;
        return 0;
    }
    int rc = 0;
    char **where = td_xcalloc(n, sizeof *where);
    double *rew = td_xcalloc(n, sizeof *rew);
    eval_ctx c = {.R = R, .req = td_xcalloc(n, sizeof(char *))};
    for (size_t i = 0; i < n; i++) {
        char w[4400];
        snprintf(w, sizeof w, "evaluation record %s:%ld", R->eval_path, R->ev.items[i].line);
        where[i] = strdup(w);
    }
    rc = td_greedy_complete(td_trainer_model(R->tr), td_trainer_lora(R->tr), &R->rtrain, R->eval_ids, R->eval_len,
                            n, R->B, R->o->max_completion_length, R->eos, R->n_eos, eval_one, &c, err);
    if (!rc) rc = rl_reward_score(R->reward_proc, (int)n, c.req, rew, NULL, (const char *const *)where, err);
    if (!rc) {
        double sum = 0, full = 0;
        for (size_t i = 0; i < n; i++) {
            sum += rew[i];
            full += rew[i] >= 1.0;
        }
        M[TD_RLM_eval_reward] = sum / (double)n;
        M[TD_RLM_eval_accuracy] = c.n_task ? c.exact / c.n_task : full / (double)n;
    }
    for (size_t i = 0; i < n; i++) { free(where[i]); free(c.req[i]); }
    free(where); free(rew); free(c.req);
    return rc ? -1 : 0;
}

int rl_step(rl_run *R, int k, double *M, td_error *err)
{
    for (int i = 0; i < TD_RLM_COUNT; i++) M[i] = NAN;
    R->nonfinite = 0;
    M[TD_RLM_step] = k;
    double t0 = omp_get_wtime();
    if (R->o->eval_steps > 0 && k % R->o->eval_steps == 0 && evaluate(R, M, err)) return -1;
    /* the current policy on the inference path: the engine's weight sync (sync.c); its bytes
     * brought down from a device on stderr under TIDAL_STEP_D2H=1 (as the trainer's step) */
    size_t d2h0 = td_device_d2h_bytes();
    if (rl_sync(R, M, err)) return -1;
    const char *log = getenv("TIDAL_STEP_D2H");
    if (log && *log && strcmp(log, "0"))
        fprintf(stderr, "tidal: weight sync before step %d: %zu bytes device -> host\n", k + 1,
                td_device_d2h_bytes() - d2h0);
    if (rollout(R, k, M, err)) return -1;
    double t1 = omp_get_wtime();
    if (rewards(R, k, M, err)) return -1;
    double t2 = omp_get_wtime();
    if (score_old(R, err)) return -1;
    double t3 = omp_get_wtime();
    if (R->o->dump_step == k + 1) {
        size_t N = (size_t)R->B * (size_t)R->max_len + 1;
        R->dump_logp = td_xmalloc(N * sizeof(float));
        R->dump_dlogp = td_xmalloc(N * sizeof(float));
    }
    int urc = update(R, M, err);
    if (!urc && R->dump_logp) urc = dump_step(R, k, M[TD_RLM_loss], err);
    free(R->dump_logp); free(R->dump_dlogp);
    R->dump_logp = R->dump_dlogp = NULL;
    if (urc) return -1;
    double t4 = omp_get_wtime();
    response_metrics(R, M);
    double lsum = 0, lmax = 0, trunc = 0;
    for (int s = 0; s < R->B; s++) {
        int T = R->len[s] - R->plen[s];
        lsum += T;
        lmax = fmax(lmax, T);
        trunc += R->finish[s] != TD_FINISH_EOS;
    }
    M[TD_RLM_response_length_mean] = lsum / R->B;
    M[TD_RLM_response_length_max] = lmax;
    M[TD_RLM_response_length_clip_ratio] = trunc / R->B;
    M[TD_RLM_entropy] = R->entropy_n > 0 ? R->entropy_sum / R->entropy_n : NAN;
    M[TD_RLM_nonfinite] = R->nonfinite;
    M[TD_RLM_time_rollout] = t1 - t0;
    M[TD_RLM_time_reward] = t2 - t1;
    M[TD_RLM_time_old] = t3 - t2;
    M[TD_RLM_time_update] = t4 - t3;
    M[TD_RLM_time_step] = omp_get_wtime() - t0;
    return 0;
}
