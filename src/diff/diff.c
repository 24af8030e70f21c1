/* The diff job (see include/tidal/diff.h): batches of prompts through the inference path (B)
 * and the training path (A), metrics per token, rows appended to the run file per batch. */
#include "tidal/diff.h"
#include "tidal/checkpoint.h"
#include "tidal/lora.h"
#include "tidal/metrics.h"
#include "tidal/model.h"
#include "tidal/prompts.h"
#include "tidal/runfile.h"
#include "tidal/tokenizer.h"
#include "columns.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---------------------------------------------------------------- run-file columns */

enum { T_SEQ, T_POS, T_TOKEN, T_LOGP_A, T_LOGP_B, T_LOGP_B_PROC, T_DLOGP, T_KL_BA, T_KL_AB, T_K3, T_TV,
       T_ENT_A, T_ENT_B, T_TOP1_A, T_TOP1_B, T_RANK_A, T_RANK_B, T_IS_PROMPT, T_STEP,
       T_LOGP_TRAINER,   /* replays whose dump holds the trainer's own log-probs only: written last */
       T_COUNT };
static const td_column TOKEN_COLS[T_COUNT] = {
    {"/tokens/seq", TD_COL_I64, 0, 0, 0},        {"/tokens/pos", TD_COL_I32, 0, 0, 0},
    {"/tokens/token", TD_COL_I32, 0, 0, 0},      {"/tokens/logp_a", TD_COL_F64, 0, 0, 0},
    {"/tokens/logp_b", TD_COL_F64, 0, 0, 0},     {"/tokens/logp_b_proc", TD_COL_F64, 0, 0, 0},
    {"/tokens/dlogp", TD_COL_F64, 0, 0, 0},      {"/tokens/kl_ba", TD_COL_F64, 0, 0, 0},
    {"/tokens/kl_ab", TD_COL_F64, 0, 0, 0},      {"/tokens/k3", TD_COL_F64, 0, 0, 0},
    {"/tokens/tv", TD_COL_F64, 0, 0, 0},         {"/tokens/entropy_a", TD_COL_F64, 0, 0, 0},
    {"/tokens/entropy_b", TD_COL_F64, 0, 0, 0},  {"/tokens/top1_a", TD_COL_I32, 0, 0, 0},
    {"/tokens/top1_b", TD_COL_I32, 0, 0, 0},     {"/tokens/rank_a", TD_COL_I32, 0, 0, 0},
    {"/tokens/rank_b", TD_COL_I32, 0, 0, 0},     {"/tokens/is_prompt", TD_COL_I8, 0, 0, 0},
    {"/tokens/step", TD_COL_I32, 0, 0, 0},
    {"/tokens/logp_trainer", TD_COL_F64, 0, 0, 0},
};

enum { S_PROMPT_INDEX, S_BATCH, S_PROMPT_LEN, S_RESPONSE_LEN, S_TOKEN_OFFSET, S_N_SCORED, S_FINISH,
       S_SUM_DLOGP, S_MEAN_ABS, S_MAX_ABS, S_MEAN_KL, S_LOG_RATIO, S_TOKENS_OFFSET, S_COUNT };
static const td_column SEQ_COLS[S_COUNT] = {
    {"/seqs/prompt_index", TD_COL_I64, 0, 0, 0}, {"/seqs/batch", TD_COL_I64, 0, 0, 0},
    {"/seqs/prompt_len", TD_COL_I32, 0, 0, 0},   {"/seqs/response_len", TD_COL_I32, 0, 0, 0},
    {"/seqs/token_offset", TD_COL_I64, 0, 0, 0}, {"/seqs/n_scored", TD_COL_I32, 0, 0, 0},
    {"/seqs/finish", TD_COL_I8, 0, 0, 0},        {"/seqs/sum_dlogp", TD_COL_F64, 0, 0, 0},
    {"/seqs/mean_abs_dlogp", TD_COL_F64, 0, 0, 0}, {"/seqs/max_abs_dlogp", TD_COL_F64, 0, 0, 0},
    {"/seqs/mean_kl_ba", TD_COL_F64, 0, 0, 0},   {"/seqs/log_ratio", TD_COL_F64, 0, 0, 0},
    {"/seqs/tokens_offset", TD_COL_I64, 0, 0, 0},
};
enum { FINISH_LENGTH = 0, FINISH_EOS = 1, FINISH_REPLAY = 2 };

/* /prompts/tokens: every sequence's prompt + response ids, concatenated; a sequence's start is
 * /seqs/tokens_offset and its length prompt_len + response_len. */
enum { P_TOKENS, P_COUNT };
static const td_column PROMPT_COLS[P_COUNT] = {
    {"/prompts/tokens", TD_COL_I32, 0, 0, 0},
};

/* ---------------------------------------------------------------- one batch */

typedef struct {
    int n;                    /* sequences in the batch                                   */
    int V;
    int **seq;                /* (n) prompt + response tokens                             */
    int *len, *plen;          /* (n) full and prompt lengths                              */
    int *finish;              /* (n)                                                      */
    float **rows_b;           /* (n) B's raw log-softmax rows: (len, V) by position       */
    float **logp_b_proc;      /* (n) processed log-prob of the token at each position     */
    const float **replay_b;   /* (n) rollout mode: recorded log-probs of response tokens  */
    td_sampler *proc;         /* replay of processed log-probs: A's row processed the same way */
    const td_sampling *sampling;
    float *proc_row;          /* (V) scratch for it                                       */
    int score_prompt;
    td_token_metrics **m;     /* (n) metrics by predicted position (len)                  */
    unsigned char **have;     /* (n) which positions were scored                          */
    int L, C;                 /* --layers: layers and hidden size, else L = 0             */
    float **res_b;            /* (n) B's residual stream: (len, L, C) by position         */
    float **rel;              /* (n) relative error at each scored position: (len, L)     */
} batch_state;

