/* tidal-rl's run file (OUTPUT_DIR/rl.h5; reports/SCHEMA.md, "RL runs"):
 *   /steps/<metric>        one row per step, float64, the names of TD_RL_METRICS (verl/TRL's)
 *   /steps/collapse_fired  int32: bit mask of detector signals first marked by this step's push
 *   /steps/collapse_active int32: bit mask of signals whose condition holds at this step
 *   /steps/routing_flip_rate_layers  mixtures of experts: (steps, MoE layers) float64, each MoE
 *                          layer's routing_flip_rate (absent for a dense model)
 *   /seqs /tokens /prompts the first --log-completions completions of every step, in the
 *                          tidal-diff layout (A = training path pi_old, B = rollout), /seqs/batch
 *                          = the step: tidal-report and tidal-heatmap read them
 *   /progress              one row per step: the row counts after it (what --resume cuts to)
 * Checkpoints: OUTPUT_DIR/checkpoint-K/ after step K-1 (HF's step K): trainer_state.bin
 * (td_trainer_save_state), the policy as HF / PEFT save it (model.safetensors F32 + config.json, or
 * adapter_model.safetensors + adapter_config.json), trainer_state.json (HF's log_history of /steps),
 * then the root attribute checkpoint_step = K; all are kept (--save-total-limit N: the newest N),
 * so tidal-postmortem can diff any of them; the last step's is
 * always written (at the end, or when a signal stops the run). --resume cuts every group back to
 * checkpoint_step rows and continues: each step's rollouts depend on the seed and the step only,
 * and the trainer state is restored bit for bit, so the rows come out the same. The run
 * configuration (rl_config) must be the file's except max_steps: a larger total extends the run
 * (rl.h, td_rl_run) and becomes the file's max_steps.
 * --report-to: each committed /steps row also goes to TensorBoard / metrics.jsonl (log_step;
 * include/tidal/tfevents.h), cut back with the file on --resume (td_rl_run). */
#include "rl_internal.h"
#include "tidal/checkpoint.h"
#include "tidal/diff.h"
#include "tidal/opts.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define RL_FLIP_LAYERS "/steps/routing_flip_rate_layers"

static void file_path(const rl_run *R, char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", R->o->output_dir, name);
}

