/* Prompt and rollout JSONL files (see include/tidal/prompts.h). */
#include "tidal/prompts.h"
#include "tidal/io.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static json_t *get_alias(json_t *o, const char *a, const char *b)
{
    json_t *v = json_object_get(o, a);
    return v ? v : json_object_get(o, b);
}

/* A JSON array of token ids, each in [0, vocab). */
static int ids_from_json(json_t *arr, const char *where, const char *key, int vocab, int32_t **out,
                         int *n, td_error *err)
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

/* Parses one line into p; 0, or -1 + err (the line is bad). */
static int parse_line(const char *line, size_t len, const char *where, td_tokenize_fn tokenize,
                      void *tok_user, int vocab, int max_len, td_prompt *p, td_error *err)
{
    memset(p, 0, sizeof *p);
    json_error_t je;
    json_t *o = td_json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &je);
    if (!o) return td_fail(err, "%s: invalid JSON at column %d: %s", where, je.column, je.text);
    int rc = -1;
    if (!json_is_object(o)) { td_fail(err, "%s: expected a JSON object", where); goto done; }
    json_t *text = json_object_get(o, "text"), *tokens = json_object_get(o, "tokens");
    json_t *pids = get_alias(o, "prompt_ids", "prompt_token_ids");
    json_t *rids = get_alias(o, "response_ids", "output_token_ids");
    json_t *rlp = get_alias(o, "rollout_logprobs", "logprobs");
    int kinds = (text != NULL) + (tokens != NULL) + (pids != NULL);
    if (kinds != 1) {
        td_fail(err, "%s: expected exactly one of \"text\", \"tokens\" or \"prompt_ids\"", where);
        goto done;
    }
    if (text) {
        if (!json_is_string(text)) { td_fail(err, "%s: \"text\" must be a string", where); goto done; }
        if (!tokenize) { td_fail(err, "%s: a \"text\" prompt needs a tokenizer, and the checkpoint has none (give \"tokens\" instead)", where); goto done; }
        int32_t *ids = NULL;
        size_t n = 0;
        td_error terr = {{0}};   /* a tokenizer that fails without a message still prints cleanly */
        if (tokenize(tok_user, json_string_value(text), json_string_length(text), &ids, &n, &terr)) {
            td_fail(err, "%s: %s", where, terr.msg);
            goto done;
        }
        p->prompt = ids;
        p->n_prompt = (int)n;
        for (size_t i = 0; i < n; i++)
            if (ids[i] < 0 || ids[i] >= vocab) { td_fail(err, "%s: tokenizer produced id %d outside the vocabulary [0, %d)", where, ids[i], vocab); goto done; }
    } else if (tokens) {
        if (ids_from_json(tokens, where, "tokens", vocab, &p->prompt, &p->n_prompt, err)) goto done;
    } else {
        if (ids_from_json(pids, where, "prompt_ids", vocab, &p->prompt, &p->n_prompt, err)) goto done;
        if (!rids) { td_fail(err, "%s: a rollout needs \"response_ids\" with \"prompt_ids\"", where); goto done; }
        if (ids_from_json(rids, where, "response_ids", vocab, &p->response, &p->n_response, err)) goto done;
        if (!json_is_array(rlp) || (int)json_array_size(rlp) != p->n_response) {
            td_fail(err, "%s: \"rollout_logprobs\" must be an array of %d numbers, one per response token", where, p->n_response);
            goto done;
        }
        p->rollout_logp = td_xmalloc(((size_t)p->n_response + 1) * sizeof(float));
        for (int i = 0; i < p->n_response; i++) {
            json_t *v = json_array_get(rlp, (size_t)i);
            double x = json_is_number(v) ? json_number_value(v) : NAN;
            if (!(x <= 0.0) || !isfinite(x)) {
                td_fail(err, "%s: \"rollout_logprobs\"[%d] must be a finite log-probability <= 0", where, i);
                goto done;
            }
            p->rollout_logp[i] = (float)x;
        }
        if (p->n_response < 1) { td_fail(err, "%s: empty \"response_ids\"", where); goto done; }
    }
    if (p->n_prompt < 1) { td_fail(err, "%s: empty prompt", where); goto done; }
    if (p->n_prompt + p->n_response > max_len) {
        td_fail(err, "%s: prompt%s of %d tokens is longer than the context (%d)", where,
                p->response ? " + response" : "", p->n_prompt + p->n_response, max_len);
        goto done;
    }
    rc = 0;
done:
    json_decref(o);
    if (rc) { free(p->prompt); free(p->response); free(p->rollout_logp); memset(p, 0, sizeof *p); }
    return rc;
}

int td_prompts_load(const char *path, td_tokenize_fn tokenize, void *tok_user, int vocab_size,
                    int max_len, bool skip_bad, td_prompt_set *out, td_error *err)
{
    memset(out, 0, sizeof *out);
    FILE *f = fopen(path, "r");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, n_alloc = 0;
    ssize_t len;
    long lineno = 0, first_line = 0;   /* first_line: the first good line, whose kind the file has */
    int rc = 0;
    while ((len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t l = (size_t)len;
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r' || line[l - 1] == ' ' || line[l - 1] == '\t')) l--;
        if (l == 0) continue;
        char where[1100];
        snprintf(where, sizeof where, "%s:%ld", path, lineno);
        td_prompt p;
        td_error lerr;
        if (parse_line(line, l, where, tokenize, tok_user, vocab_size, max_len, &p, &lerr)) {
            if (skip_bad) {
                fprintf(stderr, "warning: skipping %s\n", lerr.msg);
                out->n_skipped++;
                continue;
            }
            td_fail(err, "%s", lerr.msg);
            rc = -1;
            break;
        }
        p.line = lineno;
        bool rollout = p.response != NULL;
        if (!first_line) {
            first_line = lineno;
            out->has_rollouts = rollout;
        } else if (rollout != out->has_rollouts) {
            /* a property of the file, not a damaged line: stops the load even with skip_bad */
            td_fail(err, "%s: a %s, but line %ld is a %s: the file mixes prompts and rollouts; give one kind per file",
                    where, rollout ? "rollout" : "prompt", first_line, rollout ? "prompt" : "rollout");
            free(p.prompt); free(p.response); free(p.rollout_logp);
            rc = -1;
            break;
        }
        if (out->n == n_alloc) {
            n_alloc = n_alloc ? 2 * n_alloc : 64;
            td_prompt *grown = realloc(out->items, n_alloc * sizeof *out->items);
            if (!grown) {
                free(p.prompt); free(p.response); free(p.rollout_logp);
                td_fail(err, "%s: out of memory at line %ld", path, lineno);
                rc = -1;
                break;
            }
            out->items = grown;
        }
        out->items[out->n++] = p;
    }
    free(line);
    fclose(f);
    if (rc == 0 && out->n == 0) {
        if (out->n_skipped) td_fail(err, "%s: no prompts in the file (all %zu non-empty lines were bad)", path, out->n_skipped);
        else td_fail(err, "%s: no prompts in the file", path);
        rc = -1;
    }
    if (rc) { td_prompts_free(out); return -1; }
    return 0;
}

void td_prompts_free(td_prompt_set *ps)
{
    for (size_t i = 0; i < ps->n; i++) {
        free(ps->items[i].prompt);
        free(ps->items[i].response);
        free(ps->items[i].rollout_logp);
    }
    free(ps->items);
    memset(ps, 0, sizeof *ps);
}
