/* Rescoring a run's tokens under other recipe pairs (include/tidal/attribute.h): the training
 * side teacher-forced as the diff job scores it, the inference side by prefill + KV-cache decode
 * of the recorded tokens in the run's own batches, slots and step schedule (as the diff job's
 * generation ran them, minus the sampling), so the run's own pair gives its logp_a and logp_b
 * bit for bit. */
#include "tidal/attribute.h"
#include "tidal/checkpoint.h"
#include "tidal/io.h"
#include "tidal/metrics.h"
#include "tidal/model.h"
#include "tidal/runfile.h"
#include "tidal/sampling.h"
#include "tidal/seqset.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct td_rescorer {
    td_model *model;
    td_seqset s;
    int V, batch, max_len;
    int *b0;                 /* (nb + 1) first sequence of each batch           */
    int nb;
    size_t *row_off;         /* (n) first response row of each sequence in rows */
    size_t n_rows;           /* response tokens                                 */
    float *rows_a;           /* (n_rows, V) A's log-softmax rows, for cur_a     */
    char *cur_a, *cur_b;     /* JSON of the recipes the paths hold now          */
    td_forward *fa;
    td_session *sb;
};

static char *attr(td_runfile *rf, const char *name, const char *path, td_error *err)
{
    char *v = td_runfile_get_str(rf, name, err);
    if (!v) td_fail(err, "%s: no root attribute %s (not a tidal-diff run file?)", path, name);
    return v;
}

td_rescorer *td_rescorer_open(const char *run_path, const char *model_dir, td_recipe *a, td_recipe *b, td_error *err)
{
    td_runfile *rf = td_runfile_open(run_path, 0, err);
    if (!rf) return NULL;
    td_rescorer *r = td_xcalloc(1, sizeof *r);
    char *mode = NULL, *lora = NULL, *ra = NULL, *rb = NULL, *bs = NULL, *samp = NULL, *mp = NULL;
    json_t *sj = NULL;
    int ok = 0;
    if (!(mode = attr(rf, "mode", run_path, err)) || !(ra = attr(rf, "recipe_a", run_path, err)) ||
        !(rb = attr(rf, "recipe_b", run_path, err)) || !(bs = attr(rf, "batch", run_path, err)) ||
        !(samp = attr(rf, "sampling", run_path, err)) || !(mp = attr(rf, "model_path", run_path, err)))
        goto done;
    lora = td_runfile_get_str(rf, "lora_path", err);
    if (strcmp(mode, "generate")) {
        td_fail(err, "%s: a %s run: attribution rescores tokens that recipe B generated (a generate run of tidal-diff)", run_path, mode);
        goto done;
    }
    if (lora && *lora) { td_fail(err, "%s: a run with a LoRA adapter (%s): attribution does not model adapters yet", run_path, lora); goto done; }
    td_error e2;
    char *lt = td_runfile_get_str(rf, "logprob_temperature", &e2);   /* absent in older runs: 1 */
    int scaled = lt && strtod(lt, NULL) != 1.0;
    free(lt);
    if (scaled) {
        td_fail(err, "%s: a run scored at --logprob-temperature != 1: attribution rescores raw rows (T = 1) only", run_path);
        goto done;
    }
    if (td_recipe_from_json(ra, strlen(ra), "recipe_a of the run", a, err) ||
        td_recipe_from_json(rb, strlen(rb), "recipe_b of the run", b, err)) goto done;
    r->batch = atoi(bs);
    sj = td_json_load_text(samp, strlen(samp), "sampling of the run", err);
    if (!sj) goto done;
    int max_new = (int)json_integer_value(json_object_get(sj, "max_new_tokens"));
    if (r->batch < 1 || max_new < 0) { td_fail(err, "%s: batch %s / max_new_tokens %d out of range", run_path, bs, max_new); goto done; }
    if (td_seqset_from_run(&r->s, run_path, err)) goto done;
    if (!(r->model = td_model_load(model_dir ? model_dir : mp, err))) goto done;
    r->V = r->model->cfg.vocab_size;
    /* the diff job's sizes: the longest prompt + max_new_tokens, within the context */
    int ctx = r->model->cfg.max_position > 0 ? r->model->cfg.max_position : 1 << 20, maxp = 0;
    for (int i = 0; i < r->s.n; i++) {
        if (r->s.plen[i] > maxp) maxp = r->s.plen[i];
        for (int t = 0; t < r->s.len[i]; t++)
            if (r->s.tok[i][t] < 0 || r->s.tok[i][t] >= r->V) {
                td_fail(err, "%s: sequence %d holds token %d outside the model's vocabulary (%d): another checkpoint?", run_path, i,
                        r->s.tok[i][t], r->V);
                goto done;
            }
    }
    r->max_len = maxp + max_new;
    if (r->max_len > ctx) r->max_len = ctx;
    if (r->max_len < 2) r->max_len = 2;
    if (r->s.max_len > r->max_len) { td_fail(err, "%s: a sequence of %d tokens is longer than prompt + max_new_tokens", run_path, r->s.max_len); goto done; }
    /* batches: consecutive rows of one /seqs/batch value, at most `batch` of them */
    r->b0 = td_xmalloc((size_t)(r->s.n + 1) * sizeof(int));
    for (int i = 0; i < r->s.n; i++)
        if (i == 0 || r->s.batch[i] != r->s.batch[i - 1] || i - r->b0[r->nb - 1] >= r->batch) r->b0[r->nb++] = i;
    r->b0[r->nb] = r->s.n;
    r->row_off = td_xmalloc((size_t)(r->s.n ? r->s.n : 1) * sizeof(size_t));
    for (int i = 0; i < r->s.n; i++) { r->row_off[i] = r->n_rows; r->n_rows += (size_t)(r->s.len[i] - r->s.plen[i]); }
    r->rows_a = td_xmalloc((r->n_rows ? r->n_rows : 1) * (size_t)r->V * sizeof(float));
    r->fa = td_forward_create(r->model, r->max_len * (r->batch < 4 ? r->batch : 4), r->max_len, 0, err);
    if (!r->fa) goto done;
    r->sb = td_session_create(r->model, r->batch, r->max_len, 0, err);
    if (!r->sb) goto done;
    td_session_set_raw_logits(r->sb, 1);
    ok = 1;
done:
    free(mode); free(lora); free(ra); free(rb); free(bs); free(samp); free(mp);
    json_decref(sj);
    td_runfile_close(rf, NULL);
    if (!ok) { td_rescorer_free(r); return NULL; }
    return r;
}