char *rl_config_json(const rl_run *R)
{
    const td_rl_opts *o = R->o;
    const td_rl_loss_cfg *c = &R->lc;
    json_t *j = json_pack("{s:s, s:s, s:s, s:s, s:b, s:f, s:s, s:f, s:f, s:f, s:s, s:f, s:s, s:i, s:f}",
                          "model_path", o->model_path, "dataset_path", o->dataset_path,
                          "train_recipe", R->rtrain.name, "rollout_recipe", R->rroll.name,
                          "exact_match", o->exact_match, "rollout_logit_noise", o->rollout_logit_noise,
                          "policy_loss", c->policy_loss == TD_PL_PG ? "pg" : "ppo",
                          "epsilon", c->epsilon, "epsilon_high", c->epsilon_high, "dual_clip", c->dual_clip,
                          "loss_type", td_rl_loss_type_name(c->loss_type),
                          "beta", c->beta, "is_correction", td_rl_is_name(c->is_mode),
                          "is_drop_masked", c->is_drop_masked, "is_cap", c->is_cap);
    json_object_set_new(j, "is_cap_low", json_real(c->is_cap_low));
    if (o->lora_modules)   /* absent for the default (q_proj, v_proj): older run files resume */
        json_object_set_new(j, "lora_target_modules", json_integer(o->lora_modules));
    if (o->freeze_router) json_object_set_new(j, "freeze_router", json_true());   /* absent without */
    td_train_opts aux = {.output_router_logits = o->output_router_logits, .router_aux_loss_coef = o->router_aux_loss_coef};
    td_train_opts_resolve_moe(&aux, &R->model->cfg);
    if (aux.output_router_logits) {   /* absent when off (the default): older run files resume */
        json_object_set_new(j, "output_router_logits", json_true());
        json_object_set_new(j, "router_aux_loss_coef", json_real(aux.router_aux_loss_coef));
    }
    if (o->routing_replay != TD_RL_REPLAY_NONE)   /* absent without: older run files resume */
        json_object_set_new(j, "routing_replay", json_string(o->routing_replay == TD_RL_REPLAY_R2 ? "r2" : "r3"));
    if (o->chat_template)   /* absent without: older run files resume */
        json_object_set_new(j, "chat_template", json_string(o->chat_template));
    if (o->reward_command) {   /* absent for built-in rewards: older run files resume as they were */
        json_object_set_new(j, "reward_command", json_string(o->reward_command));
        json_object_set_new(j, "reward_weights", json_string(o->reward_weights ? o->reward_weights : ""));
    }
    json_object_set_new(j, "scale_rewards", json_string((const char *[]){"group", "batch", "none"}[c->scale_rewards]));
    json_object_set_new(j, "num_generations", json_integer(c->num_generations));
    json_object_set_new(j, "per_device_batch_size", json_integer(c->micro_batch));
    json_object_set_new(j, "gradient_accumulation_steps", json_integer(c->grad_accum));
    json_object_set_new(j, "mask_truncated_completions", json_boolean(o->mask_truncated));
    json_object_set_new(j, "learning_rate", json_real(o->learning_rate));
    json_object_set_new(j, "lr_scheduler_type", json_string(td_lr_schedule_name((td_lr_schedule)o->lr_schedule)));
    json_object_set_new(j, "warmup_ratio", json_real(o->warmup_ratio));
    json_object_set_new(j, "weight_decay", json_real(o->weight_decay));
    json_object_set_new(j, "max_grad_norm", json_real(o->max_grad_norm));
    if (o->gradient_checkpointing) json_object_set_new(j, "gradient_checkpointing", json_true());
    json_object_set_new(j, "lora_r", json_integer(o->lora_r));
    json_object_set_new(j, "lora_alpha", json_real(o->lora_alpha));
    if (o->eval_steps > 0) {   /* without --eval-steps the configuration stays as it was */
        json_object_set_new(j, "eval_steps", json_integer(o->eval_steps));
        json_object_set_new(j, "eval_dataset_path", json_string(R->eval_path));
        json_object_set_new(j, "eval_max_samples", json_integer((json_int_t)R->n_eval));
    }
    if (o->lora_r > 0) {   /* full fine-tuning's configuration stays as it was (older runs resume) */
        json_object_set_new(j, "lora_sync", json_string(td_rl_lora_sync_name((td_rl_lora_sync)o->lora_sync)));
        json_object_set_new(j, "model_dtype", json_string(td_format_info((td_format)o->model_dtype)->name));
    }
    json_object_set_new(j, "temperature", json_real(o->temperature));
    json_object_set_new(j, "top_p", json_real(o->top_p));
    json_object_set_new(j, "top_k", json_integer(o->top_k));
    json_object_set_new(j, "repetition_penalty", json_real(o->repetition_penalty));
    json_object_set_new(j, "max_steps", json_integer(R->total_steps));
    json_object_set_new(j, "max_completion_length", json_integer(o->max_completion_length));
    json_object_set_new(j, "seed", json_integer((json_int_t)o->seed));
    json_object_set_new(j, "log_completions", json_integer(R->nlog));
    /* output only, free on --resume and carried over unless given again (rl_carry_over) */
    json_object_set_new(j, "report_to", json_string(td_report_to_name(o->report_to)));
    json_object_set_new(j, "save_steps", json_integer(o->save_steps));
    json_object_set_new(j, "save_total_limit", json_integer(o->save_total_limit));
    char *s = json_dumps(j, JSON_SORT_KEYS | JSON_COMPACT);
    json_decref(j);
    return s;
}

static int write_attrs(rl_run *R, td_error *err)
{
    const td_rl_opts *o = R->o;
    char created[64], *cfg = rl_config_json(R), *col = td_collapse_cfg_json(&o->collapse);
    char *ra = td_recipe_to_json(&R->rtrain), *rb = td_recipe_to_json(&R->rroll);
    time_t now = time(NULL);
    strftime(created, sizeof created, "%Y-%m-%dT%H:%M:%SZ", gmtime(&now));
    int rc = td_runfile_set_str(R->rf, "tool", "tidal-rl", err) ||
             td_runfile_set_str(R->rf, "command_line", o->command_line ? o->command_line : "", err) ||
             td_runfile_set_str(R->rf, "created", created, err) ||
             td_runfile_set_str(R->rf, "mode", "rl", err) ||
             td_runfile_set_str(R->rf, "model_path", o->model_path, err) ||
             td_runfile_set_str(R->rf, "device", td_model_device(R->model), err) ||
             (R->memory_plan && td_runfile_set_str(R->rf, "memory_plan", R->memory_plan, err)) ||
             td_runfile_set_str(R->rf, "dataset_path", o->dataset_path, err) ||
             td_runfile_set_i64(R->rf, "seed", (int64_t)o->seed, err) ||
             td_runfile_set_str(R->rf, "recipe_a_name", R->rtrain.name, err) ||
             td_runfile_set_str(R->rf, "recipe_b_name", o->exact_match ? R->rtrain.name : R->rroll.name, err) ||
             td_runfile_set_str(R->rf, "recipe_a", ra, err) || td_runfile_set_str(R->rf, "recipe_b", rb, err) ||
             td_runfile_set_str(R->rf, "rl_config", cfg, err) ||
             td_runfile_set_str(R->rf, "collapse_config", col, err) ||
             td_runfile_set_i64(R->rf, "max_steps", R->total_steps, err) ||
             td_runfile_set_i64(R->rf, "checkpoint_step", 0, err) ||
             td_runfile_set_i64(R->rf, "finished", 0, err) ? -1 : 0;
    free(cfg); free(col); free(ra); free(rb);
    return rc;
}

