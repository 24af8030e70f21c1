/* Prompt and rollout JSONL files (see include/tidal/prompts.h). */
#include "tidal/prompts.h"
#include "tidal/chat_template.h"
#include "tidal/io.h"
#include "rollouts.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { MAX_PER_LINE = 64 };     /* rollouts one record may hold (vLLM outputs, n samples) */

typedef struct {
    const td_prompt_reader *r;
    td_chat_template *tmpl;     /* parsed on the first conversational record */
    int tmpl_state;             /* 0 not yet, 1 parsed, -1 failed (tmpl_err says why) */
    td_error tmpl_err;
} loader;

/* A JSON array of token ids, each in [0, vocab). */
static int ids_from_json(json_t *arr, const char *where, const char *key, int vocab, int32_t **out, int *n,
                         td_error *err)
{
    if (!json_is_array(arr)) return td_fail(err, "%s: \"%s\" must be an array of token ids", where, key);
    size_t len = json_array_size(arr);
    if (len > (1u << 24)) return td_fail(err, "%s: \"%s\" has %zu ids, more than tidal accepts", where, key, len);
    int32_t *ids = td_xmalloc((len ? len : 1) * sizeof(int32_t));
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v)) { free(ids); return td_fail(err, "%s: \"%s\"[%zu] is not an integer", where, key, i); }
        json_int_t t = json_integer_value(v);
        if (t < 0 || t >= vocab) {
            free(ids);
            return td_fail(err, "%s: \"%s\"[%zu] = %lld is outside the vocabulary [0, %d)", where, key, i, (long long)t, vocab);
        }
        ids[i] = (int32_t)t;
    }
    *out = ids;
    *n = (int)len;
    return 0;
}

static int tokenize_text(loader *L, const char *text, size_t len, bool model_input, const char *where, td_prompt *p,
                         td_error *err)
{
    const td_prompt_reader *r = L->r;
    int32_t *ids = NULL;
    size_t n = 0;
    td_error terr = {{0}};   /* a tokenizer that fails without a message still prints cleanly */
    if (r->tokenize(r->tok_user, text, len, model_input, &ids, &n, &terr)) return td_fail(err, "%s: %s", where, terr.msg);
    p->prompt = ids;
    p->n_prompt = (int)n;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || ids[i] >= r->vocab_size)
            return td_fail(err, "%s: tokenizer produced id %d outside the vocabulary [0, %d)", where, ids[i], r->vocab_size);
    return 0;
}

int td_prompt_chat_text(const td_chat_template *t, const char *from, const char *bos, const char *eos, json_t *msgs,
                        const char *key, const char *where, char **text_out, size_t *n_out, td_error *err)
{
    static const char *const how = "apply the template yourself and give the text as {\"prompt\": \"...\"} "
                                   "(tokenised as TRL does), or give {\"tokens\": [...]}";
    if (!json_is_array(msgs) || json_array_size(msgs) == 0)
        return td_fail(err, "%s: \"%s\" must be a non-empty list of {\"role\", \"content\"} messages", where, key);
    for (size_t i = 0; i < json_array_size(msgs); i++) {
        json_t *m = json_array_get(msgs, i);
        if (!json_is_object(m) || !json_is_string(json_object_get(m, "role")))
            return td_fail(err, "%s: \"%s\"[%zu] must be an object with a \"role\" string", where, key, i);
    }
    const char *last = json_string_value(json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "role"));
    bool gen = strcmp(last, "user") == 0, cont = strcmp(last, "assistant") == 0;
    if (!gen && !cont)
        return td_fail(err, "%s: the last message of \"%s\" is from \"%s\": a prompt ends with a user message (the "
                       "model answers) or an assistant message (the model continues it)", where, key, last);
    json_t *vars = json_pack("{ss ss sn sn}", "bos_token", bos ? bos : "", "eos_token", eos ? eos : "", "tools", "documents");
    char *text = NULL;
    size_t n = 0;
    td_error terr;
    int rc = td_chat_template_render(t, msgs, gen, vars, &text, &n, &terr);
    json_decref(vars);
    if (rc) return td_fail(err, "%s: the chat template of %s failed on this conversation: %s; %s", where,
                           from ? from : "the checkpoint", terr.msg, how);
    if (cont) {                                   /* transformers' continue_final_message */
        json_t *c = json_object_get(json_array_get(msgs, json_array_size(msgs) - 1), "content");
        const char *fin = json_string_value(c), *hit = NULL;
        size_t fl = json_string_length(c);
        for (int pass = 0; pass < 2 && fin && !hit; pass++) {
            if (pass) {                           /* templates that trim messages: the trimmed text */
                while (fl && strchr(" \t\n\r\f\v", fin[0])) { fin++; fl--; }
                while (fl && strchr(" \t\n\r\f\v", fin[fl - 1])) fl--;
            }
            for (const char *q = text; fl && (q = memmem(q, n - (size_t)(q - text), fin, fl)); q++) hit = q;
        }
        if (!hit) {
            free(text);
            return td_fail(err, "%s: the final assistant message's content is not in the rendered template, so it cannot "
                           "be continued; %s", where, how);
        }
        n = (size_t)(hit - text) + fl;
        text[n] = 0;
    }
    *text_out = text;
    *n_out = n;
    return 0;
}

