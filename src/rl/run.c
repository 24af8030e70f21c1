/* tidal — the tidal-rl run (include/tidal/rl.h): setup, resume, the step loop with progress
 * and checkpoints, the end. */
#include "rl_internal.h"
#include "tidal/memplan.h"
#include "tidal/checkpoint.h"
#include "tidal/io.h"
#include "tidal/sampling.h"

#include <dirent.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

int rl_old_in_update(const td_rl_opts *o)
{
    const char *sep = getenv("TIDAL_RL_OLD_FORWARD");
    return o->loss.is_mode == TD_RLIS_NONE && !(sep && *sep && strcmp(sep, "0"));
}

static int load_inputs(rl_run *R, td_error *err)
{
    const td_rl_opts *o = R->o;
    struct stat st;
    if (stat(o->model_path, &st) != 0)
        return td_fail(err, "%s: no such checkpoint directory (--model-path: the directory does not exist)", o->model_path);
    if (!S_ISDIR(st.st_mode))
        return td_fail(err, "%s: not a directory (--model-path names a checkpoint directory: config.json, "
                       "safetensors, tokenizer.json)", o->model_path);
    char tp[4200];
    snprintf(tp, sizeof tp, "%s/tokenizer.json", o->model_path);
    R->tkz = td_tokenizer_load(tp, err);
    if (!R->tkz) return td_fail(err, "%s (tidal-rl decodes completions for the reward: the model "
                                "directory needs its tokenizer.json)", err->msg);
    if (o->chat_template && td_tokenizer_set_chat_template(R->tkz, o->chat_template, err)) return -1;
    if (rl_load_records(R, err)) return -1;
    R->prompt_ids = td_xcalloc(R->n_items, sizeof(int *));
    R->prompt_len = td_xcalloc(R->n_items, sizeof(int));
    int longest = 0;
    size_t at = 0;
    for (size_t i = 0; i < R->n_items; i++) {
        char where[4200];
        snprintf(where, sizeof where, "%s:%ld", o->dataset_path, R->items[i].line);
        if (rl_encode_prompt(R, &R->items[i], where, &R->prompt_ids[i], &R->prompt_len[i], err)) return -1;
        if (R->prompt_len[i] > longest) { longest = R->prompt_len[i]; at = i; }
    }
    if (o->eval_steps > 0) {   /* --eval-dataset-path, else the test split beside the data */
        const char *slash = strrchr(o->dataset_path, '/');
        if (o->eval_dataset_path) snprintf(R->eval_path, sizeof R->eval_path, "%s", o->eval_dataset_path);
        else if (slash) snprintf(R->eval_path, sizeof R->eval_path, "%.*s/test.jsonl", (int)(slash - o->dataset_path), o->dataset_path);
        else snprintf(R->eval_path, sizeof R->eval_path, "test.jsonl");
        if (rl_read_records(R, R->eval_path, &R->ev, err))
            return td_fail(err, "%s (--eval-steps evaluates on --eval-dataset-path, by default the test.jsonl beside "
                           "--dataset-path)", err->msg);
        if (R->ev.n == 0) return td_fail(err, "%s: no evaluation records", R->eval_path);
        R->n_eval = o->eval_max_samples > 0 && (size_t)o->eval_max_samples < R->ev.n ? (size_t)o->eval_max_samples
                                                                                  : R->ev.n;
        if (o->reward_command) {   /* scored by the command (step.c evaluate): the prompts as the run feeds them */
            R->eval_ids = td_xcalloc(R->n_eval, sizeof *R->eval_ids);
            R->eval_len = td_xcalloc(R->n_eval, sizeof *R->eval_len);
            for (size_t i = 0; i < R->n_eval; i++) {
                char w[4400];
                snprintf(w, sizeof w, "%s:%ld", R->eval_path, R->ev.items[i].line);
                if (rl_encode_prompt(R, &R->ev.items[i], w, &R->eval_ids[i], &R->eval_len[i], err)) return -1;
            }
        }
    }
    R->max_len = longest + o->max_completion_length;
    if (R->max_len > o->max_seq_length)
        return td_fail(err, "%s:%ld: the prompt's %d tokens + --max-completion-length %d exceed "
                       "--max-seq-length %d", o->dataset_path, R->items[at].line, longest,
                       o->max_completion_length, o->max_seq_length);
    R->model = td_model_load(o->model_path, err);
    if (!R->model || td_model_set_device(R->model, o->device ? o->device : "cpu", err)) return -1;
    R->V = R->model->cfg.vocab_size;
    /* the same stop set as tidal-diff: generation_config.json's list, else config.json's */
    R->n_eos = td_checkpoint_stop_ids(o->model_path, &R->model->cfg, td_tokenizer_eos_id(R->tkz), R->eos, err);
    if (R->n_eos < 0) return -1;
    if (!R->n_eos)
        return td_fail(err, "%s: no EOS token (config.json eos_token_id or tokenizer_config.json "
                       "eos_token): completions could not end", o->model_path);
    if (td_recipe_resolve(o->train_recipe, &R->rtrain, err)) return -1;
    if (td_recipe_resolve(o->exact_match ? o->train_recipe : o->rollout_recipe, &R->rroll, err)) return -1;
    return 0;
}