/* Scored positions of a sequence: the response tokens, and prompt tokens 1..P-1 if asked. */
static int scored(const batch_state *b, int s, int pos)
{
    if (pos < 1 || pos >= b->len[s]) return 0;
    return pos >= b->plen[s] || b->score_prompt;
}

/* Training-path rows arrive here: row t predicts the token at t+1. */
static void on_row_a(void *user, int s, int t, const float *logp_a)
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

/* Prefill rows of the inference path (prompt scoring): row t predicts the token at t+1. */
static void on_row_b_prefill(void *user, int slot, int t, const float *logits)
{
    batch_state *b = user;
    int pos = t + 1;
    if (pos >= b->plen[slot]) return;   /* the last prompt row is handled by the decode loop */
    float *dst = b->rows_b[slot] + (size_t)pos * b->V;
    memcpy(dst, logits, (size_t)b->V * sizeof(float));
    td_log_softmax(dst, b->V);
    b->logp_b_proc[slot][pos] = dst[b->seq[slot][pos]];
}

/* --layers: the inference path's residual stream after each layer, kept by position. */
static void on_layer_b(void *user, int l, int N, const int *slot, const int *pos, const float *x)
{
    batch_state *b = user;
    for (int i = 0; i < N; i++)
        memcpy(b->res_b[slot[i]] + ((size_t)pos[i] * b->L + l) * b->C, x + (size_t)i * b->C,
               (size_t)b->C * sizeof(float));
}

/* --layers: the training path's residual at position t against B's: ||h_a - h_b|| / ||h_a||,
 * recorded for the token at t + 1 that this position predicts. */
static void on_layer_a(void *user, int l, int N, const int *seq, const int *pos, const float *x)
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

/* ---------------------------------------------------------------- the job */

typedef struct {
    const td_diff_opts *o;
    td_model *model;
    td_tokenizer *tok;
    td_prompt_set prompts;
    size_t *mine;            /* prompt indices of this shard, in order */
    size_t n_mine;
    td_forward *fa;
    td_session *sb;
    td_lora *lora;           /* --lora adapter, or NULL */
    td_sampler *sampler;
    td_runfile *rf;
    int max_len;             /* longest prompt + max_new_tokens (context-bounded) */
    int eos[TD_CONFIG_MAX_EOS];  /* ids that end a sequence: generation_config.json's list, else config.json's */
    int n_eos;
    td_column tcols[T_COUNT], scols[S_COUNT], pcols[P_COUNT];
    float *layer_rows;       /* --layers: (rows, L) of the batch being collected */
    size_t n_layer_rows, cap_layer_rows;
    int64_t token_rows, seq_rows, prompt_rows;
    /* --force over a finished file: the new run is written to OUT.new.tmp and takes OUT's
     * place only once it holds a completed batch (or is complete), so a mistake in the new
     * command (a mistyped prompts file, a model that fails to load) keeps the old result. */
    int replacing;
    char write_path[4200];
} job;

static int tokenize_cb(void *user, const char *text, size_t len, bool model_input, int32_t **ids, size_t *n, td_error *err)
{
    return td_tokenizer_encode((const td_tokenizer *)user, text, len, model_input, !model_input, ids, n, err);
}

static bool is_eos(const job *J, int y)
{
    for (int i = 0; i < J->n_eos; i++)
        if (y == J->eos[i]) return true;
    return false;
}

/* The stop set as the run file records it: "[128001,128008,128009]". */
static void eos_json(const job *J, char *out, size_t cap)
{
    size_t n = (size_t)snprintf(out, cap, "[");
    for (int i = 0; i < J->n_eos && n < cap; i++) n += (size_t)snprintf(out + n, cap - n, "%s%d", i ? "," : "", J->eos[i]);
    if (n < cap) snprintf(out + n, cap - n, "]");
}

/* Generates responses for the batch's prompts with the inference path (B). */
static int generate(job *J, batch_state *b, const size_t *idx, td_error *err)
{
    const td_diff_opts *o = J->o;
    int V = b->V;
    float *logits = td_xmalloc((size_t)b->n * V * sizeof(float));
    float *proc = td_xmalloc((size_t)V * sizeof(float));
    int *slots = td_xmalloc((size_t)b->n * sizeof(int)), *next = td_xmalloc((size_t)b->n * sizeof(int));
    td_rng *rng = td_xmalloc((size_t)b->n * sizeof(td_rng));
    float *out = td_xmalloc((size_t)b->n * V * sizeof(float));   /* one decode step's rows */
    int rc = -1;
    for (int s = 0; s < b->n; s++) {
        td_rng_stream(&rng[s], o->seed, idx[s]);
        td_session_reset(J->sb, s);
        if (td_session_prefill(J->sb, s, b->seq[s], b->plen[s], logits + (size_t)s * V,
                               o->score_prompt ? on_row_b_prefill : NULL, b, err)) goto done;
    }
    int active = b->n;
    for (int step = 0; step < o->max_new_tokens && active > 0; step++) {
        int n = 0;
        for (int s = 0; s < b->n; s++) {
            if (b->finish[s] >= 0) continue;
            if (b->len[s] >= J->max_len) { b->finish[s] = FINISH_LENGTH; active--; continue; }  /* buffers hold max_len */
            const float *lg = logits + (size_t)s * V;
            int pos = b->len[s];                          /* position of the token drawn */
            int y = td_sample(J->sampler, &o->sampling, lg, b->seq[s], b->len[s], &rng[s], proc);
            float *row = b->rows_b[s] + (size_t)pos * V;
            memcpy(row, lg, (size_t)V * sizeof(float));
            td_log_softmax(row, V);
            b->logp_b_proc[s][pos] = proc[y];
            b->seq[s][pos] = y;
            b->len[s]++;
            if (o->stop_at_eos && is_eos(J, y)) b->finish[s] = FINISH_EOS;
            else if (b->len[s] - b->plen[s] >= o->max_new_tokens || b->len[s] >= J->max_len) b->finish[s] = FINISH_LENGTH;
            if (b->finish[s] >= 0) { active--; continue; }
            slots[n] = s;
            next[n] = y;
            n++;
        }
        if (n == 0) break;
        if (td_session_decode(J->sb, n, slots, next, out, err)) goto done;
        for (int i = 0; i < n; i++) memcpy(logits + (size_t)slots[i] * V, out + (size_t)i * V, (size_t)V * sizeof(float));
    }
    for (int s = 0; s < b->n; s++) if (b->finish[s] < 0) b->finish[s] = FINISH_LENGTH;
    rc = 0;
done:
    free(logits); free(proc); free(slots); free(next); free(rng); free(out);
    return rc;
}

