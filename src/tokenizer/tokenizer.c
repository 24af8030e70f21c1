/* Loading a tokenizer.json (+ tokenizer_config.json), the encode pipeline and decoding.
 * See include/tidal/tokenizer.h for the contract (agreement with HF `tokenizers`). */
#include "tok_internal.h"
#include "tidal/chat_template.h"

#include "tidal/io.h"

#include <stdlib.h>
#include <string.h>

/* ---- loading pieces ---- */
static int load_added(td_tokenizer *t, json_t *arr, size_t max_ids, td_error *err)
{
    if (!arr || json_is_null(arr)) return 0;
    if (!json_is_array(arr)) return td_fail(err, "%s: \"added_tokens\" must be an array", t->path);
    t->added = td_xcalloc(json_array_size(arr) + 1, sizeof *t->added);
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *a = json_array_get(arr, i), *id = json_object_get(a, "id"), *c = json_object_get(a, "content");
        if (!json_is_object(a) || !json_is_integer(id) || !json_is_string(c) || !json_string_length(c))
            return td_fail(err, "%s: added_tokens[%zu]: expected {\"id\": integer, \"content\": non-empty string, ...}",
                           t->path, i);
        if (json_integer_value(id) < 0 || (size_t)json_integer_value(id) >= max_ids)
            return td_fail(err, "%s: added_tokens[%zu] \"%s\": id %lld outside [0, %zu) (vocab entries + added tokens)",
                           t->path, i, json_string_value(c), (long long)json_integer_value(id), max_ids);
        const char *s = json_string_value(c);
        size_t len = json_string_length(c);
        if (tk_utf8_check((const uint8_t *)s, len) != len || memchr(s, 0, len))
            return td_fail(err, "%s: added_tokens[%zu]: content is not valid UTF-8 text", t->path, i);
        tk_added *x = &t->added[t->n_added];
        x->content = strdup(s);
        x->len = (uint32_t)len;
        x->id = (int32_t)json_integer_value(id);
        x->special = json_is_true(json_object_get(a, "special"));
        json_t *norm = json_object_get(a, "normalized");
        x->normalized = norm ? json_is_true(norm) : !x->special;      // HF's default
        x->lstrip = json_is_true(json_object_get(a, "lstrip"));
        x->rstrip = json_is_true(json_object_get(a, "rstrip"));
        x->single_word = json_is_true(json_object_get(a, "single_word"));
        if (!tk_strmap_put(&t->added_by_str, s, len, (int32_t)t->n_added)) {
            free(x->content);   /* not counted in n_added: the free of the list would miss it */
            x->content = NULL;
            return td_fail(err, "%s: added_tokens[%zu]: \"%s\" is listed twice", t->path, i, s);
        }
        t->n_added++;
    }
    return 0;
}

static int load_normalizer(td_tokenizer *t, json_t *j, td_error *err)
{
    if (!j || json_is_null(j)) return 0;
    json_t *type = json_object_get(j, "type");
    if (!json_is_string(type)) return td_fail(err, "%s: normalizer must be null or an object with a \"type\"", t->path);
    const char *ty = json_string_value(type);
    if (strcmp(ty, "NFC") == 0) { t->nfc = true; return 0; }
    if (strcmp(ty, "Sequence") == 0) {
        json_t *list = json_object_get(j, "normalizers");
        if (!json_is_array(list)) return td_fail(err, "%s: normalizer Sequence needs a \"normalizers\" array", t->path);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (load_normalizer(t, json_array_get(list, i), err)) return -1;
        return 0;
    }
    return td_fail(err, "%s: normalizer type \"%s\" is not supported (tidal reads none, NFC, and Sequences of NFC)",
                   t->path, ty);
}