static int build(rl_run *R, td_error *err)
{
    const td_rl_opts *o = R->o;
    R->lc = o->loss;
    R->lc.max_completion_length = o->max_completion_length;
    if (!o->is_cap_given || !o->is_cap_low_given) {
        double lo, hi;
        td_rl_is_default_caps(R->lc.is_mode, &lo, &hi);
        if (!o->is_cap_given) R->lc.is_cap = hi;
        if (!o->is_cap_low_given) R->lc.is_cap_low = lo;
    }
    R->G = R->lc.num_generations;
    R->B = R->lc.micro_batch * R->lc.grad_accum;
    R->P = R->B / R->G;
    R->total_steps = o->max_steps > 0 ? o->max_steps : (int)ceil(o->epochs * (double)R->n_items / R->P);
    R->nlog = o->log_completions < R->B ? o->log_completions : R->B;
    td_train_opts t;
    td_train_opts_defaults(&t);
    t.lr = o->learning_rate;
    t.weight_decay = o->weight_decay;
    t.max_grad_norm = o->max_grad_norm;
    t.gradient_checkpointing = o->gradient_checkpointing;
    t.schedule = (td_lr_schedule)o->lr_schedule;
    t.max_steps = R->total_steps;
    t.warmup_ratio = o->warmup_ratio;
    t.lora_modules = o->lora_modules;
    t.freeze_router = o->freeze_router;
    t.output_router_logits = o->output_router_logits;
    t.router_aux_loss_coef = o->router_aux_loss_coef;
    t.lora_r = o->lora_r;
    t.lora_alpha = o->lora_alpha;
    t.lora_base_dtype = o->lora_r > 0 ? o->model_dtype : TD_F32;
    t.seed = o->seed;
    t.max_seq_len = R->max_len;
    t.max_tokens = R->lc.micro_batch * R->max_len;
    R->tr = td_trainer_create(R->model, &R->rtrain, &t, NULL, err);
    if (!R->tr) return -1;
    td_trainer_set_temperature(R->tr, (float)o->temperature);
    /* pi_old: with one optimiser step per batch, pi_theta's forward in the update is pi_old's, so
     * without an IS correction (which weighs the loss by pi_old / mu before the update) TRL takes
     * old_per_token_logps = per_token_logps.detach() and runs no forward of its own; tidal does the
     * same (bit for bit the separate forward's values for full fine-tuning: ppo_kl was exactly 0 in
     * every step of the MoE grid's eleven arms; under LoRA in 60 steps of a rank-1 merge-unmerge
     * run at 1e-2, every /steps column). The LoRA grids (reports/rl/lora) ran with the separate
     * forward, which differed from the update's in rare steps (ppo_kl 1e-10 to 1e-5 in 10 of the
     * 136 runs there, mostly after the run had died; the cause is not traced); TIDAL_RL_OLD_FORWARD=1
     * keeps the separate forward and reproduces them. */
    R->old_in_update = rl_old_in_update(o);
    if (!R->old_in_update) {
        R->fold = td_forward_create(td_trainer_model(R->tr), t.max_tokens, R->max_len, 0, err);
        if (!R->fold) return -1;
        td_forward_set_temperature(R->fold, (float)o->temperature);
    }
    if (rl_sync_init(R, err)) return -1;
    /* the reference: the initial weights; under LoRA the trainer's base with the adapter off
     * (PEFT's disable_adapter(): the base in --model-dtype, drifted if the sync drifts it) */
    if (R->lc.beta > 0) {
        R->fref = td_forward_create(o->lora_r > 0 ? td_trainer_model(R->tr) : R->model, t.max_tokens, R->max_len, 0, err);
        if (!R->fref || td_forward_set_recipe(R->fref, &R->rtrain, err)) return -1;
        td_forward_set_temperature(R->fref, (float)o->temperature);
    }
    R->sess = td_session_create(R->engine ? R->engine : td_trainer_model(R->tr), R->B, R->max_len, 0, err);
    if (!R->sess) return -1;
    const td_config *mc = &R->model->cfg;
    if (o->routing_replay != TD_RL_REPLAY_NONE && mc->num_experts <= 0)
        return td_fail(err, "--routing-replay %s: %s is a dense model: it has no routing to replay",
                       o->routing_replay == TD_RL_REPLAY_R2 ? "r2" : "r3", o->model_path);
    if (mc->num_experts > 0) {   /* routing observed on both paths, replayed as asked */
        R->Lm = td_config_num_moe_layers(mc);
        R->K = mc->num_experts_per_tok;
        size_t cells = (size_t)R->B * R->max_len * R->Lm * R->K;
        R->route_b = td_xmalloc(cells * sizeof(int));
        R->route_old = td_xmalloc(cells * sizeof(int));
        R->route_tok_flip = td_xmalloc((size_t)R->B * R->max_len);
        R->route_flips_l = td_xcalloc((size_t)R->Lm, sizeof(int64_t));
        R->route_routed_l = td_xcalloc((size_t)R->Lm, sizeof(int64_t));
        R->flip_rate_l = td_xcalloc((size_t)R->Lm, sizeof(double));
        td_session_set_moe_fn(R->sess, rl_moe_on_rollout, R);
        if (R->fold) td_forward_set_moe_fn(R->fold, rl_moe_on_old, R);
        if (o->routing_replay == TD_RL_REPLAY_R3) {
            if (R->fold) td_forward_set_moe_replay(R->fold, rl_moe_replay_rollout, R);
            td_trainer_set_moe_replay(R->tr, rl_moe_replay_rollout, R);
        } else if (o->routing_replay == TD_RL_REPLAY_R2 && !R->old_in_update) {
            /* R2 replays pi_old's routing in pi_theta's update; with pi_old's forward being the
             * update's own (above), the update routes itself: the same experts */
            td_trainer_set_moe_replay(R->tr, rl_moe_replay_old, R);
        }
    }
    R->smp = td_sampler_create(R->V);
    int B = R->B, L = R->max_len;
    size_t N = (size_t)B * o->max_completion_length;
    R->tok = td_xcalloc((size_t)B, sizeof(int *));
    R->mu_pos = td_xcalloc((size_t)B, sizeof(float *));
    R->old_pos = td_xcalloc((size_t)B, sizeof(float *));
    for (int s = 0; s < B; s++) {
        R->tok[s] = td_xcalloc((size_t)L, sizeof(int));
        R->mu_pos[s] = td_xcalloc((size_t)L, sizeof(float));
        R->old_pos[s] = td_xcalloc((size_t)L, sizeof(float));
    }
    R->len = td_xcalloc((size_t)B, sizeof(int));
    R->plen = td_xcalloc((size_t)B, sizeof(int));
    R->finish = td_xcalloc((size_t)B, sizeof(int));
    R->exact = td_xcalloc((size_t)B, sizeof(int));
    R->item = td_xcalloc((size_t)B, sizeof(size_t));
    R->rows_b = td_xcalloc((size_t)(R->nlog ? R->nlog : 1) * L * R->V, sizeof(float));
    R->tm = td_xcalloc((size_t)(R->nlog ? R->nlog : 1) * L, sizeof(td_token_metrics));
    R->off = td_xcalloc((size_t)B + 1, sizeof(int64_t));
    float **f[] = {&R->old, &R->mu, &R->ref, &R->mask, &R->w, &R->m};
    for (size_t i = 0; i < sizeof f / sizeof f[0]; i++) *f[i] = td_xcalloc(N, sizeof(float));
    R->reward = td_xcalloc((size_t)B, sizeof(double));
    R->adv = td_xcalloc((size_t)B, sizeof(double));
    R->coef = td_xcalloc((size_t)B, sizeof(double));
    R->det = td_collapse_new(&o->collapse);
    return 0;
}

