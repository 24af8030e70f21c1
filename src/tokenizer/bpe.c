/* BPE model: a word (one pre-tokenized piece) starts as one symbol per character and pairs
 * are merged, lowest merge rank first (leftmost among equal ranks), until no adjacent pair
 * has a merge. The loop is HF's Word::merge_all: a heap of candidate merges keyed by
 * (rank, position), stale entries recognised by the merged id they would produce. */
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t pair_key(int32_t a, int32_t b) { return ((uint64_t)(uint32_t)a << 32) | (uint32_t)b; }

static size_t mix64(uint64_t x)
{
    x ^= x >> 33; x *= 0xff51afd7ed558ccdull; x ^= x >> 33; x *= 0xc4ceb9fe1a85ec53ull; x ^= x >> 33;
    return (size_t)x;
}

/* Key 0 marks an empty slot, so pairs are stored as key+1 (no real pair is all ones). */
static struct tk_merge *merge_slot(const tk_bpe *b, uint64_t pair)
{
    size_t j = mix64(pair) & (b->merges_cap - 1);
    while (b->merges[j].pair && b->merges[j].pair != pair + 1) j = (j + 1) & (b->merges_cap - 1);
    return &b->merges[j];
}

static const struct tk_merge *merge_get(const tk_bpe *b, int32_t l, int32_t r)
{
    if (!b->merges_cap) return NULL;
    const struct tk_merge *m = merge_slot(b, pair_key(l, r));
    return m->pair ? m : NULL;
}

static int vocab_lookup(const tk_bpe *b, const char *s, size_t n, const char *path, const char *what,
                        int32_t *id, td_error *err)
{
    *id = tk_strmap_get(&b->vocab, s, n);
    if (*id < 0) return td_fail(err, "%s: model.merges: %s \"%.*s\" is not in model.vocab", path, what, (int)n, s);
    return 0;
}

static int add_merge(tk_bpe *b, const char *l, size_t nl, const char *r, size_t nr, int32_t rank,
                     const char *path, td_error *err)
{
    int32_t a, c, m;
    if (vocab_lookup(b, l, nl, path, "left token", &a, err) || vocab_lookup(b, r, nr, path, "right token", &c, err))
        return -1;
    size_t pl = b->cont_prefix ? strlen(b->cont_prefix) : 0;   // "##" is dropped from the right part
    if (pl > nr || (pl && memcmp(r, b->cont_prefix, pl) != 0)) pl = 0;
    char stack[256], *joined = nl + nr < sizeof stack ? stack : td_xmalloc(nl + nr + 1);
    memcpy(joined, l, nl);
    memcpy(joined + nl, r + pl, nr - pl);
    int rc = vocab_lookup(b, joined, nl + nr - pl, path, "merged token", &m, err);
    if (joined != stack) free(joined);
    if (rc) return -1;
    struct tk_merge *s = merge_slot(b, pair_key(a, c));
    if (!s->pair) b->n_merges++;
    *s = (struct tk_merge){pair_key(a, c) + 1, rank, m};   // a repeated pair keeps the later rank, as HF's map does
    return 0;
}

static char *opt_string(json_t *model, const char *key, const char *path, td_error *err, int *bad)
{
    json_t *v = json_object_get(model, key);
    if (!v || json_is_null(v)) return NULL;
    if (!json_is_string(v)) { *bad = td_fail(err, "%s: model.%s must be a string or null", path, key); return NULL; }
    return strdup(json_string_value(v));
}

static bool opt_bool(json_t *model, const char *key)
{
    json_t *v = json_object_get(model, key);
    return v && json_is_true(v);
}