static int special_ids(td_tokenizer *t, json_t *specials, const char *name, tk_ids *out, td_error *err)
{
    json_t *s = json_object_get(specials, name), *ids = json_object_get(s, "ids");
    if (!json_is_array(ids))
        return td_fail(err, "%s: post_processor.special_tokens has no entry \"%s\" with an \"ids\" array", t->path, name);
    for (size_t i = 0; i < json_array_size(ids); i++) {
        json_t *v = json_array_get(ids, i);
        if (!json_is_integer(v) || json_integer_value(v) < 0 || (size_t)json_integer_value(v) >= t->n_ids)
            return td_fail(err, "%s: post_processor.special_tokens[\"%s\"].ids[%zu] is not a valid id", t->path, name, i);
        tk_ids_put(out, (int32_t)json_integer_value(v));
    }
    return 0;
}

static int pair_id(td_tokenizer *t, json_t *p, const char *what, tk_ids *out, td_error *err)
{
    json_t *id = json_array_get(p, 1);
    if (!json_is_array(p) || !json_is_integer(id) || json_integer_value(id) < 0 || (size_t)json_integer_value(id) >= t->n_ids)
        return td_fail(err, "%s: post_processor.%s must be [\"token\", id] with a valid id", t->path, what);
    tk_ids_put(out, (int32_t)json_integer_value(id));
    return 0;
}

static int load_post(td_tokenizer *t, json_t *j, td_error *err)
{
    if (!j || json_is_null(j)) return 0;
    json_t *type = json_object_get(j, "type");
    if (!json_is_string(type)) return td_fail(err, "%s: post_processor must be null or an object with a \"type\"", t->path);
    const char *ty = json_string_value(type);
    if (strcmp(ty, "ByteLevel") == 0) return 0;                 // offsets only
    if (strcmp(ty, "Sequence") == 0) {
        json_t *list = json_object_get(j, "processors");
        if (!json_is_array(list)) return td_fail(err, "%s: post_processor Sequence needs a \"processors\" array", t->path);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (load_post(t, json_array_get(list, i), err)) return -1;
        return 0;
    }
    if (t->post_before.n || t->post_after.n)
        return td_fail(err, "%s: post_processor adds special tokens twice (two templates in a Sequence)", t->path);
    if (strcmp(ty, "RobertaProcessing") == 0 || strcmp(ty, "BertProcessing") == 0)
        return pair_id(t, json_object_get(j, "cls"), "cls", &t->post_before, err) ||
               pair_id(t, json_object_get(j, "sep"), "sep", &t->post_after, err) ? -1 : 0;
    if (strcmp(ty, "TemplateProcessing") == 0) {
        json_t *single = json_object_get(j, "single"), *specials = json_object_get(j, "special_tokens");
        if (!json_is_array(single)) return td_fail(err, "%s: post_processor TemplateProcessing needs a \"single\" array", t->path);
        bool seen_a = false;
        for (size_t i = 0; i < json_array_size(single); i++) {
            json_t *it = json_array_get(single, i), *sp = json_object_get(it, "SpecialToken"), *sq = json_object_get(it, "Sequence");
            if (sp && json_is_string(json_object_get(sp, "id"))) {
                if (special_ids(t, specials, json_string_value(json_object_get(sp, "id")), seen_a ? &t->post_after : &t->post_before, err))
                    return -1;
            } else if (sq && json_is_string(json_object_get(sq, "id")) && strcmp(json_string_value(json_object_get(sq, "id")), "A") == 0 && !seen_a) {
                seen_a = true;
            } else {
                return td_fail(err, "%s: post_processor.single[%zu]: expected {\"SpecialToken\": {\"id\": ...}} or one "
                               "{\"Sequence\": {\"id\": \"A\"}}", t->path, i);
            }
        }
        if (!seen_a) return td_fail(err, "%s: post_processor.single has no {\"Sequence\": {\"id\": \"A\"}}", t->path);
        return 0;
    }
    return td_fail(err, "%s: post_processor type \"%s\" is not supported (tidal reads TemplateProcessing, ByteLevel, "
                   "RobertaProcessing, BertProcessing, Sequence)", t->path, ty);
}