static void teardown(rl_run *R)
{
    rl_reward_stop(R->reward_proc);   /* first: it sees EOF at once and exits while we free */
    rl_records_free(R);
    td_steplog_close(R->log, NULL);   /* every step was flushed when written */
    free(R->comp);
    /* what the backend held at most (the plan bounds it: tests/py/test_memplan_train.py) */
    if (R->rf && R->memory_plan) td_runfile_set_i64(R->rf, "memory_peak", (int64_t)td_device_mem_peak(), NULL);
    free(R->memory_plan);
    if (R->rf) td_runfile_close(R->rf, NULL);
    td_columns_free(R->tcols, TD_TOK_LOGP_TRAINER);
    td_columns_free(R->scols, TD_SEQ_TEXT_OFFSET);
    td_columns_free(R->pcols, TD_PRM_COUNT);
    for (int s = 0; R->tok && s < R->B; s++) { free(R->tok[s]); free(R->mu_pos[s]); free(R->old_pos[s]); }
    free(R->tok); free(R->mu_pos); free(R->old_pos);
    free(R->len); free(R->plen); free(R->finish); free(R->exact); free(R->item);
    free(R->rows_b); free(R->tm); free(R->off);
    free(R->old); free(R->mu); free(R->ref); free(R->mask); free(R->w); free(R->m);
    free(R->reward); free(R->adv); free(R->coef);
    td_collapse_free(R->det);
    td_sampler_free(R->smp);
    td_session_free(R->sess);
    free(R->route_b); free(R->route_old); free(R->route_tok_flip);
    free(R->route_flips_l); free(R->route_routed_l); free(R->flip_rate_l);
    rl_sync_free(R);
    td_forward_free(R->fold);
    td_forward_free(R->fref);
    td_trainer_free(R->tr);
    td_model_free(R->model);
    for (size_t i = 0; R->prompt_ids && i < R->n_items; i++) free(R->prompt_ids[i]);
    free(R->prompt_ids); free(R->prompt_len);
    if (R->items) td_task_items_free(R->items, R->n_items);
    for (size_t i = 0; R->eval_ids && i < R->n_eval; i++) free(R->eval_ids[i]);
    free(R->eval_ids); free(R->eval_len);
    rl_records_clear(&R->ev);
    td_tokenizer_free(R->tkz);
    free(R->carried_eval_path);
}