static void columns_init(rl_run *R)
{
    td_columns_init(R->tcols, td_schema_tokens, TD_TOK_LOGP_TRAINER);   /* the optional last one left out */
    td_columns_init(R->scols, td_schema_seqs, TD_SEQ_TEXT_OFFSET);
    td_columns_init(R->pcols, td_schema_prompts, TD_PRM_COUNT);
}

/* The state after `steps` completed steps: /steps rows replayed through the detector. */
static int replay(rl_run *R, int steps, td_error *err)
{
    double *col = td_xmalloc((size_t)(steps ? steps : 1) * sizeof(double));
    double *rows = td_xcalloc((size_t)(steps ? steps : 1) * TD_RLM_COUNT, sizeof(double));
    for (int i = 0; i < TD_RLM_COUNT; i++) {
        char p[128];
        snprintf(p, sizeof p, "/steps/%s", td_rl_metric_names[i]);
        if (steps && !td_runfile_exists(R->rf, p)) {   /* a column newer than the file: nan rows */
            for (int k = 0; k < steps; k++) col[k] = NAN;
            if (td_runfile_append(R->rf, p, TD_COL_F64, 1, col, (size_t)steps, err)) { free(col); free(rows); return -1; }
        } else if (steps && td_runfile_read(R->rf, p, TD_COL_F64, 0, steps, col, err)) {
            free(col); free(rows); return -1;
        }
        for (int k = 0; k < steps; k++) rows[(size_t)k * TD_RLM_COUNT + i] = col[k];
    }
    if (R->Lm && steps && !td_runfile_exists(R->rf, RL_FLIP_LAYERS)) {   /* a run file older than the column */
        double *nan = td_xmalloc((size_t)steps * R->Lm * sizeof(double));
        for (size_t i = 0; i < (size_t)steps * R->Lm; i++) nan[i] = NAN;
        int rc = td_runfile_append(R->rf, RL_FLIP_LAYERS, TD_COL_F64, (size_t)R->Lm, nan, (size_t)steps, err);
        free(nan);
        if (rc) { free(col); free(rows); return -1; }
    }
    R->skipped_extra = 0;
    for (int k = 0; k < steps; k++) {
        const double *M = rows + (size_t)k * TD_RLM_COUNT;
        td_collapse_push(R->det, M);
        if (M[TD_RLM_skipped] == 1 && M[TD_RLM_loss_scale] == 1) R->skipped_extra++;
    }
    free(col);
    free(rows);
    return 0;
}

/* Run files written before /steps/kl became TRL's kl (the KL to the reference) hold the rollout
 * mismatch k1 as "kl": resumed, that column's rows are copied to rollout_corr_kl, its new name;
 * the old rows of "kl" keep the k1 they were written with. */
static int rename_old_kl(rl_run *R, int steps, td_error *err)
{
    if (steps == 0 || td_runfile_exists(R->rf, "/steps/rollout_corr_kl") || !td_runfile_exists(R->rf, "/steps/kl"))
        return 0;
    double *col = td_xmalloc((size_t)steps * sizeof(double));
    int rc = td_runfile_read(R->rf, "/steps/kl", TD_COL_F64, 0, steps, col, err) ||
             td_runfile_append(R->rf, "/steps/rollout_corr_kl", TD_COL_F64, 1, col, (size_t)steps, err) ? -1 : 0;
    free(col);
    return rc;
}

