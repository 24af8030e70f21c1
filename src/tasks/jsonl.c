/* Task records as JSONL, the prompt-completion shape TRL reads:
 *   {"id": ..., "task": ..., "split": ..., "prompt": ..., "completion": ..., "answer": ..., knobs...}
 * Writes go to a temporary file renamed into place when complete; reads name file and line. */
#include "tasks_internal.h"

#include "tidal/dataset.h"
#include "tidal/io.h"

#include <errno.h>
#include <jansson.h>

static json_t *record(const td_task_item *it, td_split split)
{
    json_t *o = json_object();
    json_object_set_new(o, "id", json_string(it->id ? it->id : ""));
    json_object_set_new(o, "task", json_string(it->task->name));
    json_object_set_new(o, "split", json_string(split == TD_SPLIT_TEST ? "test" : "train"));
    json_object_set_new(o, "prompt", json_string(it->prompt));
    if (it->completion) json_object_set_new(o, "completion", json_string(it->completion));
    json_object_set_new(o, "answer", json_string(it->answer));
    td_task_params p = it->params;
    char knobs[128];
    snprintf(knobs, sizeof knobs, "%s", it->task->knobs);
    for (char *save, *k = strtok_r(knobs, " ", &save); k; k = strtok_r(NULL, " ", &save))
        json_object_set_new(o, k, json_integer(*td_task_param(&p, k)));
    return o;
}

int td_task_write_jsonl(const char *path, const td_task_item *items, size_t n, td_split split, td_error *err)
{
    size_t pl = strlen(path);
    char *tmp = td_xmalloc(pl + 16);
    snprintf(tmp, pl + 16, "%s.tmp", path);
    FILE *f = fopen(tmp, "w");
    if (!f) {
        int rc = td_fail(err, "%s: cannot write: %s", tmp, strerror(errno));
        free(tmp);
        return rc;
    }
    int bad = 0;
    for (size_t i = 0; i < n && !bad; i++) {
        json_t *o = record(&items[i], split);
        char *line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
        bad = !line || fputs(line, f) < 0 || fputc('\n', f) < 0;
        free(line);
        json_decref(o);
    }
    bad |= fclose(f) != 0;
    int rc = 0;
    if (bad || rename(tmp, path) != 0) {
        rc = td_fail(err, "%s: cannot write (disk full or folder not writable?): %s", path, strerror(errno));
        remove(tmp);
    }
    free(tmp);
    return rc;
}

/* A string field: its copy in *out; missing and required, or not a string: -1 + err. */
static int get_string(json_t *o, const char *key, bool required, char **out, const char *where, td_error *err)
{
    json_t *v = json_object_get(o, key);
    *out = NULL;
    if (!v) return required ? td_fail(err, "%s: no \"%s\" field (a task record needs prompt, answer and task)", where, key) : 0;
    if (!json_is_string(v)) return td_fail(err, "%s: \"%s\" is not a string", where, key);
    if (strlen(json_string_value(v)) != json_string_length(v))
        return td_fail(err, "%s: \"%s\" holds a NUL character (\\u0000)", where, key);
    *out = strdup(json_string_value(v));
    return 0;
}

int td_task_item_from_json(json_t *o, const char *where, td_task_item *it, td_error *err)
{
    int rc = -1;
    char *task = NULL;
    if (!json_is_object(o)) { td_fail(err, "%s: not a JSON object", where); goto out; }
    if (get_string(o, "task", true, &task, where, err) || get_string(o, "prompt", true, &it->prompt, where, err) ||
        get_string(o, "answer", true, &it->answer, where, err) ||
        get_string(o, "completion", false, &it->completion, where, err) || get_string(o, "id", false, &it->id, where, err))
        goto out;
    td_error terr;
    if (!(it->task = td_task_find(task, &terr))) { td_fail(err, "%s: %s", where, terr.msg); goto out; }
    char knobs[128];
    snprintf(knobs, sizeof knobs, "%s", it->task->knobs);
    for (char *save, *k = strtok_r(knobs, " ", &save); k; k = strtok_r(NULL, " ", &save)) {
        json_t *v = json_object_get(o, k);
        if (!v) continue;
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > INT32_MAX) {
            td_fail(err, "%s: \"%s\" is not a non-negative integer", where, k);
            goto out;
        }
        *td_task_param(&it->params, k) = (int)json_integer_value(v);
    }
    if (it->task->check_record(it->prompt, it->answer, &terr)) { td_fail(err, "%s: task %s: %s", where, task, terr.msg); goto out; }
    rc = 0;
out:
    free(task);
    return rc;
}

/* Calls fn on every non-empty line of path (trailing whitespace trimmed) until it fails. */
typedef int (*line_fn)(void *user, const char *line, size_t len, long lineno, td_error *err);