/* Appends a finished batch's rows to the column buffers. */
static void collect(job *J, batch_state *b, const size_t *idx, int64_t batch_no)
{
    for (int s = 0; s < b->n; s++) {
        int64_t seq_row = J->seq_rows + s;
        int64_t first = J->token_rows + (int64_t)J->tcols[T_SEQ].n;
        double sum = 0, sum_abs = 0, mx = 0, kl = 0, log_ratio = 0;
        int ns = 0;
        for (int pos = 1; pos < b->len[s]; pos++) {
            if (!b->have[s][pos]) continue;
            const td_token_metrics *m = &b->m[s][pos];
            double d = m->logp_b - m->logp_a;
            td_column *c = J->tcols;
            td_column_push_i64(&c[T_SEQ], seq_row);
            td_column_push_i32(&c[T_POS], pos);
            td_column_push_i32(&c[T_TOKEN], b->seq[s][pos]);
            td_column_push_f64(&c[T_LOGP_A], m->logp_a);
            td_column_push_f64(&c[T_LOGP_B], m->logp_b);
            td_column_push_f64(&c[T_LOGP_B_PROC], b->replay_b ? NAN : b->logp_b_proc[s][pos]);
            td_column_push_f64(&c[T_DLOGP], d);
            td_column_push_f64(&c[T_KL_BA], m->kl_ba);
            td_column_push_f64(&c[T_KL_AB], m->kl_ab);
            td_column_push_f64(&c[T_K3], m->k3);
            td_column_push_f64(&c[T_TV], m->tv);
            td_column_push_f64(&c[T_ENT_A], m->entropy_a);
            td_column_push_f64(&c[T_ENT_B], m->entropy_b);
            td_column_push_i32(&c[T_TOP1_A], m->top1_a);
            td_column_push_i32(&c[T_TOP1_B], m->top1_b);
            td_column_push_i32(&c[T_RANK_A], m->rank_a);
            td_column_push_i32(&c[T_RANK_B], m->rank_b);
            td_column_push_i8(&c[T_IS_PROMPT], pos < b->plen[s]);
            td_column_push_i32(&c[T_STEP], pos - b->plen[s]);   /* generation step; < 0 in the prompt */
            if (J->prompts.has_trainer_logp) {
                const float *tr = J->prompts.items[idx[s]].trainer_logp;
                td_column_push_f64(&c[T_LOGP_TRAINER], tr && pos >= b->plen[s] ? tr[pos - b->plen[s]] : NAN);
            }
            if (b->L) {
                if (J->n_layer_rows == J->cap_layer_rows) {
                    J->cap_layer_rows = J->cap_layer_rows ? 2 * J->cap_layer_rows : 1024;
                    J->layer_rows = td_xrealloc(J->layer_rows, J->cap_layer_rows * b->L * sizeof(float));
                }
                memcpy(J->layer_rows + J->n_layer_rows * b->L, b->rel[s] + (size_t)pos * b->L, b->L * sizeof(float));
                J->n_layer_rows++;
            }
            sum += d;
            sum_abs += fabs(d);
            if (fabs(d) > mx) mx = fabs(d);
            kl += m->kl_ba;
            if (pos >= b->plen[s]) log_ratio += m->logp_a - m->logp_b;
            ns++;
        }
        td_column *c = J->scols;
        td_column_push_i64(&c[S_PROMPT_INDEX], (int64_t)idx[s]);
        td_column_push_i64(&c[S_BATCH], batch_no);
        td_column_push_i32(&c[S_PROMPT_LEN], b->plen[s]);
        td_column_push_i32(&c[S_RESPONSE_LEN], b->len[s] - b->plen[s]);
        td_column_push_i64(&c[S_TOKEN_OFFSET], first);
        td_column_push_i32(&c[S_N_SCORED], ns);
        td_column_push_i8(&c[S_FINISH], (int8_t)b->finish[s]);
        td_column_push_f64(&c[S_SUM_DLOGP], sum);
        td_column_push_f64(&c[S_MEAN_ABS], ns ? sum_abs / ns : NAN);
        td_column_push_f64(&c[S_MAX_ABS], mx);
        td_column_push_f64(&c[S_MEAN_KL], ns ? kl / ns : NAN);
        td_column_push_f64(&c[S_LOG_RATIO], log_ratio);
        td_column_push_i64(&c[S_TOKENS_OFFSET], J->prompt_rows + (int64_t)J->pcols[P_TOKENS].n);
        for (int t = 0; t < b->len[s]; t++) td_column_push_i32(&J->pcols[P_TOKENS], b->seq[s][t]);
    }
}

