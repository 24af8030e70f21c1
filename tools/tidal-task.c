/* tidal-task: verifiable tasks for SFT and RL (include/tidal/tasks.h).
 *
 *   tidal-task list
 *       the tasks, their knobs and the short/long presets
 *   tidal-task generate --task NAME --output-dir DIR [--seed S] [--train-size N] [--test-size N]
 *                       [--length short|long] [--digits N] [--count N] [--max-value N] [--max-target N] [--force]
 *       DIR/train.jsonl, DIR/test.jsonl (prompt-completion records) and DIR/generation.json (the
 *       command, seed, knobs, sizes, response lengths); refuses to replace them without --force
 *   tidal-task score --dataset-path FILE --completions FILE [--output FILE] [--force]
 *       one JSON row per completion (id, reward, exact, parsed) on stdout or --output, and the
 *       mean reward, exact-match rate and unparsable count on stderr
 */
#include "tidal/opts.h"
#include "tidal/tasks.h"

#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *const ABOUT =
    "Verifiable tasks for SFT and RL: add (addition with a scratch-pad), sort, countdown (reach a\n"
    "target with + - * /). Commands: list, generate, score; 'tidal-task COMMAND --help' for each.";

static int top_help(FILE *f)
{
    fprintf(f, "usage: tidal-task list\n"
               "       tidal-task generate --task NAME --output-dir DIR [options]\n"
               "       tidal-task score --dataset-path FILE --completions FILE [--output FILE]\n\n%s\n\n"
               "  -h, --help      this help ('tidal-task COMMAND --help': the command's options)\n"
               "      --version   the version\n\n"
               "Exit status: 0 done, 1 failed (bad input file), 2 usage error.\n", ABOUT);
    return 0;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

static int cmd_list(void)
{
    for (size_t i = 0; i < td_task_count(); i++) {
        const td_task *t = td_task_at(i);
        printf("%-10s %s\n           knobs: %s\n", t->name, t->about, t->knobs);
        for (int L = 0; L < 2; L++) {
            td_task_params p = L ? t->long_params : t->short_params;
            printf("           --length %-5s", L ? "long" : "short");
            char knobs[128];
            snprintf(knobs, sizeof knobs, "%s", t->knobs);
            for (char *save, *k = strtok_r(knobs, " ", &save); k; k = strtok_r(NULL, " ", &save))
                printf(" %s=%d", k, *td_task_param(&p, k));
            printf("\n");
        }
    }
    return 0;
}

static double mean_tokens(const td_task_item *it, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++) s += (double)strlen(it[i].completion) + 1;   /* + EOS */
    return n ? s / (double)n : 0;
}

static int write_meta(const char *path, const char *cmd, const td_task *t, const td_task_params *p, unsigned long long seed,
                      const char *length, size_t ntr, double ltr, size_t nte, double lte, td_error *err)
{
    json_t *knobs = json_object();
    td_task_params q = *p;
    char names[128];
    snprintf(names, sizeof names, "%s", t->knobs);
    for (char *save, *k = strtok_r(names, " ", &save); k; k = strtok_r(NULL, " ", &save))
        json_object_set_new(knobs, k, json_integer(*td_task_param(&q, k)));
    json_t *o = json_pack("{s:s, s:s, s:s, s:I, s:s, s:o, s:{s:s, s:I, s:f}, s:{s:s, s:I, s:f}, s:s, s:s}",
                          "command", cmd, "tidal_version", TD_VERSION, "task", t->name, "seed", (json_int_t)seed,
                          "length", length, "knobs", knobs,
                          "train", "file", "train.jsonl", "records", (json_int_t)ntr, "mean_response_tokens", ltr,
                          "test", "file", "test.jsonl", "records", (json_int_t)nte, "mean_response_tokens", lte,
                          "split_rule", "a prompt is a test prompt iff FNV-1a-64(prompt) % 8 == 0",
                          "tokens", "one per character (td_charvocab) plus <eos> at the end of each completion");
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(6));
    FILE *f = text ? fopen(tmp, "w") : NULL;
    int rc = !f || fprintf(f, "%s\n", text) < 0;
    if (f) rc |= fclose(f) != 0;
    rc = rc || rename(tmp, path) != 0;
    free(text);
    json_decref(o);
    if (rc) { remove(tmp); return td_fail(err, "%s: cannot write: %s", path, strerror(errno)); }
    return 0;
}

