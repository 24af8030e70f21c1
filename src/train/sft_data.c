/* tidal — tidal-sft's data: task records read (tasks.h) and tokenised as TRL's SFTTrainer
 * tokenises prompt-completion records (include/tidal/sft.h). */
#include "sft_internal.h"
#include "tidal/chat_template.h"
#include "tidal/dataset.h"
#include "../io/rollouts.h"
#include "tidal/io.h"

#include <stdlib.h>
#include <string.h>

/* 0, or -1 + err naming the first character the tokenizer does not know (its <unk>) or an id
 * outside the model's vocabulary. */
static int check_ids(const td_tokenizer *tok, const int32_t *ids, size_t n, int vocab, const char *text,
                     const char *what, td_error *err)
{
    int32_t unk = td_tokenizer_token_id(tok, "<unk>");
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab)
            return td_fail(err, "%s: token id %d is outside the model's vocabulary (vocab_size %d): the "
                           "tokenizer does not match the checkpoint", what, (int)ids[i], vocab);
        if (unk >= 0 && ids[i] == unk && !strstr(text, "<unk>"))
            return td_fail(err, "%s: the text holds a character the tokenizer's vocabulary lacks (it "
                           "encodes to <unk>): the tokenizer does not match the data", what);
    }
    return 0;
}

int td_sft_encode_prompt(const td_tokenizer *tok, const char *text, int vocab, int **ids, int *n, td_error *err)
{
    int32_t *raw = NULL;
    size_t k = 0;
    if (td_tokenizer_encode(tok, text, strlen(text), false, true, &raw, &k, err)) return -1;
    if (check_ids(tok, raw, k, vocab, text, "prompt", err)) { free(raw); return -1; }
    *ids = td_xmalloc((k ? k : 1) * sizeof(int));
    for (size_t i = 0; i < k; i++) (*ids)[i] = raw[i];
    *n = (int)k;
    free(raw);
    return 0;
}

static int encode_record(const td_tokenizer *tok, const td_task_item *it, int vocab, int eos, sft_example *e,
                         const char *where, td_error *err)
{
    td_error why;
    int *p = NULL, np = 0;
    if (td_sft_encode_prompt(tok, it->prompt, vocab, &p, &np, &why))
        return td_fail(err, "%s: %s", where, why.msg);
    int32_t *c = NULL;
    size_t nc = 0;
    if (it->completion) {
        if (td_tokenizer_encode(tok, it->completion, strlen(it->completion), false, false, &c, &nc, &why) ||
            check_ids(tok, c, nc, vocab, it->completion, "completion", &why)) {
            free(p);
            free(c);
            return td_fail(err, "%s: %s", where, why.msg);
        }
    }
    e->plen = np;
    e->len = it->completion ? np + (int)nc + 1 : np;
    e->ids = td_xmalloc((size_t)(e->len ? e->len : 1) * sizeof(int));
    memcpy(e->ids, p, (size_t)np * sizeof(int));
    for (size_t i = 0; i < nc; i++) e->ids[np + i] = c[i];
    if (it->completion) e->ids[e->len - 1] = eos;
    free(p);
    free(c);
    if (np < 1) return td_fail(err, "%s: the prompt encodes to no token", where);
    return 0;
}

/* text -> ids checked against the vocabulary; special tokens written in the text are their ids
 * (HF's tokenizer(text) and apply_chat_template(tokenize=True) read them so) */
static int encode_text(const td_tokenizer *tok, const char *text, size_t len, bool add_special, int vocab,
                       const char *what, int32_t **ids, size_t *n, td_error *err)
{
    if (td_tokenizer_encode(tok, text, len, true, add_special, ids, n, err)) return -1;
    if (check_ids(tok, *ids, *n, vocab, text, what, err)) { free(*ids); *ids = NULL; return -1; }
    return 0;
}

/* A conversation through the checkpoint's chat template (add_generation_prompt as given), the
 * template parsed once per file into *tmpl. */