static int run_batch(job *J, int64_t batch_no, const size_t *idx, int n, td_error *err)
{
    const td_diff_opts *o = J->o;
    batch_state b = {.n = n, .V = J->model->cfg.vocab_size, .score_prompt = o->score_prompt};
    int maxl = J->max_len;
    b.seq = td_xcalloc((size_t)n, sizeof(int *));
    b.len = td_xcalloc((size_t)n, sizeof(int));
    b.plen = td_xcalloc((size_t)n, sizeof(int));
    b.finish = td_xcalloc((size_t)n, sizeof(int));
    b.rows_b = td_xcalloc((size_t)n, sizeof(float *));
    b.logp_b_proc = td_xcalloc((size_t)n, sizeof(float *));
    b.m = td_xcalloc((size_t)n, sizeof(td_token_metrics *));
    b.have = td_xcalloc((size_t)n, sizeof(unsigned char *));
    int replay = J->prompts.has_rollouts;
    if (replay) b.replay_b = td_xcalloc((size_t)n, sizeof(float *));
    if (replay && o->rollout_logprobs && !strcmp(o->rollout_logprobs, "processed")) {
        b.proc = td_sampler_create(b.V);
        b.sampling = &o->sampling;
        b.proc_row = td_xmalloc((size_t)b.V * sizeof(float));
    }
    if (o->layers) {
        b.L = J->model->cfg.num_layers;
        b.C = J->model->cfg.hidden_size;
        b.res_b = td_xcalloc((size_t)n, sizeof(float *));
        b.rel = td_xcalloc((size_t)n, sizeof(float *));
    }
    for (int s = 0; s < n; s++) {
        const td_prompt *p = &J->prompts.items[idx[s]];
        b.seq[s] = td_xmalloc((size_t)maxl * sizeof(int));
        for (int t = 0; t < p->n_prompt; t++) b.seq[s][t] = p->prompt[t];
        b.plen[s] = b.len[s] = p->n_prompt;
        b.finish[s] = -1;
        if (replay) {
            for (int t = 0; t < p->n_response; t++) b.seq[s][p->n_prompt + t] = p->response[t];
            b.len[s] += p->n_response;
            b.finish[s] = FINISH_REPLAY;
            b.replay_b[s] = p->rollout_logp;
        } else {
            b.rows_b[s] = td_xmalloc((size_t)maxl * b.V * sizeof(float));
            b.logp_b_proc[s] = td_xmalloc((size_t)maxl * sizeof(float));
        }
        b.m[s] = td_xcalloc((size_t)maxl, sizeof(td_token_metrics));
        if (b.L) {
            b.res_b[s] = td_xmalloc((size_t)maxl * b.L * b.C * sizeof(float));
            b.rel[s] = td_xcalloc((size_t)maxl * b.L, sizeof(float));
        }
        b.have[s] = td_xcalloc((size_t)maxl, 1);
    }
    int rc = -1;
    if (b.L) {
        td_session_set_layer_fn(J->sb, on_layer_b, &b);
        td_forward_set_layer_fn(J->fa, on_layer_a, &b);
    }
    if (!replay && generate(J, &b, idx, err)) goto done;
    if (td_forward_logprobs(J->fa, n, (const int *const *)b.seq, b.len, NULL, on_row_a, &b, err)) goto done;
    collect(J, &b, idx, batch_no);
    rc = 0;
done:
    for (int s = 0; s < n; s++) {
        free(b.seq[s]); free(b.rows_b[s]); free(b.logp_b_proc[s]); free(b.m[s]); free(b.have[s]);
        if (b.L) { free(b.res_b[s]); free(b.rel[s]); }
    }
    free(b.res_b); free(b.rel);
    if (b.L) { td_session_set_layer_fn(J->sb, NULL, NULL); td_forward_set_layer_fn(J->fa, NULL, NULL); }
    free(b.seq); free(b.len); free(b.plen); free(b.finish); free(b.rows_b); free(b.logp_b_proc);
    free(b.m); free(b.have); free(b.replay_b);
    td_sampler_free(b.proc);
    free(b.proc_row);
    return rc;
}

/* --force: the new file (J->write_path, closed or open) replaces OUT by a rename; reopened for
 * appending when the run goes on. */
static int take_place(job *J, int reopen, td_error *err)
{
    if (!J->replacing) return 0;
    if (J->rf && td_runfile_close(J->rf, err)) { J->rf = NULL; return -1; }
    J->rf = NULL;
    if (rename(J->write_path, J->o->out_path) != 0)
        return td_fail(err, "%s: cannot replace it with %s", J->o->out_path, J->write_path);
    J->replacing = 0;
    if (reopen && !(J->rf = td_runfile_open(J->o->out_path, 1, err))) return -1;
    return 0;
}

/* Writes the buffered batch rows, then its /progress row, then flushes. */
static int commit_batch(job *J, int64_t batch_no, td_error *err)
{
    if (td_columns_write(J->rf, J->tcols, J->prompts.has_trainer_logp ? T_COUNT : T_COUNT - 1, err) || td_columns_write(J->rf, J->scols, S_COUNT, err) ||
        td_columns_write(J->rf, J->pcols, P_COUNT, err)) return -1;
    if (J->o->layers && td_runfile_append(J->rf, "/layers/rel_err", TD_COL_F32, (size_t)J->model->cfg.num_layers,
                                          J->layer_rows, J->n_layer_rows, err)) return -1;
    J->n_layer_rows = 0;
    J->token_rows += (int64_t)J->tcols[0].n;
    J->seq_rows += (int64_t)J->scols[0].n;
    J->prompt_rows += (int64_t)J->pcols[P_TOKENS].n;
    td_columns_clear(J->tcols, T_COUNT);
    td_columns_clear(J->scols, S_COUNT);
    td_columns_clear(J->pcols, P_COUNT);
    int64_t prog[4] = {batch_no, J->seq_rows, J->token_rows, J->prompt_rows};
    if (td_runfile_append(J->rf, "/progress/batch", TD_COL_I64, 1, &prog[0], 1, err) ||
        td_runfile_append(J->rf, "/progress/seq_rows", TD_COL_I64, 1, &prog[1], 1, err) ||
        td_runfile_append(J->rf, "/progress/token_rows", TD_COL_I64, 1, &prog[2], 1, err) ||
        td_runfile_append(J->rf, "/progress/prompt_rows", TD_COL_I64, 1, &prog[3], 1, err))
        return -1;
    if (td_runfile_flush(J->rf, err)) return -1;
    return take_place(J, 1, err);
}

