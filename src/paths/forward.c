/* tidal — the teacher-forced structure (training path): whole sequences packed row after row
 * into micro-batches, no KV cache (each layer's keys/values are the rows' own projections),
 * then the lm_head and log-softmax in chunks of logits_rows rows, so the (tokens, V) logits
 * of a micro-batch never exist at once. */
#include "../model/model_internal.h"
#include "paths_internal.h"
#include "tidal/progress.h"

#include <stdlib.h>

struct td_forward {
    const td_model *m;
    td_ops ops;
    td_acts acts;            // cap = max_tokens, max_keys = max_seq_len
    int max_tokens, max_seq_len, logits_rows;
    float *logits;           // (logits_rows, V) in backend memory
    float *logits_host;      // the rows the host reads: logits itself on the CPU, a copy else
    int *gather_t, *gather_top;   // (logits_rows) on a device: each row's target and top column,
    float *gather_lp;             // its target's log-prob (logprob_gather: R values come down, not R x V)
    int *tok;                // (max_tokens) packed tokens of the micro-batch
    int *pos;                // (max_tokens) position of each row in its sequence
    int *row_seq;            // (max_tokens) sequence index of each row
    td_recipe_state rs;      // the recipe (default: fp32 reference)
    const td_lora *lora;     // the adapter given with the recipe, and how
    int lora_mode;
    int rows_parallel;       // row_fn may run on several rows at once (td_forward_set_rows_parallel)
};

td_forward *td_forward_create(const td_model *m, int max_tokens, int max_seq_len,
                              int logits_rows, td_error *err)
{
    if (max_tokens < 1 || max_seq_len < 1 || max_seq_len > max_tokens)
        return td_fail(err, "td_forward_create: max_tokens %d, max_seq_len %d (expected "
                       "1 <= max_seq_len <= max_tokens)", max_tokens, max_seq_len), NULL;
    if (td_config_check_len(&m->cfg, max_seq_len, err)) return NULL;
    /* default: 256 rows, enough to amortise streaming the (V, C) lm_head through the GEMM
     * (it is read once per chunk), small enough that (rows, V) stays ~150 MB at V = 152k */
    if (logits_rows <= 0) logits_rows = 256;
    if (logits_rows > max_tokens) logits_rows = max_tokens;
    td_forward *f = td_xcalloc(1, sizeof *f);
    f->m = m;
    td_ops_init(&f->ops, m->backend ? m->backend : &td_backend_cpu);
    f->max_tokens = max_tokens;
    f->max_seq_len = max_seq_len;
    f->logits_rows = logits_rows;
    acts_alloc(&f->acts, &m->cfg, &f->ops, max_tokens, max_seq_len, 0);
    f->logits = f->ops.be->alloc((size_t)logits_rows * m->cfg.vocab_size * sizeof(float));
    f->logits_host = paths_host_mirror(&f->ops, f->logits, (size_t)logits_rows * m->cfg.vocab_size);
    if (f->logits_host != f->logits) {
        f->gather_t = td_xmalloc((size_t)logits_rows * sizeof(int));
        f->gather_top = td_xmalloc((size_t)logits_rows * sizeof(int));
        f->gather_lp = td_xmalloc((size_t)logits_rows * sizeof(float));
    }
    f->tok = td_xmalloc((size_t)max_tokens * sizeof(int));
    f->pos = td_xmalloc((size_t)max_tokens * sizeof(int));
    f->row_seq = td_xmalloc((size_t)max_tokens * sizeof(int));
    if (recipe_state_set(&f->rs, &f->ops, m, td_recipe_find_preset("fp32"), NULL, 0, max_tokens, 0, err)) {
        td_forward_free(f);
        return NULL;
    }
    return f;
}

void td_forward_free(td_forward *f)
{
    if (!f) return;
    acts_free(&f->acts);
    recipe_state_free(&f->rs);
    td_backend_forget(f->ops.be);
    if (f->logits_host != f->logits) free(f->logits_host);
    free(f->gather_t);
    free(f->gather_top);
    free(f->gather_lp);
    f->ops.be->free(f->logits);
    free(f->tok); free(f->pos); free(f->row_seq);
    free(f);
}

/* Sequences s0 .. s1-1 (already validated, total length <= max_tokens) packed row after row
 * and run through the decoder; returns the number of rows. */