void td_rescorer_free(td_rescorer *r)
{
    if (!r) return;
    td_forward_free(r->fa);
    td_session_free(r->sb);
    if (r->model) td_model_free(r->model);
    td_seqset_free(&r->s);
    free(r->b0); free(r->row_off); free(r->rows_a); free(r->cur_a); free(r->cur_b);
    free(r);
}

int64_t td_rescorer_tokens(const td_rescorer *r) { return (int64_t)r->n_rows; }

typedef struct { td_rescorer *r; int s0; } a_ctx;

/* Training-path rows: row t predicts the token at t + 1; keep the response positions. */
static void on_row_a(void *user, int s, int t, const float *row)
{
    a_ctx *c = user;
    td_rescorer *r = c->r;
    int i = c->s0 + s, pos = t + 1;
    if (pos < r->s.plen[i] || pos >= r->s.len[i]) return;
    memcpy(r->rows_a + (r->row_off[i] + (size_t)(pos - r->s.plen[i])) * r->V, row, (size_t)r->V * sizeof(float));
}

static int score_a(td_rescorer *r, const td_recipe *a, td_error *err)
{
    if (td_forward_set_recipe(r->fa, a, err)) return -1;
    for (int bi = 0; bi < r->nb; bi++) {
        a_ctx c = {r, r->b0[bi]};
        int n = r->b0[bi + 1] - r->b0[bi];
        if (td_forward_logprobs(r->fa, n, (const int *const *)(r->s.tok + c.s0), r->s.len + c.s0, NULL, on_row_a, &c, err))
            return -1;
    }
    return 0;
}

static void accumulate(td_rescorer *r, int i, int pos, float *row_b, td_rescore_stat *st)
{
    td_log_softmax(row_b, r->V);
    td_token_metrics m;
    td_token_metrics_compute(r->rows_a + (r->row_off[i] + (size_t)(pos - r->s.plen[i])) * r->V, row_b, r->V,
                             r->s.tok[i][pos], &m);
    double d = m.logp_b - m.logp_a;
    st->abs_dlogp += fabs(d);
    st->dlogp += d;
    st->kl_ba += m.kl_ba;
    st->k3 += m.k3;
    st->n++;
}

