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
    size_t *krow;            /* (longest prompt) kept rows of a prefill chunk's prompt rows */
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

/* Whether sequence s's prompt rows must come to the host on a device: a caller reads them there
 * (row_fn, b->logp), or wants processed log-probs (b->logp_proc: the raw one at prompt
 * positions) of positions whose rows are not kept on the device. Else the kept ones go from
 * prefill's logits buffer to their kept rows on the device (on_prefill_rows_dev). */
static int prompt_rows_on_host(const rollout *r, int s)
{
    const td_rollout_batch *b = r->b;
    return r->row_fn || (b->logp && b->logp[s]) ||
           (b->logp_proc && b->logp_proc[s] && rows_dev_row(&b->keep, s, 1) < 0);
}

/* Prefill rows in backend memory (a device): rows t = pos0 .. pos0 + R - 1 predict t + 1; the
 * kept ones among the prompt positions 1 .. P - 1 become their kept log-softmax rows there
 * (row_logsoftmax: td_log_softmax's floats of the same logits / T, what deliver uploads on the
 * host path), in one launch: the kept positions of a sequence are consecutive. */
static void on_prefill_rows_dev(void *user, int slot, int pos0, const float *rows, int R)
{
    rollout *r = user;
    const td_rollout_batch *b = r->b;
    int lo = pos0, hi = pos0 + R;
    if (hi > b->prompt_len[slot] - 1) hi = b->prompt_len[slot] - 1;   /* the last row is the decode loop's */
    while (lo < hi && rows_dev_row(&b->keep, slot, lo + 1) < 0) lo++;
    if (lo >= hi) return;
    for (int t = lo; t < hi; t++) r->krow[t - lo] = (size_t)rows_dev_row(&b->keep, slot, t + 1);
    const td_rows_dev *kd = b->keep.rows;
    kd->ops.be->row_logsoftmax(&kd->ops, kd->rows, r->krow, rows + (size_t)(lo - pos0) * r->V, hi - lo, r->V,
                               r->o->row_temperature);
}

/* The decode loop on a backend that samples (be->sample, the CUDA backend): each step's rows
 * stay in backend memory, the backend draws the tokens (td_sample's, same streams) and only
 * the tokens and their processed log-probs come down; the full rows are downloaded only for a
 * caller that reads them (row_fn, b->logp). Sequences, order and stopping rules are the host
 * loop's below. The prefill's last row of sequence s is in drows (backend memory, n_seq rows)
 * at row s, or, when its prompt rows came to the host (host[s]), in logits (host) at row s;
 * drows then holds each step's rows; out: n_seq rows of host scratch. */
static int decode_on_device(td_session *sess, rollout *r, td_rng *rng, float *drows, const float *logits,
                            const unsigned char *host, float *out, int *slots, int *next, td_progress *pr,
                            td_error *err)
{
    const td_ops *ops = session_ops(sess);
    const td_rollout_opts *o = r->o;
    td_rollout_batch *b = r->b;
    const int n_seq = b->n, V = r->V;
    const int need_rows = r->row_fn || b->logp;
    int *act = td_xmalloc((size_t)n_seq * sizeof(int)), *tok = td_xmalloc((size_t)n_seq * sizeof(int));
    int *nseen = td_xmalloc((size_t)n_seq * sizeof(int));
    const int **seen = td_xmalloc((size_t)n_seq * sizeof(int *));
    float *lp = td_xmalloc((size_t)n_seq * sizeof(float));
    td_rng *rg = td_xmalloc((size_t)n_seq * sizeof(td_rng));
    size_t *krow = td_xmalloc((size_t)n_seq * sizeof(size_t));   /* kept rows of a step */
    int rc = -1, n = 0, down = 0;   /* down: rows of the first step still to download for need_rows */
    for (int s = 0; s < n_seq; s++) {   /* the first step samples the prefill's rows, packed */
        if (b->finish[s] >= 0) continue;
        if (b->len[s] >= o->max_len) { b->finish[s] = TD_FINISH_LENGTH; continue; }
        float *dst = drows + (size_t)n * V;
        if (host[s]) {   /* on the host already: uploaded, and not downloaded again */
            ops->be->upload(dst, logits + (size_t)s * V, (size_t)V * sizeof(float));
            memcpy(out + (size_t)n * V, logits + (size_t)s * V, (size_t)V * sizeof(float));
        } else {
            if (n != s) ops->be->upload(dst, drows + (size_t)s * V, (size_t)V * sizeof(float));
            down++;
        }
        act[n++] = s;
    }
    const float *rows = drows;
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
        if (need_rows && step > 0)
            ops->be->download(out, rows, (size_t)n * V * sizeof(float));
        else if (need_rows && down)   /* the first step: the rows prefill left on the device */
            for (int i = 0; i < n; i++)
                if (!host[act[i]]) ops->be->download(out + (size_t)i * V, rows + (size_t)i * V, (size_t)V * sizeof(float));
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
        td_progress_add(pr, 1, "decode steps");
    }
    rc = 0;