static int decode_packed(td_forward *f, int s0, int s1, const int *const *tokens, const int *lens)
{
    size_t KVD = (size_t)f->m->cfg.num_kv_heads * f->m->cfg.head_dim;
    int N = 0;
    for (int s = s0; s < s1; s++) {
        for (int t = 0; t < lens[s]; t++) {
            f->tok[N + t] = tokens[s][t];
            f->pos[N + t] = t;
            f->row_seq[N + t] = s;
            f->acts.kv_off[N + t] = (size_t)N * KVD;   /* the sequence's first row */
        }
        N += lens[s];
    }
    /* the rows' own projections are the keys and values: one layer's, or each layer's slice */
    size_t stride = f->acts.save == TD_ACTS_ALL ? (size_t)f->acts.cap * KVD : 0;
    td_kv_store kv = {f->acts.k, f->acts.v, stride, sizeof(float)};
    f->ops.row_seq = f->row_seq;
    decoder_forward(&f->ops, f->m, &f->acts, f->tok, f->pos, N, &kv);
    return N;
}

/* Sequences s0 .. s1-1 (already validated, total length <= max_tokens) in one micro-batch. */
static void run_micro_batch(td_forward *f, int s0, int s1, const int *const *tokens,
                            const int *lens, float *const *logp, td_row_fn row_fn, void *user)
{
    const td_model *m = f->m;
    int V = m->cfg.vocab_size;
    int N = decode_packed(f, s0, s1, tokens, lens);

    for (int r0 = 0; r0 < N; r0 += f->logits_rows) {
        int R = N - r0 < f->logits_rows ? N - r0 : f->logits_rows;
        head_forward(&f->ops, m, f->logits,
                     f->acts.xn + (size_t)r0 * m->cfg.hidden_size, R, 0);
        if (!row_fn && f->gather_t) {
            /* log-probs alone, on a device: each row's target value is gathered there and R
             * floats come down instead of R x V (2048 rows of a 152k vocabulary: 1.2 GB over
             * PCIe, most of the H200's teacher-forced bench on 2026-11-29); the same floats */
            for (int r = 0; r < R; r++) {
                int s = f->row_seq[r0 + r], t = f->pos[r0 + r];
                f->gather_t[r] = t + 1 < lens[s] ? tokens[s][t + 1] : 0;
            }
            logprob_gather(&f->ops, f->gather_lp, f->gather_top, f->logits, f->gather_t, R, V);
            for (int r = 0; r < R; r++) {
                int s = f->row_seq[r0 + r], t = f->pos[r0 + r];
                if (logp && logp[s] && t + 1 < lens[s]) logp[s][t] = f->gather_lp[r];
            }
            continue;
        }
        f->ops.be->download(f->logits_host, f->logits, (size_t)R * V * sizeof(float));
        /* each row's writes are its own (logp[s][t], and row_fn's where the caller said so) */
        #pragma omp parallel for schedule(dynamic, 1) if (row_fn && f->rows_parallel && R > 1)
        for (int r = 0; r < R; r++) {
            int s = f->row_seq[r0 + r], t = f->pos[r0 + r];
            const float *row = f->logits_host + (size_t)r * V;
            if (logp && logp[s] && t + 1 < lens[s]) logp[s][t] = row[tokens[s][t + 1]];
            if (row_fn) row_fn(user, s, t, row);
        }
    }
}

/* td_forward_metrics's micro-batch: the rows of each logits chunk stay in backend memory; the
 * chunk's scored rows are paired with B's kept rows and the backend computes their metrics
 * (R td_token_metrics come down instead of R rows). A replay (b NULL): A's rows alone, scored
 * from from[s] on, B's log-prob logp_b[s][pos - from[s]] set here. */
typedef struct {
    const td_rows_dev_map *b;
    const int *from;                 /* replay: first scored position of each sequence */
    const float *const *logp_b;      /* replay: B's log-prob of each scored token        */
    td_token_metrics *const *m;
    size_t *ia, *ib;         /* (logits_rows) A's chunk row and B's kept row of each pair */
    int *y;
    td_token_metrics *out;
} metrics_req;

