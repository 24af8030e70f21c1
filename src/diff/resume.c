/* --resume (src/diff/job.h): the file must be of the same run; groups are cut back to the row
 * counts /progress recorded after the last completed batch (dropping a batch that was being
 * written when the run stopped), and the prompts already there are skipped. /text goes on if
 * the file has it (/progress/text_rows), whatever the tokenizer now says. */
#include "job.h"
#include "tidal/opts.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

/* A file without the device attribute was made before --device existed: on the CPU. */
const char *td_diff_device_key(const char *desc)
{
    if (!strncmp(desc, "cuda:", 5)) {
        const char *sp = strchr(desc, ' ');
        return sp ? sp + 1 : desc;
    }
    return desc;
}

int td_resume_device_check(td_runfile *rf, const char *now, const char *new_out, td_error *err)
{
    td_error e2;
    char *have = td_runfile_get_str(rf, "device", &e2);
    int same = !strcmp(td_diff_device_key(have ? have : "cpu"), td_diff_device_key(now));
    if (!same)
        td_fail(err, "%s: --resume on another device (the file was made on %s, this run is on %s): the two "
                "devices' kernels give other numbers; resume on that device, or use a new %s",
                td_runfile_path(rf), have ? have : "cpu", now, new_out);
    free(have);
    return same ? 0 : -1;
}

static int check_device(job *J, td_error *err)
{
    return td_resume_device_check(J->rf, td_model_device(J->model), "-o", err);
}

/* The attributes that must match for --resume to continue a file, and the options they come
 * from; the JSON-valued ones (sampling, recipes) are compared member by member. */
static const td_setting_flag RESUME_FLAGS[] = {
    {"model_fingerprint", "--model (its files' fingerprint)", NULL},
    {"recipe_a", "--recipe-a", NULL}, {"recipe_b", "--recipe-b", NULL},
    {"sampling.temperature", "--temperature", NULL}, {"sampling.top_p", "--top-p", NULL},
    {"sampling.top_k", "--top-k", NULL}, {"sampling.min_p", "--min-p", NULL},
    {"sampling.repetition_penalty", "--repetition-penalty", NULL},
    {"sampling.max_new_tokens", "--max-new-tokens", NULL},
    {"sampling.stop_at_eos", "--no-stop-at-eos", "given|not given"},
    {"seed_str", "--seed", NULL}, {"shard", "--shard", NULL}, {"batch", "--batch", NULL},
    {"score_prompt", "--score-prompt", "not given|given"}, {"prompts_file", "--prompts", NULL}, {"layers", "--layers", "not given|given"},
    {"lora_path", "--lora", NULL}, {"lora_mode_a", "--lora-merge-a", NULL},
    {"lora_mode_b", "--lora-merge-b / --lora-sync", NULL}, {"logprob_temperature", "--logprob-temperature", NULL},
    {0}};

/* the value of an attribute as JSON: the object or number its text is, else the string */
static void put_value(json_t *obj, const char *key, const char *text)
{
    json_t *v = NULL;
    char *end = NULL;
    if (text && text[0] == '{') {
        v = json_loads(text, 0, NULL);
    } else if (text && text[0]) {
        long long i = strtoll(text, &end, 10);
        if (!*end) v = json_integer(i);
        else {
            double d = strtod(text, &end);
            if (!*end) v = json_real(d);
        }
    }
    json_object_set_new(obj, key, v ? v : text ? json_string(text) : json_null());
}

static int check_same(td_runfile *rf, const char *const *keys, const char *const *vals, size_t n, td_error *err)
{
    json_t *had = json_object(), *now = json_object();
    for (size_t i = 0; i < n; i++) {
        td_error e2;
        char *have = td_runfile_get_str(rf, keys[i], &e2);
        if (!have || strcmp(have, vals[i])) {
            put_value(had, keys[i], have);
            put_value(now, keys[i], vals[i]);
        }
        free(have);
    }
    int rc = 0;
    if (json_object_size(had)) {
        char *a = json_dumps(had, JSON_COMPACT), *b = json_dumps(now, JSON_COMPACT), lines[sizeof err->msg];
        if (td_settings_diff(a, b, RESUME_FLAGS, NULL, lines, sizeof lines) <= 0)   /* equal as numbers, unequal as text */
            snprintf(lines, sizeof lines, "  (%s)", a);
        rc = td_fail(err, "%s: --resume with other settings than the file was made with (use a new -o, or give "
                     "the file's values):\n%s", td_runfile_path(rf), lines);
        free(a);
        free(b);
    }
    json_decref(had);
    json_decref(now);
    return rc;
}