/* The inference path over the recorded tokens, batch by batch: prefill every slot, then decode
 * step k for the slots whose response has a token after step k, in slot order (the diff job's
 * schedule: a sequence's last token is never decoded). */
static int score_b(td_rescorer *r, td_rescore_stat *st, td_error *err)
{
    int V = r->V, rc = -1;
    float *last = td_xmalloc((size_t)r->batch * V * sizeof(float)), *out = td_xmalloc((size_t)r->batch * V * sizeof(float));
    int *slots = td_xmalloc((size_t)r->batch * sizeof(int)), *next = td_xmalloc((size_t)r->batch * sizeof(int));
    for (int bi = 0; bi < r->nb; bi++) {
        int s0 = r->b0[bi], n = r->b0[bi + 1] - s0, maxr = 0;
        for (int s = 0; s < n; s++) {
            int i = s0 + s, rl = r->s.len[i] - r->s.plen[i];
            td_session_reset(r->sb, s);
            if (td_session_prefill(r->sb, s, r->s.tok[i], r->s.plen[i], last + (size_t)s * V, NULL, NULL, err)) goto done;
            if (rl > 0) accumulate(r, i, r->s.plen[i], last + (size_t)s * V, st);
            if (rl > maxr) maxr = rl;
        }
        for (int k = 0; k + 1 < maxr; k++) {
            int m = 0;
            for (int s = 0; s < n; s++) {
                int i = s0 + s;
                if (k + 1 < r->s.len[i] - r->s.plen[i]) { slots[m] = s; next[m] = r->s.tok[i][r->s.plen[i] + k]; m++; }
            }
            if (td_session_decode(r->sb, m, slots, next, out, err)) goto done;
            for (int q = 0; q < m; q++) {
                int i = s0 + slots[q];
                accumulate(r, i, r->s.plen[i] + k + 1, out + (size_t)q * V, st);
            }
        }
    }
    rc = 0;
done:
    free(last); free(out); free(slots); free(next);
    return rc;
}

int td_rescorer_eval(td_rescorer *r, int n, const td_recipe *a, const td_recipe *b, td_rescore_stat *out, FILE *progress,
                     td_error *err)
{
    char **ja = td_xcalloc((size_t)(n ? n : 1), sizeof(char *)), **jb = td_xcalloc((size_t)(n ? n : 1), sizeof(char *));
    unsigned char *done = td_xcalloc((size_t)(n ? n : 1), 1);
    int rc = -1, ndone = 0;
    for (int i = 0; i < n; i++) { ja[i] = td_recipe_to_json(&a[i]); jb[i] = td_recipe_to_json(&b[i]); }
    /* one A recipe at a time: its rows once, then every pair that uses it */
    for (int i = 0; i < n; i++) {
        if (done[i]) continue;
        if (!r->cur_a || strcmp(r->cur_a, ja[i])) {
            free(r->cur_a);
            r->cur_a = NULL;
            if (score_a(r, &a[i], err)) goto out;
            r->cur_a = strdup(ja[i]);
        }
        for (int k = i; k < n; k++) {
            if (done[k] || strcmp(ja[k], ja[i])) continue;
            if (!r->cur_b || strcmp(r->cur_b, jb[k])) {
                free(r->cur_b);
                r->cur_b = NULL;
                if (td_session_set_recipe(r->sb, &b[k], err)) goto out;
                r->cur_b = strdup(jb[k]);
            }
            td_rescore_stat st = {0};
            if (score_b(r, &st, err)) goto out;
            if (st.n) { st.abs_dlogp /= (double)st.n; st.dlogp /= (double)st.n; st.kl_ba /= (double)st.n; st.k3 /= (double)st.n; }
            out[k] = st;
            done[k] = 1;
            ndone++;
            if (progress) fprintf(progress, "tidal-attribute: pair %d/%d (%s / %s): mean |dlogp| %.4g\n", ndone, n, a[k].name,
                                  b[k].name, st.abs_dlogp);
        }
    }
    rc = 0;
out:
    for (int i = 0; i < n; i++) { free(ja[i]); free(jb[i]); }
    free(ja); free(jb); free(done);
    return rc;
}