/* FNV-1a over config.json and the safetensors headers' bytes: a fingerprint of the model. */
static uint64_t fnv1a(uint64_t h, const void *data, size_t n)
{
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) { h ^= p[i]; h *= 0x100000001B3ull; }
    return h;
}

static void model_fingerprint(const char *dir, char out[32])
{
    uint64_t h = 0xCBF29CE484222325ull;
    const char *files[] = {"config.json", "model.safetensors", "model.safetensors.index.json"};
    for (size_t i = 0; i < 3; i++) {
        char path[4096];
        snprintf(path, sizeof path, "%s/%s", dir, files[i]);
        FILE *f = fopen(path, "rb");
        if (!f) continue;
        char buf[65536];
        size_t n = fread(buf, 1, sizeof buf, f);   /* the header and config: first 64 KiB */
        h = fnv1a(h, buf, n);
        struct stat st;
        if (stat(path, &st) == 0) h = fnv1a(h, &st.st_size, sizeof st.st_size);
        fclose(f);
    }
    snprintf(out, 32, "fnv1a64:%016llx", (unsigned long long)h);
}

static char *sampling_json(const td_diff_opts *o)
{
    char *s = td_xmalloc(512);
    snprintf(s, 512, "{\"temperature\":%.17g,\"top_p\":%.17g,\"top_k\":%d,\"min_p\":%.17g,"
             "\"repetition_penalty\":%.17g,\"max_new_tokens\":%d,\"stop_at_eos\":%s}",
             o->sampling.temperature, o->sampling.top_p, o->sampling.top_k, o->sampling.min_p,
             o->sampling.repetition_penalty, o->max_new_tokens, o->stop_at_eos ? "true" : "false");
    return s;
}

/* The attributes that must match for --resume to continue a file. */
static int check_same(td_runfile *rf, const char *name, const char *want, td_error *err)
{
    td_error e2;
    char *have = td_runfile_get_str(rf, name, &e2);
    int same = have && !strcmp(have, want);
    free(have);
    if (!same)
        return td_fail(err, "%s: --resume with a different %s than the file was made with; use a new -o", td_runfile_path(rf), name);
    return 0;
}

static int open_output(job *J, td_error *err)
{
    const td_diff_opts *o = J->o;
    char fp[32], shard[64], seed[32];
    model_fingerprint(o->model_dir, fp);
    snprintf(shard, sizeof shard, "%d/%d", o->shard_k, o->shard_n);
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)o->seed);
    char *ra = td_recipe_to_json(&o->recipe_a), *rb = td_recipe_to_json(&o->recipe_b), *sj = sampling_json(o);
    char batch[32], score[8], layers[8];
    snprintf(batch, sizeof batch, "%d", o->batch);
    snprintf(score, sizeof score, "%d", o->score_prompt);
    snprintf(layers, sizeof layers, "%d", o->layers);
    const char *mode_a = !o->lora_dir ? "none" : o->lora_merge_a ? "merged" : "unmerged";
    const char *mode_b = !o->lora_dir || J->prompts.has_rollouts ? "none" : o->lora_merge_b ? "merged" : "unmerged";
    const char *keys[] = {"model_fingerprint", "recipe_a", "recipe_b", "sampling", "seed_str", "shard", "batch", "score_prompt", "prompts_file",
                          "layers", "lora_path", "lora_mode_a", "lora_mode_b"};
    const char *vals[] = {fp, ra, rb, sj, seed, shard, batch, score, o->prompts_path, layers, o->lora_dir ? o->lora_dir : "", mode_a, mode_b};
    int rc = -1;
    char *model_abs = NULL;
    if (o->resume) {
        J->rf = td_runfile_open(o->out_path, 1, err);
        if (!J->rf) goto done;
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (check_same(J->rf, keys[i], vals[i], err)) goto done;
        /* cut away rows written after the last completed batch */
        int64_t nb = td_runfile_rows(J->rf, "/progress/batch");
        int64_t p[3] = {0, 0, 0};
        if (nb > 0) {
            if (td_runfile_read(J->rf, "/progress/seq_rows", TD_COL_I64, nb - 1, 1, &p[0], err) ||
                td_runfile_read(J->rf, "/progress/token_rows", TD_COL_I64, nb - 1, 1, &p[1], err) ||
                td_runfile_read(J->rf, "/progress/prompt_rows", TD_COL_I64, nb - 1, 1, &p[2], err)) goto done;
        }
        /* the counts come from the file: they must name rows the file holds (they size buffers) */
        const char *held[3] = {"/seqs/prompt_index", "/tokens/seq", "/prompts/tokens"};
        for (int k = 0; k < 3; k++) {
            int64_t have = td_runfile_rows(J->rf, held[k]);
            if (nb < 0 || have < 0) {
                td_fail(err, "%s: %s claims more rows than its storage holds (corrupt file?)", o->out_path,
                        nb < 0 ? "/progress/batch" : held[k]);
                goto done;
            }
            if (p[k] < 0 || p[k] > have) {
                td_fail(err, "%s: /progress says %lld rows of %s are complete but the file holds %lld (corrupt file?)",
                        o->out_path, (long long)p[k], held[k], (long long)have);
                goto done;
            }
        }
        J->seq_rows = p[0];
        J->token_rows = p[1];
        J->prompt_rows = p[2];
        if (td_runfile_truncate_group(J->rf, "/seqs", p[0], err) || td_runfile_truncate_group(J->rf, "/tokens", p[1], err) ||
            td_runfile_truncate_group(J->rf, "/layers", p[1], err) ||
            td_runfile_truncate_group(J->rf, "/prompts", p[2], err) || td_runfile_truncate_group(J->rf, "/progress", nb, err))
            goto done;
        rc = 0;
        goto done;
    }
    J->rf = td_runfile_create(J->write_path, o->force, err);
    if (!J->rf) goto done;
    /* absolute, so that tools run from another directory still find the tokenizer (the
     * fingerprint tells them whether the checkpoint there is still the one that was run) */
    model_abs = realpath(o->model_dir, NULL);
    char created[64];
    time_t now = time(NULL);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    if (td_runfile_set_str(J->rf, "command_line", o->command_line ? o->command_line : "", err) ||
        td_runfile_set_str(J->rf, "tool", "tidal-diff", err) ||
        td_runfile_set_str(J->rf, "created", created, err) ||
        td_runfile_set_str(J->rf, "model_path", model_abs ? model_abs : o->model_dir, err) ||
        td_runfile_set_i64(J->rf, "seed", (int64_t)o->seed, err) ||
        td_runfile_set_str(J->rf, "recipe_a_name", o->recipe_a.name, err) ||
        td_runfile_set_str(J->rf, "recipe_b_name", o->recipe_b.name, err) ||
        td_runfile_set_str(J->rf, "mode", J->prompts.has_rollouts ? "replay" : "generate", err) ||
        td_runfile_set_i64(J->rf, "batches_planned", (int64_t)((J->n_mine + (size_t)o->batch - 1) / (size_t)o->batch), err))
        goto done;
    char eos[16 * TD_CONFIG_MAX_EOS];
    eos_json(J, eos, sizeof eos);
    if (td_runfile_set_str(J->rf, "eos_token_ids", eos, err) ||
        td_runfile_set_str(J->rf, "config_unknown_keys", J->model->cfg.unknown_keys, err))
        goto done;
    /* a replay: where the engine's log-probs came from, and what they are (raw log-softmax, or
     * after the engine's temperature / top-p / top-k: --rollout-logprobs) */
    if (J->prompts.has_rollouts &&
        (td_runfile_set_str(J->rf, "rollout_format", J->prompts.rollout_format, err) ||
         td_runfile_set_str(J->rf, "rollout_logprobs", o->rollout_logprobs ? o->rollout_logprobs : "raw", err) ||
         td_runfile_set_str(J->rf, "trainer_logprobs", J->prompts.has_trainer_logp ? "yes" : "no", err)))
        goto done;
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        if (td_runfile_set_str(J->rf, keys[i], vals[i], err)) goto done;
    if (td_runfile_flush(J->rf, err)) goto done;
    rc = 0;
