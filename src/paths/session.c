/* tidal — the incremental structure (inference path): a KV cache of nslots slots, prefill in
 * chunks, then one token per slot per batched decode step. Every buffer is allocated here, at
 * creation, but the KV cache: its element format is the recipe's (ops.h td_kv_store_format:
 * floats on the CPU, the recipe's kv_cache codes on CUDA, 2-4x smaller), so it is allocated at
 * the first prefill under a recipe, and again only when a recipe changes that format (which
 * empties every slot: the codes of one format are not another's). */
#include "../model/model_internal.h"
#include "paths_internal.h"

#include <stdlib.h>
#include <string.h>

struct td_session {
    const td_model *m;
    td_ops ops;
    td_acts acts;            // cap = max(prefill_chunk, nslots), max_keys = max_len
    int nslots, max_len, chunk, logits_rows;
    float *kcache;           // (L, nslots, max_len, NKV*HD) elements of kv_fmt, NULL until used
    float *vcache;           // (L, nslots, max_len, NKV*HD)
    int kv_fmt;              // the format the cache was allocated for (ops.kv_fmt: the recipe's)
    int *len;                // (nslots) tokens held per slot
    float *logits;           // (logits_rows, V) for prefill row callbacks, backend memory
    float *logits_host;      // the rows the host reads: logits itself on the CPU, a copy else
    int *pos;                // (cap)
    int *tok;                // (cap)
    int raw_logits;          // rows are raw logits instead of log-softmax
    int *row_slot;           // (cap) slot of each row, for layer observers
    td_recipe_state rs;      // the recipe (default: none = fp32 reference)
};

td_session *td_session_create(const td_model *m, int nslots, int max_len, int prefill_chunk,
                              td_error *err)
{
    if (nslots < 1 || max_len < 1 || prefill_chunk < 0)
        return td_fail(err, "td_session_create: nslots %d, max_len %d, prefill_chunk %d "
                       "(expected >= 1, >= 1, >= 0)", nslots, max_len, prefill_chunk), NULL;
    if (td_config_check_len(&m->cfg, max_len, err)) return NULL;
    const td_config *c = &m->cfg;
    td_session *s = td_xcalloc(1, sizeof *s);
    s->m = m;
    td_ops_init(&s->ops, m->backend ? m->backend : &td_backend_cpu);
    s->nslots = nslots;
    s->max_len = max_len;
    s->chunk = prefill_chunk ? prefill_chunk : 128;
    if (s->chunk > max_len) s->chunk = max_len;
    int cap = s->chunk > nslots ? s->chunk : nslots;
    acts_alloc(&s->acts, c, &s->ops, cap, max_len, 0);
    s->len = td_xcalloc((size_t)nslots, sizeof(int));
    s->logits_rows = s->chunk < 64 ? s->chunk : 64;
    s->logits = s->ops.be->alloc((size_t)s->logits_rows * c->vocab_size * sizeof(float));
    s->logits_host = paths_host_mirror(&s->ops, s->logits, (size_t)s->logits_rows * c->vocab_size);
    s->pos = td_xmalloc((size_t)cap * sizeof(int));
    s->tok = td_xmalloc((size_t)cap * sizeof(int));
    s->row_slot = td_xmalloc((size_t)cap * sizeof(int));
    if (recipe_state_set(&s->rs, &s->ops, m, td_recipe_find_preset("fp32"), NULL, 0, cap, 0, err)) {
        td_session_free(s);
        return NULL;
    }
    return s;
}

void td_session_free(td_session *s)
{
    if (!s) return;
    acts_free(&s->acts);
    recipe_state_free(&s->rs);
    td_backend_forget(s->ops.be);
    if (s->kcache) s->ops.be->free(s->kcache);
    if (s->vcache) s->ops.be->free(s->vcache);
    if (s->logits_host != s->logits) free(s->logits_host);
    s->ops.be->free(s->logits);
    free(s->len); free(s->pos);
    free(s->tok);
    free(s->row_slot);
    free(s);
}

void td_session_reset(td_session *s, int slot)
{
    if (slot >= 0 && slot < s->nslots) s->len[slot] = 0;
}

int td_session_len(const td_session *s, int slot)
{
    return slot >= 0 && slot < s->nslots ? s->len[slot] : -1;
}