static int cmd_generate(int argc, char **argv)
{
    const char *task = NULL, *dir = NULL;
    unsigned long long seed = 0;
    int ntr = 1000, nte = 200, length = 0, force = 0;
    td_task_params set = {0};
    int given[4] = {0};
    td_opt opts[] = {
        TD_OPT_S("task", 0, &task, "NAME", "add | sort | countdown (tidal-task list)"),
        TD_OPT_S("output-dir", 'o', &dir, "DIR", "where train.jsonl, test.jsonl, generation.json go (created)"),
        TD_OPT_U("seed", 0, &seed, "S", "seed (default 0): the same records on every machine"),
        TD_OPT_I("train-size", 0, &ntr, "N", 0, 10000000, "train records (default 1000)"),
        TD_OPT_I("test-size", 0, &nte, "N", 0, 10000000, "test records (default 200)"),
        TD_OPT_C("length", 0, &length, "short|long", "knob preset: ~32 or ~128+ response tokens (default short)"),
        TD_OPT_I("digits", 0, &set.digits, "N", 1, 1000, "add: digits per operand; sort: digits per value"),
        TD_OPT_I("count", 0, &set.count, "N", 1, 100000, "sort: list length; countdown: numbers given"),
        TD_OPT_I("max-value", 0, &set.max_value, "N", 1, 100000000, "countdown: largest given number"),
        TD_OPT_I("max-target", 0, &set.max_target, "N", 1, 1000000000, "countdown: largest target and step result"),
        TD_OPT_F("force", 0, &force, 1, "replace existing files in DIR"),
        {0},
    };
    td_opt_get(opts, "task")->required = 1;
    td_opt_get(opts, "output-dir")->required = 1;
    const char *knob_opt[4] = {"digits", "count", "max-value", "max-target"};
    const char *knob_name[4] = {"digits", "count", "max_value", "max_target"};
    for (int k = 0; k < 4; k++) td_opt_get(opts, knob_opt[k])->given = &given[k];
    td_cli cli = {"tidal-task", "generate --task NAME --output-dir DIR [--seed S] [--train-size N] [--test-size N]\n"
                  "generate [--length short|long] [--digits N] [--count N] [--max-value N] [--max-target N] [--force]",
                  "Writes seeded train/test splits of a task as prompt-completion JSONL (TRL's shape) with the\n"
                  "answer and the knobs in every record. Train and test never share a prompt.",
                  NULL, opts, 0, 0};
    int nargs, rc = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc >= 0) return rc;
    td_error err;
    const td_task *t = td_task_find(task, &err);
    if (!t) return td_cli_bad(&cli, "--task", task, "one of add, sort, countdown");
    td_task_params p;
    td_task_preset(t, length ? "long" : "short", &p, &err);
    for (int k = 0; k < 4; k++) {
        if (!given[k]) continue;
        char knobs[128], want[32], label[32];
        snprintf(knobs, sizeof knobs, " %s ", t->knobs);
        snprintf(want, sizeof want, " %s ", knob_name[k]);
        snprintf(label, sizeof label, "--%s", knob_opt[k]);
        if (!strstr(knobs, want)) return td_cli_bad(&cli, label, NULL, "not a knob of task %s (its knobs: %s)", t->name, t->knobs);
        *td_task_param(&p, knob_name[k]) = *td_task_param(&set, knob_name[k]);
    }
    if (t->check(&p, &err)) return td_cli_bad(&cli, "knobs", NULL, "%s", err.msg);

    char path[3][4200];
    const char *names[3] = {"train.jsonl", "test.jsonl", "generation.json"};
    for (int i = 0; i < 3; i++) snprintf(path[i], sizeof path[i], "%s/%s", dir, names[i]);
    for (int i = 0; i < 3 && !force; i++)
        if (exists(path[i])) {
            fprintf(stderr, "tidal-task: %s already exists; not replacing it (use --force to replace it)\n", path[i]);
            return 1;
        }
    if (td_make_parent_dirs(path[0], &err)) { fprintf(stderr, "tidal-task: %s\n", err.msg); return 1; }

    td_task_item *tr = NULL, *te = NULL;
    rc = 1;
    char *cmd = td_command_line(argc + 1, argv - 1);
    if (td_task_generate(t, &p, seed, TD_SPLIT_TRAIN, (size_t)ntr, &tr, &err) ||
        td_task_generate(t, &p, seed, TD_SPLIT_TEST, (size_t)nte, &te, &err) ||
        td_task_check_disjoint(tr, (size_t)ntr, te, (size_t)nte, &err) ||
        td_task_write_jsonl(path[0], tr, (size_t)ntr, TD_SPLIT_TRAIN, &err) ||
        td_task_write_jsonl(path[1], te, (size_t)nte, TD_SPLIT_TEST, &err) ||
        write_meta(path[2], cmd, t, &p, seed, length ? "long" : "short", (size_t)ntr, mean_tokens(tr, (size_t)ntr),
                   (size_t)nte, mean_tokens(te, (size_t)nte), &err)) {
        fprintf(stderr, "tidal-task: %s\n", err.msg);
    } else {
        fprintf(stderr, "tidal-task: %s: %d train + %d test records in %s (response tokens incl. EOS: "
                "train mean %.1f, test mean %.1f)\n", t->name, ntr, nte, dir, mean_tokens(tr, (size_t)ntr),
                mean_tokens(te, (size_t)nte));
        rc = 0;
    }
    free(cmd);
    td_task_items_free(tr, (size_t)ntr);
    td_task_items_free(te, (size_t)nte);
    return rc;
}