static int cut_back(rl_run *R, int steps, td_error *err)
{
    const char *groups[3] = {"/seqs", "/tokens", "/prompts"};
    const char *cols[3] = {"/progress/seq_rows", "/progress/token_rows", "/progress/prompt_rows"};
    for (int g = 0; g < 3; g++) {
        int64_t n = 0;
        if (steps > 0 && td_runfile_read(R->rf, cols[g], TD_COL_I64, steps - 1, 1, &n, err)) return -1;
        if (td_runfile_exists(R->rf, groups[g]) && td_runfile_truncate_group(R->rf, groups[g], n, err)) return -1;
        R->rows[g] = n;
    }
    if ((td_runfile_exists(R->rf, "/progress") && td_runfile_truncate_group(R->rf, "/progress", steps, err)) ||
        (td_runfile_exists(R->rf, "/steps") && td_runfile_truncate_group(R->rf, "/steps", steps, err)))
        return -1;
    if (rename_old_kl(R, steps, err)) return -1;
    return replay(R, steps, err);
}

/* --resume: the options of rl_config's keys that are not --key itself, and the ones a resume may
 * change (the total: HF's Trainer continues to a new max_steps) */
static const td_setting_flag RESUME_FLAGS[] = {
    {"train_recipe", "--train-recipe (or --dtype)", NULL}, {"rollout_recipe", "--rollout-recipe (or --dtype)", NULL},
    {"is_drop_masked", "--is-masked-normaliser", "keep|drop"}, {"lr_scheduler_type", "--lr-scheduler-type", NULL},
    {"mask_truncated_completions", "--mask-truncated-completions", NULL}, {"log_completions", "--log-completions", NULL},
    {0}};
static const char *const RESUME_FREE[] = {"max_steps", "gradient_checkpointing", "report_to", "save_steps",
                                           "save_total_limit", NULL};

int rl_carry_over(rl_run *R, td_rl_opts *o, td_error *err)
{
    char path[4200], said[600] = "";
    struct stat st;
    file_path(R, path, sizeof path, TD_RL_RUNFILE);
    if (!o->resume || o->overwrite || stat(path, &st) != 0 || st.st_size == 0) return 0;
    td_runfile *rf = td_runfile_open(path, 0, err);
    if (!rf) return -1;
    char *text = td_runfile_get_str(rf, "rl_config", NULL);
    td_runfile_close(rf, NULL);
    json_t *cfg = text ? json_loads(text, 0, NULL) : NULL;
    free(text);
    if (!json_is_object(cfg)) { json_decref(cfg); return 0; }   /* rl_file_open names what is wrong */
    json_t *v;
    if (!o->given.report_to && json_is_string(v = json_object_get(cfg, "report_to")) &&
        td_report_to_parse(&o->report_to, json_string_value(v), NULL, 0) == 0 && o->report_to)
        snprintf(said, sizeof said, " --report-to %s", json_string_value(v));
    struct { int given, *dest; const char *key, *flag; } ints[] = {
        {o->given.save_steps, &o->save_steps, "save_steps", "--save-steps"},
        {o->given.save_total_limit, &o->save_total_limit, "save_total_limit", "--save-total-limit"},
        {o->given.log_completions, &o->log_completions, "log_completions", "--log-completions"},
        {o->given.eval_steps, &o->eval_steps, "eval_steps", "--eval-steps"},
        {o->given.eval_max_samples, &o->eval_max_samples, "eval_max_samples", "--eval-max-samples"}};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        if (ints[i].given || !json_is_integer(v = json_object_get(cfg, ints[i].key))) continue;
        int was = *ints[i].dest;
        *ints[i].dest = (int)json_integer_value(v);
        size_t at = strlen(said);
        if (*ints[i].dest != was) snprintf(said + at, sizeof said - at, " %s %d", ints[i].flag, *ints[i].dest);
    }
    if (!o->eval_dataset_path && o->eval_steps > 0 && json_is_string(v = json_object_get(cfg, "eval_dataset_path"))) {
        R->carried_eval_path = strdup(json_string_value(v));
        o->eval_dataset_path = R->carried_eval_path;
    }
    json_decref(cfg);
    if (*said && !o->quiet)
        fprintf(stderr, "tidal-rl: --resume: carried over from the run (give them to change them):%s\n", said);
    return 0;
}

/* --resume-from-checkpoint PATH: the newest checkpoint, the one the run file names */
static int check_named(const td_rl_opts *o, int ck, td_error *err)
{
    const char *p = o->resume_checkpoint;
    if (!strcmp(p, "true") || !strcmp(p, "True") || !strcmp(p, "last")) return 0;
    char want[4300];
    snprintf(want, sizeof want, "%s/checkpoint-%d", o->output_dir, ck);
    char *a = realpath(p, NULL), *b = realpath(want, NULL);
    int same = a && b && !strcmp(a, b);
    free(a);
    free(b);
    if (same) return 0;
    if (ck == 0)
        return td_fail(err, "--resume-from-checkpoint %s: the run has no checkpoint yet (it restarts from step 0 with "
                       "--resume)", p);
    return td_fail(err, "--resume-from-checkpoint %s: the run's checkpoint is %s (tidal-rl continues from the newest, the one its run file names)", p, want);
}