static int load_decoder(td_tokenizer *t, json_t *j, td_error *err)
{
    if (!j || json_is_null(j)) return 0;
    json_t *type = json_object_get(j, "type");
    if (!json_is_string(type)) return td_fail(err, "%s: decoder must be null or an object with a \"type\"", t->path);
    const char *ty = json_string_value(type);
    if (strcmp(ty, "Sequence") == 0) {
        json_t *list = json_object_get(j, "decoders");
        if (!json_is_array(list)) return td_fail(err, "%s: decoder Sequence needs a \"decoders\" array", t->path);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (load_decoder(t, json_array_get(list, i), err)) return -1;
        return 0;
    }
    int d = strcmp(ty, "ByteLevel") == 0 ? DEC_BYTELEVEL : strcmp(ty, "Fuse") == 0 ? DEC_FUSE : -1;
    if (d < 0) return td_fail(err, "%s: decoder type \"%s\" is not supported (tidal reads ByteLevel, Fuse, Sequence)", t->path, ty);
    if (t->n_decoders == sizeof t->decoders / sizeof t->decoders[0])
        return td_fail(err, "%s: decoder Sequence is longer than %zu", t->path, sizeof t->decoders / sizeof t->decoders[0]);
    t->decoders[t->n_decoders++] = d;
    return 0;
}

/* The chat template: tokenizer_config.json "chat_template" (a string, or a list of
 * {"name", "template"} from which "default" is taken, as transformers does), else the
 * chat_template.jinja that transformers >= 4.50 writes beside it. */
static int load_chat_template(td_tokenizer *t, json_t *cfg, const char *cpath, size_t dir_len, td_error *err)
{
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_array(ct)) {
        json_t *pick = NULL;
        for (size_t i = 0; i < json_array_size(ct); i++) {
            json_t *e = json_array_get(ct, i), *name = json_object_get(e, "name");
            if (json_is_string(name) && strcmp(json_string_value(name), "default") == 0) pick = json_object_get(e, "template");
        }
        if (!pick) return td_fail(err, "%s: \"chat_template\" is a list without a {\"name\": \"default\"} entry", cpath);
        ct = pick;
    }
    if (ct && !json_is_null(ct)) {
        if (!json_is_string(ct)) return td_fail(err, "%s: \"chat_template\" must be a string or a list of named templates", cpath);
        t->chat_template = strndup(json_string_value(ct), json_string_length(ct));
        t->chat_template_from = strdup(cpath);
        return 0;
    }
    char *jpath = td_xmalloc(dir_len + 32);
    memcpy(jpath, cpath, dir_len);
    strcpy(jpath + dir_len, "chat_template.jinja");
    FILE *f = fopen(jpath, "rb");
    if (f) {
        fclose(f);
        t->chat_template = td_read_file(jpath, 1 << 22, NULL, err);
        if (!t->chat_template) { free(jpath); return -1; }
        t->chat_template_from = jpath;
        return 0;
    }
    free(jpath);
    return 0;
}

/* bos_token / eos_token in tokenizer_config.json: a string, {"content": string}, or null. */
static int config_token(td_tokenizer *t, json_t *cfg, const char *key, const char *cpath, int32_t *id, td_error *err)
{
    json_t *v = json_object_get(cfg, key);
    if (!v || json_is_null(v)) return 0;
    if (json_is_object(v)) v = json_object_get(v, "content");
    if (!json_is_string(v)) return td_fail(err, "%s: \"%s\" must be a string, {\"content\": string} or null", cpath, key);
    *id = td_tokenizer_token_id(t, json_string_value(v));
    if (*id < 0) return td_fail(err, "%s: %s \"%s\" is not a token of %s", cpath, key, json_string_value(v), t->path);
    return 0;
}