/* A conversation through the chat template (td_prompt_chat_text), then tokenised. */
static int chat(loader *L, json_t *msgs, const char *key, const char *where, td_prompt *p, td_error *err)
{
    const td_prompt_reader *r = L->r;
    static const char *const how = "apply the template yourself and give the text as {\"prompt\": \"...\"} "
                                   "(tokenised as TRL does), or give {\"tokens\": [...]}";
    if (!r->chat_template)
        return td_fail(err, "%s: \"%s\" is a conversation, but the checkpoint has no chat template (no \"chat_template\" "
                       "in tokenizer_config.json, no chat_template.jinja; tidal-diff --chat-template FILE gives one); %s",
                       where, key, how);
    if (!r->tokenize)
        return td_fail(err, "%s: a conversation needs a tokenizer, and the checkpoint has none", where);
    if (L->tmpl_state == 0) {
        L->tmpl = td_chat_template_parse(r->chat_template, strlen(r->chat_template), &L->tmpl_err);
        L->tmpl_state = L->tmpl ? 1 : -1;
    }
    if (L->tmpl_state < 0)
        return td_fail(err, "%s: the chat template of %s cannot be used: %s; %s", where,
                       r->chat_template_from ? r->chat_template_from : "the checkpoint", L->tmpl_err.msg, how);
    char *text;
    size_t n;
    if (td_prompt_chat_text(L->tmpl, r->chat_template_from, r->bos_token, r->eos_token, msgs, key, where, &text, &n, err))
        return -1;
    int rc = tokenize_text(L, text, n, true, where, p, err);
    free(text);
    return rc;
}

/* Names the keys of a record with no recognised one. */
static int no_kind(json_t *o, const char *where, td_error *err)
{
    char found[300];
    td_json_key_list(o, found, sizeof found);
    return td_fail(err, "%s: the record has %s%s; expected one of \"text\", \"prompt\", \"messages\", \"tokens\" "
                   "(a prompt) or a rollout (\"prompt_ids\" + \"response_ids\", TRL \"completion_ids\", verl "
                   "\"responses\", vLLM \"outputs\", SGLang \"output_ids\")", where, found[0] ? "the keys " : "no keys", found);
}

/* Parses one line into items[0..]; the number of items, or -1 + err (the line is bad). */
static int parse_line(loader *L, const char *line, size_t len, const char *where, td_prompt *items,
                      const char **format, td_error *err)
{
    const td_prompt_reader *r = L->r;
    memset(items, 0, MAX_PER_LINE * sizeof *items);
    json_error_t je;
    json_t *o = td_json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!o) return td_fail(err, "%s: invalid JSON at column %d: %s", where, je.column, td_json_line_error(&je));
    int n = -1;
    td_prompt *p = &items[0];
    if (!json_is_object(o)) { td_fail(err, "%s: expected a JSON object", where); goto done; }
    n = td_rollouts_from_json(o, where, r->vocab_size, items, MAX_PER_LINE, format, err);
    if (n != 0) goto check;
    *format = NULL;
    static const char *const kinds[] = {"text", "prompt", "messages", "tokens"};
    json_t *v[4];
    int k = -1, count = 0;
    for (int i = 0; i < 4; i++)
        if ((v[i] = json_object_get(o, kinds[i]))) { k = i; count++; }
    n = -1;
    if (count == 0) { no_kind(o, where, err); goto done; }
    if (count > 1) { td_fail(err, "%s: expected exactly one of \"text\", \"prompt\", \"messages\" or \"tokens\"", where); goto done; }
    if (k == 3) {
        if (ids_from_json(v[3], where, "tokens", r->vocab_size, &p->prompt, &p->n_prompt, err)) goto done;
    } else if (k == 2 || (k == 1 && json_is_array(v[1]))) {
        if (chat(L, v[k], kinds[k], where, p, err)) goto done;
    } else {
        if (!json_is_string(v[k])) {
            td_fail(err, "%s: \"%s\" must be a string%s", where, kinds[k], k == 1 ? " or a list of messages" : "");
            goto done;
        }
        if (!r->tokenize) {
            td_fail(err, "%s: a \"%s\" prompt needs a tokenizer, and the checkpoint has none (give \"tokens\" instead)", where, kinds[k]);
            goto done;
        }
        if (tokenize_text(L, json_string_value(v[k]), json_string_length(v[k]), k == 1, where, p, err)) goto done;
    }
    n = 1;