static int render(const td_tokenizer *tok, td_chat_template **tmpl, json_t *msgs, const char *key, bool gen,
                  const char *where, char **text, size_t *n, td_error *err)
{
    const char *from, *src = td_tokenizer_chat_template(tok, &from);
    if (!src)
        return td_fail(err, "%s: \"%s\" is a conversation, but the tokenizer has no chat template (no \"chat_template\" "
                       "in tokenizer_config.json, no chat_template.jinja); apply one yourself and give text", where, key);
    if (!json_is_array(msgs) || !json_array_size(msgs))
        return td_fail(err, "%s: \"%s\" must be a non-empty list of {\"role\", \"content\"} messages", where, key);
    if (!*tmpl) {
        td_error terr;
        *tmpl = td_chat_template_parse(src, strlen(src), &terr);
        if (!*tmpl) return td_fail(err, "%s: the chat template of %s cannot be used: %s", where, from, terr.msg);
    }
    const char *bos = td_tokenizer_token_str(tok, td_tokenizer_bos_id(tok)), *eos = td_tokenizer_token_str(tok, td_tokenizer_eos_id(tok));
    json_t *vars = json_pack("{ss ss}", "bos_token", bos ? bos : "", "eos_token", eos ? eos : "");
    td_error terr;
    int rc = td_chat_template_render(*tmpl, msgs, gen, vars, text, n, &terr);
    json_decref(vars);
    return rc ? td_fail(err, "%s: the chat template of %s failed on \"%s\": %s", where, from, key, terr.msg) : 0;
}

/* A record in one of TRL's SFT dataset shapes, tokenised as SFTTrainer tokenises it
 * (trl/trainer/sft_trainer.py, tokenize()):
 *   {"prompt": str, "completion": str}     ids = tok(prompt + completion) + eos, prompt tokens =
 *                                          tok(prompt) (the eos as TRL's add_eos appends it);
 *   {"prompt": [msgs], "completion": [msgs]}  ids = template(prompt + completion), prompt tokens =
 *                                          template(prompt, add_generation_prompt=True);
 *   {"messages": [msgs]}                   ids = template(messages): every token in the loss;
 *   {"text": str}                          ids = tok(text) + eos: every token in the loss.
 * The loss covers the tokens after the prompt (all but the first when there is none). */
static int own_record(const td_tokenizer *tok, td_chat_template **tmpl, json_t *rec, int vocab, int eos,
                      td_task_item *it, sft_example *e, const char *where, td_error *err)
{
    json_t *p = json_object_get(rec, "prompt"), *c = json_object_get(rec, "completion"),
           *m = json_object_get(rec, "messages"), *t = json_object_get(rec, "text");
    int32_t *full = NULL, *pre = NULL;
    size_t nf = 0, np = 0;
    char *a = NULL, *b = NULL;
    size_t na = 0, nb = 0;
    td_error why;
    int rc = 0, add_eos = 0;
    if (p && c) {
        if (json_is_string(p) && json_is_string(c)) {
            na = json_string_length(p) + json_string_length(c);
            a = td_xmalloc(na + 1);
            memcpy(a, json_string_value(p), json_string_length(p));
            memcpy(a + json_string_length(p), json_string_value(c), json_string_length(c) + 1);
            rc = encode_text(tok, a, na, true, vocab, "prompt + completion", &full, &nf, &why) ||
                 encode_text(tok, json_string_value(p), json_string_length(p), true, vocab, "prompt", &pre, &np, &why);
            add_eos = 1;
            it->prompt = strdup(json_string_value(p));
            it->completion = strdup(json_string_value(c));
        } else if (json_is_array(p) && json_is_array(c)) {
            json_t *both = json_copy(p);
            json_array_extend(both, c);
            rc = render(tok, tmpl, both, "prompt + completion", false, where, &a, &na, err) ||
                 render(tok, tmpl, p, "prompt", true, where, &b, &nb, err);
            json_decref(both);
            if (rc) goto done;
            rc = encode_text(tok, a, na, false, vocab, "prompt + completion", &full, &nf, &why) ||
                 encode_text(tok, b, nb, false, vocab, "prompt", &pre, &np, &why);
            it->prompt = strdup(b);
        } else {
            rc = td_fail(err, "%s: \"prompt\" and \"completion\" must both be strings or both lists of "
                         "{\"role\", \"content\"} messages (TRL's prompt-completion shapes)", where);
            goto done;
        }
    } else if (m) {
        if ((rc = render(tok, tmpl, m, "messages", false, where, &a, &na, err))) goto done;
        rc = encode_text(tok, a, na, false, vocab, "messages", &full, &nf, &why);
        it->prompt = strdup("");
    } else if (t && json_is_string(t)) {
        rc = encode_text(tok, json_string_value(t), json_string_length(t), true, vocab, "text", &full, &nf, &why);
        add_eos = 1;
        it->prompt = strdup("");
    } else {
        char keys[300];
        td_json_key_list(rec, keys, sizeof keys);
        rc = td_fail(err, "%s: the record has %s%s; expected a built-in task's record (\"task\", \"prompt\", "
                     "\"completion\") or one of TRL's SFT shapes: \"prompt\" + \"completion\" (strings or "
                     "conversations), \"messages\", or \"text\"", where, keys[0] ? "the keys " : "no keys", keys);
        goto done;
    }
    if (rc) { rc = td_fail(err, "%s: %s", where, why.msg); goto done; }
    if (np > nf || (np && memcmp(full, pre, np * sizeof *pre) != 0))
        fprintf(stderr, "tidal-sft: %s: warning: the tokenised prompt is not the start of the tokenised prompt + "
                "completion (a merge across the boundary); the loss starts after %zu tokens, as TRL's does\n", where, np);
    e->len = (int)nf + add_eos;
    e->plen = np ? (int)np : 1;
    if (e->len < 2 || e->plen >= e->len) {
        rc = td_fail(err, "%s: %s", where, e->len < 2 ? "the record encodes to fewer than two tokens: nothing to learn"
                                                     : "the completion encodes to no token");
        goto done;
    }
    e->ids = td_xmalloc((size_t)e->len * sizeof(int));
    for (size_t i = 0; i < nf; i++) e->ids[i] = full[i];
    if (add_eos) e->ids[e->len - 1] = eos;
done:
    free(full); free(pre); free(a); free(b);
    return rc ? -1 : 0;
}