/* The final policy directory loads like the starting one: the tokenizer files beside it (TRL
 * saves the tokenizer with the model). */
static int copy_tokenizer(const char *from, const char *to, td_error *err)
{
    static const char *const FILES[] = {"tokenizer.json", "tokenizer_config.json", "generation_config.json"};
    for (size_t i = 0; i < sizeof FILES / sizeof FILES[0]; i++) {
        char a[4200], b[4400];
        snprintf(a, sizeof a, "%s/%s", from, FILES[i]);
        snprintf(b, sizeof b, "%s/%s", to, FILES[i]);
        size_t n;
        char *text = td_read_file(a, 64u << 20, &n, NULL);
        if (!text) continue;   /* absent in the source: nothing to copy */
        FILE *f = fopen(b, "wb");
        int ok = f && fwrite(text, 1, n, f) == n;
        if (f && fclose(f)) ok = 0;
        free(text);
        if (!ok) return td_fail(err, "%s: cannot write", b);
    }
    return 0;
}

static void fmt_secs(char *buf, size_t n, double s)
{
    if (!isfinite(s) || s < 0) snprintf(buf, n, "?");
    else if (s < 3600) snprintf(buf, n, "%dm%02ds", (int)s / 60, (int)s % 60);
    else snprintf(buf, n, "%dh%02dm", (int)s / 3600, ((int)s % 3600) / 60);
}

