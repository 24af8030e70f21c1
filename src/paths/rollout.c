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

/* The log-probs of the token at pos, predicted by raw logits `lg` (host; NULL when the row
 * stayed on the device and nothing here needs it): to the batch's buffers, row_fn and the kept
 * device rows (unless the caller kept it there already: kept). lp_proc: the token's processed
 * log-prob (the sampler's), NULL for a prompt row. */
static void deliver(rollout *r, int s, int pos, const float *lg, const float *lp_proc, int kept)
{
    td_rollout_batch *b = r->b;
    int y = b->tokens[s][pos];
    long krow = kept || !lg ? -1 : rows_dev_row(&b->keep, s, pos);
    if (!r->row_fn && !(b->logp && b->logp[s]) && krow < 0) {
        if (lp_proc && b->logp_proc && b->logp_proc[s]) b->logp_proc[s][pos] = *lp_proc;
        if (lp_proc || !(b->logp_proc && b->logp_proc[s])) return;
    }
    float T = r->o->row_temperature;
    if (T > 0 && T != 1.0f)
        for (int v = 0; v < r->V; v++) r->row[v] = lg[v] / T;
    else
        memcpy(r->row, lg, (size_t)r->V * sizeof(float));
    td_log_softmax(r->row, r->V);
    float lp = lp_proc ? *lp_proc : r->row[y];
    if (b->logp && b->logp[s]) b->logp[s][pos] = r->row[y];
    if (b->logp_proc && b->logp_proc[s]) b->logp_proc[s][pos] = lp;
    if (r->row_fn) r->row_fn(r->user, s, pos, r->row, lp);
    if (krow >= 0) {   /* a host row (prefill's): td_log_softmax's floats, as the device makes them */
        const td_rows_dev *k = b->keep.rows;
        k->ops.be->upload(k->rows + (size_t)krow * k->V, r->row, (size_t)r->V * sizeof(float));
    }
}

/* Prefill rows: row t predicts the token at t + 1; the last prompt row is the decode loop's. */
static void on_prefill_row(void *user, int slot, int t, const float *logits)
{
    rollout *r = user;
    if (t + 1 < r->b->prompt_len[slot]) deliver(r, slot, t + 1, logits, NULL, 0);
}

/* The decode loop on a backend that samples (be->sample, the CUDA backend): each step's rows
 * stay in backend memory, the backend draws the tokens (td_sample's, same streams) and only
 * the tokens and their processed log-probs come down; the full rows are downloaded only for a
 * caller that reads them (row_fn, b->logp). Sequences, order and stopping rules are the host
 * loop's below. logits: the prefill's last rows (host); out: n_seq rows of host scratch. */