int tk_bpe_load(tk_bpe *b, json_t *model, const char *path, size_t max_ids, td_error *err)
{
    memset(b, 0, sizeof *b);
    b->unk_id = -1;
    for (int i = 0; i < 256; i++) b->byte_fallback_ids[i] = -1;
    if (!json_is_object(model)) return td_fail(err, "%s: \"model\" must be an object", path);
    json_t *type = json_object_get(model, "type");
    json_t *vocab = json_object_get(model, "vocab");
    json_t *merges = json_object_get(model, "merges");
    if (type && !json_is_string(type)) return td_fail(err, "%s: model.type must be a string", path);
    if (type && strcmp(json_string_value(type), "BPE") != 0)
        return td_fail(err, "%s: model type \"%s\" is not supported (tidal reads BPE models: GPT-2, Llama 3, "
                       "Qwen2/2.5/3 and its own character vocabularies)", path, json_string_value(type));
    if (!type && !(vocab && merges))
        return td_fail(err, "%s: model has no \"type\" and is not a BPE model (vocab + merges)", path);
    if (!json_is_object(vocab)) return td_fail(err, "%s: model.vocab must be an object {token: id}", path);
    if (!json_is_array(merges)) return td_fail(err, "%s: model.merges must be an array", path);
    json_t *dropout = json_object_get(model, "dropout");
    if (dropout && !json_is_null(dropout) && !(json_is_number(dropout) && json_number_value(dropout) == 0.0))
        return td_fail(err, "%s: model.dropout is set: BPE dropout is random and is a training-time feature; "
                       "tidal encodes deterministically (set it to null)", path);
    int bad = 0;
    b->cont_prefix = opt_string(model, "continuing_subword_prefix", path, err, &bad);
    b->eow_suffix = opt_string(model, "end_of_word_suffix", path, err, &bad);
    char *unk = opt_string(model, "unk_token", path, err, &bad);
    if (bad) { free(unk); return -1; }
    b->fuse_unk = opt_bool(model, "fuse_unk");
    b->byte_fallback = opt_bool(model, "byte_fallback");
    b->ignore_merges = opt_bool(model, "ignore_merges");

    size_t nv = json_object_size(vocab), n_ids = 0;
    const char *key;
    json_t *val;
    /* n_ids goes into b only once id_str exists: tk_bpe_free walks id_str[0..n_ids) */
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || (size_t)json_integer_value(val) >= max_ids) {
            free(unk);
            return td_fail(err, "%s: model.vocab[\"%s\"]: id must be an integer in [0, %zu) (the number of vocab "
                           "entries and added tokens)", path, key, max_ids);
        }
        size_t id = (size_t)json_integer_value(val);
        if (id + 1 > n_ids) n_ids = id + 1;
    }
    b->n_ids = n_ids;
    b->id_str = td_xcalloc(b->n_ids ? b->n_ids : 1, sizeof *b->id_str);
    b->id_len = td_xcalloc(b->n_ids ? b->n_ids : 1, sizeof *b->id_len);
    json_object_foreach(vocab, key, val) {
        size_t id = (size_t)json_integer_value(val), len = strlen(key);
        if (b->id_str[id]) {
            free(unk);
            return td_fail(err, "%s: model.vocab: id %zu is given to both \"%s\" and \"%s\"", path, id, b->id_str[id], key);
        }
        tk_strmap_put(&b->vocab, key, len, (int32_t)id);
        b->id_str[id] = strdup(key);
        b->id_len[id] = (uint32_t)len;
    }
    (void)nv;
    if (unk) {
        b->unk_id = tk_strmap_get(&b->vocab, unk, strlen(unk));
        if (b->unk_id < 0) {
            td_fail(err, "%s: model.unk_token \"%s\" is not in model.vocab", path, unk);
            free(unk);
            return -1;
        }
        free(unk);
    }
    if (b->byte_fallback)
        for (int i = 0; i < 256; i++) {
            char name[8];
            snprintf(name, sizeof name, "<0x%02X>", i);
            b->byte_fallback_ids[i] = tk_strmap_get(&b->vocab, name, 6);
        }

    size_t nm = json_array_size(merges);
    b->merges_cap = 16;
    while (b->merges_cap < 2 * nm + 2) b->merges_cap *= 2;
    b->merges = td_xcalloc(b->merges_cap, sizeof *b->merges);
    for (size_t i = 0; i < nm; i++) {
        json_t *m = json_array_get(merges, i);
        if (json_is_string(m)) {
            const char *s = json_string_value(m), *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' '))
                return td_fail(err, "%s: model.merges[%zu] = \"%s\": expected \"left right\" with one space", path, i, s);
            if (add_merge(b, s, (size_t)(sp - s), sp + 1, strlen(sp + 1), (int32_t)i, path, err)) return -1;
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            json_t *l = json_array_get(m, 0), *r = json_array_get(m, 1);
            if (add_merge(b, json_string_value(l), json_string_length(l), json_string_value(r),
                          json_string_length(r), (int32_t)i, path, err))
                return -1;
        } else {
            return td_fail(err, "%s: model.merges[%zu]: expected \"left right\" or [\"left\", \"right\"]", path, i);
        }
    }
    return 0;
}

void tk_bpe_free(tk_bpe *b)
{
    for (size_t i = 0; i < b->n_ids; i++) free(b->id_str[i]);
    free(b->id_str);
    free(b->id_len);
    tk_strmap_free(&b->vocab);
    free(b->merges);
    free(b->cont_prefix);
    free(b->eow_suffix);
    memset(b, 0, sizeof *b);
}

/* ---- merging one word ---- */
typedef struct { int32_t id, prev, next, len; } sym;     // len 0 = merged away
typedef struct { int32_t rank, pos, new_id; } cand;

static bool cand_less(cand a, cand b) { return a.rank < b.rank || (a.rank == b.rank && a.pos < b.pos); }

static void heap_push(cand *h, size_t *n, cand c)
{
    size_t i = (*n)++;
    while (i && cand_less(c, h[(i - 1) / 2])) { h[i] = h[(i - 1) / 2]; i = (i - 1) / 2; }
    h[i] = c;
}

