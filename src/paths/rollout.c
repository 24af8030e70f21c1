/* Rollouts on the inference path (include/tidal/rollout.h): prefill, sampling, batched decode
 * with the EOS stop set. */
#include "tidal/rollout.h"
#include "paths_internal.h"
#include "tidal/progress.h"

#include <stdlib.h>
#include <string.h>

typedef struct {
    const td_rollout_opts *o;
    td_rollout_batch *b;
    td_rollout_row_fn row_fn;
    void *user;
    int V;
    float *row;              /* (V) the log-softmax row being handed out */
} rollout;

static bool is_eos(const td_rollout_opts *o, int y)
{
    for (int i = 0; i < o->n_eos; i++)
        if (y == o->eos[i]) return true;
    return false;
}

/* The log-probs of the token at pos, predicted by raw logits `lg`: to the batch's buffers and
 * row_fn. */
static void deliver(rollout *r, int s, int pos, const float *lg, const float *proc)
{
    td_rollout_batch *b = r->b;
    if (!r->row_fn && !(b->logp && b->logp[s]) && !(b->logp_proc && b->logp_proc[s])) return;
    int y = b->tokens[s][pos];
    float T = r->o->row_temperature;
    if (T > 0 && T != 1.0f)
        for (int v = 0; v < r->V; v++) r->row[v] = lg[v] / T;
    else
        memcpy(r->row, lg, (size_t)r->V * sizeof(float));
    td_log_softmax(r->row, r->V);
    float lp = proc ? proc[y] : r->row[y];
    if (b->logp && b->logp[s]) b->logp[s][pos] = r->row[y];
    if (b->logp_proc && b->logp_proc[s]) b->logp_proc[s][pos] = lp;
    if (r->row_fn) r->row_fn(r->user, s, pos, r->row, lp);
}

/* Prefill rows: row t predicts the token at t + 1; the last prompt row is the decode loop's. */
static void on_prefill_row(void *user, int slot, int t, const float *logits)
{
    rollout *r = user;
    if (t + 1 < r->b->prompt_len[slot]) deliver(r, slot, t + 1, logits, NULL);
}

int td_rollout_generate(td_session *sess, td_sampler *smp, const td_rollout_opts *o, td_rollout_batch *b,
                        td_rollout_row_fn row_fn, void *user, td_error *err)
{
    const int n_seq = b->n, V = session_vocab(sess);
    rollout r = {o, b, row_fn, user, V, td_xmalloc((size_t)V * sizeof(float))};
    float *logits = td_xmalloc((size_t)n_seq * V * sizeof(float));   /* each sequence's next row */
    float *proc = td_xmalloc((size_t)V * sizeof(float));
    int *slots = td_xmalloc((size_t)n_seq * sizeof(int)), *next = td_xmalloc((size_t)n_seq * sizeof(int));
    td_rng *rng = td_xmalloc((size_t)n_seq * sizeof(td_rng));
    td_rng *noise = o->logit_noise > 0 ? td_xmalloc((size_t)n_seq * sizeof(td_rng)) : NULL;
    float *out = td_xmalloc((size_t)n_seq * V * sizeof(float));      /* one decode step's rows */
    int rc = -1;
    td_session_set_raw_logits(sess, 1);
    td_progress pr;   /* prefill in prompt tokens, then decode in steps (quiet when short) */
    td_progress_start(&pr, session_progress(sess), "rollout prefill");
    for (int s = 0; s < n_seq; s++) pr.total += b->prompt_len[s];
    for (int s = 0; s < n_seq; s++) {
        b->len[s] = b->prompt_len[s];
        b->finish[s] = -1;
        td_rng_stream(&rng[s], o->seed, b->stream[s]);
        if (noise) td_rng_stream(&noise[s], o->noise_seed, b->stream[s]);
        td_session_reset(sess, s);
        if (td_session_prefill(sess, s, b->tokens[s], b->prompt_len[s], logits + (size_t)s * V,
                               o->prompt_rows ? on_prefill_row : NULL, &r, err)) goto done;
        td_progress_add(&pr, b->prompt_len[s], "prompt tokens");
    }
    td_progress_end(&pr);
    td_progress_start(&pr, session_progress(sess), "rollout decode");
    pr.total = o->max_new_tokens;
    int active = n_seq;
    for (int step = 0; step < o->max_new_tokens && active > 0; step++) {
        int n = 0;
        for (int s = 0; s < n_seq; s++) {
            if (b->finish[s] >= 0) continue;
            if (b->len[s] >= o->max_len) { b->finish[s] = TD_FINISH_LENGTH; active--; continue; }  /* buffers hold max_len */
            float *lg = logits + (size_t)s * V;
            if (noise)
                for (int v = 0; v < V; v++) lg[v] += (float)(o->logit_noise * td_rng_normal(&noise[s]));
            int pos = b->len[s];                          /* position of the token drawn */
            int y = td_sample(smp, &o->sampling, lg, b->tokens[s], b->len[s], &rng[s], proc);
            b->tokens[s][pos] = y;
            deliver(&r, s, pos, lg, proc);
            b->len[s]++;
            if (o->stop_at_eos && is_eos(o, y)) b->finish[s] = TD_FINISH_EOS;
            else if (b->len[s] - b->prompt_len[s] >= o->max_new_tokens || b->len[s] >= o->max_len)
                b->finish[s] = TD_FINISH_LENGTH;
            if (b->finish[s] >= 0) { active--; continue; }
            slots[n] = s;
            next[n] = y;
            n++;
        }
        if (n == 0) break;
        if (td_session_decode(sess, n, slots, next, out, err)) goto done;
        for (int i = 0; i < n; i++) memcpy(logits + (size_t)slots[i] * V, out + (size_t)i * V, (size_t)V * sizeof(float));
        td_progress_add(&pr, 1, "decode steps");
    }
    td_progress_end(&pr);
    for (int s = 0; s < n_seq; s++) if (b->finish[s] < 0) b->finish[s] = TD_FINISH_LENGTH;
    rc = 0;
done:
    free(r.row); free(logits); free(proc); free(slots); free(next); free(rng); free(noise); free(out);
    return rc;
}