static void remove_checkpoint_dir(const char *dir);

/* A run killed while a checkpoint-K.tmp/ was written, or after a checkpoint-K/ was renamed but
 * before the run file named it, left folders past the one the file names: --resume removes every
 * checkpoint-K.tmp/ and every checkpoint-K/ with K past it (those at or before it are the run's
 * history, kept). */
static void remove_other_checkpoints(const char *output_dir, int64_t keep)
{
    DIR *d = opendir(output_dir);
    if (!d) return;
    struct dirent *e;
    char path[4300];
    while ((e = readdir(d))) {
        long long k;
        int used = 0;
        if (sscanf(e->d_name, "checkpoint-%lld%n", &k, &used) != 1 || k < 1) continue;
        const char *rest = e->d_name + used;
        if (*rest && strcmp(rest, ".tmp")) continue;   /* not one of ours */
        if (!*rest && k <= keep) continue;
        snprintf(path, sizeof path, "%s/%s", output_dir, e->d_name);
        remove_checkpoint_dir(path);
    }
    closedir(d);
}

int rl_file_open(rl_run *R, int *start, td_error *err)
{
    const td_rl_opts *o = R->o;
    char path[4200];
    file_path(R, path, sizeof path, TD_RL_RUNFILE);
    columns_init(R);
    *start = 0;
    struct stat st;
    int exists = stat(path, &st) == 0;
    if (exists && !o->resume && !o->overwrite)
        return td_fail(err, "%s exists: --resume continues that run, --overwrite-output-dir "
                       "replaces it", path);
    const char *named = o->resume_checkpoint;
    if (!exists && named && strcmp(named, "true") && strcmp(named, "True") && strcmp(named, "last"))
        return td_fail(err, "--resume-from-checkpoint %s: %s holds no run to continue", named, o->output_dir);
    /* created, then stopped before its first commit: nothing to continue */
    int empty = exists && st.st_size == 0;
    if (!exists || o->overwrite || empty) {
        if (td_make_parent_dirs(path, err)) return -1;
        R->rf = td_runfile_create(path, 1, err);
        if (!R->rf || write_attrs(R, err) || td_runfile_flush(R->rf, err)) return -1;
        return 0;
    }
    R->rf = td_runfile_open(path, 1, err);
    if (!R->rf) return -1;
    char *tool = td_runfile_get_str(R->rf, "tool", NULL), *cfg = td_runfile_get_str(R->rf, "rl_config", NULL);
    char *mine = rl_config_json(R), lines[sizeof err->msg];
    int rc = 0;
    if (!tool || strcmp(tool, "tidal-rl") || !cfg)
        rc = td_fail(err, "%s: not a tidal-rl run file (--overwrite-output-dir replaces it)", path);
    else if (td_settings_diff(cfg, mine, RESUME_FLAGS, RESUME_FREE, lines, sizeof lines) != 0)
        rc = td_fail(err, "%s: --resume with other settings than the run's (give the run's values, or use a new "
                     "--output-dir):\n%s", path, lines);
    else if (td_resume_device_check(R->rf, td_model_device(R->model), "--output-dir", err))
        rc = -1;
    free(tool); free(cfg);
    int64_t ck = 0;
    if (!rc && td_runfile_get_i64(R->rf, "checkpoint_step", &ck, err)) rc = -1;
    if (!rc && ck > R->total_steps)
        rc = td_fail(err, "%s: --max-steps %d, but the run has done %lld steps (checkpoint-%lld): give --max-steps "
                     "%lld or more", path, R->total_steps, (long long)ck, (long long)ck, (long long)ck);
    if (!rc && o->resume_checkpoint && check_named(o, (int)ck, err)) rc = -1;
    /* the new total (an extension) is the run's from now on */
    if (!rc && (td_runfile_set_str(R->rf, "rl_config", mine, err) ||
                td_runfile_set_i64(R->rf, "max_steps", R->total_steps, err) ||
                td_runfile_set_str(R->rf, "resumed_command_line", o->command_line ? o->command_line : "", err)))
        rc = -1;
    free(mine);
    if (rc) return -1;
    if (ck > 0) {
        char sp[4300];
        snprintf(sp, sizeof sp, "%s/checkpoint-%lld/trainer_state.bin", o->output_dir, (long long)ck);
        if (td_trainer_load_state(R->tr, sp, err)) return -1;
        snprintf(sp, sizeof sp, "%s/checkpoint-%lld", o->output_dir, (long long)ck);
        if (rl_sync_load(R, sp, err)) return -1;
    }
    if (cut_back(R, (int)ck, err) || td_runfile_set_i64(R->rf, "finished", 0, err) || td_runfile_flush(R->rf, err))
        return -1;
    remove_other_checkpoints(o->output_dir, ck);
    *start = (int)ck;
    return 0;
}

