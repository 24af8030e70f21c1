/* tidal-postmortem: find the root of an RL collapse in a run folder (HF Trainer / TRL, verl,
 * tidal-rl), or check a set-up before a run (--preflight).
 *
 *  1. the run's own curves (include/tidal/postmortem.h: rl.h5, trainer_state.json, JSON lines,
 *     TensorBoard) under the trainers' names; tidal's collapse detector and the post-mortem's
 *     precursor rules over them: the drop, its onset, each precursor with its step and rule;
 *  2. the checkpoints measured: tidal-diff on --max-prompts prompts of --dataset-path at the run's
 *     completion length, in the run's recipes and in the FP16 counterfactual (fp16 on both paths),
 *     one run file per checkpoint and pair under OUT/diffs/ (finished ones are kept: the same
 *     command resumes); under LoRA what a bf16 / fp16 engine's merged copy keeps of the adapter;
 *  3. OUT/report.md (curves and measurements on one step axis, a verdict table worded as
 *     evidence, what to try next ranked by it, the thresholds and their sources), PNG figures,
 *     OUT/postmortem.json (what --json prints).
 */
#include "tidal/analysis.h"
#include "tidal/checkpoint.h"
#include "tidal/dataset.h"
#include "tidal/diff.h"
#include "tidal/opts.h"
#include "tidal/postmortem.h"
#include "tidal/render.h"
#include "tidal/rng.h"
#include "tidal/runfile.h"
#include "tidal/seqset.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define PROG "tidal-postmortem"
#define MAX_CK 64

typedef struct {
    const char *run_dir, *out_dir, *model, *dataset, *train_recipe, *rollout_recipe, *checkpoints, *collapse_spec;
    const char *adapter, *device;
    int max_checkpoints, max_prompts, max_completion, lora_sync, json, no_measure, preflight, lora_r;
    double lora_alpha, lr;
    unsigned long long seed;
    char *command;
    const volatile sig_atomic_t *stop;
} pm_opts;

/* one diff's numbers */
typedef struct {
    int ok;
    char file[4400];
    size_t tokens, seqs;
    double mean, p99, max, k3, kl, seq_abs_mean, seq_abs_max, seq_ess, tok_ess, is_mean, chi2;
} pm_diff;

/* what an engine's merged copy keeps of an adapter (pm_lora.c) */
typedef struct { double surv, aligned, changed; } pm_keep;

typedef struct {
    int64_t step;
    const td_pm_checkpoint *ck;
    pm_diff run, fp16;
    pm_keep keep, keep16;   /* NaN: not an adapter */
    pm_keep upd, upd16;     /* the update since the checkpoint before (prev_step) as the engine copy sees it */
    int64_t prev_step;      /* -1: no adapter checkpoint before this one */
} pm_meas;

static int is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static int is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

/* fp16's counterpart of a recipe name: the engine's own family where there is one */
static const char *fp16_of(const char *name, int train)
{
    static const char *const pairs[][2] = {{"bf16-train", "fp16-train"}, {"bf16-autocast", "fp16-train"},
                                           {"bf16-infer", "fp16-infer"}, {"vllm-bf16", "vllm-fp16"},
                                           {"sglang-bf16", "sglang-fp16"}, {"fp8-rollout", "fp16-infer"},
                                           {"vllm-fp8", "vllm-fp16"}, {"vllm-fp8-per-token", "vllm-fp16"}};
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++)
        if (!strcmp(name, pairs[i][0]) || !strcmp(name, pairs[i][1])) return pairs[i][1];
    return train ? "fp16-train" : "fp16-infer";
}

/* ---------------------------------------------------------------- prompts */

/* --max-prompts records of the dataset, drawn without replacement by the seed, written as
 * tidal-diff's prompts (a built-in task's record as {"text"}: tokenised as tidal-rl and tidal-sft
 * tokenise it; TRL's prompt/messages as they are) */
static int write_prompts(const pm_opts *o, const char *path, size_t *n_out, td_error *err)
{
    td_record *recs;
    size_t n;
    if (td_records_read(o->dataset, &recs, &n, err)) return -1;
    if (!n) { td_records_free(recs, n); return td_fail(err, "%s: no records", o->dataset); }
    size_t *idx = td_xmalloc(n * sizeof *idx), k = (size_t)o->max_prompts < n ? (size_t)o->max_prompts : n;
    for (size_t i = 0; i < n; i++) idx[i] = i;
    td_rng g;
    td_rng_seed(&g, o->seed);
    for (size_t i = 0; i < k; i++) {
        size_t j = i + (size_t)td_rng_below(&g, n - i), t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
    }
    FILE *f = fopen(path, "w");
    if (!f) { free(idx); td_records_free(recs, n); return td_fail(err, "%s: cannot create: %s", path, strerror(errno)); }
    int rc = 0;
    for (size_t i = 0; i < k && !rc; i++) {
        json_t *r = recs[idx[i]].obj, *out = json_object();
        json_t *p = json_object_get(r, "prompt"), *m = json_object_get(r, "messages"), *task = json_object_get(r, "task");
        if (task && json_is_string(p)) json_object_set(out, "text", p);
        else if (p) json_object_set(out, "prompt", p);
        else if (m) json_object_set(out, "messages", m);
        else rc = td_fail(err, "%s:%ld: no \"prompt\" or \"messages\" (TRL's dataset shapes)", o->dataset, recs[idx[i]].line);
        if (!rc) {
            char *s = json_dumps(out, JSON_COMPACT);
            fprintf(f, "%s\n", s);
            free(s);
        }
        json_decref(out);
    }
    if (fclose(f) != 0 && !rc) rc = td_fail(err, "%s: cannot write: %s", path, strerror(errno));
    free(idx);
    td_records_free(recs, n);
    *n_out = k;
    return rc;
}

/* the prompts as token ids through tok_dir's tokenizer (so that checkpoints without one, and
 * adapters, are diffed on the same ids) */
static int tokenize_prompts(const char *tok_dir, const char *in, const char *out, td_error *err)
{
    char cp[4400];
    snprintf(cp, sizeof cp, "%s/config.json", tok_dir);
    td_config cfg;
    if (td_config_parse(cp, &cfg, err)) return -1;
    td_seqset s;
    if (td_seqset_from_prompts(&s, tok_dir, in, cfg.vocab_size, cfg.max_position > 0 ? cfg.max_position : 1 << 20, err))
        return -1;
    FILE *f = fopen(out, "w");
    if (!f) { td_seqset_free(&s); return td_fail(err, "%s: cannot create: %s", out, strerror(errno)); }
    for (int i = 0; i < s.n; i++) {
        fputs("{\"tokens\": [", f);
        for (int t = 0; t < s.plen[i]; t++) fprintf(f, t ? ", %d" : "%d", s.tok[i][t]);
        fputs("]}\n", f);
    }
    td_seqset_free(&s);
    return fclose(f) == 0 ? 0 : td_fail(err, "%s: cannot write: %s", out, strerror(errno));
}

/* ---------------------------------------------------------------- measuring */

static void summarise(const char *path, pm_diff *d)
{
    td_run run;
    td_error err;
    d->ok = 0;
    if (td_run_load(&run, path, 0, &err)) { fprintf(stderr, PROG ": %s\n", err.msg); return; }
    size_t n = 0;
    double *a = td_xmalloc((run.n ? run.n : 1) * sizeof *a), *k3 = td_xmalloc((run.n ? run.n : 1) * sizeof *k3);
    for (size_t i = 0; i < run.n; i++)
        if (!run.is_prompt[i]) { a[n] = fabs(run.dlogp[i]); k3[n] = run.k3[i]; n++; }
    td_summary s, s3;
    td_summary_compute(a, n, &s);
    td_summary_compute(k3, n, &s3);
    td_verl_metrics v;
    td_verl_metrics_compute(&run, &v);
    double *lw;
    size_t nw;
    td_is_raw rs = {0}, rt = {0};
    if (!td_is_log_weights(&run, TD_IS_SEQUENCE, &lw, &nw)) {
        td_is_raw_stats(lw, nw, TD_IS_SEQUENCE, &rs);
        double m = 0, mx = 0;
        for (size_t i = 0; i < nw; i++) { m += fabs(lw[i]); if (fabs(lw[i]) > mx) mx = fabs(lw[i]); }
        d->seq_abs_mean = nw ? m / nw : NAN;
        d->seq_abs_max = mx;
        free(lw);
    }
    if (!td_is_log_weights(&run, TD_IS_TOKEN, &lw, &nw)) { td_is_raw_stats(lw, nw, TD_IS_TOKEN, &rt); free(lw); }
    d->tokens = n;
    d->seqs = run.nseq;
    d->mean = s.mean; d->p99 = s.p99; d->max = s.max; d->k3 = s3.mean; d->kl = v.kl;
    d->seq_ess = rs.ess_frac; d->tok_ess = rt.ess_frac; d->is_mean = rt.w_mean; d->chi2 = rt.chi2;
    d->ok = n > 0;
    free(a);
    free(k3);
    td_run_free(&run);
}