static int cmp_item_id(const void *a, const void *b)
{
    return strcmp((*(const td_task_item *const *)a)->id, (*(const td_task_item *const *)b)->id);
}

/* The dataset record a completion answers: by id (bsearch in byid, sorted), or by position. */
static const td_task_item *record_for(const td_task_item *items, td_task_item **byid, size_t n, const td_task_completion *c,
                                      size_t k)
{
    if (!c->id) return k < n ? &items[k] : NULL;
    td_task_item key = {.id = c->id}, *kp = &key;
    td_task_item **hit = bsearch(&kp, byid, n, sizeof *byid, cmp_item_id);
    return hit ? *hit : NULL;
}

static int cmd_score(int argc, char **argv)
{
    const char *data = NULL, *comp = NULL, *out = NULL;
    int force = 0;
    td_opt opts[] = {
        TD_OPT_S("dataset-path", 0, &data, "FILE", "task records (JSONL with prompt, answer, task)"),
        TD_OPT_S("completions", 0, &comp, "FILE", "JSONL with \"completion\" (and \"id\" of the record, or\nline k for record k)"),
        TD_OPT_S("output", 'o', &out, "FILE", "per-completion rows here instead of stdout"),
        TD_OPT_F("force", 0, &force, 1, "replace an existing --output"),
        {0},
    };
    td_opt_get(opts, "dataset-path")->required = 1;
    td_opt_get(opts, "completions")->required = 1;
    td_cli cli = {"tidal-task", "score --dataset-path FILE --completions FILE [--output FILE] [--force]",
                  "Scores completions with the tasks' rewards: one row per completion (id, reward, exact,\n"
                  "parsed) and, on stderr, the mean reward, the exact-match rate and the unparsable count.",
                  NULL, opts, 0, 0};
    int nargs, rc = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc >= 0) return rc;
    if (out && exists(out) && !force) {
        fprintf(stderr, "tidal-task: %s already exists; not replacing it (use --force to replace it)\n", out);
        return 1;
    }
    td_error err;
    td_task_item *items = NULL;
    td_task_completion *c = NULL;
    size_t n = 0, nc = 0;
    if (td_task_read_jsonl(data, &items, &n, &err) || td_task_read_completions(comp, &c, &nc, &err)) {
        fprintf(stderr, "tidal-task: %s\n", err.msg);
        td_task_items_free(items, n);
        return 1;
    }
    rc = 1;
    FILE *f = NULL;
    char tmp[4200] = "";
    td_task_item **byid = td_xmalloc(n * sizeof *byid);
    for (size_t i = 0; i < n; i++) byid[i] = &items[i];
    qsort(byid, n, sizeof *byid, cmp_item_id);
    for (size_t i = 1; i < n && c[0].id; i++)
        if (strcmp(byid[i - 1]->id, byid[i]->id) == 0) {
            fprintf(stderr, "tidal-task: %s: id \"%s\" is on lines %ld and %ld: completions with ids need unique ids\n",
                    data, byid[i]->id, byid[i - 1]->line, byid[i]->line);
            goto out;
        }
    if (!c[0].id && nc != n) {
        fprintf(stderr, "tidal-task: %s has %zu completions without ids but %s has %zu records: give \"id\" on "
                "each line or one line per record\n", comp, nc, data, n);
        goto out;
    }
    for (size_t k = 0; k < nc; k++)
        if (!record_for(items, byid, n, &c[k], k)) {
            fprintf(stderr, "tidal-task: %s:%ld: id \"%s\" is not a record of %s\n", comp, c[k].line, c[k].id, data);
            goto out;
        }
    if (out) {
        snprintf(tmp, sizeof tmp, "%s.tmp", out);
        if (td_make_parent_dirs(out, &err) || !(f = fopen(tmp, "w"))) {
            fprintf(stderr, "tidal-task: %s: cannot write: %s\n", tmp, strerror(errno));
            goto out;
        }
    }
    double sum = 0;
    size_t exact = 0, unparsed = 0;
    for (size_t k = 0; k < nc; k++) {
        const td_task_item *it = record_for(items, byid, n, &c[k], k);
        double r;
        td_reward_info info;
        if (td_task_reward(it->task, it->prompt, it->answer, c[k].completion, c[k].len, &r, &info, &err)) {
            fprintf(stderr, "tidal-task: %s:%ld: %s\n", data, it->line, err.msg);   /* checked at load: not reached */
            goto out;
        }
        sum += r;
        exact += info.exact;
        unparsed += !info.parsed;
        json_t *row = json_pack("{s:s, s:I, s:f, s:b, s:b}", "id", it->id, "line", (json_int_t)c[k].line, "reward", r,
                                "exact", info.exact, "parsed", info.parsed);
        char *s = json_dumps(row, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(15));
        fprintf(f ? f : stdout, "%s\n", s);
        free(s);
        json_decref(row);
    }
    if (f && (fclose(f) != 0 || rename(tmp, out) != 0)) {
        f = NULL;
        fprintf(stderr, "tidal-task: %s: cannot write: %s\n", out, strerror(errno));
        remove(tmp);
        goto out;
    }
    f = NULL;
    fprintf(stderr, "score: %zu completions of %zu records: mean reward %.6f, exact match %.6f (%zu), unparsable %zu\n", nc, n,
            sum / (double)nc, (double)exact / (double)nc, exact, unparsed);
    rc = 0;