static void run_micro_batch_metrics(td_forward *f, int s0, int s1, const int *const *tokens,
                                    const int *lens, metrics_req *q)
{
    const td_model *m = f->m;
    int V = m->cfg.vocab_size;
    int N = decode_packed(f, s0, s1, tokens, lens);
    for (int r0 = 0; r0 < N; r0 += f->logits_rows) {
        int R = N - r0 < f->logits_rows ? N - r0 : f->logits_rows, n = 0;
        for (int r = 0; r < R; r++) {
            int s = f->row_seq[r0 + r], pos = f->pos[r0 + r] + 1;
            long kb = pos >= lens[s] ? -1 : q->b ? rows_dev_row(q->b, s, pos) : pos >= q->from[s] ? 0 : -1;
            if (kb < 0) continue;
            q->ia[n] = (size_t)r;
            q->ib[n] = (size_t)kb;
            q->y[n] = tokens[s][pos];
            n++;
        }
        if (n == 0) continue;   /* nothing scored in this chunk: no lm_head either */
        head_forward(&f->ops, m, f->logits, f->acts.xn + (size_t)r0 * m->cfg.hidden_size, R, 0);
        f->ops.be->token_metrics(&f->ops, q->out, f->logits, q->ia, q->b ? q->b->rows->rows : NULL,
                                 q->b ? q->ib : NULL, q->y, n, V);
        for (int i = 0; i < n; i++) {
            int r = (int)q->ia[i], s = f->row_seq[r0 + r], pos = f->pos[r0 + r] + 1;
            td_token_metrics *mt = &q->m[s][pos];
            *mt = q->out[i];
            if (!q->b) {   /* td_token_metrics_replay's B side */
                mt->logp_b = q->logp_b[s][pos - q->from[s]];
                mt->k3 = td_k3(mt->logp_a, mt->logp_b);
            }
        }
    }
}

static int check_sequences(const td_forward *f, int nseq, const int *const *tokens, const int *lens,
                           const char *fn, td_error *err)
{
    int V = f->m->cfg.vocab_size;
    for (int s = 0; s < nseq; s++) {
        if (lens[s] < 1 || lens[s] > f->max_seq_len)
            return td_fail(err, "%s: sequence %d has length %d (expected 1..%d)", fn, s, lens[s],
                           f->max_seq_len);
        for (int t = 0; t < lens[s]; t++)
            if (tokens[s][t] < 0 || tokens[s][t] >= V)
                return td_fail(err, "%s: sequence %d position %d: token %d outside the "
                               "vocabulary 0..%d", fn, s, t, tokens[s][t], V - 1);
    }
    return 0;
}

static int forward_metrics(td_forward *f, int nseq, const int *const *tokens, const int *lens, metrics_req *q,
                           const char *fn, td_error *err)
{
    if (check_sequences(f, nseq, tokens, lens, fn, err)) return -1;
    q->ia = td_xmalloc((size_t)f->logits_rows * sizeof(size_t));
    q->ib = td_xmalloc((size_t)f->logits_rows * sizeof(size_t));
    q->y = td_xmalloc((size_t)f->logits_rows * sizeof(int));
    q->out = td_xmalloc((size_t)f->logits_rows * sizeof(td_token_metrics));
    td_progress pr;
    td_progress_start(&pr, f->m->progress, "teacher-forced forward");
    f->ops.progress = &pr;
    for (int s = 0; s < nseq; s++) pr.total += (double)lens[s] * f->m->cfg.num_layers;
    for (int s0 = 0; s0 < nseq;) {   /* the micro-batches of td_forward_logprobs */
        int s1 = s0, total = 0;
        while (s1 < nseq && total + lens[s1] <= f->max_tokens) total += lens[s1++];
        run_micro_batch_metrics(f, s0, s1, tokens, lens, q);
        s0 = s1;
    }
    f->ops.progress = NULL;
    td_progress_end(&pr);
    free(q->ia); free(q->ib); free(q->y); free(q->out);
    return 0;
}

int td_forward_device_metrics(const td_forward *f) { return f->ops.be->token_metrics != NULL; }

int td_forward_metrics(td_forward *f, int nseq, const int *const *tokens, const int *lens,
                       const td_rows_dev_map *b_rows, td_token_metrics *const *m, td_error *err)
{
    if (!b_rows || !b_rows->rows || b_rows->rows->ops.be != f->ops.be || !f->ops.be->token_metrics)
        return td_fail(err, "td_forward_metrics: B's rows are not kept on this path's device");
    metrics_req q = {.b = b_rows, .m = m};
    return forward_metrics(f, nseq, tokens, lens, &q, "td_forward_metrics", err);
}

int td_forward_metrics_replay(td_forward *f, int nseq, const int *const *tokens, const int *lens, const int *from,
                              const float *const *logp_b, td_token_metrics *const *m, td_error *err)
{
    if (!f->ops.be->token_metrics)
        return td_fail(err, "td_forward_metrics_replay: this path's backend (%s) computes no metrics", f->ops.be->name);
    for (int s = 0; s < nseq; s++)
        if (from[s] < 1)
            return td_fail(err, "td_forward_metrics_replay: sequence %d scored from position %d (expected >= 1)", s,
                           from[s]);
    metrics_req q = {.from = from, .logp_b = logp_b, .m = m};
    return forward_metrics(f, nseq, tokens, lens, &q, "td_forward_metrics_replay", err);
}

