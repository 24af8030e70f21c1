/* tidal — supervised fine-tuning on a task dataset (include/tidal/sft.h): the run's set-up
 * (output folder, model, tokenizer, data, trainer, run file, resume), the step loop, the
 * checkpoints and the final save. Data: sft_data.c; evaluation: sft_eval.c; files: sft_save.c. */
#include "sft_internal.h"
#include "tidal/checkpoint.h"
#include "tidal/diff.h"
#include "tidal/memplan.h"
#include "tidal/opts.h"
#include "tidal/rng.h"
#include "tidal/runschema.h"
#include "tidal/tfevents.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

void td_sft_opts_defaults(td_sft_opts *o)
{
    memset(o, 0, sizeof *o);
    o->recipe = *td_recipe_find_preset("fp32");
    o->eval_recipe = *td_recipe_find_preset("fp32");
    td_train_opts_defaults(&o->train);
    o->epochs = 3.0;
    o->batch = 8;
    o->grad_accum = 1;
    o->eval_batch = 32;
    o->save_dtype = TD_DT_F32;
}

typedef struct {
    const td_sft_opts *o;
    td_model *model;
    td_config cfg;            /* --plan-only: config.json alone (no weights); else the model's */
    char *memory_plan;        /* the GPU memory plan (JSON) recorded in sft.h5; NULL on the CPU */
    td_tokenizer *tok;
    sft_data train, eval;
    int has_eval;
    size_t n_eval;            /* records evaluated (eval_max_samples) */
    td_trainer *tr;
    td_runfile *rf;
    td_steplog *log;          /* --report-to: each /steps row as it is written */
    char run_path[4200];
    int total;                /* optimiser steps of the run */
    int *perm;                /* the current epoch's order */
    long perm_epoch;
    long skipped;             /* steps skipped so far */
    double t0;
    char settings[8192];      /* settings_json: recorded in every trainer_state.json */
} sft_job;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int exists(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0;
}

/* The example at stream position p: epoch p / N, shuffled by td_rng_stream(seed, epoch). */
static const sft_example *stream_at(sft_job *J, long p)
{
    size_t N = J->train.n;
    long e = p / (long)N;
    if (e != J->perm_epoch) {
        td_rng r;
        td_rng_stream(&r, J->o->train.seed, (uint64_t)e);
        for (size_t i = 0; i < N; i++) J->perm[i] = (int)i;
        for (size_t i = N - 1; i > 0; i--) {   /* Fisher-Yates */
            size_t k = (size_t)td_rng_below(&r, i + 1);
            int t = J->perm[i];
            J->perm[i] = J->perm[k];
            J->perm[k] = t;
        }
        J->perm_epoch = e;
    }
    return &J->train.ex[J->perm[p % (long)N]];
}