done:
    free(ra); free(rb); free(sj); free(model_abs);
    return rc;
}

/* Prompt indices already in the file (resume), as a sorted-free mark array. */
static int mark_done(job *J, unsigned char *done, td_error *err)
{
    int64_t n = J->seq_rows;
    if (n == 0) return 0;
    int64_t *idx = td_xmalloc((size_t)n * sizeof(int64_t));
    int rc = td_runfile_read(J->rf, "/seqs/prompt_index", TD_COL_I64, 0, n, idx, err);
    for (int64_t i = 0; rc == 0 && i < n; i++)
        if (idx[i] >= 0 && (size_t)idx[i] < J->prompts.n) done[idx[i]] = 1;
    free(idx);
    return rc;
}

/* A merged adapter's survival (lora.h): on stderr and as root attributes lora_survival_X,
 * lora_changed_frac_X, lora_aligned_X (X = a or b). */
static int lora_report(job *J, char path, td_lora_merge_stats st, const td_recipe *r, td_error *err)
{
    if (!st.merged) return 0;
    const td_format_traits *ft = td_format_info(r->weights);
    fprintf(stderr, "lora: merged into %s weights of path %c: %.1f%% of the update survives (%.1f%% of elements changed, "
            "%.1f%% along the update)\n", ft ? ft->name : "?", path == 'a' ? 'A' : 'B', 100 * st.survival,
            100 * st.changed_frac, 100 * st.aligned);
    char k1[32], k2[32], k3[32];
    snprintf(k1, sizeof k1, "lora_survival_%c", path);
    snprintf(k2, sizeof k2, "lora_changed_frac_%c", path);
    snprintf(k3, sizeof k3, "lora_aligned_%c", path);
    if (td_runfile_set_f64(J->rf, k1, st.survival, err) || td_runfile_set_f64(J->rf, k2, st.changed_frac, err) ||
        td_runfile_set_f64(J->rf, k3, st.aligned, err)) return -1;
    return 0;
}

static void job_free(job *J)
{
    td_forward_free(J->fa);
    td_session_free(J->sb);
    td_sampler_free(J->sampler);
    td_columns_free(J->tcols, T_COUNT);
    td_columns_free(J->scols, S_COUNT);
    td_columns_free(J->pcols, P_COUNT);
    td_prompts_free(&J->prompts);
    free(J->mine);
    free(J->layer_rows);
    if (J->tok) td_tokenizer_free(J->tok);
    td_lora_free(J->lora);
    if (J->model) td_model_free(J->model);
}