/* OUTPUT_DIR's checkpoint-K/ folders: how many, and the newest K (0: none) */
static int count_checkpoints(const char *dir, int *newest)
{
    DIR *d = opendir(dir);
    int n = 0;
    *newest = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        int k, used = 0;
        if (sscanf(e->d_name, "checkpoint-%d%n", &k, &used) != 1 || e->d_name[used] || k < 1) continue;
        n++;
        if (k > *newest) *newest = k;
    }
    if (d) closedir(d);
    return n;
}

/* The end of a finished run, on stdout (also under -q, which prints nothing else): the reward
 * at the last step and over the last ten, the last clean evaluation, what the collapse detector
 * marked (steps counted from 1, as the progress lines), and where the files are. Read back from
 * the run file, so a resume with nothing left to do says the same. */
static void print_summary(rl_run *R, int steps, int stopped)
{
    const td_rl_opts *o = R->o;
    printf("tidal-rl: %s after %d of %d steps (train %s, rollout %s)\n", stopped ? "stopped on a collapse" : "done",
           steps, R->total_steps, R->rtrain.name, o->exact_match ? R->rtrain.name : R->rroll.name);
    if (steps > 0) {
        double *col = td_xmalloc((size_t)steps * sizeof(double)), acc = NAN, mean = 0;
        int first = steps > 10 ? steps - 10 : 0, got = 0;
        if (!td_runfile_read(R->rf, "/steps/reward", TD_COL_F64, 0, steps, col, NULL)) {
            for (int i = first; i < steps; i++) mean += col[i] / (steps - first);
            td_runfile_read(R->rf, "/steps/accuracy", TD_COL_F64, steps - 1, 1, &acc, NULL);
            char acc_text[48] = "";   /* none for a --reward-command without an accuracy */
            if (isfinite(acc)) snprintf(acc_text, sizeof acc_text, " (accuracy %.3f)", acc);
            printf("  reward      %.3f at step %d%s; %.3f over steps %d-%d\n", col[steps - 1], steps, acc_text, mean,
                   first + 1, steps);
        }
        if (o->eval_steps > 0 && !td_runfile_read(R->rf, "/steps/eval_accuracy", TD_COL_F64, 0, steps, col, NULL))
            for (int i = steps - 1; i >= 0 && !got; i--)
                if (isfinite(col[i])) {
                    double rw = NAN;
                    td_runfile_read(R->rf, "/steps/eval_reward", TD_COL_F64, i, 1, &rw, NULL);
                    printf("  clean eval  accuracy %.3f, reward %.3f before step %d (%zu records, greedy, the trainer's "
                           "policy)\n", col[i], rw, i + 1, R->n_eval);
                    got = 1;
                }
        free(col);
    }
    char marks[512] = "";
    for (int i = 1; i < TD_CLP_NSIGNALS; i++) {   /* the precursors, in the detector's order */
        int at = td_collapse_first(R->det, (td_collapse_signal)i);
        size_t n = strlen(marks);
        if (at >= 0)
            snprintf(marks + n, sizeof marks - n, "%s %s at step %d", n ? "," : "; marked:", td_collapse_signal_names[i],
                     at + 1);
    }
    int drop = td_collapse_first(R->det, TD_CLP_REWARD);
    if (drop >= 0)
        printf("  collapse    yes: reward_drop from step %d%s%s\n", drop + 1,
               stopped ? " (stopped there: --stop-on-collapse)" : "", marks);
    else
        printf("  collapse    no (the reward's EMA never fell below its best by the detector's margin)%s\n", marks);
    int newest, nck = count_checkpoints(o->output_dir, &newest);
    printf("  files       %s/%s (every step: tidal-report, tidal-postmortem %s)\n", o->output_dir, TD_RL_RUNFILE,
           o->output_dir);
    if (nck) printf("              %s/checkpoint-%d/ (the newest of %d; --resume with a larger --max-steps continues from it)\n", o->output_dir,
                    newest, nck);
    printf("              %s/model/ (the final policy%s)\n", o->output_dir, o->lora_r > 0 ? ": the PEFT adapter" : "");
    if (o->report_to & TD_REPORT_TENSORBOARD)
        printf("              %s/runs/ (tensorboard --logdir %s)\n", o->output_dir, o->output_dir);
    if (o->report_to & TD_REPORT_JSONL) printf("              %s/metrics.jsonl\n", o->output_dir);
    fflush(stdout);
}