static int each_line(const char *path, line_fn fn, void *user, td_error *err)
{
    FILE *f = fopen(path, "r");
    if (!f) return td_fail(err, "%s: cannot open: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0;
    ssize_t len;
    long lineno = 0;
    int rc = 0;
    while (rc == 0 && (len = getline(&line, &cap, f)) >= 0) {
        lineno++;
        size_t l = (size_t)len;
        while (l && (line[l - 1] == '\n' || line[l - 1] == '\r' || line[l - 1] == ' ' || line[l - 1] == '\t')) l--;
        if (l) rc = fn(user, line, l, lineno, err);
    }
    if (!rc && ferror(f)) rc = td_fail(err, "%s: read error at line %ld", path, lineno + 1);
    free(line);
    fclose(f);
    return rc;
}

/* Every record of the file (dataset.h: JSON Lines or an array, .json.gz, a BOM), named by its
 * line; the first that is not a task record stops the read. */
int td_task_read_jsonl(const char *path, td_task_item **items, size_t *n, td_error *err)
{
    td_record *recs;
    size_t nr;
    *items = NULL;
    *n = 0;
    if (td_records_read(path, &recs, &nr, err)) return -1;
    td_task_item *out = td_xcalloc(nr, sizeof *out);
    int rc = 0;
    size_t k = 0;
    for (; k < nr && !rc; k++) {
        char where[600];
        snprintf(where, sizeof where, "%s:%ld", path, recs[k].line);
        out[k] = (td_task_item){.line = recs[k].line};
        rc = td_task_item_from_json(recs[k].obj, where, &out[k], err);
        if (!rc && !out[k].id) {
            tk_text id = {0};
            tk_putf(&id, "line-%ld", recs[k].line);
            out[k].id = tk_take(&id);
        }
    }
    td_records_free(recs, nr);
    if (rc) { td_task_items_free(out, k); return -1; }
    *items = out;
    *n = nr;
    return 0;
}

typedef struct {
    const char *path;
    td_task_completion *c;
    size_t n, cap;
    int with_id;   /* -1 before the first line */
} completion_list;

static int add_completion(void *user, const char *line, size_t len, long lineno, td_error *err)
{
    completion_list *L = user;
    const char *path = L->path;
    json_error_t je;
    json_t *o = json_loadb(line, len, JSON_REJECT_DUPLICATES | JSON_ALLOW_NUL, &je);
    json_t *text = o ? json_object_get(o, "completion") : NULL, *id = o ? json_object_get(o, "id") : NULL;
    int rc = 0;
    if (!o) rc = td_fail(err, "%s:%ld: invalid JSON at column %d: %s", path, lineno, je.column, td_json_line_error(&je));
    else if (!json_is_object(o)) rc = td_fail(err, "%s:%ld: not a JSON object", path, lineno);
    else if (!json_is_string(text)) rc = td_fail(err, "%s:%ld: no \"completion\" string", path, lineno);
    else if (id && !json_is_string(id)) rc = td_fail(err, "%s:%ld: \"id\" is not a string", path, lineno);
    else if (L->with_id >= 0 && L->with_id != (id != NULL))
        rc = td_fail(err, "%s:%ld: %s \"id\" where the lines before %s: give ids on every line or on none", path, lineno,
                     id ? "has an" : "has no", id ? "have none" : "have one");
    if (!rc) {
        L->with_id = id != NULL;
        if (L->n == L->cap) {
            L->cap = L->cap ? 2 * L->cap : 64;
            L->c = td_xrealloc(L->c, L->cap * sizeof *L->c);
        }
        size_t tl = json_string_length(text);
        char *copy = td_xmalloc(tl + 1);
        memcpy(copy, json_string_value(text), tl + 1);
        L->c[L->n++] = (td_task_completion){id ? strdup(json_string_value(id)) : NULL, copy, tl, lineno};
    }
    json_decref(o);
    return rc;
}

int td_task_read_completions(const char *path, td_task_completion **out, size_t *n, td_error *err)
{
    completion_list L = {path, NULL, 0, 0, -1};
    int rc = each_line(path, add_completion, &L, err);
    if (!rc && L.n == 0) rc = td_fail(err, "%s: no completions (the file is empty)", path);
    if (rc) { td_task_completions_free(L.c, L.n); L.c = NULL; L.n = 0; }
    *out = L.c;
    *n = L.n;
    return rc ? -1 : 0;
}

void td_task_completions_free(td_task_completion *c, size_t n)
{
    if (!c) return;
    for (size_t i = 0; i < n; i++) {
        free(c[i].id);
        free(c[i].completion);
    }
    free(c);
}