static int load_config(td_tokenizer *t, bool has_post, td_error *err)
{
    const char *slash = strrchr(t->path, '/');
    size_t dl = slash ? (size_t)(slash - t->path) + 1 : 0;
    char *cpath = td_xmalloc(dl + 32);
    memcpy(cpath, t->path, dl);
    strcpy(cpath + dl, "tokenizer_config.json");
    FILE *f = fopen(cpath, "rb");
    if (!f) { free(cpath); return 0; }
    fclose(f);
    json_t *cfg = td_json_load_file(cpath, err);
    int rc = -1;
    if (!cfg) goto out;
    if (!json_is_object(cfg)) { td_fail(err, "%s: expected a JSON object", cpath); goto out; }
    if (config_token(t, cfg, "bos_token", cpath, &t->bos_id, err) || config_token(t, cfg, "eos_token", cpath, &t->eos_id, err))
        goto out;
    if (load_chat_template(t, cfg, cpath, dl, err)) goto out;
    if (!has_post) {         // transformers' Llama-style fast tokenizers build their template from these
        if (json_is_true(json_object_get(cfg, "add_bos_token")) && t->bos_id >= 0) tk_ids_put(&t->post_before, t->bos_id);
        if (json_is_true(json_object_get(cfg, "add_eos_token")) && t->eos_id >= 0) tk_ids_put(&t->post_after, t->eos_id);
    }
    rc = 0;
out:
    json_decref(cfg);
    free(cpath);
    return rc;
}

/* The first component of type `ty` in a normalizer / pre_tokenizer / decoder tree (objects
 * nested through "normalizers", "pretokenizers", "decoders" lists); NULL if none. */
static json_t *find_type(json_t *j, const char *ty)
{
    if (!json_is_object(j)) return NULL;
    json_t *t = json_object_get(j, "type");
    if (json_is_string(t) && strcmp(json_string_value(t), ty) == 0) return j;
    static const char *const lists[] = {"normalizers", "pretokenizers", "decoders"};
    for (size_t k = 0; k < 3; k++) {
        json_t *l = json_object_get(j, lists[k]);
        for (size_t i = 0; i < json_array_size(l); i++) {
            json_t *f = find_type(json_array_get(l, i), ty);
            if (f) return f;
        }
    }
    return NULL;
}

/* Refuses what tidal does not read by its kind, before anything else is checked: a Unigram or
 * WordPiece model, or a SentencePiece-style pipeline (Metaspace "▁" word boundaries, as Llama 2,
 * Mistral, Gemma and T5 write them). Later checks (added token ids against the vocabulary size)
 * assume a BPE vocabulary object and would give a made-up reason for these. */
static int check_kind(json_t *root, json_t *model, const char *path, td_error *err)
{
    static const char *const bpe_only = "tidal reads byte-level BPE tokenizers (GPT-2, Llama 3, Qwen2/2.5/3) and "
                                        "its own character vocabularies";
    json_t *type = json_object_get(model, "type");
    if (json_is_string(type) && strcmp(json_string_value(type), "BPE") != 0) {
        const char *ty = json_string_value(type);
        return td_fail(err, "%s: model type \"%s\" is not supported (%s%s)", path, ty,
                       strcmp(ty, "Unigram") == 0 ? "a SentencePiece Unigram model; " : "", bpe_only);
    }
    static const struct { const char *field, *type; } sp[] = {
        {"pre_tokenizer", "Metaspace"}, {"decoder", "Metaspace"}, {"normalizer", "Prepend"},
    };
    for (size_t k = 0; k < sizeof sp / sizeof sp[0]; k++)
        if (find_type(json_object_get(root, sp[k].field), sp[k].type))
            return td_fail(err, "%s: %s type \"%s\" is not supported: a SentencePiece-style tokenizer (\"\u2581\" "
                           "word boundaries); %s", path, sp[k].field, sp[k].type, bpe_only);
    return 0;
}