/* dataset_path: a folder (train.jsonl, test.jsonl) or a file (its sibling test.jsonl). */
static void data_paths(const td_sft_opts *o, char *train, char *eval, size_t cap)
{
    struct stat st;
    if (stat(o->dataset_path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(train, cap, "%s/train.jsonl", o->dataset_path);
        snprintf(eval, cap, "%s/test.jsonl", o->dataset_path);
    } else {
        snprintf(train, cap, "%s", o->dataset_path);
        const char *slash = strrchr(o->dataset_path, '/');
        if (slash) snprintf(eval, cap, "%.*s/test.jsonl", (int)(slash - o->dataset_path), o->dataset_path);
        else snprintf(eval, cap, "test.jsonl");
        if (!strcmp(eval, train)) eval[0] = 0;
    }
    if (o->eval_dataset_path) snprintf(eval, cap, "%s", o->eval_dataset_path);
    else if (eval[0] && !exists(eval)) eval[0] = 0;
}

/* The settings a resumed run must keep (trainer_state.json "tidal_settings"): everything that
 * shapes the steps and their /steps rows. Free to change: --max-steps / --epochs (the new total:
 * HF's Trainer recomputes the schedule from it), --save-steps, --save-dtype and the evaluation
 * batch (greedy decoding is batch-invariant). */
static void settings_json(const td_sft_opts *o, const td_config *c, char *out, size_t cap)
{
    const td_train_opts *t = &o->train;
    td_train_opts aux = *t;   /* the load-balancing loss as the model's config resolves it */
    if (c) td_train_opts_resolve_moe(&aux, c);
    char seed[32];
    snprintf(seed, sizeof seed, "%llu", (unsigned long long)t->seed);
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:f, s:s, s:f, s:i, s:f, s:f, s:f, s:f, s:f}",
                          "model_path", o->model_path, "dataset_path", o->dataset_path, "recipe", o->recipe.name,
                          "eval_recipe", o->eval_recipe.name, "learning_rate", t->lr,
                          "lr_scheduler_type", td_lr_schedule_name(t->schedule), "warmup_ratio", t->warmup_ratio,
                          "warmup_steps", t->warmup_steps, "weight_decay", t->weight_decay,
                          "max_grad_norm", t->max_grad_norm, "adam_beta1", t->beta1, "adam_beta2", t->beta2,
                          "adam_epsilon", t->eps);
    if (t->gradient_checkpointing) json_object_set_new(j, "gradient_checkpointing", json_true());
    if (aux.output_router_logits > 0) {   /* absent when off (the default): older runs resume */
        json_object_set_new(j, "output_router_logits", json_true());
        json_object_set_new(j, "router_aux_loss_coef", json_real(aux.router_aux_loss_coef));
    }
    if (o->tokenizer_path) json_object_set_new(j, "tokenizer_path", json_string(o->tokenizer_path));
    if (o->eval_dataset_path) json_object_set_new(j, "eval_dataset_path", json_string(o->eval_dataset_path));
    json_object_set_new(j, "lora_r", json_integer(t->lora_r));
    if (t->lora_r > 0) {
        json_object_set_new(j, "lora_alpha", json_real(t->lora_alpha));
        json_object_set_new(j, "lora_target_modules", json_integer(t->lora_modules));
    }
    json_object_set_new(j, "seed", json_string(seed));
    json_object_set_new(j, "per_device_batch_size", json_integer(o->batch));
    json_object_set_new(j, "gradient_accumulation_steps", json_integer(o->grad_accum));
    json_object_set_new(j, "eval_steps", json_integer(o->eval_steps));
    json_object_set_new(j, "eval_max_samples", json_integer(o->eval_max_samples));
    json_object_set_new(j, "max_new_tokens", json_integer(o->max_new_tokens));
    char *s = json_dumps(j, JSON_COMPACT | JSON_REAL_PRECISION(17));
    snprintf(out, cap, "%s", s ? s : "");
    free(s);
    json_decref(j);
}

/* --resume-from-checkpoint PATH: a checkpoint-K of output_dir (its run file is the one cut back) */
static int chosen_checkpoint(const td_sft_opts *o, char *ck, size_t cap, td_error *err)
{
    const char *p = o->resume_checkpoint, *base = strrchr(p, '/');
    base = base ? base + 1 : p;
    char parent[4200], st[4300];
    snprintf(parent, sizeof parent, "%s/..", p);
    char *a = realpath(parent, NULL), *b = realpath(o->output_dir, NULL);
    int k, used = 0, ok = a && b && !strcmp(a, b) && sscanf(base, "checkpoint-%d%n", &k, &used) == 1 && !base[used];
    free(a);
    free(b);
    snprintf(st, sizeof st, "%s/optimizer.safetensors", p);
    if (!ok || !exists(st))
        return td_fail(err, "--resume-from-checkpoint %s: expected a checkpoint-K folder of %s with its "
                       "optimizer.safetensors", p, o->output_dir);
    snprintf(ck, cap, "%s", p);
    return 0;
}

static const td_setting_flag RESUME_FLAGS[] = {{"lr_scheduler_type", "--lr-scheduler", NULL}, {0}};

/* A folder that already holds a run's results is refused unless overwrite (or resume). */
static int check_output(const td_sft_opts *o, const char *run_path, td_error *err)
{
    char path[4200], ck[4200];
    const char *held[] = {"model.safetensors", "adapter_model.safetensors", "trainer_state.json"};
    int has = 0;
    for (size_t i = 0; i < 3; i++) {
        snprintf(path, sizeof path, "%s/%s", o->output_dir, held[i]);
        has |= exists(path);
    }
    has |= sft_latest_checkpoint(o->output_dir, ck, sizeof ck) > 0;
    has |= exists(run_path);
    if (has && !o->overwrite)
        return td_fail(err, "%s already holds a training run (a model, checkpoint-K or %s): pass --resume to "
                       "continue it or --overwrite-output-dir to replace it", o->output_dir, run_path);
    if (has) {   /* overwrite: old checkpoints would be resumed from by mistake later */
        while (sft_latest_checkpoint(o->output_dir, ck, sizeof ck) > 0) sft_remove_dir(ck);
        snprintf(path, sizeof path, "%s/trainer_state.json", o->output_dir);
        remove(path);
    }
    snprintf(path, sizeof path, "%s/x", o->output_dir);
    if (td_make_parent_dirs(path, err)) return -1;
    return 0;
}