/* the logged sequences of step k in the tidal-diff layout */
static void push_sample(rl_run *R, int k)
{
    for (int s = 0; s < R->nlog; s++) {
        int64_t seq_row = R->rows[0] + s, first = R->rows[1] + (int64_t)R->tcols[TD_TOK_SEQ].n;
        double sum = 0, sum_abs = 0, mx = 0, kl = 0, lr = 0;
        int ns = 0;
        for (int pos = R->plen[s]; pos < R->len[s]; pos++) {
            const td_token_metrics *m = &R->tm[(size_t)s * R->max_len + pos];
            double d = m->logp_b - m->logp_a;
            td_columns_push_token(R->tcols, seq_row, pos, R->tok[s][pos], m,
                                  R->o->exact_match ? m->logp_a : R->mu_pos[s][pos], R->plen[s]);
            sum += d;
            sum_abs += fabs(d);
            mx = fmax(mx, fabs(d));
            kl += m->kl_ba;
            lr -= d;
            ns++;
        }
        td_seq_row row = {(int64_t)R->item[s], k, first, R->rows[2] + (int64_t)R->pcols[TD_PRM_TOKENS].n, R->plen[s],
                          R->len[s] - R->plen[s], ns, (int8_t)R->finish[s], sum, ns ? sum_abs / ns : NAN, mx,
                          ns ? kl / ns : NAN, lr};
        td_columns_push_seq(R->scols, &row);
        for (int t = 0; t < R->len[s]; t++) td_column_push_i32(&R->pcols[TD_PRM_TOKENS], R->tok[s][t]);
    }
}

/* TRL rewards/<name>/mean: component c's mean over the step's non-null values */
static double comp_mean(const rl_run *R, int c)
{
    double sum = 0, cnt = 0;
    for (int s = 0; s < R->B; s++) {
        double v = R->comp[(size_t)s * R->n_comp + c];
        if (!isnan(v)) { sum += v; cnt++; }
    }
    return cnt > 0 ? sum / cnt : NAN;
}

/* The committed row to --report-to's sinks: every /steps column under its name (the step is
 * the event's), the reward components' means recomputed as above. */
static int log_step(rl_run *R, int k, const double *M, int32_t fired, int32_t active, td_error *err)
{
    if (!R->log) return 0;
    int n = 0;
    td_step_value *v = td_xmalloc((size_t)(TD_RLM_COUNT + R->n_comp + 2) * sizeof *v);
    char **names = td_xcalloc((size_t)R->n_comp + 1, sizeof *names);
    for (int i = 0; i < TD_RLM_COUNT; i++)
        if (i != TD_RLM_step) v[n++] = (td_step_value){td_rl_metric_names[i], M[i], 0};
    for (int c = 0; c < R->n_comp; c++) {
        size_t len = strlen(R->comp_names[c]) + 8;
        names[c] = td_xmalloc(len);
        snprintf(names[c], len, "reward_%s", R->comp_names[c]);
        v[n++] = (td_step_value){names[c], comp_mean(R, c), 0};
    }
    v[n++] = (td_step_value){"collapse_fired", fired, 1};
    v[n++] = (td_step_value){"collapse_active", active, 1};
    int rc = td_steplog_write(R->log, k, v, n, err);
    for (int c = 0; c < R->n_comp; c++) free(names[c]);
    free(names);
    free(v);
    return rc;
}