td_tokenizer *td_tokenizer_load(const char *path, td_error *err)
{
    json_t *root = td_json_load_file(path, err);
    if (!root) return NULL;
    td_tokenizer *t = td_xcalloc(1, sizeof *t);
    t->path = strdup(path);
    t->bos_id = t->eos_id = -1;
    pthread_mutex_init(&t->pool_lock, NULL);
    int rc = -1;
    if (!json_is_object(root)) { td_fail(err, "%s: expected a JSON object (a tokenizer.json)", path); goto out; }
    json_t *model = json_object_get(root, "model");
    if (!model) { td_fail(err, "%s: no \"model\": not a tokenizer.json", path); goto out; }
    if (check_kind(root, model, path, err)) goto out;
    json_t *added = json_object_get(root, "added_tokens");
    size_t max_ids = json_object_size(json_object_get(model, "vocab")) + (json_is_array(added) ? json_array_size(added) : 0);
    if (load_added(t, added, max_ids ? max_ids : 1, err)) goto out;
    if (tk_bpe_load(&t->bpe, model, path, max_ids ? max_ids : 1, err)) goto out;
    t->n_ids = t->bpe.n_ids;
    for (size_t i = 0; i < t->n_added; i++)
        if ((size_t)t->added[i].id + 1 > t->n_ids) t->n_ids = (size_t)t->added[i].id + 1;
    t->added_by_id = td_xmalloc((t->n_ids ? t->n_ids : 1) * sizeof *t->added_by_id);
    for (size_t i = 0; i < t->n_ids; i++) t->added_by_id[i] = -1;
    for (size_t i = 0; i < t->n_added; i++) t->added_by_id[t->added[i].id] = (int32_t)i;
    tk_matcher_build(&t->raw_match, t->added, t->n_added, false);
    tk_matcher_build(&t->norm_match, t->added, t->n_added, true);
    if (load_normalizer(t, json_object_get(root, "normalizer"), err)) goto out;
    if (tk_pretok_load(json_object_get(root, "pre_tokenizer"), path, &t->pretok, &t->n_pretok, err)) goto out;
    json_t *post = json_object_get(root, "post_processor");
    if (load_post(t, post, err)) goto out;
    if (load_decoder(t, json_object_get(root, "decoder"), err)) goto out;
    if (load_config(t, post && !json_is_null(post), err)) goto out;
    if (t->bos_id < 0 && t->post_before.n) t->bos_id = t->post_before.p[0];
    if (t->eos_id < 0 && t->post_after.n) t->eos_id = t->post_after.p[t->post_after.n - 1];
    rc = 0;
out:
    json_decref(root);
    if (rc) { td_tokenizer_free(t); return NULL; }
    return t;
}

static void work_free(tk_work *w);