/* the KV cache in the recipe's format, allocated on first use */
static td_kv_store cache_store(td_session *s)
{
    const td_config *c = &s->m->cfg;
    size_t KVD = (size_t)c->num_kv_heads * c->head_dim, per_layer = (size_t)s->nslots * s->max_len * KVD;
    size_t esize = td_kv_esize(s->ops.kv_fmt);
    if (!s->kcache) {
        s->kcache = s->ops.be->alloc((size_t)c->num_layers * per_layer * esize);
        s->vcache = s->ops.be->alloc((size_t)c->num_layers * per_layer * esize);
        s->kv_fmt = s->ops.kv_fmt;
    }
    td_kv_store kv = {s->kcache, s->vcache, per_layer, esize};
    return kv;
}

static size_t slot_offset(const td_session *s, int slot)
{
    size_t KVD = (size_t)s->m->cfg.num_kv_heads * s->m->cfg.head_dim;
    return (size_t)slot * s->max_len * KVD;
}

/* td_session_prefill (row_fn: the rows on the host, downloaded chunk by chunk; last: host
 * memory) and session_prefill_dev (rows_fn: the rows in backend memory, the logits buffer R rows
 * at a time; last: backend memory, paths_internal.h); one of row_fn / rows_fn at most. */
static int prefill(td_session *s, int slot, const int *tokens, int n, float *last, td_row_fn row_fn,
                   session_rows_fn rows_fn, void *user, td_error *err)
{
    const td_model *m = s->m;
    int V = m->cfg.vocab_size, C = m->cfg.hidden_size;
    if (slot < 0 || slot >= s->nslots)
        return td_fail(err, "td_session_prefill: slot %d (expected 0..%d)", slot, s->nslots - 1);
    if (n < 1 || n > s->max_len - s->len[slot])
        return td_fail(err, "td_session_prefill: %d tokens into slot %d holding %d of %d",
                       n, slot, s->len[slot], s->max_len);
    for (int i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= V)
            return td_fail(err, "td_session_prefill: token %d at %d outside the vocabulary "
                           "0..%d", tokens[i], i, V - 1);
    td_kv_store kv = cache_store(s);
    for (int i0 = 0; i0 < n; i0 += s->chunk) {
        int N = n - i0 < s->chunk ? n - i0 : s->chunk;
        for (int i = 0; i < N; i++) {
            s->pos[i] = s->len[slot] + i;
            s->acts.kv_off[i] = slot_offset(s, slot);
            s->row_slot[i] = slot;
        }
        s->ops.decode = 0;
        s->ops.row_seq = s->row_slot;
        decoder_forward(&s->ops, m, &s->acts, tokens + i0, s->pos, N, &kv);
        if (row_fn || rows_fn)
            for (int r0 = 0; r0 < N; r0 += s->logits_rows) {
                int R = N - r0 < s->logits_rows ? N - r0 : s->logits_rows;
                head_forward(&s->ops, m, s->logits, s->acts.xn + (size_t)r0 * C, R, s->raw_logits);
                if (rows_fn) {
                    rows_fn(user, slot, s->pos[r0], s->logits, R);
                    continue;
                }
                s->ops.be->download(s->logits_host, s->logits, (size_t)R * V * sizeof(float));
                for (int r = 0; r < R; r++)
                    row_fn(user, slot, s->pos[r0 + r], s->logits_host + (size_t)r * V);
            }
        s->len[slot] += N;
        if (i0 + N == n && last) {
            size_t at = (size_t)((N - 1) % s->logits_rows) * V;   /* the last row, when computed */
            if (row_fn)        /* downloaded with the others */
                memcpy(last, s->logits_host + at, (size_t)V * sizeof(float));
            else if (rows_fn)  /* still in the logits buffer: a copy within the device */
                s->ops.be->upload(last, s->logits + at, (size_t)V * sizeof(float));
            else
                head_forward(&s->ops, m, last, s->acts.xn + (size_t)(N - 1) * C, 1, s->raw_logits);
        }
    }
    return 0;
}

int td_session_prefill(td_session *s, int slot, const int *tokens, int n, float *last_row,
                       td_row_fn row_fn, void *user, td_error *err)
{
    return prefill(s, slot, tokens, n, last_row, row_fn, NULL, user, err);
}