out:
    free(byid);
    if (f) { fclose(f); remove(tmp); }
    td_task_items_free(items, n);
    td_task_completions_free(c, nc);
    return rc;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        fprintf(stderr, "tidal-task: expected a command: list, generate or score\nTry 'tidal-task --help' for the options.\n");
        return 2;
    }
    const char *c = argv[1];
    if (!strcmp(c, "--help") || !strcmp(c, "-h")) return top_help(stdout);
    if (!strcmp(c, "--version")) { printf("tidal-task (tidal) %s\n", TD_VERSION); return 0; }
    if (!strcmp(c, "list")) {
        if (argc > 2 && (!strcmp(argv[2], "--help") || !strcmp(argv[2], "-h"))) return top_help(stdout);
        if (argc > 2) { fprintf(stderr, "tidal-task list: %s: unexpected argument\nTry 'tidal-task --help' for the options.\n", argv[2]); return 2; }
        return cmd_list();
    }
    if (!strcmp(c, "generate")) return cmd_generate(argc - 1, argv + 1);
    if (!strcmp(c, "score")) return cmd_score(argc - 1, argv + 1);
    if (c[0] == '-') fprintf(stderr, "tidal-task: %s: unknown option\nTry 'tidal-task --help' for the options.\n", c);
    else fprintf(stderr, "tidal-task: %s: unknown command (expected list, generate or score)\nTry 'tidal-task --help' for the options.\n", c);
    return 2;
}