void td_tokenizer_free(td_tokenizer *t)
{
    if (!t) return;
    tk_bpe_free(&t->bpe);
    for (size_t i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    tk_strmap_free(&t->added_by_str);
    free(t->added_by_id);
    tk_matcher_free(&t->raw_match);
    tk_matcher_free(&t->norm_match);
    tk_pretok_free(t->pretok, t->n_pretok);
    free(t->post_before.p);
    free(t->post_after.p);
    while (t->pool) {
        tk_work *w = t->pool;
        t->pool = w->next;
        work_free(w);
    }
    pthread_mutex_destroy(&t->pool_lock);
    free(t->chat_template);
    free(t->chat_template_from);
    free(t->path);
    free(t);
}

/* ---- encode ---- */
static tk_work *work_take(const td_tokenizer *tc)
{
    td_tokenizer *t = (td_tokenizer *)tc;        // the pool is the one mutable part, under its lock
    pthread_mutex_lock(&t->pool_lock);
    tk_work *w = t->pool;
    if (w) t->pool = w->next;
    pthread_mutex_unlock(&t->pool_lock);
    if (!w) {
        w = td_xcalloc(1, sizeof *w);
        tk_pretok_state_init(&w->st);
        w->slots = td_xcalloc(TK_CACHE_SLOTS, sizeof *w->slots);
    }
    return w;
}

static void work_give(const td_tokenizer *tc, tk_work *w)
{
    td_tokenizer *t = (td_tokenizer *)tc;
    pthread_mutex_lock(&t->pool_lock);
    w->next = t->pool;
    t->pool = w;
    pthread_mutex_unlock(&t->pool_lock);
}

static void work_free(tk_work *w)
{
    tk_pretok_state_free(&w->st);
    free(w->p1);
    free(w->p2);
    free(w->norm.p);
    free(w->slots);
    free(w->keys.p);
    free(w->ids.p);
    free(w);
}

/* BPE of one word through the workspace's cache (words up to TK_CACHE_MAX_WORD bytes; the
 * cache is emptied when half full, which keeps probing short and memory bounded). */
static void bpe_cached(const td_tokenizer *t, tk_work *w, const char *s, size_t n, tk_ids *out)
{
    if (n > TK_CACHE_MAX_WORD) { tk_bpe_word(&t->bpe, s, n, out); return; }
    uint64_t h = tk_hash(s, n);
    size_t j = h & (TK_CACHE_SLOTS - 1);
    for (; w->slots[j].key_len; j = (j + 1) & (TK_CACHE_SLOTS - 1)) {
        tk_cache_slot *c = &w->slots[j];
        if (c->h == h && c->key_len == n && memcmp(w->keys.p + c->key_off, s, n) == 0) {
            for (uint32_t k = 0; k < c->n_ids; k++) tk_ids_put(out, w->ids.p[c->ids_off + k]);
            return;
        }
    }
    size_t before = out->n;
    tk_bpe_word(&t->bpe, s, n, out);
    if (w->n_cached >= TK_CACHE_SLOTS / 2) {
        memset(w->slots, 0, TK_CACHE_SLOTS * sizeof *w->slots);
        w->n_cached = 0;
        w->keys.n = 0;
        w->ids.n = 0;
        j = h & (TK_CACHE_SLOTS - 1);
    }
    w->slots[j] = (tk_cache_slot){h, (uint32_t)w->keys.n, (uint32_t)n, (uint32_t)w->ids.n, (uint32_t)(out->n - before)};
    tk_buf_put(&w->keys, s, n);
    for (size_t k = before; k < out->n; k++) tk_ids_put(&w->ids, out->p[k]);
    w->n_cached++;
}

int td_tokenizer_encode(const td_tokenizer *t, const char *text, size_t len, bool allow_special, bool add_special,
                        int32_t **ids, size_t *n, td_error *err)
{
    *ids = NULL;
    *n = 0;
    size_t bad = tk_utf8_check((const uint8_t *)text, len);
    if (bad != len) return td_fail(err, "input text is not valid UTF-8 (byte %zu of %zu)", bad, len);
    tk_ids out = {0};
    if (add_special) for (size_t i = 0; i < t->post_before.n; i++) tk_ids_put(&out, t->post_before.p[i]);
    tk_work *w = work_take(t);
    size_t n1 = 0, n2 = 0;
    int rc = 0;
    tk_added_split(&t->raw_match, text, len, allow_special, &w->p1, &n1, &w->c1);
    for (size_t i = 0; i < n1 && !rc; i++) {
        tk_piece a = w->p1[i];
        if (a.id >= 0) { tk_ids_put(&out, a.id); continue; }
        if (!a.len) continue;
        const char *seg = text + a.off;
        size_t seg_len = a.len;
        if (t->nfc) {
            w->norm.n = 0;
            tk_nfc(&w->norm, seg, seg_len);
            seg = w->norm.p;
            seg_len = w->norm.n;
        }
        n2 = 0;
        tk_added_split(&t->norm_match, seg, seg_len, allow_special, &w->p2, &n2, &w->c2);
        for (size_t k = 0; k < n2 && !rc; k++) {
            tk_piece b = w->p2[k];
            if (b.id >= 0) { tk_ids_put(&out, b.id); continue; }
            if (!b.len) continue;
            rc = tk_pretok_run(t->pretok, t->n_pretok, seg + b.off, b.len, &w->st, err);
            for (size_t q = 0; !rc && q < w->st.nsp[w->st.cur]; q++) {
                tk_span s = w->st.sp[w->st.cur][q];
                bpe_cached(t, w, w->st.buf[w->st.cur].p + s.off, s.len, &out);
            }
        }
    }
    if (add_special) for (size_t i = 0; i < t->post_after.n; i++) tk_ids_put(&out, t->post_after.p[i]);
    work_give(t, w);
    if (rc) { free(out.p); return -1; }
    *ids = out.p ? out.p : td_xmalloc(sizeof(int32_t));
    *n = out.n;
    return 0;
}

/* ---- decode ---- */
const char *td_tokenizer_token_str(const td_tokenizer *t, int32_t id)
{
    if (id < 0 || (size_t)id >= t->n_ids) return NULL;
    if (t->added_by_id[id] >= 0) return t->added[t->added_by_id[id]].content;
    return (size_t)id < t->bpe.n_ids ? t->bpe.id_str[id] : NULL;
}

int32_t td_tokenizer_token_id(const td_tokenizer *t, const char *token)
{
    size_t len = strlen(token);
    int32_t k = tk_strmap_get(&t->added_by_str, token, len);
    if (k >= 0) return t->added[k].id;
    return tk_strmap_get(&t->bpe.vocab, token, len);
}

size_t td_tokenizer_vocab_size(const td_tokenizer *t) { return t->n_ids; }
int32_t td_tokenizer_bos_id(const td_tokenizer *t) { return t->bos_id; }
int td_tokenizer_set_chat_template(td_tokenizer *t, const char *path, td_error *err)
{
    td_error perr;
    char *text = td_read_file(path, 1 << 22, NULL, &perr);
    if (!text) return td_fail(err, "--chat-template: %s", perr.msg);
    td_chat_template *parsed = td_chat_template_parse(text, strlen(text), &perr);
    if (!parsed) {
        free(text);
        return td_fail(err, "--chat-template %s: not a chat template tidal can render: %s", path, perr.msg);
    }
    td_chat_template_free(parsed);
    free(t->chat_template);
    free(t->chat_template_from);
    t->chat_template = text;
    t->chat_template_from = strdup(path);
    return 0;
}

const char *td_tokenizer_chat_template(const td_tokenizer *t, const char **from)
{
    if (from) *from = t->chat_template_from;
    return t->chat_template;
}
int32_t td_tokenizer_eos_id(const td_tokenizer *t) { return t->eos_id; }

bool td_tokenizer_is_special(const td_tokenizer *t, int32_t id)
{
    return id >= 0 && (size_t)id < t->n_ids && t->added_by_id[id] >= 0 && t->added[t->added_by_id[id]].special;
}

/* HF Tokenizer::decode: id → token string (added vocabulary first), dropping unknown ids and,
 * on request, special tokens; then the decoder chain, each decoder mapping a list of strings
 * to a list of strings; the result is their concatenation (no decoder: joined by " "). */
char *td_tokenizer_decode(const td_tokenizer *t, const int32_t *ids, size_t n, bool skip_special, size_t *len_out)
{
    tk_buf cur = {0};                  // list of strings: bytes in cur, boundaries in ends
    size_t *ends = td_xmalloc((n + 1) * sizeof *ends), m = 0;
    for (size_t i = 0; i < n; i++) {
        const char *s = td_tokenizer_token_str(t, ids[i]);
        if (!s || (skip_special && td_tokenizer_is_special(t, ids[i]))) continue;
        int32_t k = t->added_by_id[ids[i]];
        tk_buf_put(&cur, s, k >= 0 ? t->added[k].len : t->bpe.id_len[ids[i]]);
        ends[m++] = cur.n;
    }
    for (size_t d = 0; d < t->n_decoders; d++) {
        tk_buf next = {0};
        if (t->decoders[d] == DEC_BYTELEVEL) {     // each token unmapped (or kept as is), then lossy UTF-8
            tk_buf bytes = {0};
            for (size_t i = 0, a = 0; i < m; a = ends[i++])
                if (!tk_bytelevel_unmap(&bytes, cur.p + a, ends[i] - a)) tk_buf_put(&bytes, cur.p + a, ends[i] - a);
            tk_utf8_lossy(&next, (const uint8_t *)(bytes.p ? bytes.p : ""), bytes.n);
            free(bytes.p);
        } else {                                   // Fuse
            tk_buf_put(&next, cur.p ? cur.p : "", cur.n);
        }
        free(cur.p);
        cur = next;
        m = 1;
        ends[0] = cur.n;
    }
    tk_buf res = {0};
    tk_buf_put(&res, "", 0);
    for (size_t i = 0, a = 0; i < m; a = ends[i++]) {
        if (i && !t->n_decoders) tk_buf_put(&res, " ", 1);
        tk_buf_put(&res, cur.p + a, ends[i] - a);
    }
    free(cur.p);
    free(ends);
    if (len_out) *len_out = res.n;
    return res.p;
}