int session_prefill_dev(td_session *s, int slot, const int *tokens, int n, float *last_dev,
                        session_rows_fn rows_fn, void *user, td_error *err)
{
    return prefill(s, slot, tokens, n, last_dev, NULL, rows_fn, user, err);
}

int td_session_decode(td_session *s, int n, const int *slots, const int *tokens, float *rows,
                      td_error *err)
{
    const td_model *m = s->m;
    int V = m->cfg.vocab_size;
    if (n < 1 || n > s->nslots)
        return td_fail(err, "td_session_decode: %d slots (expected 1..%d)", n, s->nslots);
    for (int i = 0; i < n; i++) {
        int sl = slots[i];
        if (sl < 0 || sl >= s->nslots)
            return td_fail(err, "td_session_decode: slot %d (expected 0..%d)", sl,
                           s->nslots - 1);
        for (int j = 0; j < i; j++)
            if (slots[j] == sl)
                return td_fail(err, "td_session_decode: slot %d given twice", sl);
        if (s->len[sl] >= s->max_len)
            return td_fail(err, "td_session_decode: slot %d is full (%d positions)", sl,
                           s->max_len);
        if (tokens[i] < 0 || tokens[i] >= V)
            return td_fail(err, "td_session_decode: token %d for slot %d outside the "
                           "vocabulary 0..%d", tokens[i], sl, V - 1);
    }
    for (int i = 0; i < n; i++) {
        s->pos[i] = s->len[slots[i]];
        s->acts.kv_off[i] = slot_offset(s, slots[i]);
        s->row_slot[i] = slots[i];
    }
    td_kv_store kv = cache_store(s);
    s->ops.decode = 1;
    s->ops.row_seq = s->row_slot;
    decoder_forward(&s->ops, m, &s->acts, tokens, s->pos, n, &kv);
    for (int i = 0; i < n; i++) s->len[slots[i]]++;
    head_forward(&s->ops, m, rows, s->acts.xn, n, s->raw_logits);
    return 0;
}

void td_session_set_raw_logits(td_session *s, int raw) { s->raw_logits = raw; }

int session_vocab(const td_session *s) { return s->m->cfg.vocab_size; }

FILE *session_progress(const td_session *s) { return s->m->progress; }
const td_ops *session_ops(const td_session *s) { return &s->ops; }

int td_session_set_recipe(td_session *s, const td_recipe *r, td_error *err)
{
    return td_session_set_recipe_lora(s, r, NULL, 0, err);
}

int td_session_set_recipe_lora(td_session *s, const td_recipe *r, const td_lora *lora, int mode,
                               td_error *err)
{
    int cap = s->chunk > s->nslots ? s->chunk : s->nslots;
    if (recipe_state_set(&s->rs, &s->ops, s->m, r, lora, mode, cap, 0, err)) return -1;
    s->ops.cache = 1;
    s->ops.kv_fmt = td_kv_store_format(s->ops.be, s->ops.recipe);
    if (s->kcache && s->kv_fmt != s->ops.kv_fmt) {   /* another format: a new, empty cache */
        s->ops.be->free(s->kcache);
        s->ops.be->free(s->vcache);
        s->kcache = s->vcache = NULL;
        for (int i = 0; i < s->nslots; i++) s->len[i] = 0;
    }
    return 0;
}

void td_session_set_moe_fn(td_session *s, td_moe_fn fn, void *user)
{
    s->ops.moe_fn = fn;
    s->ops.moe_user = user;
}

void td_session_set_moe_replay(td_session *s, td_moe_replay_fn fn, void *user)
{
    s->ops.moe_replay = fn;
    s->ops.moe_replay_user = user;
}

void td_session_set_layer_fn(td_session *s, td_layer_fn fn, void *user)
{
    s->ops.layer_fn = fn;
    s->ops.layer_user = user;
}
td_lora_merge_stats td_session_lora_stats(const td_session *s) { return s->rs.merge; }

void session_refresh_lora(td_session *s, const td_lora *lora)
{
    if (s->rs.lora && lora) lora_rt_refresh(s->rs.lora, lora);
}

const td_recipe_state *session_recipe_state(const td_session *s) { return &s->rs; }