static int load_inputs(sft_job *J, int with_train, td_error *err)
{
    const td_sft_opts *o = J->o;
    if (o->plan_only) {   /* the plan needs the shapes only */
        char cpath[4200];
        snprintf(cpath, sizeof cpath, "%s/config.json", o->model_path);
        if (td_config_parse(cpath, &J->cfg, err)) return -1;
    } else {
        J->model = td_model_load(o->model_path, err);
        if (!J->model || td_model_set_device(J->model, o->device ? o->device : "cpu", err)) return -1;
        J->cfg = J->model->cfg;
    }
    const td_config *c = &J->cfg;
    char tpath[4200];
    const char *tp = o->tokenizer_path ? o->tokenizer_path : o->model_path;
    struct stat st;
    if (stat(tp, &st) == 0 && S_ISDIR(st.st_mode)) snprintf(tpath, sizeof tpath, "%s/tokenizer.json", tp);
    else snprintf(tpath, sizeof tpath, "%s", tp);
    if (!exists(tpath))
        return td_fail(err, "%s: no tokenizer.json (give --tokenizer-path, e.g. a folder made by "
                       "'tidal-tokenize --write-char-vocab DIR')", tpath);
    J->tok = td_tokenizer_load(tpath, err);
    if (!J->tok) return -1;
    if (td_tokenizer_vocab_size(J->tok) > (size_t)c->vocab_size)
        return td_fail(err, "%s has %zu tokens but %s/config.json has vocab_size %d: the tokenizer does not "
                       "match the checkpoint", tpath, td_tokenizer_vocab_size(J->tok), o->model_path, c->vocab_size);
    char train[4200], eval[4200];
    data_paths(o, train, eval, sizeof train);
    if (with_train && sft_data_load(&J->train, strdup(train), J->tok, c->vocab_size, 1, err)) return -1;
    if (eval[0]) {
        if (sft_data_load(&J->eval, strdup(eval), J->tok, c->vocab_size, 0, err)) return -1;
        J->has_eval = 1;
        J->n_eval = o->eval_max_samples > 0 && (size_t)o->eval_max_samples < J->eval.n ? (size_t)o->eval_max_samples
                                                                                       : J->eval.n;
    }
    return with_train ? td_config_check_len(c, J->train.max_len, err) : 0;
}

static int open_runfile(sft_job *J, int resume_rows, td_error *err)
{
    const td_sft_opts *o = J->o;
    if (resume_rows >= 0) {
        J->rf = td_runfile_open(J->run_path, 1, err);
        if (!J->rf || td_resume_device_check(J->rf, td_model_device(J->model), "--output-dir", err)) return -1;
        int64_t have = td_runfile_rows(J->rf, td_schema_steps[TD_STP_STEP].path);
        if (have < resume_rows)
            return td_fail(err, "%s: %lld /steps rows, the checkpoint is at step %d: not this run's file",
                           J->run_path, (long long)have, resume_rows);
        if (td_runfile_truncate_group(J->rf, TD_SCHEMA_STEPS, resume_rows, err)) return -1;
        return td_runfile_set_i64(J->rf, "max_steps", J->total, err) ||   /* an extension's new total */
               td_runfile_set_str(J->rf, "resumed_command_line", o->command ? o->command : "", err) ? -1 : 0;
    }
    J->rf = td_runfile_create(J->run_path, 1, err);
    if (!J->rf) return -1;
    char *rj = td_recipe_to_json(&o->recipe), *ej = td_recipe_to_json(&o->eval_recipe);
    int rc = td_runfile_set_str(J->rf, "command_line", o->command ? o->command : "", err) ||
             td_runfile_set_str(J->rf, "tool", "tidal-sft", err) ||
             td_runfile_set_str(J->rf, "model_path", o->model_path, err) ||
             td_runfile_set_str(J->rf, "device", td_model_device(J->model), err) ||
             td_runfile_set_str(J->rf, "dataset_path", J->train.path, err) ||
             td_runfile_set_str(J->rf, "recipe", rj, err) || td_runfile_set_str(J->rf, "eval_recipe", ej, err) ||
             td_runfile_set_i64(J->rf, "seed", (int64_t)o->train.seed, err) ||
             td_runfile_set_i64(J->rf, "max_steps", J->total, err) ||
             td_runfile_set_i64(J->rf, "train_records", (int64_t)J->train.n, err) ||
             td_runfile_set_i64(J->rf, "eval_records", (int64_t)J->n_eval, err) ||
             td_runfile_set_str(J->rf, "loss", "mean token cross-entropy over the completion tokens and EOS of "
                                "each optimiser step's sequences (all micro-batches)", err) ||
             (J->memory_plan && td_runfile_set_str(J->rf, "memory_plan", J->memory_plan, err));
    free(rj);
    free(ej);
    return rc ? -1 : 0;
}