int td_forward_logprobs(td_forward *f, int nseq, const int *const *tokens, const int *lens,
                        float *const *logp, td_row_fn row_fn, void *user, td_error *err)
{
    int V = f->m->cfg.vocab_size;
    for (int s = 0; s < nseq; s++) {
        if (lens[s] < 1 || lens[s] > f->max_seq_len)
            return td_fail(err, "td_forward_logprobs: sequence %d has length %d (expected "
                           "1..%d)", s, lens[s], f->max_seq_len);
        for (int t = 0; t < lens[s]; t++)
            if (tokens[s][t] < 0 || tokens[s][t] >= V)
                return td_fail(err, "td_forward_logprobs: sequence %d position %d: token %d "
                               "outside the vocabulary 0..%d", s, t, tokens[s][t], V - 1);
    }
    /* Greedy packing of consecutive whole sequences into micro-batches of <= max_tokens;
     * progress in token-layers (decoder_forward counts them) */
    td_progress pr;
    td_progress_start(&pr, f->m->progress, "teacher-forced forward");
    f->ops.progress = &pr;
    for (int s = 0; s < nseq; s++) pr.total += (double)lens[s] * f->m->cfg.num_layers;
    for (int s0 = 0; s0 < nseq;) {
        int s1 = s0, total = 0;
        while (s1 < nseq && total + lens[s1] <= f->max_tokens) total += lens[s1++];
        run_micro_batch(f, s0, s1, tokens, lens, logp, row_fn, user);
        s0 = s1;
    }
    f->ops.progress = NULL;
    td_progress_end(&pr);
    return 0;
}

void forward_keep_activations(td_forward *f, int keep)
{
    if (f->acts.save == keep) return;
    acts_free(&f->acts);
    acts_alloc(&f->acts, &f->m->cfg, &f->ops, f->max_tokens, f->max_seq_len, keep);
    /* a backward reads the fp32 view of every weight: prepare the recipe again in fp32 (the
     * model is a trainer's, fp32, small); the recipe was prepared once already, so this cannot
     * fail for want of anything but memory */
    td_error err;
    if (recipe_state_set(&f->rs, &f->ops, f->m, &f->rs.recipe, f->lora, f->lora_mode, f->max_tokens, keep != TD_ACTS_NONE, &err)) {
        fprintf(stderr, "tidal: %s\n", err.msg);
        abort();
    }
}

const td_acts *forward_acts(const td_forward *f) { return &f->acts; }

void forward_set_backend(td_forward *f, const td_backend *be) { f->ops.be = be; }

int forward_decoder(td_forward *f, int nseq, const int *const *tokens, const int *lens,
                    td_forward_rows *rows)
{
    int N = decode_packed(f, 0, nseq, tokens, lens);
    *rows = (td_forward_rows){.N = N, .ops = &f->ops, .tok = f->tok, .pos = f->pos,
                              .row_seq = f->row_seq};
    return N;
}

int td_forward_set_recipe(td_forward *f, const td_recipe *r, td_error *err)
{
    return td_forward_set_recipe_lora(f, r, NULL, 0, err);
}

void td_forward_set_rows_parallel(td_forward *f, int on) { f->rows_parallel = on != 0; }

void td_forward_set_temperature(td_forward *f, float T)
{
    f->ops.temperature = T > 0 ? T : 1.0f;
}

void td_forward_set_moe_fn(td_forward *f, td_moe_fn fn, void *user)
{
    f->ops.moe_fn = fn;
    f->ops.moe_user = user;
}

void td_forward_set_moe_replay(td_forward *f, td_moe_replay_fn fn, void *user)
{
    f->ops.moe_replay = fn;
    f->ops.moe_replay_user = user;
}

void td_forward_set_layer_fn(td_forward *f, td_layer_fn fn, void *user)
{
    f->ops.layer_fn = fn;
    f->ops.layer_user = user;
}

int td_forward_set_recipe_lora(td_forward *f, const td_recipe *r, const td_lora *lora, int mode,
                               td_error *err)
{
    f->lora = lora;
    f->lora_mode = mode;
    return recipe_state_set(&f->rs, &f->ops, f->m, r, lora, mode, f->max_tokens, f->acts.save != TD_ACTS_NONE, err);
}

td_lora_merge_stats td_forward_lora_stats(const td_forward *f) { return f->rs.merge; }

void forward_refresh_lora(td_forward *f)
{
    if (f->rs.lora && f->lora) lora_rt_refresh(f->rs.lora, f->lora);
}

const td_recipe_state *forward_recipe_state(const td_forward *f) { return &f->rs; }