static cand heap_pop(cand *h, size_t *n)
{
    cand top = h[0], last = h[--*n];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(h[c + 1], h[c])) c++;
        if (!cand_less(h[c], last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void push_pair(const tk_bpe *b, const sym *s, int32_t pos, cand *h, size_t *nh)
{
    const struct tk_merge *m = merge_get(b, s[pos].id, s[s[pos].next].id);
    if (m) heap_push(h, nh, (cand){m->rank, pos, m->new_id});
}

void tk_bpe_word(const tk_bpe *b, const char *w, size_t n, tk_ids *out)
{
    if (!n) return;
    if (b->ignore_merges) {                       // Llama 3: a word that is a token is that token
        int32_t id = tk_strmap_get(&b->vocab, w, n);
        if (id >= 0) { tk_ids_put(out, id); return; }
    }
    size_t pl = b->cont_prefix ? strlen(b->cont_prefix) : 0, sl = b->eow_suffix ? strlen(b->eow_suffix) : 0;
    /* Symbols: one per character, or one per byte of "prefix + char + suffix" under byte
     * fallback. Heap: ns-1 initial pairs plus at most 2 per merge (each merge also pops). */
    size_t cap = n * (1 + pl + sl) + sl;
    sym stack_s[64];
    cand stack_h[192];
    sym *s = cap <= 64 ? stack_s : td_xmalloc(cap * sizeof *s);
    cand *h = cap <= 64 ? stack_h : td_xmalloc(3 * cap * sizeof *h);
    size_t ns = 0, nh = 0;
    int32_t unk_id = -1, unk_len = 0;            // pending unknown run (HF merge_word)
    char tmp[64];
    for (size_t i = 0; i < n;) {
        size_t adv;
        tk_utf8_next((const uint8_t *)w + i, &adv);
        const char *c = w + i;
        size_t cl = adv;
        bool first = i == 0, last = i + adv == n;
        char *heap_tmp = NULL;
        if ((!first && pl) || (last && sl)) {
            size_t need = (first ? 0 : pl) + adv + (last ? sl : 0);
            char *t = need <= sizeof tmp ? tmp : (heap_tmp = td_xmalloc(need));
            size_t k = 0;
            if (!first && pl) { memcpy(t, b->cont_prefix, pl); k += pl; }
            memcpy(t + k, c, adv); k += adv;
            if (last && sl) { memcpy(t + k, b->eow_suffix, sl); k += sl; }
            c = t; cl = k;
        }
        int32_t id = tk_strmap_get(&b->vocab, c, cl);
        if (id >= 0) {
            if (unk_id >= 0) { s[ns] = (sym){unk_id, 0, 0, unk_len}; ns++; unk_id = -1; }
            s[ns++] = (sym){id, 0, 0, (int32_t)adv};
        } else {
            bool done = false;
            if (b->byte_fallback) {
                done = true;
                for (size_t k = 0; k < cl; k++) if (b->byte_fallback_ids[(uint8_t)c[k]] < 0) done = false;
                if (done)
                    for (size_t k = 0; k < cl; k++) s[ns++] = (sym){b->byte_fallback_ids[(uint8_t)c[k]], 0, 0, 1};
            }
            if (!done && b->unk_id >= 0) {
                if (unk_id >= 0 && b->fuse_unk) unk_len += (int32_t)adv;
                else {
                    if (unk_id >= 0) s[ns++] = (sym){unk_id, 0, 0, unk_len};
                    unk_id = b->unk_id;
                    unk_len = (int32_t)adv;
                }
            }
        }
        free(heap_tmp);
        i += adv;
    }
    if (unk_id >= 0) s[ns++] = (sym){unk_id, 0, 0, unk_len};
    for (size_t i = 0; i < ns; i++) { s[i].prev = (int32_t)i - 1; s[i].next = i + 1 < ns ? (int32_t)i + 1 : -1; }
    for (size_t i = 0; i + 1 < ns; i++) push_pair(b, s, (int32_t)i, h, &nh);
    while (nh) {
        cand top = heap_pop(h, &nh);
        sym *cur = &s[top.pos];
        if (!cur->len || cur->next < 0) continue;
        int32_t nx = cur->next;
        const struct tk_merge *m = merge_get(b, cur->id, s[nx].id);
        if (!m || m->new_id != top.new_id) continue;         // stale entry
        cur->id = top.new_id;
        cur->len += s[nx].len;
        cur->next = s[nx].next;
        s[nx].len = 0;
        if (cur->next >= 0) s[cur->next].prev = top.pos;
        if (cur->prev >= 0) push_pair(b, s, cur->prev, h, &nh);
        if (cur->next >= 0) push_pair(b, s, top.pos, h, &nh);
    }
    for (size_t i = 0; i < ns; i++) if (s[i].len) tk_ids_put(out, s[i].id);
    if (s != stack_s) free(s);
    if (h != stack_h) free(h);
}