static int append_row(sft_job *J, const double *v, td_error *err)
{
    for (int c = 0; c < TD_STP_COUNT; c++) {
        const td_colspec *s = &td_schema_steps[c];
        if (c == TD_STP_AUX_LOSS && isnan(v[c])) continue;   /* the load-balancing loss off: no column */
        union { int8_t i8; int32_t i32; int64_t i64; double f64; } x;
        switch (s->type) {
        case TD_COL_I8: x.i8 = (int8_t)v[c]; break;
        case TD_COL_I32: x.i32 = (int32_t)v[c]; break;
        case TD_COL_I64: x.i64 = (int64_t)v[c]; break;
        default: x.f64 = v[c]; break;
        }
        if (td_runfile_append(J->rf, s->path, s->type, 1, &x, 1, err)) return -1;
    }
    if (td_runfile_flush(J->rf, err)) return -1;
    /* the row to --report-to's sinks: every column under its /steps name, the step the event's */
    td_step_value lv[TD_STP_COUNT];
    int n = 0;
    for (int c = 0; c < TD_STP_COUNT; c++)
        if (c != TD_STP_STEP && !(c == TD_STP_AUX_LOSS && isnan(v[c])))
            lv[n++] = (td_step_value){td_schema_steps[c].path + strlen(TD_SCHEMA_STEPS "/"), v[c],
                                      td_schema_steps[c].type != TD_COL_F64};
    return td_steplog_write(J->log, (int64_t)v[TD_STP_STEP], lv, n, err);
}