int td_rl_run(const td_rl_opts *given, td_error *err)
{
    if (td_rl_opts_check(given, err)) return -1;
    if (given->n_jobs > 0) omp_set_num_threads(given->n_jobs);
    if (given->plan_only) return rl_plan_only(given, err);
    rl_run R;
    memset(&R, 0, sizeof R);
    td_rl_opts run_opts = *given;   /* --resume: with what carries over from the run */
    const td_rl_opts *o = &run_opts;
    R.o = o;
    int rc = -1, start = 0, stopped = 0, interrupted = 0, k, dead_said = 0, drop_said = 0;
    /* the plan before the trainer is made and before the run file is touched */
    if (rl_carry_over(&R, &run_opts, err) || load_inputs(&R, err) || rl_memory_plan(&R, err) || build(&R, err) || rl_file_open(&R, &start, err)) goto done;
    /* the logs cut back to the steps rl.h5 keeps (0..start-1), then this invocation's sinks */
    if (!(R.log = td_steplog_open(o->output_dir, o->report_to, start, err))) goto done;
    if (!o->quiet && (o->report_to & TD_REPORT_TENSORBOARD))
        fprintf(stderr, "tidal-rl: TensorBoard events in %s/runs (tensorboard --logdir %s)\n", o->output_dir, o->output_dir);
    if (o->reward_command) {
        if (!(R.reward_proc = rl_reward_start(o, err))) goto done;
        R.n_comp = rl_reward_names(R.reward_proc, &R.comp_names);
        R.comp = td_xcalloc((size_t)R.B * (R.n_comp ? R.n_comp : 1), sizeof(double));
    }
    double M[TD_RLM_COUNT], t0 = omp_get_wtime();
    if (!o->quiet && start > 0)
        fprintf(stderr, start < R.total_steps ? "tidal-rl: resuming %s/%s at step %d of %d\n"
                                              : "tidal-rl: %s/%s has done its %d of %d steps: nothing to resume\n",
                o->output_dir, TD_RL_RUNFILE, start, R.total_steps);
    for (k = start; k < R.total_steps; k++) {
        if (o->stop && *o->stop) {   /* a signal: keep the steps done, resumable (opts.h, "Stopping") */
            interrupted = 1;
            break;
        }
        if (rl_step(&R, k, M, err)) {
            /* nothing of step k is in the file: it stays a run --resume continues (HF's Trainer
             * restarts from the last checkpoint the same way) */
            int64_t ck = 0;
            td_runfile_get_i64(R.rf, "checkpoint_step", &ck, NULL);
            char hint[300];
            snprintf(hint, sizeof hint, "\n  %s/%s keeps steps 0..%d; the same command with --resume continues from %s%lld",
                     o->output_dir, TD_RL_RUNFILE, k - 1, ck > 0 ? "checkpoint-" : "step ", (long long)ck);
            size_t l = strlen(err->msg);
            if (k > 0 && l + strlen(hint) < sizeof err->msg) memcpy(err->msg + l, hint, strlen(hint) + 1);
            goto done;
        }
        if (rl_file_commit(&R, k, M, err)) goto done;
        if (o->save_steps > 0 && (k + 1) % o->save_steps == 0 && k + 1 < R.total_steps &&
            rl_checkpoint_save(&R, k + 1, err))
            goto done;
        if (!o->quiet) {
            int dead = td_collapse_first(R.det, TD_CLP_DEAD);
            if (dead >= 0 && !dead_said) {   /* a run that learns nothing says so once */
                dead_said = 1;
                fprintf(stderr, "tidal-rl: dead run since step %d: %s for %d steps, so no policy gradient (grad_norm "
                        "%.3g); raise --max-completion-length, lower --learning-rate or look at the reward\n", dead + 1,
                        M[TD_RLM_response_length_clip_ratio] >= 1 ? "every completion hit --max-completion-length"
                                                                   : "every group's rewards were equal",
                        o->collapse.dead_hold, M[TD_RLM_grad_norm]);
            }
            int drop = td_collapse_first(R.det, TD_CLP_REWARD);
            if (drop >= 0 && !drop_said) {   /* the detector's collapse, said when it fires */
                drop_said = 1;
                fprintf(stderr, "tidal-rl: collapse: the reward's EMA fell below its best by the detector's margin (%.2g, or "
                        "%.0f%% of the gain) and stayed there %d steps, from step %d (reward_drop); `tidal-postmortem %s` "
                        "examines the run\n", o->collapse.drop_abs, 100 * o->collapse.drop_rel, o->collapse.hold, drop + 1,
                        o->output_dir);
            }
            double el = omp_get_wtime() - t0, per = el / (k + 1 - start);
            char eta[32], trl_kl[32] = "";
            fmt_secs(eta, sizeof eta, per * (R.total_steps - k - 1));
            if (R.lc.beta > 0) snprintf(trl_kl, sizeof trl_kl, " kl %.2e", M[TD_RLM_kl]);   /* TRL's, to the reference */
            fprintf(stderr, "tidal-rl: step %d/%d reward %.3f acc %.3f%s rollout_corr/kl %.2e k3 %.2e grad_norm %.3g "
                    "clip_ratio %.3f entropy %.3f len %.1f | %.2f s/step (rollout %.2f, reward %.2f, pi_old %.2f, "
                    "update %.2f), ETA %s\n", k + 1, R.total_steps,
                    M[TD_RLM_reward], M[TD_RLM_accuracy], trl_kl, M[TD_RLM_rollout_corr_kl], M[TD_RLM_k3_kl],
                    M[TD_RLM_grad_norm], M[TD_RLM_pg_clipfrac], M[TD_RLM_entropy], M[TD_RLM_response_length_mean],
                    per, M[TD_RLM_time_rollout], M[TD_RLM_time_reward], M[TD_RLM_time_old], M[TD_RLM_time_update], eta);
            if (isfinite(M[TD_RLM_eval_accuracy]))
                fprintf(stderr, "tidal-rl: eval before step %d: accuracy %.3f reward %.3f (%zu records, greedy, trainer's "
                        "policy)\n", k + 1, M[TD_RLM_eval_accuracy], M[TD_RLM_eval_reward], R.n_eval);
        }
        if (o->stop_on_collapse && td_collapse_first(R.det, TD_CLP_REWARD) >= 0) {
            stopped = 1;
            k++;
            if (!o->quiet)
                fprintf(stderr, "tidal-rl: collapse (reward_drop from step %d): stopping (--stop-on-collapse)\n",
                        td_collapse_first(R.det, TD_CLP_REWARD));
            break;
        }
    }
    /* the last step's state, always: --resume continues from it, and extends a finished run to
     * a larger --max-steps (HF's Trainer saves its last checkpoint the same way) */
    int64_t have = 0;
    td_runfile_get_i64(R.rf, "checkpoint_step", &have, NULL);
    if (k > have && rl_checkpoint_save(&R, k, err)) goto done;
    if (interrupted) {
        if (rl_file_finish(&R, k, 0, err)) goto done;
        if (k == 0)
            fprintf(stderr, "tidal-rl: stopped by a signal before the first step\n");
        else
            fprintf(stderr, "tidal-rl: stopped by a signal after step %d of %d; %s/checkpoint-%d and %s/%s hold "
                    "the steps done\n", k, R.total_steps, o->output_dir, k, o->output_dir, TD_RL_RUNFILE);
        rc = 2;
        goto done;
    }
    char mp[4100];
    snprintf(mp, sizeof mp, "%s/model", o->output_dir);
    /* the final model first, then the run file says finished: a run killed while the model is
     * written is one that --resume (and tidal-sweep, which skips finished runs) finishes */
    if (td_trainer_save(R.tr, mp, TD_DT_F32, o->command_line ? o->command_line : "tidal-rl", err) ||
        (o->lora_r == 0 && copy_tokenizer(o->model_path, mp, err)) ||
        rl_file_finish(&R, k, stopped, err))
        goto done;
    print_summary(&R, k, stopped);
    rc = stopped;
done:
    teardown(&R);
    if (rc >= 0) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", o->output_dir, TD_RL_RUNFILE);
        td_error e2;
        if (td_runfile_compact(path, &e2) && !o->quiet) fprintf(stderr, "tidal-rl: %s\n", e2.msg);
    }
    return rc;
}