int sft_data_load(sft_data *d, const char *path, const td_tokenizer *tok, int vocab, int need_completion,
                  td_error *err)
{
    memset(d, 0, sizeof *d);
    d->path = path;
    td_record *recs;
    size_t n;
    if (td_records_read(path, &recs, &n, err)) return -1;
    int eos = td_tokenizer_eos_id(tok);
    if (eos < 0 || eos >= vocab) {
        td_records_free(recs, n);
        return td_fail(err, "the tokenizer has no eos_token inside the model's vocabulary (eos id %d, vocab_size "
                       "%d): SFT appends it to every completion", eos, vocab);
    }
    d->n = n;
    d->items = td_xcalloc(n ? n : 1, sizeof *d->items);
    d->ex = td_xcalloc(n ? n : 1, sizeof *d->ex);
    td_chat_template *tmpl = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        td_task_item *it = &d->items[i];
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", path, recs[i].line);
        it->line = recs[i].line;
        json_t *task = json_object_get(recs[i].obj, "task");
        if (json_is_string(task)) {   /* a built-in task's record: gradable, evaluated by its task */
            if (td_task_item_from_json(recs[i].obj, where, it, err)) { rc = -1; break; }
            if (need_completion && !it->completion) {
                rc = td_fail(err, "%s: no \"completion\": SFT needs the reference completion of every training "
                             "record", where);
                break;
            }
            rc = encode_record(tok, it, vocab, eos, &d->ex[i], where, err);
        } else if (!need_completion) {
            rc = td_fail(err, "%s: evaluation grades built-in task records (\"task\": add, sort, countdown); this "
                         "record has none: give --eval-dataset-path a task split, or no evaluation set", where);
        } else {
            rc = own_record(tok, &tmpl, recs[i].obj, vocab, eos, it, &d->ex[i], where, err);
            if (!rc && !it->id) {
                char buf[64];
                snprintf(buf, sizeof buf, "line-%ld", recs[i].line);
                it->id = strdup(buf);
            }
        }
        if (rc) break;
        if (d->ex[i].len > d->max_len) d->max_len = d->ex[i].len;
        if (d->ex[i].len - d->ex[i].plen > d->max_response) d->max_response = d->ex[i].len - d->ex[i].plen;
    }
    td_chat_template_free(tmpl);
    td_records_free(recs, n);
    return rc ? -1 : 0;
}

void sft_data_free(sft_data *d)
{
    for (size_t i = 0; d->ex && i < d->n; i++) free(d->ex[i].ids);
    free(d->ex);
    td_task_items_free(d->items, d->n);
    memset(d, 0, sizeof *d);
}