int td_diff_run(const td_diff_opts *o, td_diff_summary *sum, td_error *err)
{
    job J;
    memset(&J, 0, sizeof J);
    J.o = o;
    memcpy(J.tcols, TOKEN_COLS, sizeof TOKEN_COLS);
    memcpy(J.scols, SEQ_COLS, sizeof SEQ_COLS);
    memcpy(J.pcols, PROMPT_COLS, sizeof PROMPT_COLS);
    int rc = -1;
    unsigned char *done = NULL;
    if (o->batch < 1 || o->max_new_tokens < 0 || o->shard_n < 1 || o->shard_k < 0 || o->shard_k >= o->shard_n) {
        td_fail(err, "bad options: --batch %d, --max-new-tokens %d, --shard %d/%d", o->batch, o->max_new_tokens, o->shard_k, o->shard_n);
        goto out;
    }
    if (td_sampling_check(&o->sampling, err)) goto out;
    /* fail on an unwritable output before the long work, not after it; a finished file that
     * --force replaces stays until the new run has a completed batch (take_place) */
    J.replacing = !o->resume && o->force && access(o->out_path, F_OK) == 0;
    snprintf(J.write_path, sizeof J.write_path, J.replacing ? "%s.new.tmp" : "%s", o->out_path);
    if (!o->resume) {
        J.rf = td_runfile_create(J.write_path, o->force, err);
        if (!J.rf) goto out;
        td_runfile_close(J.rf, NULL);
        J.rf = NULL;
        remove(J.write_path);
    }
    fprintf(stderr, "tidal-diff: loading %s\n", o->model_dir);
    J.model = td_model_load(o->model_dir, err);
    if (!J.model) goto out;
    const td_config *cfg = &J.model->cfg;
    if (o->lora_dir && !(J.lora = td_lora_load(o->lora_dir, cfg, err))) goto out;
    char tok_path[4096];
    snprintf(tok_path, sizeof tok_path, "%s/tokenizer.json", o->model_dir);
    struct stat st;
    if (stat(tok_path, &st) == 0) {
        J.tok = td_tokenizer_load(tok_path, err);
        if (!J.tok) goto out;
    }
    /* the stop set: generation_config.json's eos list wins over config.json's, as in transformers */
    char gen_path[4096];
    snprintf(gen_path, sizeof gen_path, "%s/generation_config.json", o->model_dir);
    td_gen_config gen;
    if (td_gen_config_parse(stat(gen_path, &st) == 0 ? gen_path : NULL, cfg, &gen, err)) goto out;
    J.n_eos = gen.n_eos;
    memcpy(J.eos, gen.eos_token_ids, sizeof J.eos);
    if (J.n_eos == 0 && J.tok && td_tokenizer_eos_id(J.tok) >= 0) J.eos[J.n_eos++] = td_tokenizer_eos_id(J.tok);
    int ctx = cfg->max_position > 0 ? cfg->max_position : 1 << 20;
    td_prompt_reader reader = {.tokenize = J.tok ? tokenize_cb : NULL, .tok_user = J.tok, .vocab_size = cfg->vocab_size,
                               .max_len = ctx, .skip_bad = o->skip_bad_lines};
    if (J.tok) {
        reader.chat_template = td_tokenizer_chat_template(J.tok, &reader.chat_template_from);
        reader.bos_token = td_tokenizer_token_str(J.tok, td_tokenizer_bos_id(J.tok));
        reader.eos_token = td_tokenizer_token_str(J.tok, td_tokenizer_eos_id(J.tok));
    }
    if (td_prompts_read(o->prompts_path, &reader, &J.prompts, err)) goto out;
    if (J.prompts.has_rollouts && o->score_prompt) { td_fail(err, "--score-prompt applies to generated runs, not to replayed rollouts"); goto out; }
    if (J.prompts.has_rollouts && o->layers) { td_fail(err, "--layers needs the inference path's hidden states: it applies to generated runs, not to replayed rollouts"); goto out; }
    /* this shard's prompts, in file order */
    J.mine = td_xmalloc(J.prompts.n * sizeof(size_t));
    int max_prompt = 0;
    for (size_t i = 0; i < J.prompts.n; i++) {
        if ((int)(i % (size_t)o->shard_n) != o->shard_k) continue;
        J.mine[J.n_mine++] = i;
        int l = J.prompts.items[i].n_prompt + J.prompts.items[i].n_response;
        /* a generated sequence must fit the context whole: refuse it here, not cut it short */
        if (!J.prompts.has_rollouts && (int64_t)l + o->max_new_tokens > ctx) {
            td_fail(err, "%s:%ld: prompt of %d tokens + --max-new-tokens %d is past the model's context of %d "
                    "positions (max_position_embeddings); shorten the prompt or lower --max-new-tokens",
                    o->prompts_path, J.prompts.items[i].line, l, o->max_new_tokens, ctx);
            goto out;
        }
        td_error why;
        if (td_config_check_len(cfg, (int64_t)l + (J.prompts.has_rollouts ? 0 : o->max_new_tokens), &why)) {
            td_fail(err, "%s:%ld: %s", o->prompts_path, J.prompts.items[i].line, why.msg);
            goto out;
        }
        if (l > max_prompt) max_prompt = l;
    }
    J.max_len = max_prompt + (J.prompts.has_rollouts ? 0 : o->max_new_tokens);
    if (J.max_len > ctx) J.max_len = ctx;
    if (J.max_len < 2) J.max_len = 2;

    if (open_output(&J, err)) goto out;
    done = td_xcalloc(J.prompts.n, 1);
    if (mark_done(&J, done, err)) goto out;

    J.fa = td_forward_create(J.model, J.max_len * (o->batch < 4 ? o->batch : 4), J.max_len, 0, err);
    if (!J.fa || td_forward_set_recipe_lora(J.fa, &o->recipe_a, J.lora, o->lora_merge_a, err)) goto out;
    if (lora_report(&J, 'a', td_forward_lora_stats(J.fa), &o->recipe_a, err)) goto out;
    if (!J.prompts.has_rollouts) {
        J.sb = td_session_create(J.model, o->batch, J.max_len, 0, err);
        if (!J.sb || td_session_set_recipe_lora(J.sb, &o->recipe_b, J.lora, o->lora_merge_b, err)) goto out;
        if (lora_report(&J, 'b', td_session_lora_stats(J.sb), &o->recipe_b, err)) goto out;
        td_session_set_raw_logits(J.sb, 1);
        J.sampler = td_sampler_create(cfg->vocab_size);
    } else if (o->lora_merge_b) {
        fprintf(stderr, "tidal-diff: note: --lora-merge-b has no effect when replaying rollouts (path B is the recorded log-probs)\n");
    }
    size_t nbatches = (J.n_mine + (size_t)o->batch - 1) / (size_t)o->batch, skipped = 0;
    struct timespec ts0, ts1;
    clock_gettime(CLOCK_MONOTONIC, &ts0);
    int64_t tokens0 = J.token_rows, ran = 0;
    time_t w0 = time(NULL);
    int tty = isatty(fileno(stderr));
    for (size_t bi = 0; bi < nbatches; bi++) {
        size_t i0 = bi * (size_t)o->batch, n = J.n_mine - i0 < (size_t)o->batch ? J.n_mine - i0 : (size_t)o->batch;
        if (done[J.mine[i0]]) { skipped++; continue; }   /* batches are all-or-nothing */
        if (o->stop && *o->stop) {
            fprintf(stderr, "\n");
            if (J.replacing)
                td_fail(err, TD_DIFF_INTERRUPTED ": stopped before batch %zu of %zu; nothing of the new run was "
                        "kept and %s is as it was", bi + 1, nbatches, o->out_path);
            else
                td_fail(err, TD_DIFF_INTERRUPTED ": stopped before batch %zu of %zu; %s holds every batch "
                        "completed so far (--resume finishes it)", bi + 1, nbatches, o->out_path);
            goto out;
        }
        if (run_batch(&J, (int64_t)bi, J.mine + i0, (int)n, err)) goto out;
        if (commit_batch(&J, (int64_t)bi, err)) goto out;
        ran++;
        double el = difftime(time(NULL), w0);
        fprintf(stderr, "%stidal-diff: batch %zu/%zu  sequences %lld  tokens %lld  %.0f s%s", tty ? "\r" : "", bi + 1,
                nbatches, (long long)J.seq_rows, (long long)J.token_rows, el, tty ? "" : "\n");
    }
    clock_gettime(CLOCK_MONOTONIC, &ts1);
    if (tty && nbatches) fprintf(stderr, "\n");
    if (skipped) fprintf(stderr, "tidal-diff: resumed: %zu batches were already complete\n", skipped);
    if (td_runfile_close(J.rf, err)) { J.rf = NULL; goto out; }
    J.rf = NULL;
    if (take_place(&J, 0, err)) goto out;   /* a run with no batch to do */
    if (td_runfile_compact(o->out_path, err)) goto out;   /* complete: drop the appends' dead space */
    rc = sum ? td_diff_summarize(o->out_path, sum, err) : 0;
    if (sum) {
        sum->run_batches = ran;
        sum->run_tokens = J.token_rows - tokens0;
        sum->run_seconds = (double)(ts1.tv_sec - ts0.tv_sec) + 1e-9 * (double)(ts1.tv_nsec - ts0.tv_nsec);
    }
out:
    if (J.rf) td_runfile_close(J.rf, NULL);
    if (J.replacing) remove(J.write_path);   /* the old OUT stays */
    if (rc && sum) sum->out_untouched = J.replacing;
    free(done);
    job_free(&J);
    return rc;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

int td_diff_summarize(const char *run_path, td_diff_summary *s, td_error *err)
{
    memset(s, 0, sizeof *s);
    td_runfile *rf = td_runfile_open(run_path, 0, err);
    if (!rf) return -1;
    int64_t n = td_runfile_rows(rf, "/tokens/logp_a");
    s->seqs = td_runfile_rows(rf, "/seqs/prompt_index");
    s->tokens = n;
    int rc = 0;
    if (n < 0 || s->seqs < 0) {
        td_runfile_close(rf, NULL);
        return td_fail(err, "%s: /tokens or /seqs claims more rows than the file holds (corrupt file?)", run_path);
    }
    if (n > 0) {
        double *d = td_xmalloc((size_t)n * sizeof(double)), *kl = td_xmalloc((size_t)n * sizeof(double));
        double *k3 = td_xmalloc((size_t)n * sizeof(double));
        int32_t *ta = td_xmalloc((size_t)n * 4), *tb = td_xmalloc((size_t)n * 4);
        rc = td_runfile_read(rf, "/tokens/dlogp", TD_COL_F64, 0, n, d, err) ||
             td_runfile_read(rf, "/tokens/kl_ba", TD_COL_F64, 0, n, kl, err) ||
             td_runfile_read(rf, "/tokens/k3", TD_COL_F64, 0, n, k3, err) ||
             td_runfile_read(rf, "/tokens/top1_a", TD_COL_I32, 0, n, ta, err) ||
             td_runfile_read(rf, "/tokens/top1_b", TD_COL_I32, 0, n, tb, err) ? -1 : 0;
        if (rc == 0) {
            double sa = 0, sk = 0, s3 = 0;
            int64_t agree = 0, nkl = 0;
            for (int64_t i = 0; i < n; i++) {
                d[i] = fabs(d[i]);
                sa += d[i];
                if (!isnan(kl[i])) { sk += kl[i]; nkl++; }
                s3 += k3[i];
                agree += ta[i] == tb[i];
            }
            qsort(d, (size_t)n, sizeof(double), cmp_double);
            s->mean_abs_dlogp = sa / n;
            s->p99_abs_dlogp = d[(size_t)((n - 1) * 0.99)];
            s->max_abs_dlogp = d[n - 1];
            s->mean_kl_ba = nkl ? sk / nkl : NAN;
            s->mean_k3 = s3 / n;
            s->top1_agree = tb[0] < 0 ? NAN : (double)agree / n;
        }
        free(d); free(kl); free(k3); free(ta); free(tb);
    }
    td_runfile_close(rf, NULL);
    return rc;
}