check:
    for (int i = 0; i < n; i++) {
        p = &items[i];
        if (p->n_prompt < 1) { td_fail(err, "%s: empty prompt", where); n = -1; break; }
        if (p->n_prompt + p->n_response > r->max_len) {
            td_fail(err, "%s: prompt%s of %d tokens is longer than the context (%d)", where,
                    p->response ? " + response" : "", p->n_prompt + p->n_response, r->max_len);
            n = -1;
            break;
        }
    }
done:
    json_decref(o);
    if (n < 0) {
        for (int i = 0; i < MAX_PER_LINE; i++) {
            free(items[i].prompt); free(items[i].response); free(items[i].rollout_logp); free(items[i].trainer_logp);
            memset(&items[i], 0, sizeof items[i]);
        }
    }
    return n;
}

static void prompt_free(td_prompt *p)
{
    free(p->prompt); free(p->response); free(p->rollout_logp); free(p->trainer_logp);
}

int td_prompts_read(const char *path, const td_prompt_reader *r, td_prompt_set *out, td_error *err)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    loader L = {.r = r};
    td_prompt *items = td_xmalloc(MAX_PER_LINE * sizeof *items);
    char *line = NULL;
    size_t cap = 0, n_alloc = 0;
    ssize_t len;
    long lineno = 0, first_line = 0;   /* first_line: the first good line, whose kind the file has */
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t l = (size_t)len;
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r' || line[l - 1] == ' ' || line[l - 1] == '\t')) l--;
        if (l == 0) continue;
        char where[1100];
        snprintf(where, sizeof where, "%s:%ld", path, lineno);
        td_error lerr;
        const char *format = NULL;
        int n = parse_line(&L, line, l, where, items, &format, &lerr);
        if (n < 0) {
            if (r->skip_bad) {
                fprintf(stderr, "warning: skipping %s\n", lerr.msg);
                out->n_skipped++;
                continue;
            }
            td_fail(err, "%s", lerr.msg);
            rc = -1;
            break;
        }
        bool rollout = items[0].response != NULL;
        if (!first_line) {
            first_line = lineno;
            out->has_rollouts = rollout;
            out->rollout_format = format;
        } else if (rollout != out->has_rollouts || (rollout && strcmp(format, out->rollout_format) != 0)) {
            /* a property of the file, not a damaged line: stops the load even with skip_bad */
            if (rollout != out->has_rollouts)
                td_fail(err, "%s: a %s, but line %ld is a %s: the file mixes prompts and rollouts; give one kind per file",
                        where, rollout ? "rollout" : "prompt", first_line, rollout ? "prompt" : "rollout");
            else
                td_fail(err, "%s: a %s rollout, but line %ld is a %s rollout: give one format per file", where, format,
                        first_line, out->rollout_format);
            rc = -1;
        }
        for (int i = 0; i < n; i++) {
            if (rc == 0 && out->n == n_alloc) {
                n_alloc = n_alloc ? 2 * n_alloc : 64;
                td_prompt *grown = realloc(out->items, n_alloc * sizeof *out->items);
                if (!grown) { td_fail(err, "%s: out of memory at line %ld", path, lineno); rc = -1; }
                else out->items = grown;
            }
            if (rc) { prompt_free(&items[i]); continue; }
            items[i].line = lineno;
            out->has_trainer_logp |= items[i].trainer_logp != NULL;
            out->items[out->n++] = items[i];
        }
    }
    free(line);
    free(items);
    fclose(f);
    td_chat_template_free(L.tmpl);
    if (rc == 0 && out->n == 0) {
        if (out->n_skipped) td_fail(err, "%s: no prompts in the file (all %zu non-empty lines were bad)", path, out->n_skipped);
        else td_fail(err, "%s: no prompts in the file", path);
        rc = -1;
    }
    if (rc) { td_prompts_free(out); return -1; }
    return 0;
}

int td_prompts_load(const char *path, td_tokenize_fn tokenize, void *tok_user, int vocab_size,
                    int max_len, bool skip_bad, td_prompt_set *out, td_error *err)
{
    td_prompt_reader r = {.tokenize = tokenize, .tok_user = tok_user, .vocab_size = vocab_size, .max_len = max_len,
                          .skip_bad = skip_bad};
    return td_prompts_read(path, &r, out, err);
}

void td_prompts_free(td_prompt_set *ps)
{
    for (size_t i = 0; i < ps->n; i++) prompt_free(&ps->items[i]);
    free(ps->items);
    memset(ps, 0, sizeof *ps);
}