done:
    free(act); free(tok); free(nseen); free(seen); free(lp); free(rg); free(krow);
    return rc;
}

int td_rollout_generate(td_session *sess, td_sampler *smp, const td_rollout_opts *o, td_rollout_batch *b,
                        td_rollout_row_fn row_fn, void *user, td_error *err)
{
    const int n_seq = b->n, V = session_vocab(sess);
    if (b->keep.rows && b->keep.rows->ops.be != session_ops(sess)->be)
        return td_fail(err, "td_rollout_generate: the kept rows are not on the session's device");
    const td_ops *ops = session_ops(sess);
    /* on a backend that samples, the rows stay there: prefill's last rows go to drows, where the
     * first sampling step reads them, and the kept prompt rows to their kept rows */
    const int on_dev = ops->be->sample && !(o->logit_noise > 0);
    int maxp = 1;
    for (int s = 0; s < n_seq; s++) maxp = b->prompt_len[s] > maxp ? b->prompt_len[s] : maxp;
    rollout r = {o, b, row_fn, user, V, td_xmalloc((size_t)V * sizeof(float)), td_xmalloc((size_t)maxp * sizeof(size_t))};
    float *drows = on_dev ? ops->be->alloc((size_t)n_seq * V * sizeof(float)) : NULL;
    float *logits = td_xmalloc((size_t)n_seq * V * sizeof(float));   /* each sequence's next row (host) */
    unsigned char *host = td_xcalloc((size_t)n_seq, 1);   /* whose prefill rows (the last one too) came to the host */
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
        /* on a device, prefill's rows stay there unless the prompt rows are read on the host (then
         * the last row comes down with them, as on the host path) */
        host[s] = !on_dev || (o->prompt_rows && prompt_rows_on_host(&r, s));
        if (!host[s]) {
            session_rows_fn dev = o->prompt_rows && b->keep.rows ? on_prefill_rows_dev : NULL;
            if (session_prefill_dev(sess, s, b->tokens[s], b->prompt_len[s], drows + (size_t)s * V, dev, &r, err))
                goto done;
        } else if (td_session_prefill(sess, s, b->tokens[s], b->prompt_len[s], logits + (size_t)s * V,
                                      o->prompt_rows ? on_prefill_row : NULL, &r, err)) {
            goto done;
        }
        td_progress_add(&pr, b->prompt_len[s], "prompt tokens");
    }
    td_progress_end(&pr);
    td_progress_start(&pr, session_progress(sess), "rollout decode");
    pr.total = o->max_new_tokens;
    if (on_dev) {
        rc = decode_on_device(sess, &r, rng, drows, logits, host, out, slots, next, &pr, err);
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
    if (drows) ops->be->free(drows);
    free(r.row); free(r.krow); free(logits); free(host); free(proc); free(slots); free(next); free(rng); free(noise); free(out);
    return rc;
}