int rl_file_commit(rl_run *R, int k, const double *M, td_error *err)
{
    unsigned fired = td_collapse_push(R->det, M);
    int32_t f = (int32_t)fired, a = (int32_t)td_collapse_active(R->det);
    for (int i = 0; i < TD_RLM_COUNT; i++) {
        char p[128];
        snprintf(p, sizeof p, "/steps/%s", td_rl_metric_names[i]);
        if (td_runfile_append(R->rf, p, TD_COL_F64, 1, &M[i], 1, err)) return -1;
    }
    for (int c = 0; c < R->n_comp; c++) {
        double mean = comp_mean(R, c);
        char p[300];
        snprintf(p, sizeof p, "/steps/reward_%s", R->comp_names[c]);
        if (td_runfile_append(R->rf, p, TD_COL_F64, 1, &mean, 1, err)) return -1;
    }
    if (R->Lm && td_runfile_append(R->rf, RL_FLIP_LAYERS, TD_COL_F64, (size_t)R->Lm, R->flip_rate_l, 1, err)) return -1;
    if (td_runfile_append(R->rf, "/steps/collapse_fired", TD_COL_I32, 1, &f, 1, err) ||
        td_runfile_append(R->rf, "/steps/collapse_active", TD_COL_I32, 1, &a, 1, err))
        return -1;
    push_sample(R, k);
    size_t ns = R->scols[0].n, nt = R->tcols[0].n, np = R->pcols[0].n;
    if (td_columns_write(R->rf, R->scols, TD_SEQ_TEXT_OFFSET, err) ||
        td_columns_write(R->rf, R->tcols, TD_TOK_LOGP_TRAINER, err) ||
        td_columns_write(R->rf, R->pcols, TD_PRM_COUNT, err))
        return -1;
    R->rows[0] += (int64_t)ns;
    R->rows[1] += (int64_t)nt;
    R->rows[2] += (int64_t)np;
    td_columns_clear(R->scols, TD_SEQ_TEXT_OFFSET);
    td_columns_clear(R->tcols, TD_TOK_LOGP_TRAINER);
    td_columns_clear(R->pcols, TD_PRM_COUNT);
    int64_t prog[4] = {k, R->rows[0], R->rows[1], R->rows[2]};
    const char *pc[4] = {"/progress/batch", "/progress/seq_rows", "/progress/token_rows", "/progress/prompt_rows"};
    for (int i = 0; i < 4; i++)
        if (td_runfile_append(R->rf, pc[i], TD_COL_I64, 1, &prog[i], 1, err)) return -1;
    if (td_runfile_flush(R->rf, err)) return -1;
    return log_step(R, k, M, f, a, err);
}

/* A checkpoint folder and everything in it (the state, the policy, trainer_state.json, the LoRA
 * base of merge-unmerge, and their temporaries while written): only folders named
 * checkpoint-K[.tmp] of OUTPUT_DIR come here, and they hold only files tidal wrote. */
static void remove_checkpoint_dir(const char *dir)
{
    DIR *d = opendir(dir);
    if (d) {
        struct dirent *e;
        char p[4400];
        while ((e = readdir(d))) {
            if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            remove(p);
        }
        closedir(d);
    }
    rmdir(dir);
}

/* HF Trainer's trainer_state.json: log_history from /steps rows 0..steps-1, each at HF's step
 * (row + 1), every finite column under its own name */
static int write_trainer_state(rl_run *R, const char *dir, int steps, td_error *err)
{
    size_t n = td_runfile_list(R->rf, "/steps", NULL, 0);
    char **names = td_xcalloc(n ? n : 1, sizeof *names);
    size_t got = td_runfile_list(R->rf, "/steps", names, n);
    if (got < n) n = got;
    json_t *hist = json_array();
    for (int k = 0; k < steps; k++) json_array_append_new(hist, json_pack("{s:i}", "step", k + 1));
    double *v = td_xmalloc((size_t)(steps ? steps : 1) * sizeof *v);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char p[300];
        snprintf(p, sizeof p, "/steps/%s", names[i]);
        if (!rc && strcmp(names[i], "step") && td_runfile_width(R->rf, p) == 1 && td_runfile_rows(R->rf, p) >= steps) {
            if (td_runfile_read(R->rf, p, TD_COL_F64, 0, steps, v, err)) rc = -1;
            for (int k = 0; k < steps && !rc; k++)
                if (isfinite(v[k])) json_object_set_new(json_array_get(hist, (size_t)k), names[i], json_real(v[k]));
        }
        free(names[i]);
    }
    free(names);
    free(v);
    json_t *j = json_pack("{s:i, s:i, s:i, s:o}", "global_step", steps, "max_steps", R->total_steps, "save_steps",
                          R->o->save_steps, "log_history", hist);
    json_object_set_new(j, "best_metric", json_null());
    json_object_set_new(j, "best_model_checkpoint", json_null());
    json_object_set_new(j, "is_world_process_zero", json_true());
    json_object_set_new(j, "logging_steps", json_integer(1));
    char p[4400];
    snprintf(p, sizeof p, "%s/trainer_state.json", dir);
    if (!rc && json_dump_file(j, p, JSON_INDENT(2)) != 0) rc = td_fail(err, "%s: cannot write", p);
    json_decref(j);
    return rc;
}