static int save_checkpoint(sft_job *J, int step, td_error *err)
{
    char dir[4200], tmp[4300];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", J->o->output_dir, step);
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    sft_remove_dir(tmp);
    sft_progress p = {step, J->skipped, 0, J->o->train.seed, ""};
    snprintf(p.settings, sizeof p.settings, "%s", J->settings);
    p.epoch = (double)step * J->o->batch * J->o->grad_accum / (double)J->train.n;
    if (sft_save_dir(J->tr, J->o, J->tok, tmp, 2, &p, err)) { sft_remove_dir(tmp); return -1; }
    sft_remove_dir(dir);   /* an older one of the same step (a resumed run saving again) */
    if (rename(tmp, dir) != 0) {
        td_fail(err, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
        sft_remove_dir(tmp);
        return -1;
    }
    return 0;
}

static int evaluate(sft_job *J, double *acc, double *reward, td_error *err)
{
    td_sft_eval_opts eo = {&J->o->eval_recipe, J->o->max_new_tokens, J->o->eval_batch};
    return td_sft_evaluate(td_trainer_model(J->tr), td_trainer_lora(J->tr), J->tok, J->eval.items, J->n_eval, &eo,
                           acc, reward, NULL, err);
}

static void fmt_dur(double s, char *buf, size_t cap)
{
    if (s >= 3600) snprintf(buf, cap, "%dh%02dm", (int)(s / 3600), (int)fmod(s / 60, 60));
    else if (s >= 60) snprintf(buf, cap, "%dm%02ds", (int)(s / 60), (int)fmod(s, 60));
    else snprintf(buf, cap, "%.0fs", s);
}

/* One optimiser step k: its B*GA examples, micro-batch by micro-batch. */
static int train_step(sft_job *J, int k, double *row, td_error *err)
{
    const td_sft_opts *o = J->o;
    int S = o->batch * o->grad_accum;
    const int **toks = td_xmalloc((size_t)S * sizeof *toks);
    int *lens = td_xmalloc((size_t)S * sizeof(int));
    float **w = td_xmalloc((size_t)S * sizeof *w);
    double z = 0.0, loss = 0.0;
    int rc = -1;
    for (int i = 0; i < S; i++) {
        const sft_example *e = stream_at(J, (long)k * S + i);
        toks[i] = e->ids;
        lens[i] = e->len;
        w[i] = td_xcalloc((size_t)e->len, sizeof(float));
        for (int t = e->plen - 1; t < e->len - 1; t++) w[i][t] = 1.0f;   /* target t + 1: completion, EOS */
        z += e->len - e->plen;
    }
    long rows = 0;
    for (int i = 0; i < S; i++) rows += lens[i];
    td_trainer_set_aux_rows(J->tr, rows);   /* the aux loss: each forward weighted by its share of the step */
    for (int g = 0; g < o->grad_accum; g++) {
        double l = 0.0;
        int at = g * o->batch;
        if (td_trainer_accumulate_sft(J->tr, o->batch, toks + at, lens + at, (const float *const *)w + at, z, &l, err))
            goto out;
        loss += l;
    }
    if (k == 0 && o->dump_grads &&
        td_trainer_dump_grads(J->tr, o->dump_grads, S, toks, lens, (const float *const *)w,
                              td_tokenizer_token_id(J->tok, "<pad>") >= 0 ? td_tokenizer_token_id(J->tok, "<pad>") : 0,
                              o->command, err))
        goto out;
    td_step_info info;
    if (td_trainer_step(J->tr, &info, err)) goto out;
    long corr = 0, tot = 0;
    td_trainer_token_accuracy(J->tr, &corr, &tot, 1);
    row[TD_STP_STEP] = k + 1;
    row[TD_STP_EPOCH] = (double)(k + 1) * S / (double)J->train.n;
    row[TD_STP_LOSS] = loss;
    row[TD_STP_TOKEN_ACCURACY] = tot ? (double)corr / (double)tot : NAN;
    row[TD_STP_GRAD_NORM] = info.grad_norm;
    row[TD_STP_LR] = info.skipped ? 0.0 : info.lr;
    row[TD_STP_LOSS_SCALE] = info.loss_scale;
    row[TD_STP_SKIPPED] = info.skipped;
    row[TD_STP_SKIPPED_TOTAL] = (double)info.skipped_total;
    row[TD_STP_TARGET_TOKENS] = z;
    row[TD_STP_AUX_LOSS] = td_trainer_aux_loss(J->tr, 1);
    rc = 0;
out:
    for (int i = 0; i < S; i++) free(w[i]);
    free(w);
    free(toks);
    free(lens);
    return rc;
}

/* The GPU memory plan of this run (include/tidal/memplan.h): printed with --device cuda and with
 * --plan-only (then the free memory only when a GPU answers), kept for sft.h5's memory_plan, and
 * a refusal with the numbers when it does not fit, before anything in OUTPUT_DIR is touched. */
static int memory_plan(sft_job *J, char **json, td_error *err)
{
    const td_sft_opts *o = J->o;
    int on_gpu = o->device && strncmp(o->device, "cuda", 4) == 0;
    if (!on_gpu && !o->plan_only) return 0;
    /* the evaluation's session (td_sft_evaluate): eval batch slots, its longest prompt + budget */
    int eval_len = 0;
    if (J->has_eval && J->n_eval > 0) {
        int max_prompt = 0, max_ref = 0;
        for (size_t i = 0; i < J->n_eval; i++) {
            if (J->eval.ex[i].plen > max_prompt) max_prompt = J->eval.ex[i].plen;
            const char *comp = J->eval.items[i].completion;
            int r = comp ? (int)strlen(comp) + 1 : 0;
            if (r > max_ref) max_ref = r;
        }
        eval_len = max_prompt + (o->max_new_tokens > 0 ? o->max_new_tokens : max_ref + 16);
    }
    td_memplan_train_in in = {.cfg = &J->cfg, .train = &o->recipe, .infer = eval_len ? &o->eval_recipe : NULL,
                              .lora_rank = o->train.lora_r, .lora_modules = o->train.lora_modules,
                              .gradient_checkpointing = o->train.gradient_checkpointing,
                              .max_tokens = o->batch * J->train.max_len, .max_seq_len = J->train.max_len,
                              .slots = eval_len ? o->eval_batch : 0, .max_len = eval_len, .sampler = 1,
                              .nthreads = omp_get_max_threads()};
    td_memplan_train p = {0};
    if (on_gpu && td_device_mem_info(o->device, &p.free, &p.device_total, err)) {
        if (!o->plan_only) return -1;
        fprintf(stderr, "tidal-sft: note: %s: the plan without the free memory\n", err->msg);
        on_gpu = 0;
    }
    td_memplan_train_compute(&in, &p);
    td_memplan_train_print(stderr, "tidal-sft", &p, &in);
    if (on_gpu && !o->ignore_memory_plan && !td_memplan_train_fits(&p))
        return td_memplan_train_refuse("tidal-sft", o->device, &p, &in, err);
    if (on_gpu) *json = td_memplan_train_json(&p, &in);
    return 0;
}

static int run(sft_job *J, td_sft_result *res, td_error *err)
{
    const td_sft_opts *o = J->o;
    if (o->batch < 1 || o->grad_accum < 1 || o->max_steps < 0 || !(o->epochs > 0 || o->max_steps > 0) ||
        o->save_steps < 0 || o->eval_steps < 0)
        return td_fail(err, "bad options: batch %d, gradient accumulation %d, max_steps %d, epochs %g, save_steps "
                       "%d, eval_steps %d", o->batch, o->grad_accum, o->max_steps, o->epochs, o->save_steps,
                       o->eval_steps);
    if (o->run_file) snprintf(J->run_path, sizeof J->run_path, "%s", o->run_file);
    else snprintf(J->run_path, sizeof J->run_path, "%s/sft.h5", o->output_dir ? o->output_dir : ".");
    char ck[4200] = "", mine[sizeof ((sft_progress *)0)->settings];
    sft_progress prog = {0}, done = {0};
    int finished = 0;
    settings_json(o, NULL, mine, sizeof mine);
    snprintf(J->settings, sizeof J->settings, "%s", mine);
    char *plan_json = NULL;
    if (o->plan_only || (o->device && strncmp(o->device, "cuda", 4) == 0)) {
        /* the plan first: a refusal leaves OUTPUT_DIR as it was (check_output may clear it) */
        if (load_inputs(J, 1, err) || memory_plan(J, &plan_json, err)) return -1;
        if (o->plan_only) return 0;
    }
    J->memory_plan = plan_json;
    if (o->resume) {
        char top[4200];
        snprintf(top, sizeof top, "%s/trainer_state.json", o->output_dir);
        if (exists(top)) {   /* the run finished: its final model is in place */
            if (sft_read_progress(o->output_dir, &done, err)) return -1;
            finished = 1;
        }
        if (!sft_latest_checkpoint(o->output_dir, ck, sizeof ck) && !finished)
            return td_fail(err, "--resume: %s holds no checkpoint-K to continue from", o->output_dir);
        const char *want = o->resume_checkpoint;
        if (want && strcmp(want, "true") && strcmp(want, "True") && strcmp(want, "last")) {
            if (chosen_checkpoint(o, ck, sizeof ck, err)) return -1;
            finished = 0;   /* a checkpoint named: continue from it, whatever came after */
            done.global_step = 0;
        }
        if (ck[0] && sft_read_progress(ck, &prog, err)) return -1;
    } else if (check_output(o, J->run_path, err)) {
        return -1;
    }
    if (o->progress) fprintf(o->progress, "tidal-sft: loading %s\n", o->model_path);
    if (!J->model && load_inputs(J, 1, err)) return -1;
    settings_json(o, &J->model->cfg, mine, sizeof mine);   /* config.json's defaults resolved */
    snprintf(J->settings, sizeof J->settings, "%s", mine);
    int S = o->batch * o->grad_accum;
    J->total = o->max_steps > 0 ? o->max_steps : (int)ceil(o->epochs * (double)J->train.n / S);
    if (finished && done.global_step >= J->total) {
        if (o->progress) fprintf(o->progress, "tidal-sft: %s is complete (%d steps): nothing to resume\n",
                                 o->output_dir, done.global_step);
        res->steps = done.global_step;
        /* killed after the final model, while its run file was compacted: finish that (it
         * removes the compaction's temporary, too) */
        char ctmp[4300], jpath[4300];
        snprintf(ctmp, sizeof ctmp, "%s.compact.tmp", J->run_path);
        snprintf(jpath, sizeof jpath, "%s.journal", J->run_path);
        if ((exists(ctmp) || exists(jpath)) && exists(J->run_path) && td_runfile_compact(J->run_path, err))
            return -1;
        return 0;
    }
    if (o->resume) {   /* continuing (or extending, HF's way: to the new total) needs the run's settings */
        if (!ck[0] || prog.global_step < done.global_step)
            return td_fail(err, "--resume: %s finished at step %d and has no checkpoint of that step to continue to "
                           "%d steps from (a run made before tidal-sft kept its last step's state)", o->output_dir,
                           done.global_step, J->total);
        char lines[sizeof err->msg];
        static const char *const free_keys[] = {"gradient_checkpointing", NULL};   /* same results */
        if (prog.settings[0] && td_settings_diff(prog.settings, mine, RESUME_FLAGS, free_keys, lines, sizeof lines) != 0)
            return td_fail(err, "--resume: %s/trainer_state.json: other settings than the run's (give the run's values, "
                           "or use a new --output-dir):\n%s", ck, lines);
        if (prog.seed != o->train.seed)   /* checkpoints without the settings: the seed at least */
            return td_fail(err, "--resume: %s was made with --seed %llu, this command has %llu (the data order "
                           "would differ)", ck, (unsigned long long)prog.seed, (unsigned long long)o->train.seed);
        if (prog.global_step > J->total)
            return td_fail(err, "--resume: %s is at step %d, past --max-steps %d", ck, prog.global_step, J->total);
    }
    td_train_opts to = o->train;
    to.max_steps = J->total;
    to.max_seq_len = J->train.max_len;
    to.max_tokens = o->batch * J->train.max_len;
    J->tr = td_trainer_create(J->model, &o->recipe, &to, NULL, err);
    if (!J->tr) return -1;
    J->perm = td_xmalloc(J->train.n * sizeof(int));
    J->perm_epoch = -1;
    int start = 0;
    if (o->resume) {
        char st[4300];
        snprintf(st, sizeof st, "%s/optimizer.safetensors", ck);
        if (td_trainer_load_state(J->tr, st, err)) return -1;
        start = prog.global_step;
        J->skipped = prog.skipped;
        if (o->progress) fprintf(o->progress, "tidal-sft: resuming from %s (step %d of %d)\n", ck, start, J->total);
    }
    if (open_runfile(J, o->resume ? start : -1, err)) return -1;
    /* the logs cut back to the rows sft.h5 keeps (steps 1..start), then this invocation's sinks */
    if (!(J->log = td_steplog_open(o->output_dir, o->report_to, o->resume ? start + 1 : 0, err))) return -1;
    if (o->progress && (o->report_to & TD_REPORT_TENSORBOARD))
        fprintf(o->progress, "tidal-sft: TensorBoard events in %s/runs (tensorboard --logdir %s)\n", o->output_dir,
                o->output_dir);
    if (o->progress)
        fprintf(o->progress, "tidal-sft: %zu training records (%.1f epochs), %d steps of %d sequences, recipe %s%s, "
                "%zu trained parameters, %zu eval records\n", J->train.n, (double)J->total * S / J->train.n, J->total,
                S, o->recipe.name, o->train.lora_r ? " + LoRA" : "", td_trainer_num_params(J->tr), J->n_eval);
    double t_run = now_s(), acc = NAN, rew = NAN, row[TD_STP_COUNT];
    for (int k = start; k < J->total; k++) {
        if (o->stop && *o->stop) {
            if (k > start && save_checkpoint(J, k, err)) return -1;
            if (k == 0) return td_fail(err, "interrupted before the first step: nothing to keep");
            return td_fail(err, "interrupted after step %d of %d; %s/checkpoint-%d holds it and --resume continues",
                           k, J->total, o->output_dir, k);
        }
        double t_step = now_s();
        if (train_step(J, k, row, err)) {
            char msg[sizeof err->msg];
            snprintf(msg, sizeof msg, "%s", err->msg);
            return td_fail(err, "step %d of %d: %s (stopped; the checkpoints and %s written so far are kept)",
                           k + 1, J->total, msg, J->run_path);
        }
        row[TD_STP_EVAL_ACCURACY] = row[TD_STP_EVAL_REWARD] = NAN;
        int last = k + 1 == J->total;
        if (J->has_eval && (last || (o->eval_steps > 0 && (k + 1) % o->eval_steps == 0))) {
            if (evaluate(J, &acc, &rew, err)) return -1;
            row[TD_STP_EVAL_ACCURACY] = acc;
            row[TD_STP_EVAL_REWARD] = rew;
        }
        row[TD_STP_SECONDS] = now_s() - t_step;
        if (append_row(J, row, err)) return -1;
        res->steps = k + 1;
        res->loss = row[TD_STP_LOSS];
        res->skipped = J->skipped = (long)row[TD_STP_SKIPPED_TOTAL];
        if (o->progress && (last || (k + 1) % 10 == 0 || k == start || !isnan(row[TD_STP_EVAL_ACCURACY]))) {
            double el = now_s() - t_run, eta = el / (k + 1 - start) * (J->total - k - 1);
            char a[32], b[32];
            fmt_dur(el, a, sizeof a);
            fmt_dur(eta, b, sizeof b);
            fprintf(o->progress, "tidal-sft: step %d/%d  epoch %.2f  loss %.4f  tok-acc %.3f  grad-norm %.3g  lr %.3g%s",
                    k + 1, J->total, row[TD_STP_EPOCH], row[TD_STP_LOSS], row[TD_STP_TOKEN_ACCURACY],
                    row[TD_STP_GRAD_NORM], row[TD_STP_LR], row[TD_STP_SKIPPED] ? "  (skipped)" : "");
            if (row[TD_STP_LOSS_SCALE] != 1.0) fprintf(o->progress, "  scale %g", row[TD_STP_LOSS_SCALE]);
            if (!isnan(row[TD_STP_EVAL_ACCURACY]))
                fprintf(o->progress, "  eval-acc %.3f  eval-reward %.3f", row[TD_STP_EVAL_ACCURACY], row[TD_STP_EVAL_REWARD]);
            fprintf(o->progress, "  | %s, ETA %s\n", a, b);
        }
        if (!last && o->save_steps > 0 && (k + 1) % o->save_steps == 0 && save_checkpoint(J, k + 1, err)) return -1;
    }
    /* the run file's last words committed before the final model is published: once that is in
     * place, --resume says the run is complete */
    if (J->has_eval &&
        (td_runfile_set_f64(J->rf, "final_eval_accuracy", acc, err) || td_runfile_set_f64(J->rf, "final_eval_reward", rew, err) ||
         td_runfile_set_i64(J->rf, "final_eval_records", (int64_t)J->n_eval, err) || td_runfile_flush(J->rf, err)))
        return -1;
    /* the final model into output_dir, through a temporary folder */
    char tmp[4300];
    snprintf(tmp, sizeof tmp, "%s/final.tmp", o->output_dir);
    sft_remove_dir(tmp);
    /* the last step's state, always (as HF's Trainer saves its last checkpoint): --resume with a
     * larger --max-steps continues from it */
    if (J->total > start && save_checkpoint(J, J->total, err)) return -1;
    sft_progress fin = {J->total, res->skipped, (double)J->total * S / J->train.n, o->train.seed, ""};
    snprintf(fin.settings, sizeof fin.settings, "%s", J->settings);
    if (sft_save_dir(J->tr, o, J->tok, tmp, 1, &fin, err) || sft_publish(tmp, o->output_dir, err)) {
        sft_remove_dir(tmp);
        return -1;
    }
    /* what the backend held at most (the plan bounds it: tests/py/test_memplan_train.py) */
    if (J->memory_plan && td_runfile_set_i64(J->rf, "memory_peak", (int64_t)td_device_mem_peak(), err)) return -1;
    int rc = td_runfile_close(J->rf, err);
    J->rf = NULL;
    if (rc || td_runfile_compact(J->run_path, err)) return -1;
    res->eval_accuracy = acc;
    res->eval_reward = rew;
    res->eval_n = (int)J->n_eval;
    return 0;
}

static int eval_only(sft_job *J, td_sft_result *res, FILE *completions, td_error *err)
{
    if (load_inputs(J, 0, err)) return -1;
    if (!J->has_eval) return td_fail(err, "%s: no evaluation records (test.jsonl or --eval-dataset-path)", J->o->dataset_path);
    td_sft_eval_opts eo = {&J->o->eval_recipe, J->o->max_new_tokens, J->o->eval_batch};
    res->eval_n = (int)J->n_eval;
    return td_sft_evaluate(J->model, NULL, J->tok, J->eval.items, J->n_eval, &eo, &res->eval_accuracy,
                           &res->eval_reward, completions, err);
}

static void job_free(sft_job *J);

int td_sft_eval(const td_sft_opts *o, FILE *completions, td_sft_result *res, td_error *err)
{
    sft_job J = {.o = o};
    td_sft_result r = {.eval_accuracy = NAN, .eval_reward = NAN};
    J.t0 = now_s();
    int rc = eval_only(&J, &r, completions, err);
    r.seconds = now_s() - J.t0;
    if (res) *res = r;
    job_free(&J);
    return rc;
}

int td_sft_run(const td_sft_opts *o, td_sft_result *res, td_error *err)
{
    sft_job J = {.o = o};
    td_sft_result r = {.eval_accuracy = NAN, .eval_reward = NAN};
    J.t0 = now_s();
    int rc = run(&J, &r, err);
    r.seconds = now_s() - J.t0;
    if (res) *res = r;
    job_free(&J);
    return rc;
}

static void job_free(sft_job *J0)
{
    sft_job J = *J0;
    if (J.rf) td_runfile_close(J.rf, NULL);
    td_steplog_close(J.log, NULL);   /* every step was flushed when written */
    td_trainer_free(J.tr);
    free((char *)J.train.path);
    free((char *)J.eval.path);
    sft_data_free(&J.train);
    sft_data_free(&J.eval);
    td_tokenizer_free(J.tok);
    td_model_free(J.model);
    free(J.memory_plan);
    free(J.perm);
}