static int decode_on_device(td_session *sess, rollout *r, td_rng *rng, const float *logits, float *out,
                            int *slots, int *next, td_progress *pr, td_error *err)
{
    const td_ops *ops = session_ops(sess);
    const td_rollout_opts *o = r->o;
    td_rollout_batch *b = r->b;
    const int n_seq = b->n, V = r->V;
    const int need_rows = r->row_fn || b->logp;
    float *drows = ops->be->alloc((size_t)n_seq * V * sizeof(float));
    int *act = td_xmalloc((size_t)n_seq * sizeof(int)), *tok = td_xmalloc((size_t)n_seq * sizeof(int));
    int *nseen = td_xmalloc((size_t)n_seq * sizeof(int));
    const int **seen = td_xmalloc((size_t)n_seq * sizeof(int *));
    float *lp = td_xmalloc((size_t)n_seq * sizeof(float));
    td_rng *rg = td_xmalloc((size_t)n_seq * sizeof(td_rng));
    size_t *krow = td_xmalloc((size_t)n_seq * sizeof(size_t));   /* kept rows of a step */
    int rc = -1, n = 0;
    for (int s = 0; s < n_seq; s++) {   /* the first step samples the prefill's rows (host) */
        if (b->finish[s] >= 0) continue;
        if (b->len[s] >= o->max_len) { b->finish[s] = TD_FINISH_LENGTH; continue; }
        memcpy(out + (size_t)n * V, logits + (size_t)s * V, (size_t)V * sizeof(float));
        act[n++] = s;
    }
    const float *rows = out;
    for (int step = 0; step < o->max_new_tokens && n > 0; step++) {
        for (int i = 0; i < n; i++) {
            seen[i] = b->tokens[act[i]];
            nseen[i] = b->len[act[i]];
            rg[i] = rng[act[i]];
        }
        ops->be->sample(ops, &o->sampling, rows, n, V, seen, nseen, rg, tok, lp, NULL);
        for (int i = 0; i < n; i++) rng[act[i]] = rg[i];
        if (b->keep.rows) {   /* the step's kept rows: log-softmax on the device, into their rows */
            int nk = 0;
            for (int i = 0; i < n; i++) {
                long k = rows_dev_row(&b->keep, act[i], b->len[act[i]]);
                if (k >= 0) krow[nk++] = (size_t)k;
            }
            const td_rows_dev *kd = b->keep.rows;
            if (nk == n)   /* every row (tidal-diff keeps every response position): one launch */
                ops->be->row_logsoftmax(ops, kd->rows, krow, rows, n, V, o->row_temperature);
            else
                for (int i = 0, j = 0; i < n; i++)
                    if (rows_dev_row(&b->keep, act[i], b->len[act[i]]) >= 0)
                        ops->be->row_logsoftmax(ops, kd->rows, &krow[j++], rows + (size_t)i * V, 1, V,
                                                o->row_temperature);
        }
        if (need_rows && rows != out) ops->be->download(out, rows, (size_t)n * V * sizeof(float));
        int n2 = 0;
        for (int i = 0; i < n; i++) {
            int s = act[i], pos = b->len[s], y = tok[i];
            b->tokens[s][pos] = y;
            deliver(r, s, pos, need_rows ? out + (size_t)i * V : NULL, &lp[i], b->keep.rows != NULL);
            b->len[s]++;
            if (o->stop_at_eos && is_eos(o, y)) b->finish[s] = TD_FINISH_EOS;
            else if (b->len[s] - b->prompt_len[s] >= o->max_new_tokens || b->len[s] >= o->max_len)
                b->finish[s] = TD_FINISH_LENGTH;
            if (b->finish[s] >= 0) continue;
            slots[n2] = s;
            next[n2] = y;
            n2++;
        }
        if (n2 == 0) break;
        if (td_session_decode(sess, n2, slots, next, drows, err)) goto done;
        memcpy(act, slots, (size_t)n2 * sizeof(int));
        n = n2;
        rows = drows;
        td_progress_add(pr, 1, "decode steps");
    }
    rc = 0;
done:
    ops->be->free(drows);
    free(act); free(tok); free(nseen); free(seen); free(lp); free(rg); free(krow);
    return rc;
}

int td_rollout_generate(td_session *sess, td_sampler *smp, const td_rollout_opts *o, td_rollout_batch *b,
                        td_rollout_row_fn row_fn, void *user, td_error *err)
{
    const int n_seq = b->n, V = session_vocab(sess);
    if (b->keep.rows && b->keep.rows->ops.be != session_ops(sess)->be)
        return td_fail(err, "td_rollout_generate: the kept rows are not on the session's device");
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
    if (session_ops(sess)->be->sample && !noise) {   /* the rows stay on the device */
        rc = decode_on_device(sess, &r, rng, logits, out, slots, next, &pr, err);
        goto done;
    }
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
            deliver(&r, s, pos, lg, &proc[y], 0);
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
    rc = 0;
done:
    if (rc == 0) {
        td_progress_end(&pr);
        for (int s = 0; s < n_seq; s++) if (b->finish[s] < 0) b->finish[s] = TD_FINISH_LENGTH;
    }
    free(r.row); free(logits); free(proc); free(slots); free(next); free(rng); free(noise); free(out);
    return rc;
}