/* one tidal-diff of a checkpoint in a recipe pair; an existing file is resumed (or, finished,
 * just read) */
static int diff_one(const pm_opts *o, const char *model_dir, const char *lora_dir, const char *prompts, const char *ra,
                    const char *rb, const char *out, pm_diff *d, td_error *err)
{
    td_diff_opts D = {.model_dir = model_dir, .prompts_path = prompts, .out_path = out, .recipe_a_arg = ra,
                      .recipe_b_arg = rb, .max_new_tokens = o->max_completion, .batch = 8, .shard_n = 1,
                      .stop_at_eos = 1, .sampling = td_sampling_default(), .seed = o->seed, .lora_dir = lora_dir,
                      .command_line = o->command, .stop = o->stop, .rollout_logprobs = "raw", .device = o->device};
    if (lora_dir) D.lora_merge_b = o->lora_sync ? TD_LORA_PUNICA : TD_LORA_MERGED;
    D.resume = is_file(out);
    if (td_recipe_resolve(ra, &D.recipe_a, err) || td_recipe_resolve(rb, &D.recipe_b, err)) return -1;
    td_diff_summary s;
    if (td_diff_run(&D, &s, err)) return -1;
    snprintf(d->file, sizeof d->file, "%s", out);
    summarise(out, d);
    return 0;
}

static void nan_diff(pm_diff *d) { memset(d, 0, sizeof *d); d->mean = d->p99 = d->max = d->k3 = d->kl = d->seq_abs_mean = d->seq_abs_max = d->seq_ess = d->tok_ess = d->is_mean = d->chi2 = NAN; }

/* what a bf16 (the run's engine) and an fp16 engine copy keep of an adapter */
static void survival(const char *base_dir, const char *adapter_dir, const char *prev_dir, const char *rb, pm_keep *k,
                     pm_keep *k16, pm_keep *st, pm_keep *st16)
{
    td_error err;
    td_model *m = td_model_load(base_dir, &err);
    if (!m) { fprintf(stderr, PROG ": merge survival: %s\n", err.msg); return; }
    td_lora *lo = td_lora_load(adapter_dir, &m->cfg, &err);
    td_recipe r1, r2;
    if (lo && !td_recipe_resolve(rb, &r1, &err) && !td_recipe_resolve(fp16_of(rb, 0), &r2, &err)) {
        if (td_pm_lora_survival(m, lo, &r1, &k->surv, &k->aligned, &k->changed, &err) ||
            td_pm_lora_survival(m, lo, &r2, &k16->surv, &k16->aligned, &k16->changed, &err))
            fprintf(stderr, PROG ": merge survival: %s\n", err.msg);
        td_lora *pl = prev_dir ? td_lora_load(prev_dir, &m->cfg, &err) : NULL;
        if (pl && (td_pm_lora_step_survival(m, pl, lo, &r1, &st->surv, &st->aligned, &st->changed, &err) ||
                   td_pm_lora_step_survival(m, pl, lo, &r2, &st16->surv, &st16->aligned, &st16->changed, &err)))
            fprintf(stderr, PROG ": the update since %s: %s\n", prev_dir, err.msg);
        td_lora_free(pl);
    } else {
        fprintf(stderr, PROG ": merge survival: %s\n", err.msg);
    }
    td_lora_free(lo);
    td_model_free(m);
}

/* ---------------------------------------------------------------- the report */

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *diff_json(const pm_diff *d)
{
    json_t *j = json_object();
    if (!d->ok) return j;
    json_object_set_new(j, "file", json_string(d->file));
    json_object_set_new(j, "tokens", json_integer((json_int_t)d->tokens));
    json_object_set_new(j, "sequences", json_integer((json_int_t)d->seqs));
    json_object_set_new(j, "logp_diff_mean", num(d->mean));
    json_object_set_new(j, "logp_diff_p99", num(d->p99));
    json_object_set_new(j, "logp_diff_max", num(d->max));
    json_object_set_new(j, "k3_mean", num(d->k3));
    json_object_set_new(j, "kl", num(d->kl));
    json_object_set_new(j, "seq_log_ratio_abs_mean", num(d->seq_abs_mean));
    json_object_set_new(j, "seq_log_ratio_abs_max", num(d->seq_abs_max));
    json_object_set_new(j, "seq_ess", num(d->seq_ess));
    json_object_set_new(j, "token_ess", num(d->tok_ess));
    json_object_set_new(j, "is_weight_mean", num(d->is_mean));
    json_object_set_new(j, "chi2_token", num(d->chi2));
    return j;
}

static const char *fmtg(char *buf, size_t n, double v)
{
    if (!isfinite(v)) snprintf(buf, n, "n/a");
    else snprintf(buf, n, "%.3g", v);
    return buf;
}

/* one line plot of a log key against the step, a ring at the drop */
static void plot_keys(const td_pm_curves *c, const td_pm_events *e, const char *const *keys, size_t nkeys, const char *title,
                      int log_y, const char *path, td_font *font, const char *cmd, json_t *figs)
{
    td_line L[8];
    double *x[8], *y[8];
    size_t nl = 0;
    for (size_t k = 0; k < nkeys && nl < 8; k++) {
        int col = td_pm_key(c, keys[k]);
        if (col < 0) continue;
        x[nl] = td_xmalloc(c->n * sizeof(double));
        y[nl] = td_xmalloc(c->n * sizeof(double));
        size_t m = 0;
        int marker = -1;
        for (size_t i = 0; i < c->n; i++) {
            double v = c->v[(size_t)col * c->n + i];
            if (!isfinite(v)) continue;
            if (marker < 0 && e->onset_step >= 0 && c->step[i] >= e->onset_step) marker = (int)m;
            x[nl][m] = (double)c->step[i];
            y[nl][m] = v;
            m++;
        }
        if (!m) { free(x[nl]); free(y[nl]); continue; }
        L[nl] = (td_line){keys[k], x[nl], y[nl], m, (int)nl, 0, marker, 0};
        nl++;
    }
    if (nl) {
        td_lines_opts lo = {title, e->onset_step >= 0 ? "ring: the drop's onset" : NULL, "step", NULL, log_y};
        td_canvas *cv = td_plot_lines(L, nl, font, &lo);
        const char *kv[] = {"command_line", cmd};
        td_error err;
        if (cv && !td_canvas_write_png(cv, path, kv, 1, &err)) {
            const char *base = strrchr(path, '/');
            json_array_append_new(figs, json_string(base ? base + 1 : path));
        }
        td_canvas_free(cv);
    }
    for (size_t i = 0; i < nl; i++) { free(x[i]); free(y[i]); }
}

typedef struct {
    const char *name, *question;
    char for_[400], against[400], reading[16];
    int64_t first;   /* the step of its earliest evidence, for ranking */
    const char *next;
} hypothesis;

static const td_pm_event *first_event(const td_pm_events *e, const char *name)
{
    for (size_t i = 0; i < e->n_ev; i++)
        if (!strcmp(e->ev[i].name, name)) return &e->ev[i];
    return NULL;
}