/* checkpoint-K folders of OUTPUT_DIR, ascending */
static int cmp_ll(const void *a, const void *b)
{
    long long x = *(const long long *)a, y = *(const long long *)b;
    return x < y ? -1 : x > y;
}

static size_t list_checkpoints(const char *output_dir, long long **ks)
{
    DIR *d = opendir(output_dir);
    size_t n = 0;
    *ks = NULL;
    if (!d) return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long k;
        int used = 0;
        if (sscanf(e->d_name, "checkpoint-%lld%n", &k, &used) != 1 || k < 1 || e->d_name[used]) continue;
        *ks = td_xrealloc(*ks, (n + 1) * sizeof **ks);
        (*ks)[n++] = k;
    }
    closedir(d);
    qsort(*ks, n, sizeof **ks, cmp_ll);
    return n;
}

/* Written as checkpoint-K.tmp/ and renamed when whole; then the run file's checkpoint_step names
 * it (committed), and only then is the previous one removed. A failure at any point leaves the
 * previous checkpoint, whole, and no partial or empty folder. */
int rl_checkpoint_save(rl_run *R, int steps, td_error *err)
{
    char dir[4300], tmp[4310], path[4400];
    snprintf(dir, sizeof dir, "%s/checkpoint-%d", R->o->output_dir, steps);
    snprintf(tmp, sizeof tmp, "%s.tmp", dir);
    remove_checkpoint_dir(tmp);   /* left by a run killed while saving */
    if (mkdir(tmp, 0755) != 0) return td_fail(err, "%s: cannot create the checkpoint folder: %s", tmp, strerror(errno));
    snprintf(path, sizeof path, "%s/trainer_state.bin", tmp);
    int64_t prev = 0;
    td_runfile_get_i64(R->rf, "checkpoint_step", &prev, NULL);
    /* the trainer's state and, under merge-unmerge, the drifted LoRA base (rl/sync.c) */
    if (td_trainer_save_state(R->tr, path, err) || rl_sync_save(R, tmp, err) ||
        td_trainer_save(R->tr, tmp, TD_DT_F32, R->o->command_line ? R->o->command_line : "tidal-rl", err) ||
        write_trainer_state(R, tmp, steps, err)) {
        remove_checkpoint_dir(tmp);
        return -1;
    }
    remove_checkpoint_dir(dir);   /* stale (a run killed after the rename), or this step's state saved again */
    if (rename(tmp, dir) != 0) {
        td_fail(err, "%s: cannot rename to %s: %s", tmp, dir, strerror(errno));
        remove_checkpoint_dir(tmp);
        return -1;
    }
    /* a failed commit leaves both folders, whole: the run file names one of them (the new one
     * when the commit's journal stayed behind and the next open finishes it) */
    if (td_runfile_set_i64(R->rf, "checkpoint_step", steps, err) || td_runfile_flush(R->rf, err)) return -1;
    (void)prev;
    if (R->o->save_total_limit > 0) {   /* HF's save_total_limit: the oldest go */
        long long *ks;
        size_t n = list_checkpoints(R->o->output_dir, &ks);
        for (size_t i = 0; i + (size_t)R->o->save_total_limit < n; i++) {
            if (ks[i] == steps) continue;
            snprintf(dir, sizeof dir, "%s/checkpoint-%lld", R->o->output_dir, ks[i]);
            remove_checkpoint_dir(dir);
        }
        free(ks);
    }
    return 0;
}

int rl_file_finish(rl_run *R, int steps_done, int stopped, td_error *err)
{
    int cs = td_collapse_first(R->det, TD_CLP_REWARD);
    if (td_runfile_set_i64(R->rf, "steps_done", steps_done, err) ||
        td_runfile_set_i64(R->rf, "finished", steps_done >= R->total_steps || stopped, err) ||
        td_runfile_set_i64(R->rf, "stopped_on_collapse", stopped, err) ||
        td_runfile_set_i64(R->rf, "collapse_step", cs, err) ||
        td_runfile_set_str(R->rf, "collapse_cause", cs >= 0 ? "reward_drop" : "", err))
        return -1;
    for (int i = 0; i < TD_CLP_NSIGNALS; i++) {
        char name[64];
        snprintf(name, sizeof name, "first_%s", td_collapse_signal_names[i]);
        if (td_runfile_set_i64(R->rf, name, td_collapse_first(R->det, (td_collapse_signal)i), err)) return -1;
    }
    return td_runfile_flush(R->rf, err);
}
