/* tidal — tidal-rl's dataset (include/tidal/rl.h, "Rewards"): every record of --dataset-path
 * (dataset.h: .jsonl, .json, .json.gz), each a built-in task's (tasks.h: graded by the task) or,
 * with --reward-command, the user's own in TRL's shapes, its prompt rendered as TRL renders it;
 * the records themselves are kept for the reward command's input. */
#include "rl_internal.h"
#include "tidal/chat_template.h"
#include "tidal/dataset.h"
#include "tidal/prompts.h"
#include "../io/rollouts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* A record that is not a built-in task's: its prompt, rendered as TRL renders it, into it->prompt;
 * *chat = 1 for a conversation. */
static int own_record(rl_run *R, td_task_item *it, char *chat, json_t *rec, const char *where, td_chat_template **tmpl,
                      td_error *err)
{
    json_t *p = json_object_get(rec, "prompt"), *msgs = json_object_get(rec, "messages");
    if (p && msgs)
        return td_fail(err, "%s: the record has both \"prompt\" and \"messages\"; give one", where);
    if (!p && !msgs) {
        char keys[300];
        td_json_key_list(rec, keys, sizeof keys);
        return td_fail(err, "%s: no prompt: the record has %s%s; expected \"prompt\" (a string, or a list of "
                       "{\"role\", \"content\"} messages) or \"messages\" (TRL's dataset shapes)", where,
                       keys[0] ? "the keys " : "no keys", keys);
    }
    if (p && json_is_string(p)) {
        it->prompt = strndup(json_string_value(p), json_string_length(p));
        return 0;
    }
    if (p && !json_is_array(p))
        return td_fail(err, "%s: \"prompt\" must be a string or a list of {\"role\", \"content\"} messages", where);
    const char *from, *text = td_tokenizer_chat_template(R->tkz, &from);
    if (!text)
        return td_fail(err, "%s: the prompt is a conversation, but %s has no chat template (no \"chat_template\" in "
                       "tokenizer_config.json, no chat_template.jinja): give one with --chat-template FILE, or apply one "
                       "yourself and give the text as {\"prompt\": \"...\"}", where, R->o->model_path);
    if (!*tmpl) {
        td_error terr;
        *tmpl = td_chat_template_parse(text, strlen(text), &terr);
        if (!*tmpl) return td_fail(err, "%s: the chat template of %s cannot be used: %s", where, from, terr.msg);
    }
    size_t n;
    if (td_prompt_chat_text(*tmpl, from, td_tokenizer_token_str(R->tkz, td_tokenizer_bos_id(R->tkz)),
                            td_tokenizer_token_str(R->tkz, td_tokenizer_eos_id(R->tkz)), p ? p : msgs,
                            p ? "prompt" : "messages", where, &it->prompt, &n, err))
        return -1;
    *chat = 1;
    return 0;
}

int rl_read_records(rl_run *R, const char *path, rl_records *out, td_error *err)
{
    const td_rl_opts *o = R->o;
    td_record *recs;
    size_t n;
    if (td_records_read(path, &recs, &n, err)) return -1;
    out->n = n;
    out->items = td_xcalloc(n ? n : 1, sizeof *out->items);
    out->records = td_xcalloc(n ? n : 1, sizeof *out->records);
    out->chat = td_xcalloc(n ? n : 1, 1);
    td_chat_template *tmpl = NULL;
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        json_t *rec = recs[i].obj, *task = json_object_get(rec, "task");
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", path, recs[i].line);
        out->records[i] = json_incref(rec);
        out->items[i].line = recs[i].line;
        td_task_item *it = &out->items[i];
        int builtin = json_is_string(task) && td_task_find(json_string_value(task), NULL);
        if (builtin) {
            td_error terr;
            if (td_task_item_from_json(rec, where, it, &terr)) {
                /* a built-in task's name on a record it cannot grade: the user's own record when
                 * their command scores it, an error when the task's grader would */
                if (!o->reward_command) {
                    rc = td_fail(err, "%s (a record of your own, with a reward of your own: --reward-command CMD)",
                                 terr.msg);
                    break;
                }
                free(it->id); free(it->prompt); free(it->answer); free(it->completion);
                *it = (td_task_item){.line = recs[i].line};
                builtin = 0;
            }
        }
        if (!builtin && !o->reward_command) {
            rc = json_is_string(task)
                     ? td_fail(err, "%s: \"task\": \"%s\" is not a built-in task (add, sort, countdown): score it with "
                               "your own reward, --reward-command CMD (include/tidal/rl.h, \"Rewards\")", where,
                               json_string_value(task))
                     : td_fail(err, "%s: no \"task\" field: a record of your own needs your reward, --reward-command "
                               "CMD (include/tidal/rl.h, \"Rewards\"); the built-in tasks' records have \"task\", "
                               "\"prompt\" and \"answer\" (datasets/tasks)", where);
            break;
        }
        if (!builtin) rc = own_record(R, it, &out->chat[i], rec, where, &tmpl, err);
        if (!rc && !it->id) {
            json_t *id = json_object_get(rec, "id");
            char buf[64];
            snprintf(buf, sizeof buf, "line-%ld", recs[i].line);
            it->id = strdup(json_is_string(id) ? json_string_value(id) : buf);
        }
    }
    td_chat_template_free(tmpl);
    td_records_free(recs, n);
    return rc;
}

int rl_load_records(rl_run *R, td_error *err)
{
    rl_records set = {0};
    int rc = rl_read_records(R, R->o->dataset_path, &set, err);
    R->items = set.items;
    R->records = set.records;
    R->chat = set.chat;
    R->n_items = set.n;
    return rc;
}

int rl_encode_prompt(const rl_run *R, const td_task_item *it, const char *where, int **ids, int *n, td_error *err)
{
    int32_t *raw;
    size_t len;
    const char *p = it->prompt;
    bool own = it->task == NULL;
    if (td_tokenizer_encode(R->tkz, p, strlen(p), own, !own, &raw, &len, err))
        return td_fail(err, "%s: prompt: %s", where, err->msg);
    if (len == 0) {
        free(raw);
        return td_fail(err, "%s: empty prompt", where);
    }
    *ids = td_xmalloc(len * sizeof(int));
    for (size_t t = 0; t < len; t++) (*ids)[t] = raw[t];
    *n = (int)len;
    free(raw);
    return 0;
}

void rl_records_clear(rl_records *set)
{
    for (size_t i = 0; set->records && i < set->n; i++) json_decref(set->records[i]);
    free(set->records);
    free(set->chat);
    if (set->items) td_task_items_free(set->items, set->n);
    *set = (rl_records){0};
}

void rl_records_free(rl_run *R)
{
    for (size_t i = 0; R->records && i < R->n_items; i++) json_decref(R->records[i]);
    free(R->records);
    free(R->chat);
    R->records = NULL;
    R->chat = NULL;
}