static int before_onset(const td_pm_events *e, const td_pm_event *v)
{
    return v && (e->onset_step < 0 || v->step <= e->onset_step);
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    pm_opts o = {.max_checkpoints = 4, .max_prompts = 16, .max_completion = 0, .seed = 0, .lora_alpha = 0, .lr = 1e-5};
    int sync = 0;
    const char *operands[1] = {NULL};
    td_opt opts[] = {
        TD_OPT_S("output-dir", 'o', &o.out_dir, "DIR", "where report.md, the figures, postmortem.json and diffs/ go\n(default RUN_DIR/postmortem)"),
        TD_OPT_F("json", 0, &o.json, 1, "print postmortem.json on stdout"),
        TD_OPT_S("model", 0, &o.model, "DIR", "the base model (default: adapter_config.json's\nbase_model_name_or_path when it is a local folder;\ntidal-rl's model_path)"),
        TD_OPT_S("dataset-path", 0, &o.dataset, "FILE", "prompts to measure on (TRL's shapes; default: tidal-rl's)"),
        TD_OPT_S("checkpoints", 0, &o.checkpoints, "STEPS", "comma-separated checkpoint steps to measure (default:\nthe first, the last ones before the drop, those after\nit, evenly spaced otherwise)"),
        TD_OPT_I("max-checkpoints", 0, &o.max_checkpoints, "N", 0, MAX_CK, "checkpoints measured by default (default 4; 0 = curves only)"),
        TD_OPT_I("max-prompts", 0, &o.max_prompts, "N", 1, 1 << 20, "prompts sampled from the dataset (default 16)"),
        TD_OPT_I("max-completion-length", 0, &o.max_completion, "N", 1, 1 << 20, "tokens generated per prompt (default: tidal-rl's, else 128)"),
        TD_OPT_S("train-recipe", 0, &o.train_recipe, "NAME|FILE", "the trainer's recipe (default: tidal-rl's, else bf16-train)"),
        TD_OPT_S("rollout-recipe", 0, &o.rollout_recipe, "NAME|FILE", "the engine's recipe (default: tidal-rl's, else vllm-bf16)"),
        TD_OPT_C("lora-sync", 0, &sync, "merged|adapter", "how the engine ran the adapter: merged weights (TRL,\nverl; default) or vLLM's LoRA kernels. TRL's\nmerge-unmerge drift cannot be rebuilt from saved\nadapters: use merged"),
        TD_OPT_DEVICE(&o.device),
        TD_OPT_F("no-measure", 0, &o.no_measure, 1, "curves and events only (no checkpoint is diffed)"),
        TD_OPT_S("collapse", 0, &o.collapse_spec, "K=V,...", "detector thresholds (tidal-rl's --collapse fields)"),
        TD_OPT_U("seed", 0, &o.seed, "S", "prompt sampling and generation seed (default 0)"),
        TD_OPT_F("preflight", 0, &o.preflight, 1, "before a run: --model (+ --lora-adapter or --lora-r,\n--lora-alpha, --learning-rate) and --dataset-path give\nthe step-0 mismatch, its FP16 counterfactual and what an\nengine copy keeps of LoRA's first updates; no RUN_DIR"),
        TD_OPT_S("lora-adapter", 0, &o.adapter, "DIR", "--preflight: a PEFT adapter to start from"),
        TD_OPT_I("lora-r", 0, &o.lora_r, "R", 0, 4096, "--preflight: the LoRA rank to be trained"),
        TD_OPT_D("lora-alpha", 0, &o.lora_alpha, "A", 0, 1e9, "--preflight: lora_alpha (default 2 x r)"),
        TD_OPT_D("learning-rate", 0, &o.lr, "LR", 0, 10, "--preflight: the run's learning rate (default 1e-5)"),
        {0}};
    td_cli cli = {PROG, "RUN_DIR [options]\n--preflight --model DIR --dataset-path FILE [options]",
                  "Finds the root of an RL collapse in a run folder: HF Trainer / TRL (checkpoint-N/,\n"
                  "trainer_state.json), verl (global_step_N/, its JSON-lines or TensorBoard log) or tidal-rl.\n"
                  "The run's curves go through tidal's collapse detector under TRL's and verl's names; the\n"
                  "checkpoints are diffed in the run's recipes and in fp16; a report weighs each hypothesis.",
                  "Ctrl-C stops after the diff batch in flight; the same command continues (finished diffs are\nkept in OUT/diffs/).",
                  opts, 0, 1};
    int nargs, rc0 = td_cli_parse(&cli, argc, argv, operands, &nargs);
    /* what main allocates, freed at `out` whatever the exit */
    td_pm_curves C = {0};
    td_pm_events E = {0};
    td_pm_checkpoint *ck = NULL;
    size_t nck = 0;
    pm_meas *M = NULL;
    json_t *J = NULL, *figs = NULL;
    int status = 0;
    if (rc0 >= 0) return rc0;
    o.run_dir = nargs ? operands[0] : NULL;
    o.lora_sync = sync;
    if (!o.preflight && !o.run_dir) return td_cli_bad(&cli, "RUN_DIR", NULL, "missing (or give --preflight)");
    if (o.preflight && o.run_dir) return td_cli_bad(&cli, "--preflight", NULL, "takes no RUN_DIR: it checks a set-up before a run");
    if (o.preflight && (!o.model || !o.dataset)) return td_cli_bad(&cli, "--preflight", NULL, "needs --model DIR and --dataset-path FILE");
    if (o.adapter && o.lora_r) return td_cli_bad(&cli, "--lora-adapter", NULL, "contradicts --lora-r (an adapter has its rank)");
    if (!o.preflight && (o.adapter || o.lora_r)) return td_cli_bad(&cli, o.adapter ? "--lora-adapter" : "--lora-r", NULL, "applies to --preflight");
    if (o.lora_r && o.lora_alpha == 0) o.lora_alpha = 2.0 * o.lora_r;
    td_collapse_cfg ccfg;
    td_collapse_cfg_defaults(&ccfg);
    td_error err = {{0}};
    if (o.collapse_spec && td_collapse_cfg_parse(&ccfg, o.collapse_spec, &err)) return td_cli_bad(&cli, "--collapse", NULL, err.msg);
    o.command = td_command_line(argc, argv);
    char outd[4400];
    snprintf(outd, sizeof outd, "%s", o.out_dir ? o.out_dir : "");
    if (!o.out_dir) {
        if (o.preflight) { status = td_cli_bad(&cli, "--preflight", NULL, "needs -o DIR"); goto out; }
        snprintf(outd, sizeof outd, "%s/postmortem", o.run_dir);
    }
    o.stop = td_stop_on_signals(PROG, "diff batch");

    /* ---- the run's log and its settings ---- */
    E.drop_step = E.onset_step = -1;
    char rl_model[4096] = "", rl_data[4096] = "", rl_ra[256] = "", rl_rb[256] = "", rl_sync[32] = "";
    int rl_len = 0, rl_steps = -1;
    if (!o.preflight) {
        if (td_pm_read(o.run_dir, &C, &err) || td_pm_events_find(&C, &ccfg, &E, &err)) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            { status = 1; goto out; }
        }
        char p[4400];
        snprintf(p, sizeof p, "%s/rl.h5", o.run_dir);
        if (!strcmp(C.format, "tidal-rl")) {
            td_runfile *rf = td_runfile_open(p, 0, NULL);
            char *cfg = rf ? td_runfile_get_str(rf, "rl_config", NULL) : NULL;
            json_t *j = cfg ? json_loads(cfg, 0, NULL) : NULL;
            if (j) {
                const char *s;
                if ((s = json_string_value(json_object_get(j, "model_path")))) snprintf(rl_model, sizeof rl_model, "%s", s);
                if ((s = json_string_value(json_object_get(j, "dataset_path")))) snprintf(rl_data, sizeof rl_data, "%s", s);
                if ((s = json_string_value(json_object_get(j, "train_recipe")))) snprintf(rl_ra, sizeof rl_ra, "%s", s);
                if ((s = json_string_value(json_object_get(j, "rollout_recipe")))) snprintf(rl_rb, sizeof rl_rb, "%s", s);
                if ((s = json_string_value(json_object_get(j, "lora_sync")))) snprintf(rl_sync, sizeof rl_sync, "%s", s);
                rl_len = (int)json_integer_value(json_object_get(j, "max_completion_length"));
            }
            int64_t sd = -1;
            if (rf && !td_runfile_get_i64(rf, "steps_done", &sd, NULL)) rl_steps = (int)sd;
            json_decref(j);
            free(cfg);
            if (rf) td_runfile_close(rf, NULL);
        }
        if (td_pm_checkpoints(o.run_dir, &ck, &nck, &err)) { fprintf(stderr, PROG ": %s\n", err.msg); { status = 1; goto out; } }
        /* tidal-rl's final policy */
        snprintf(p, sizeof p, "%s/model", o.run_dir);
        if (!strcmp(C.format, "tidal-rl") && is_dir(p) && rl_steps > 0) {
            int have = 0;
            for (size_t i = 0; i < nck; i++) have |= ck[i].step == rl_steps && !ck[i].unreadable;
            char q[4500];
            snprintf(q, sizeof q, "%s/adapter_config.json", p);
            int ad = is_file(q);
            snprintf(q, sizeof q, "%s/config.json", p);
            if (!have && (ad || is_file(q))) {
                ck = td_xrealloc(ck, (nck + 1) * sizeof *ck);
                ck[nck] = (td_pm_checkpoint){rl_steps, strdup(p), ad, strdup(""), NULL};
                nck++;
            }
        }
    }
    if (!o.model && rl_model[0]) o.model = rl_model;
    if (!o.dataset && rl_data[0]) o.dataset = rl_data;
    if (!o.train_recipe) o.train_recipe = rl_ra[0] ? rl_ra : "bf16-train";
    if (!o.rollout_recipe) o.rollout_recipe = rl_rb[0] ? rl_rb : "vllm-bf16";
    if (!o.max_completion) o.max_completion = rl_len > 0 ? rl_len : 128;
    if (rl_sync[0] && !strcmp(rl_sync, "adapter")) o.lora_sync = 1;
    const char *ra16 = fp16_of(o.train_recipe, 1), *rb16 = fp16_of(o.rollout_recipe, 0);

    /* ---- which checkpoints ---- */
    size_t pick[MAX_CK], npick = 0;
    if (!o.preflight && !o.no_measure) {
        if (o.checkpoints) {
            char buf[1024];
            snprintf(buf, sizeof buf, "%s", o.checkpoints);
            for (char *t = strtok(buf, ","); t && npick < MAX_CK; t = strtok(NULL, ",")) {
                char *end;
                long long s = strtoll(t, &end, 10);
                size_t i = 0;
                while (i < nck && ck[i].step != s) i++;
                if (*end || i == nck) {
                    fprintf(stderr, PROG ": --checkpoints: no checkpoint at step %s in %s (it has:", t, o.run_dir);
                    for (size_t j = 0; j < nck; j++) fprintf(stderr, " %lld", (long long)ck[j].step);
                    fprintf(stderr, ")\n");
                    { status = 2; goto out; }
                }
                if (ck[i].unreadable) { fprintf(stderr, PROG ": %s: %s\n", ck[i].dir, ck[i].unreadable); { status = 1; goto out; } }
                pick[npick++] = i;
            }
        } else {
            npick = td_pm_pick(ck, nck, E.onset_step, (size_t)o.max_checkpoints, pick);
        }
    }
    if (npick && !o.dataset) {
        fprintf(stderr, PROG ": the checkpoints are measured on prompts: give --dataset-path FILE (the run's dataset, "
                "TRL's shapes), or --no-measure for the curves only\n");
        { status = 2; goto out; }
    }
    /* the base model of adapters */
    int any_adapter = 0;
    for (size_t i = 0; i < npick; i++) any_adapter |= ck[pick[i]].adapter;
    if (any_adapter && !o.model) {
        const char *b = "";
        for (size_t i = 0; i < npick; i++) if (ck[pick[i]].adapter) b = ck[pick[i]].base;
        if (b[0] && is_dir(b)) o.model = b;
        else {
            fprintf(stderr, PROG ": the checkpoints are LoRA adapters of '%s', which is not a local folder: give "
                    "--model DIR (the base checkpoint)\n", b[0] ? b : "(no base_model_name_or_path)");
            { status = 2; goto out; }
        }
    }
    if (td_make_parent_dirs(outd, &err) || (mkdir(outd, 0755) != 0 && errno != EEXIST)) {
        fprintf(stderr, PROG ": %s: cannot create: %s\n", outd, err.msg[0] ? err.msg : strerror(errno));
        { status = 1; goto out; }
    }

    /* ---- measuring ---- */
    M = td_xcalloc(npick + 1, sizeof *M);
    size_t nm = 0;
    int rc = 0;
    char prompts[4600], tokens[4600];
    snprintf(prompts, sizeof prompts, "%s/prompts.jsonl", outd);
    snprintf(tokens, sizeof tokens, "%s/prompt_tokens.jsonl", outd);
    size_t nprompts = 0;
    double t_start = omp_get_wtime();
    if (npick || o.preflight) {
        const char *tok_dir = o.model;
        for (size_t i = 0; !tok_dir && i < npick; i++) {
            char q[4500];
            snprintf(q, sizeof q, "%s/tokenizer.json", ck[pick[i]].dir);
            if (!ck[pick[i]].adapter && is_file(q)) tok_dir = ck[pick[i]].dir;
        }
        if (!tok_dir) {
            fprintf(stderr, PROG ": no tokenizer.json in the checkpoints: give --model DIR (the base, with its tokenizer)\n");
            { status = 2; goto out; }
        }
        if (write_prompts(&o, prompts, &nprompts, &err) || tokenize_prompts(tok_dir, prompts, tokens, &err)) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            { status = 1; goto out; }
        }
        char dd[4600];
        snprintf(dd, sizeof dd, "%s/diffs", outd);
        mkdir(dd, 0755);
        size_t total = o.preflight ? 1 : npick;
        fprintf(stderr, PROG ": measuring %zu %s x 2 recipe pairs (%s/%s and %s/%s) on %zu prompts x %d tokens\n", total,
                o.preflight ? "starting point" : "checkpoints", o.train_recipe, o.rollout_recipe, ra16, rb16, nprompts,
                o.max_completion);
        {   /* the scale of the work, before it starts: the model's size; the ETA follows the first checkpoint */
            char cp[4400];
            snprintf(cp, sizeof cp, "%s/config.json", tok_dir);
            td_config mc;
            if (!td_config_parse(cp, &mc, NULL)) {
                double np = (double)td_config_param_elems(&mc);
                fprintf(stderr, PROG ": %.3g parameters: %d sequences of up to %d new tokens per diff, %zu diffs; tidal-diff "
                        "holds the weights as stored plus each recipe's prepared copies (about %.2g GiB at bf16), and on this "
                        "CPU an 8B model takes minutes per prompt (--max-prompts, --device cuda)\n",
                        np, (int)nprompts, o.max_completion, 2 * total, 3.0 * 2.0 * np / (1u << 30));
            }
        }
        for (size_t i = 0; i < total && !rc; i++) {
            pm_meas *m = &M[nm];
            nan_diff(&m->run);
            nan_diff(&m->fp16);
            m->keep = m->keep16 = m->upd = m->upd16 = (pm_keep){NAN, NAN, NAN};
            m->prev_step = -1;
            const char *model_dir, *lora_dir = NULL;
            if (o.preflight) {
                m->step = 0;
                model_dir = o.model;
                lora_dir = o.adapter;
            } else {
                m->ck = &ck[pick[i]];
                m->step = m->ck->step;
                model_dir = m->ck->adapter ? o.model : m->ck->dir;
                lora_dir = m->ck->adapter ? m->ck->dir : NULL;
            }
            char f1[4800], f2[4800];
            snprintf(f1, sizeof f1, "%s/step-%lld-%s.h5", dd, (long long)m->step, "run");
            snprintf(f2, sizeof f2, "%s/step-%lld-%s.h5", dd, (long long)m->step, "fp16");
            double t0 = omp_get_wtime();
            if (diff_one(&o, model_dir, lora_dir, tokens, o.train_recipe, o.rollout_recipe, f1, &m->run, &err) ||
                diff_one(&o, model_dir, lora_dir, tokens, ra16, rb16, f2, &m->fp16, &err)) {
                rc = 1;
                break;
            }
            const char *prev_dir = NULL;
            if (!o.preflight && pick[i] > 0 && ck[pick[i] - 1].adapter && !ck[pick[i] - 1].unreadable) {
                prev_dir = ck[pick[i] - 1].dir;
                m->prev_step = ck[pick[i] - 1].step;
            }
            if (lora_dir) survival(o.model, lora_dir, prev_dir, o.rollout_recipe, &m->keep, &m->keep16, &m->upd, &m->upd16);
            nm++;
            double per = omp_get_wtime() - t0;
            fprintf(stderr, PROG ": checkpoint %zu/%zu (step %lld) measured in %.0f s; ETA %.0f s\n", i + 1, total,
                    (long long)m->step, per, per * (double)(total - i - 1));
        }
        if (rc) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            if (*o.stop) {
                td_stop_print_command(PROG, "continue (finished diffs are kept)", argc, argv, NULL, NULL);
                { status = TD_EXIT_STOPPED; goto out; }
            }
            { status = 1; goto out; }
        }
    }

    /* ---- LoRA projection (preflight) ---- */
    pm_keep proj[3][2];
    int nproj = 0;
    static const int PSTEPS[3] = {1, 10, 100};
    if (o.preflight && o.lora_r) {
        td_model *base = td_model_load(o.model, &err);
        td_recipe r1, r2;
        if (!base || td_recipe_resolve(o.rollout_recipe, &r1, &err) || td_recipe_resolve(rb16, &r2, &err)) {
            fprintf(stderr, PROG ": %s\n", err.msg);
            { status = 1; goto out; }
        }
        for (int s = 0; s < 3; s++) {
            pm_keep *a = &proj[s][0], *b = &proj[s][1];
            if (td_pm_lora_projected(base, &base->cfg, o.lora_r, o.lora_alpha, o.lr, PSTEPS[s], o.seed, &r1, &a->surv, &a->aligned,
                                     &a->changed, &err) ||
                td_pm_lora_projected(base, &base->cfg, o.lora_r, o.lora_alpha, o.lr, PSTEPS[s], o.seed, &r2, &b->surv, &b->aligned,
                                     &b->changed, &err)) {
                fprintf(stderr, PROG ": %s\n", err.msg);
                { status = 1; goto out; }
            }
            nproj++;
        }
        td_model_free(base);
    }

    /* ---- the verdict ---- */
    hypothesis H[6] = {
        {"mismatch", "did the training/inference mismatch rise before the reward fell?", "", "", "", -1,
         "an importance-sampling correction (tidal-rl --is-correction token-tis / seq-mis; TRL "
         "vllm_importance_sampling_correction; verl rollout_corr), or fp16 on both paths (compare the fp16 columns)"},
        {"adapter_rounding", "were the adapter's updates rounded away in the engine's weights?", "", "", "", -1,
         "sync the adapter natively (vLLM's LoRA kernels; tidal-rl --lora-sync adapter models it) or keep the engine's weights in fp16/fp32"},
        {"entropy", "did the policy's entropy collapse or explode first?", "", "", "", -1,
         "a lower learning rate, a smaller clip range, or an entropy bonus; check the temperature the trainer scores at"},
        {"learning_rate", "a gradient spike or a schedule change just before the drop?", "", "", "", -1,
         "a lower learning rate (reports/rl: at small scale the rate decided collapse before the precision did), "
         "tighter gradient clipping (max_grad_norm)"},
        {"truncation", "did completions hit the length limit (or surge towards it)?", "", "", "", -1,
         "raise max_completion_length, or mask truncated completions (TRL mask_truncated_completions)"},
        {"dead_groups", "did every group stop carrying a learning signal?", "", "", "", -1,
         "more generations per prompt, or prompts of the right difficulty (frac_reward_zero_std near 1 means no advantage)"},
    };
    /* evidence from the log */
    struct { int h; const char *ev; } map[] = {{0, "logp_diff_rise"}, {0, "is_extreme"}, {2, "entropy"}, {3, "grad_spike"},
                                               {3, "lr_change"}, {4, "length"}, {4, "length_surge"}, {5, "dead"}};
    for (size_t k = 0; k < sizeof map / sizeof *map; k++) {
        const td_pm_event *v = first_event(&E, map[k].ev);
        hypothesis *h = &H[map[k].h];
        if (v && before_onset(&E, v)) {
            size_t l = strlen(h->for_);
            snprintf(h->for_ + l, sizeof h->for_ - l, "%s%s at step %lld (%s)", l ? "; " : "", v->name, (long long)v->step, v->metric);
            if (h->first < 0 || v->step < h->first) h->first = v->step;
        } else if (v) {
            size_t l = strlen(h->against);
            snprintf(h->against + l, sizeof h->against - l, "%s%s only at step %lld, after the onset", l ? "; " : "", v->name, (long long)v->step);
        }
    }
    /* mismatch from the log: sustained, not a single-step mark (the detector's mismatch signal fires on
     * one step, and on k3 at the noise level): the median of the last 10 logged values up to the onset
     * (the end without a drop) against the median of the first 20 */
    if (!o.preflight) {
        static const char *const mk[] = {"k3_kl", "rollout_corr/k3_kl", "logp_diff_mean", "sampling/sampling_logp_difference/mean", NULL};
        int col = -1;
        for (int i = 0; mk[i] && col < 0; i++) col = td_pm_key(&C, mk[i]);
        if (col >= 0) {
            double *v = td_xmalloc((C.n ? C.n : 1) * sizeof *v);
            size_t m = 0, upto = 0;
            for (size_t i = 0; i < C.n; i++) {
                double x = C.v[(size_t)col * C.n + i];
                if (!isfinite(x)) continue;
                if (E.onset_step < 0 || C.step[i] <= E.onset_step) upto = m + 1;
                v[m++] = x;
            }
            if (m >= 4 && upto >= 2) {
                size_t nb = upto < 20 ? (upto + 1) / 2 : 20, na = upto - nb < 10 ? upto - nb : 10;
                double *w = td_xmalloc(m * sizeof *w);
                memcpy(w, v, nb * sizeof *w);
                double early = td_quantile_select(w, nb, 0.5);
                memcpy(w, v + upto - na, na * sizeof *w);
                double late = na ? td_quantile_select(w, na, 0.5) : NAN;
                free(w);
                hypothesis *h = &H[0];
                char b1[32], b2[32];
                size_t l;
                if (isfinite(late) && early > 0 && late >= 3 * early) {
                    l = strlen(h->for_);
                    snprintf(h->for_ + l, sizeof h->for_ - l, "%slogged %s: median %s over the last %zu logged steps up to the %s vs %s "
                             "over the first %zu (x%.1f)", l ? "; " : "", C.key[col], fmtg(b1, 32, late), na,
                             E.onset_step >= 0 ? "onset" : "end", fmtg(b2, 32, early), nb, late / early);
                    int64_t st = E.onset_step >= 0 ? E.onset_step : C.step[C.n - 1];
                    if (h->first < 0 || st < h->first) h->first = st;
                    /* its level against tidal's dose-response (reports/rl section 3: no harm up to k3 1.6e-2,
                     * mean |dlogp| 3.8e-2, on a 0.8M-parameter model; harm from k3 0.28, |dlogp| 0.36) */
                    int is_k3 = strstr(C.key[col], "k3") != NULL;
                    double safe = is_k3 ? 1.6e-2 : 3.8e-2;
                    if (late < safe) {
                        l = strlen(h->against);
                        snprintf(h->against + l, sizeof h->against - l, "%sits level (%s) stays below %s, where tidal's dose-response "
                                 "saw no harm (reports/rl section 3, a small model)", l ? "; " : "", fmtg(b1, 32, late),
                                 is_k3 ? "k3 1.6e-2" : "mean |dlogp| 3.8e-2");
                    }
                } else if (isfinite(late) && early > 0) {
                    l = strlen(h->against);
                    snprintf(h->against + l, sizeof h->against - l, "%slogged %s: median %s over the last %zu logged steps up to the %s vs "
                             "%s over the first %zu (x%.2f, < x3)", l ? "; " : "", C.key[col], fmtg(b1, 32, late), na,
                             E.onset_step >= 0 ? "onset" : "end", fmtg(b2, 32, early), nb, late / early);
                    if (E.onset_step >= 0 && m > upto) {   /* and after the drop: a consequence? */
                        size_t ne = m - upto < 10 ? m - upto : 10;
                        double *z = td_xmalloc(ne * sizeof *z);
                        memcpy(z, v + m - ne, ne * sizeof *z);
                        double end = td_quantile_select(z, ne, 0.5);
                        free(z);
                        l = strlen(h->against);
                        if (end >= 3 * early)
                            snprintf(h->against + l, sizeof h->against - l, "; it rose only after the onset (x%.1f over the last %zu "
                                     "logged steps): a consequence more than a cause", end / early, ne);
                    }
                }
            }
            free(v);
        }
    }
    /* mismatch from the checkpoints: before the onset against the first */
    if (nm >= 2 && M[0].run.ok) {
        double first = M[0].run.mean, before = NAN, after = NAN;
        int64_t sb = -1, sa = -1;
        for (size_t i = 1; i < nm; i++) {
            if (!M[i].run.ok) continue;
            if (E.onset_step < 0 || M[i].step <= E.onset_step) { before = M[i].run.mean; sb = M[i].step; }
            else if (sa < 0 || M[i].run.mean > after) { after = M[i].run.mean; sa = M[i].step; }   /* the largest after it */
        }
        hypothesis *h = &H[0];
        char b1[32], b2[32], b3[32];
        if (isfinite(before) && before >= 3 * first) {
            size_t l = strlen(h->for_);
            snprintf(h->for_ + l, sizeof h->for_ - l, "%smean |dlogp| %s at step %lld vs %s at step %lld (x%.1f)", l ? "; " : "",
                     fmtg(b1, 32, before), (long long)sb, fmtg(b2, 32, first), (long long)M[0].step, before / first);
            if (h->first < 0 || sb < h->first) h->first = sb;
            if (before < 3.8e-2) {
                l = strlen(h->against);
                snprintf(h->against + l, sizeof h->against - l, "%sthe checkpoints' mean |dlogp| (%s) stays below 3.8e-2, where tidal's "
                         "dose-response saw no harm (reports/rl section 3, a small model)", l ? "; " : "", fmtg(b1, 32, before));
            }
        } else if (isfinite(before)) {
            size_t l = strlen(h->against);
            snprintf(h->against + l, sizeof h->against - l, "%smean |dlogp| %s at step %lld vs %s at step %lld (x%.2f, < x3)",
                     l ? "; " : "", fmtg(b1, 32, before), (long long)sb, fmtg(b2, 32, first), (long long)M[0].step, before / first);
        }
        if (isfinite(after)) {
            size_t l = strlen(h->against);
            (void)b3;
            if (after >= 3 * first && !(isfinite(before) && before >= 3 * first))
                snprintf(h->against + l, sizeof h->against - l, "%sit rose only after the onset (x%.1f at step %lld): a consequence "
                         "more than a cause", l ? "; " : "", after / first, (long long)sa);
        }
    }
    /* adapter rounding */
    for (size_t i = 0; i < nm; i++) {
        if (!isfinite(M[i].keep.aligned)) continue;
        hypothesis *h = &H[1];
        size_t l;
        char b1[32], b2[32];
        if (M[i].keep.aligned < 0.5) {
            l = strlen(h->for_);
            snprintf(h->for_ + l, sizeof h->for_ - l, "%sstep %lld: a %s engine keeps %s of the adapter's update (fp16: %s)", l ? "; " : "",
                     (long long)M[i].step, o.rollout_recipe, fmtg(b1, 32, M[i].keep.aligned), fmtg(b2, 32, M[i].keep16.aligned));
            if (H[1].first < 0) H[1].first = M[i].step;
        } else if (i == 0 || M[i].keep.aligned >= 0.9) {
            l = strlen(h->against);
            if (l < 200)
                snprintf(h->against + l, sizeof h->against - l, "%sstep %lld: it keeps %s", l ? "; " : "", (long long)M[i].step, fmtg(b1, 32, M[i].keep.aligned));
        }
    }
    for (size_t i = 0; i < nm; i++) {   /* the updates between checkpoints, as the engine saw them */
        if (!isfinite(M[i].upd.aligned)) continue;
        hypothesis *h = &H[1];
        char b1[32], b2[32];
        size_t l;
        if (M[i].upd.aligned < 0.5) {
            l = strlen(h->for_);
            snprintf(h->for_ + l, sizeof h->for_ - l, "%sthe update from step %lld to %lld: the engine kept %s of it (fp16: %s)",
                     l ? "; " : "", (long long)M[i].prev_step, (long long)M[i].step, fmtg(b1, 32, M[i].upd.aligned),
                     fmtg(b2, 32, M[i].upd16.aligned));
            if (h->first < 0 || M[i].step < h->first) h->first = M[i].step;
        } else if (M[i].upd.aligned >= 0.9) {
            l = strlen(h->against);
            if (l < 250)
                snprintf(h->against + l, sizeof h->against - l, "%sthe update from step %lld to %lld kept %s", l ? "; " : "",
                         (long long)M[i].prev_step, (long long)M[i].step, fmtg(b1, 32, M[i].upd.aligned));
        }
    }
    for (int i = 0; i < 6; i++) {
        hypothesis *h = &H[i];
        snprintf(h->reading, sizeof h->reading, "%s", h->for_[0] ? (h->against[0] ? "mixed" : "supported") : (h->against[0] ? "against" : "no data"));
        if (!h->for_[0]) snprintf(h->for_, sizeof h->for_, "-");
        if (!h->against[0]) snprintf(h->against, sizeof h->against, i == 1 && !any_adapter ? "not a LoRA run (or no adapter measured)" : "-");
    }
    int order[6] = {0, 1, 2, 3, 4, 5};
    for (int i = 1; i < 6; i++)   /* supported first, earliest evidence first */
        for (int j = i; j > 0; j--) {
            hypothesis *a = &H[order[j - 1]], *b = &H[order[j]];
            int ka = strcmp(a->reading, "supported") ? (strcmp(a->reading, "mixed") ? 2 : 1) : 0;
            int kb = strcmp(b->reading, "supported") ? (strcmp(b->reading, "mixed") ? 2 : 1) : 0;
            int64_t fa = a->first < 0 ? INT64_MAX : a->first, fb = b->first < 0 ? INT64_MAX : b->first;
            if (kb < ka || (kb == ka && fb < fa)) { int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t; }
            else break;
        }

    /* ---- figures ---- */
    figs = json_array();
    td_font *font = td_font_open(NULL, &err);
    char fp[4800];
    if (font && !o.preflight) {
        const char *rk[] = {C.key[E.reward_col], "eval_accuracy", "reward_std"};
        snprintf(fp, sizeof fp, "%s/reward.png", outd);
        plot_keys(&C, &E, rk, 3, "reward", 0, fp, font, o.command, figs);
        const char *pk[] = {"entropy", "actor/entropy", "grad_norm", "actor/grad_norm"};
        snprintf(fp, sizeof fp, "%s/entropy_grad.png", outd);
        plot_keys(&C, &E, pk, 4, "entropy and gradient norm", 1, fp, font, o.command, figs);
        const char *mk[] = {"k3_kl", "rollout_corr/k3_kl", "logp_diff_mean", "sampling/sampling_logp_difference/mean",
                            "rollout_corr/kl", "sampling/importance_sampling_ratio/min"};
        snprintf(fp, sizeof fp, "%s/mismatch_log.png", outd);
        plot_keys(&C, &E, mk, 6, "the mismatch the run logged", 1, fp, font, o.command, figs);
        const char *lk[] = {"response_length_mean", "completions/mean_length", "response_length/mean",
                            "response_length_clip_ratio", "completions/clipped_ratio"};
        snprintf(fp, sizeof fp, "%s/length.png", outd);
        plot_keys(&C, &E, lk, 5, "completion length", 1, fp, font, o.command, figs);
        if (nm) {
            double *x = td_xmalloc(nm * sizeof(double)), *y1 = td_xmalloc(nm * sizeof(double)), *y2 = td_xmalloc(nm * sizeof(double));
            double *y3 = td_xmalloc(nm * sizeof(double)), *y4 = td_xmalloc(nm * sizeof(double));
            int mk1 = -1;
            for (size_t i = 0; i < nm; i++) {
                x[i] = (double)M[i].step;
                y1[i] = M[i].run.mean; y2[i] = M[i].fp16.mean; y3[i] = M[i].run.p99; y4[i] = M[i].fp16.p99;
                if (mk1 < 0 && E.onset_step >= 0 && M[i].step >= E.onset_step) mk1 = (int)i;
            }
            char l1[300], l2[300], l3[300], l4[300];
            snprintf(l1, sizeof l1, "mean |dlogp| %s/%s", o.train_recipe, o.rollout_recipe);
            snprintf(l2, sizeof l2, "mean |dlogp| %s/%s", ra16, rb16);
            snprintf(l3, sizeof l3, "p99 |dlogp| %s/%s", o.train_recipe, o.rollout_recipe);
            snprintf(l4, sizeof l4, "p99 |dlogp| %s/%s", ra16, rb16);
            td_line L[4] = {{l1, x, y1, nm, 0, 0, mk1, 0}, {l2, x, y2, nm, 1, 0, -1, 0}, {l3, x, y3, nm, 0, 6, -1, 0}, {l4, x, y4, nm, 1, 6, -1, 0}};
            td_lines_opts lo = {"the checkpoints measured", "solid: mean, dashed: p99; ring: the first at or after the onset", "step", "|dlogp| (nats)", 1};
            td_canvas *cv = td_plot_lines(L, 4, font, &lo);
            const char *kv[] = {"command_line", o.command};
            snprintf(fp, sizeof fp, "%s/checkpoints.png", outd);
            if (cv && !td_canvas_write_png(cv, fp, kv, 1, &err)) json_array_append_new(figs, json_string("checkpoints.png"));
            td_canvas_free(cv);
            free(x); free(y1); free(y2); free(y3); free(y4);
        }
    }
    if (font) td_font_close(font);

    /* ---- postmortem.json ---- */
    J = json_object();
    json_object_set_new(J, "command_line", json_string(o.command));
    json_object_set_new(J, "tool", json_string(PROG));
    json_object_set_new(J, "preflight", json_boolean(o.preflight));
    if (!o.preflight) {
        json_object_set_new(J, "run_dir", json_string(o.run_dir));
        json_object_set_new(J, "log_format", json_string(C.format));
        json_object_set_new(J, "log_source", json_string(C.source));
        json_object_set_new(J, "logged_steps", json_integer((json_int_t)C.n));
        json_object_set_new(J, "reward_key", json_string(C.key[E.reward_col]));
        /* the drop's step is where the reward fell (the onset); the detector confirms it later (its EMA and hold) */
        json_object_set_new(J, "reward_drop_step", E.onset_step >= 0 ? json_integer(E.onset_step) : json_null());
        json_object_set_new(J, "onset_step", E.onset_step >= 0 ? json_integer(E.onset_step) : json_null());
        json_object_set_new(J, "reward_drop_confirmed_step", E.drop_step >= 0 ? json_integer(E.drop_step) : json_null());
        json_object_set_new(J, "reward_initial", num(E.initial_reward));
        json_object_set_new(J, "reward_best_ema", num(E.best_reward));
        json_object_set_new(J, "reward_final_ema", num(E.final_reward));
        json_t *ev = json_array();
        for (size_t i = 0; i < E.n_ev; i++) {
            json_t *x = json_object();
            json_object_set_new(x, "event", json_string(E.ev[i].name));
            json_object_set_new(x, "step", json_integer(E.ev[i].step));
            json_object_set_new(x, "metric", json_string(E.ev[i].metric));
            json_object_set_new(x, "rule", json_string(E.ev[i].rule));
            json_object_set_new(x, "before_onset", json_boolean(before_onset(&E, &E.ev[i])));
            json_array_append_new(ev, x);
        }
        json_object_set_new(J, "events", ev);
        json_t *found = json_array();
        for (size_t i = 0; i < nck; i++) {
            json_t *x = json_object();
            json_object_set_new(x, "step", json_integer(ck[i].step));
            json_object_set_new(x, "dir", json_string(ck[i].dir));
            json_object_set_new(x, "adapter", json_boolean(ck[i].adapter));
            if (ck[i].unreadable) json_object_set_new(x, "unreadable", json_string(ck[i].unreadable));
            json_array_append_new(found, x);
        }
        json_object_set_new(J, "checkpoints_found", found);
    }
    json_t *cks = json_array();
    for (size_t i = 0; i < nm; i++) {
        json_t *x = diff_json(&M[i].run);
        json_object_set_new(x, "step", json_integer(M[i].step));
        json_object_set_new(x, "recipes", json_pack("[ss]", o.train_recipe, o.rollout_recipe));
        json_object_set_new(x, "fp16", diff_json(&M[i].fp16));
        json_object_set_new(json_object_get(x, "fp16"), "recipes", json_pack("[ss]", ra16, rb16));
        json_object_set_new(x, "merge_survival", num(M[i].keep.surv));
        json_object_set_new(x, "merge_aligned", num(M[i].keep.aligned));
        json_object_set_new(x, "merge_changed_frac", num(M[i].keep.changed));
        json_object_set_new(x, "merge_survival_fp16", num(M[i].keep16.surv));
        json_object_set_new(x, "merge_aligned_fp16", num(M[i].keep16.aligned));
        json_object_set_new(x, "merge_changed_frac_fp16", num(M[i].keep16.changed));
        if (M[i].prev_step >= 0) {   /* the stretch since the checkpoint before */
            json_object_set_new(x, "update_since_step", json_integer(M[i].prev_step));
            json_object_set_new(x, "update_kept", num(M[i].upd.aligned));
            json_object_set_new(x, "update_kept_fp16", num(M[i].upd16.aligned));
            json_object_set_new(x, "update_changed_frac", num(M[i].upd.changed));
        }
        json_array_append_new(cks, x);
    }
    json_object_set_new(J, "checkpoints", cks);
    if (nproj) {
        json_t *pj = json_array();
        for (int s = 0; s < nproj; s++)
            json_array_append_new(pj, json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "adam_steps", PSTEPS[s],
                                                "merge_survival", num(proj[s][0].surv), "merge_aligned", num(proj[s][0].aligned),
                                                "merge_changed_frac", num(proj[s][0].changed), "merge_survival_fp16", num(proj[s][1].surv),
                                                "merge_aligned_fp16", num(proj[s][1].aligned),
                                                "merge_changed_frac_fp16", num(proj[s][1].changed)));
        json_object_set_new(J, "lora_projection", pj);
    }
    json_t *vj = json_array();
    for (int i = 0; i < 6 && !o.preflight; i++) {
        hypothesis *h = &H[order[i]];
        json_array_append_new(vj, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "hypothesis", h->name, "question", h->question,
                                            "reading", h->reading, "for", h->for_, "against", h->against, "next", h->next));
    }
    json_object_set_new(J, "verdict", vj);
    /* preflight alarms: verl's health checks on the step-0 diff */
    json_t *alarms = json_array();
    for (size_t i = 0; i < nm && o.preflight; i++) {
        const pm_diff *d = &M[i].run;
        if (!d->ok) continue;
        char b[200];
        if (d->is_mean < 0.5 || d->is_mean > 2) { snprintf(b, sizeof b, "mean IS weight %.3g outside [0.5, 2]", d->is_mean); json_array_append_new(alarms, json_string(b)); }
        if (d->tok_ess < 0.3) { snprintf(b, sizeof b, "token ESS %.3g < 0.3", d->tok_ess); json_array_append_new(alarms, json_string(b)); }
        if (fabs(d->kl) > 0.1) { snprintf(b, sizeof b, "|kl| %.3g > 0.1", d->kl); json_array_append_new(alarms, json_string(b)); }
        if (d->chi2 > 1) { snprintf(b, sizeof b, "chi2_token %.3g > 1", d->chi2); json_array_append_new(alarms, json_string(b)); }
        if (d->seq_ess < 0.3) { snprintf(b, sizeof b, "sequence ESS %.3g < 0.3 at %d tokens", d->seq_ess, o.max_completion); json_array_append_new(alarms, json_string(b)); }
    }
    for (int s = 0; s < nproj; s++)
        if (proj[s][0].aligned < 0.5) {
            char b[240];
            snprintf(b, sizeof b, "after %d Adam step(s) a %s engine copy keeps %.3g of the adapter's update (fp16: %.3g)", PSTEPS[s],
                     o.rollout_recipe, proj[s][0].aligned, proj[s][1].aligned);
            json_array_append_new(alarms, json_string(b));
        }
    json_object_set_new(J, "alarms", alarms);
    json_object_set_new(J, "figures", figs);
    json_object_set_new(J, "seconds", json_real(omp_get_wtime() - t_start));
    snprintf(fp, sizeof fp, "%s/postmortem.json", outd);
    if (json_dump_file(J, fp, JSON_INDENT(2)) != 0) { fprintf(stderr, PROG ": %s: cannot write\n", fp); { status = 1; goto out; } }

    /* ---- report.md ---- */
    snprintf(fp, sizeof fp, "%s/report.md.tmp", outd);
    FILE *f = fopen(fp, "w");
    if (!f) { fprintf(stderr, PROG ": %s: cannot create: %s\n", fp, strerror(errno)); { status = 1; goto out; } }
    char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
    if (o.preflight) {
        fprintf(f, "# Pre-flight check of %s%s%s\n\n", o.model, o.adapter ? " + " : "", o.adapter ? o.adapter : "");
    } else {
        fprintf(f, "# Post-mortem of %s\n\n", o.run_dir);
        fprintf(f, "Read: %s (%s), %zu logged steps (%lld to %lld), %zu keys; the detector ran over the %zu with a reward "
                "(`%s`).\n\n", C.source, C.format, C.n, C.n ? (long long)C.step[0] : 0LL, C.n ? (long long)C.step[C.n - 1] : 0LL,
                C.nk, E.rows_used, C.key[E.reward_col]);
        fprintf(f, "## The drop\n\n");
        if (E.drop_step >= 0)
            fprintf(f, "The reward fell: its EMA went from a best of %s to %s (first logged value %s). The detector confirmed the "
                    "drop at step **%lld**; the final descent began at step **%lld** (onset: the first step after the last one "
                    "whose reward was within %.2g of the best EMA).\n\n",
                    fmtg(b1, 32, E.best_reward), fmtg(b2, 32, E.final_reward), fmtg(b3, 32, E.initial_reward), (long long)E.drop_step,
                    (long long)E.onset_step, 0.5 * ccfg.drop_abs);
        else
            fprintf(f, "No reward drop by the detector's rule (EMA best %s, final %s, first value %s): the rest is read as "
                    "a health check, not as causes.\n\n", fmtg(b1, 32, E.best_reward), fmtg(b2, 32, E.final_reward), fmtg(b3, 32, E.initial_reward));
        fprintf(f, "## Events, in step order\n\n| step | event | on | rule | before the onset |\n|---|---|---|---|---|\n");
        for (size_t i = 0; i < E.n_ev; i++)
            fprintf(f, "| %lld | %s | `%s` | %s | %s |\n", (long long)E.ev[i].step, E.ev[i].name, E.ev[i].metric, E.ev[i].rule,
                    before_onset(&E, &E.ev[i]) ? "yes" : "no");
        if (!E.n_ev) fprintf(f, "| - | none | | | |\n");
        fprintf(f, "\n");
    }
    if (nm) {
        fprintf(f, "## %s\n\ntidal-diff on %zu prompts of %s (seed %llu), %d tokens each, the trainer's recipe against the "
                "engine's: **%s / %s** (the run's) and **%s / %s** (the FP16 counterfactual).%s\n\n",
                o.preflight ? "The starting point measured" : "The checkpoints measured", nprompts, o.dataset, o.seed,
                o.max_completion, o.train_recipe, o.rollout_recipe, ra16, rb16,
                any_adapter || o.adapter ? (o.lora_sync ? " The engine runs the adapter as vLLM's LoRA kernels do."
                                                        : " The engine runs merged weights (TRL's merge-unmerge drift cannot be "
                                                          "rebuilt from saved adapters: `merged` stands for it).") : "");
        fprintf(f, "| step | tokens | mean \\|dlogp\\| | p99 | max | k3 | seq \\|log W\\| mean | seq ESS | fp16 mean \\|dlogp\\| | "
                "fp16 k3 | fp16 seq ESS | adapter kept (%s) | adapter kept (fp16) | last update kept (%s) | last update kept (fp16) |\n"
                "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", o.rollout_recipe, o.rollout_recipe);
        for (size_t i = 0; i < nm; i++) {
            char c1[32], c2[32], c3[32], c4[32], c5[32], c6[32];
            fprintf(f, "| %lld | %zu | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", (long long)M[i].step, M[i].run.tokens,
                    fmtg(b1, 32, M[i].run.mean), fmtg(b2, 32, M[i].run.p99), fmtg(b3, 32, M[i].run.max), fmtg(b4, 32, M[i].run.k3),
                    fmtg(b5, 32, M[i].run.seq_abs_mean), fmtg(b6, 32, M[i].run.seq_ess), fmtg(b7, 32, M[i].fp16.mean),
                    fmtg(c1, 32, M[i].fp16.k3), fmtg(c2, 32, M[i].fp16.seq_ess), fmtg(c3, 32, M[i].keep.aligned), fmtg(c4, 32, M[i].keep16.aligned),
                    fmtg(c5, 32, M[i].upd.aligned), fmtg(c6, 32, M[i].upd16.aligned));
        }
        fprintf(f, "\nAdapter kept: the share of the whole adapter's update a merged engine copy keeps (its component "
                "along the update); last update kept: the same for the update since the checkpoint before this one "
                "(the engine sees only what survives its weights' rounding).\n");
        fprintf(f, "\nEach row's run files: `diffs/step-N-run.h5`, `diffs/step-N-fp16.h5` (`tidal-report` and `tidal-heatmap` read "
                "them).\n\n");
    }
    if (!o.preflight && nck) {
        size_t bad = 0;
        for (size_t i = 0; i < nck; i++) bad += ck[i].unreadable != NULL;
        fprintf(f, "Checkpoints in the folder: %zu (%zu measured", nck, nm);
        if (bad) fprintf(f, "; %zu unreadable: %s: %s", bad, ck[0].unreadable ? ck[0].dir : "", ck[0].unreadable ? ck[0].unreadable : "see postmortem.json");
        fprintf(f, ").\n\n");
    } else if (!o.preflight) {
        fprintf(f, "The folder holds no checkpoint: only the curves could be read (HF Trainer: `save_steps`; tidal-rl: "
                "`--save-steps`).\n\n");
    }
    if (nproj) {
        fprintf(f, "## LoRA's first updates in the engine's weights (projected)\n\nAssumption: PEFT's initialisation (lora_A "
                "U(-1/sqrt(in), 1/sqrt(in)), lora_B 0) and Adam steps that move every element of lora_B by the learning rate "
                "(%.3g) in a fixed random direction; rank %d, alpha %g. Share of the update an engine copy keeps (its component along the update, <E(D(W + dW)) - E(W), dW> / |dW|^2):\n\n"
                "| Adam steps | %s | changed weights | fp16 | changed weights (fp16) |\n|---|---|---|---|---|\n",
                o.lr, o.lora_r, o.lora_alpha, o.rollout_recipe);
        for (int s = 0; s < nproj; s++)
            fprintf(f, "| %d | %s | %s | %s | %s |\n", PSTEPS[s], fmtg(b1, 32, proj[s][0].aligned), fmtg(b2, 32, proj[s][0].changed),
                    fmtg(b3, 32, proj[s][1].aligned), fmtg(b4, 32, proj[s][1].changed));
        fprintf(f, "\n");
    }
    if (o.preflight) {
        fprintf(f, "## Alarms crossed\n\n");
        size_t na = json_array_size(alarms);
        for (size_t i = 0; i < na; i++) fprintf(f, "- %s\n", json_string_value(json_array_get(alarms, i)));
        if (!na) fprintf(f, "None of verl's rollout-correction health checks (mean IS weight in [0.5, 2], ESS >= 0.3, |kl| <= 0.1, "
                         "chi2_token <= 1) is crossed at the start, and LoRA's projected updates survive the engine's rounding.\n");
        fprintf(f, "\n");
    } else {
        fprintf(f, "## Verdict (evidence, not certainty)\n\n| hypothesis | reading | for | against |\n|---|---|---|---|\n");
        for (int i = 0; i < 6; i++) {
            hypothesis *h = &H[order[i]];
            fprintf(f, "| %s: %s | **%s** | %s | %s |\n", h->name, h->question, h->reading, h->for_, h->against);
        }
        fprintf(f, "\n## What to try next, ranked by that evidence\n\n");
        int k = 1;
        for (int i = 0; i < 6; i++) {
            hypothesis *h = &H[order[i]];
            if (!strcmp(h->reading, "supported") || !strcmp(h->reading, "mixed")) fprintf(f, "%d. (%s) %s\n", k++, h->name, h->next);
        }
        if (k == 1) fprintf(f, "No hypothesis has evidence before the drop. Measure more checkpoints around it (`--checkpoints`), "
                            "and compare the run with an exact-match control (tidal-rl --exact-match) at the same learning rate.\n");
        fprintf(f, "\n");
    }
    size_t nf = json_array_size(figs);
    if (nf) {
        fprintf(f, "## Figures\n\n");
        for (size_t i = 0; i < nf; i++) fprintf(f, "![%s](%s)\n", json_string_value(json_array_get(figs, i)), json_string_value(json_array_get(figs, i)));
        fprintf(f, "\n");
    }
    char *cj = td_collapse_cfg_json(&ccfg);
    fprintf(f, "## Thresholds and their sources\n\n- tidal's collapse detector (RL.md section 5; `--collapse`): %s\n"
            "- verl's rollout-correction health checks: mean IS weight outside [0.5, 2], ESS < 0.3, |kl| > 0.1, chi2_token > 1\n"
            "- the post-mortem's own: mean completion length > 1.5x its early median for 3 logged steps; TRL's mean |logp "
            "difference| > %.0fx its early median; a checkpoint's mean |dlogp| >= 3x the first checkpoint's; an engine copy "
            "keeping < 0.5 of the adapter's update (its component along the update, tidal-rl's merge_aligned)\n\n", cj, ccfg.k3_factor);
    free(cj);
    fprintf(f, "## What these numbers do not show\n\nThe events are correlations in time on one run; a precursor before the drop "
            "is evidence, not proof, of a cause. The checkpoints are measured on %zu prompts in recipes that model the engines "
            "(the run's own kernels may differ); TRL's merge-unmerge drift and an engine's own batching are not rebuilt. A log "
            "that records a value every logging_steps gives the steps of its rows, not of the optimiser's every step.\n\n",
            nprompts);
    fprintf(f, "Made by `%s`.\n", o.command);
    int werr = fclose(f) != 0;
    char fin[4800];
    snprintf(fin, sizeof fin, "%s/report.md", outd);
    if (werr || rename(fp, fin) != 0) { fprintf(stderr, PROG ": %s: cannot write\n", fin); { status = 1; goto out; } }
    if (o.json) {
        char *s = json_dumps(J, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    } else {
        if (!o.preflight) {
            if (E.drop_step >= 0) printf(PROG ": the reward dropped at step %lld (the detector confirmed it at step %lld)\n", (long long)E.onset_step, (long long)E.drop_step);
            else printf(PROG ": no reward drop\n");
            for (int i = 0; i < 6; i++) {
                hypothesis *h = &H[order[i]];
                printf("  %-16s %-9s %s\n", h->name, h->reading, strcmp(h->for_, "-") ? h->for_ : h->against);
            }
        } else {
            size_t na = json_array_size(alarms);
            printf(PROG ": pre-flight: %zu alarm%s\n", na, na == 1 ? "" : "s");
            for (size_t i = 0; i < na; i++) printf("  %s\n", json_string_value(json_array_get(alarms, i)));
        }
        printf(PROG ": report in %s/report.md\n", outd);
    }
out:
    if (J) json_decref(J);   /* it holds figs */
    else if (figs) json_decref(figs);
    free(M);
    td_pm_checkpoints_free(ck, nck);
    td_pm_events_free(&E);
    td_pm_curves_free(&C);
    free(o.command);
    return status;
}