int resume_output(job *J, const char *const *keys, const char *const *vals, size_t n_keys, td_error *err)
{
    const char *out = J->o->out_path;
    J->rf = td_runfile_open(out, 1, err);
    if (!J->rf) return -1;
    if (check_same(J->rf, keys, vals, n_keys, err)) return -1;
    if (check_device(J, err)) return -1;
    int64_t nb = td_runfile_rows(J->rf, td_schema_progress[TD_PRG_BATCH].path);
    /* text as the file has it: a run that began without it goes on without it */
    if (nb > 0) J->has_text = td_runfile_exists(J->rf, td_schema_progress[TD_PRG_TEXT_ROWS].path);
    if (J->has_text && !J->tok)
        return td_fail(err, "%s: the run stores prompt and response text (/text), but %s has no tokenizer.json now "
                       "to decode the rest with", out, J->o->model_dir);
    int64_t p[TD_GROUP_COUNT] = {0};
    for (int g = 0; g < TD_GROUP_COUNT && nb > 0; g++)
        if ((!td_schema_groups[g].optional || J->has_text) &&
            td_runfile_read(J->rf, td_schema_groups[g].progress->path, TD_COL_I64, nb - 1, 1, &p[g], err)) return -1;
    /* the counts come from the file: they must name rows the file holds (they size buffers) */
    for (int g = 0; g < TD_GROUP_COUNT; g++) {
        if (td_schema_groups[g].optional && !J->has_text) continue;   /* cut to 0 rows below */
        const char *held = td_schema_groups[g].count_col->path;
        int64_t have = td_runfile_rows(J->rf, held);
        if (nb < 0 || have < 0)
            return td_fail(err, "%s: %s claims more rows than its storage holds (corrupt file?)", out,
                           nb < 0 ? td_schema_progress[TD_PRG_BATCH].path : held);
        if (p[g] < 0 || p[g] > have)
            return td_fail(err, "%s: /progress says %lld rows of %s are complete but the file holds %lld (corrupt file?)",
                           out, (long long)p[g], held, (long long)have);
    }
    for (int g = 0; g < TD_GROUP_COUNT; g++) {
        J->rows[g] = p[g];
        if (td_runfile_truncate_group(J->rf, td_schema_groups[g].name, p[g], err)) return -1;
        if (g == TD_GROUP_TOKENS && td_runfile_truncate_group(J->rf, TD_SCHEMA_LAYERS, p[g], err)) return -1;  /* rows aligned with /tokens */
        if (g == TD_GROUP_TOKENS && J->moe_layers && td_runfile_truncate_group(J->rf, TD_SCHEMA_ROUTING, p[g], err))
            return -1;
    }
    return td_runfile_truncate_group(J->rf, TD_SCHEMA_PROGRESS, nb, err);
}

/* Prompt indices already in the file (resume), as a mark array over the prompts. */
int mark_done(job *J, unsigned char *done, td_error *err)
{
    int64_t n = J->rows[TD_GROUP_SEQS];
    if (n == 0) return 0;
    int64_t *idx = td_xmalloc((size_t)n * sizeof(int64_t));
    int rc = td_runfile_read(J->rf, td_schema_seqs[TD_SEQ_PROMPT_INDEX].path, TD_COL_I64, 0, n, idx, err);
    for (int64_t i = 0; rc == 0 && i < n; i++)
        if (idx[i] >= 0 && (size_t)idx[i] < J->prompts.n) done[idx[i]] = 1;
    free(idx);
    return rc;
}
