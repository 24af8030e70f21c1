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
#include "tidal/checkpoint.h"
#include "tidal/opts.h"
#include "tidal/postmortem.h"

#include <errno.h>
#include <jansson.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROG "tidal-postmortem"
#define MAX_CK 64

/* the options that steer the tool itself (what the post-mortem reads and measures: td_pm_setup) */
typedef struct {
    const char *out_dir, *checkpoints, *collapse_spec;
    int max_checkpoints, json, no_measure;
    char outd[4400];   /* --output-dir, or RUN_DIR/postmortem */
} pm_opts;

static int is_dir(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISDIR(st.st_mode); }
static int is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

/* ---------------------------------------------------------------- options */

/* -1: go on; else the exit status (--help, a bad option, options that contradict each other) */
static int parse_options(int argc, char **argv, pm_opts *o, td_pm_setup *s)
{
    *o = (pm_opts){.max_checkpoints = 4};
    *s = (td_pm_setup){.max_prompts = 16, .lr = 1e-5};
    const char *operands[1] = {NULL};
    td_opt opts[] = {
        TD_OPT_S("output-dir", 'o', &o->out_dir, "DIR", "where report.md, the figures, postmortem.json and diffs/ go\n(default RUN_DIR/postmortem)"),
        TD_OPT_F("json", 0, &o->json, 1, "print postmortem.json on stdout"),
        TD_OPT_S("model", 0, &s->model, "DIR", "the base model (default: adapter_config.json's\nbase_model_name_or_path when it is a local folder;\ntidal-rl's model_path)"),
        TD_OPT_S("dataset-path", 0, &s->dataset, "FILE", "prompts to measure on (TRL's shapes; default: tidal-rl's)"),
        TD_OPT_S("checkpoints", 0, &o->checkpoints, "STEPS", "comma-separated checkpoint steps to measure (default:\nthe first, the last ones before the drop, those after\nit, evenly spaced otherwise)"),
        TD_OPT_I("max-checkpoints", 0, &o->max_checkpoints, "N", 0, MAX_CK, "checkpoints measured by default (default 4; 0 = curves only)"),
        TD_OPT_I("max-prompts", 0, &s->max_prompts, "N", 1, 1 << 20, "prompts sampled from the dataset (default 16)"),
        TD_OPT_I("max-completion-length", 0, &s->max_completion, "N", 1, 1 << 20, "tokens generated per prompt (default: tidal-rl's, else 128)"),
        TD_OPT_S("train-recipe", 0, &s->train_recipe, "NAME|FILE", "the trainer's recipe (default: tidal-rl's, else bf16-train)"),
        TD_OPT_S("rollout-recipe", 0, &s->rollout_recipe, "NAME|FILE", "the engine's recipe (default: tidal-rl's, else vllm-bf16)"),
        TD_OPT_C("lora-sync", 0, &s->lora_sync, "merged|adapter", "how the engine ran the adapter: merged weights (TRL,\nverl; default) or vLLM's LoRA kernels. TRL's\nmerge-unmerge drift cannot be rebuilt from saved\nadapters: use merged"),
        TD_OPT_DEVICE(&s->device),
        TD_OPT_F("no-measure", 0, &o->no_measure, 1, "curves and events only (no checkpoint is diffed)"),
        TD_OPT_S("collapse", 0, &o->collapse_spec, "K=V,...", "detector thresholds (tidal-rl's --collapse fields)"),
        TD_OPT_U("seed", 0, &s->seed, "S", "prompt sampling and generation seed (default 0)"),
        TD_OPT_F("preflight", 0, &s->preflight, 1, "before a run: --model (+ --lora-adapter or --lora-r,\n--lora-alpha, --learning-rate) and --dataset-path give\nthe step-0 mismatch, its FP16 counterfactual and what an\nengine copy keeps of LoRA's first updates; no RUN_DIR"),
        TD_OPT_S("lora-adapter", 0, &s->adapter, "DIR", "--preflight: a PEFT adapter to start from"),
        TD_OPT_I("lora-r", 0, &s->lora_r, "R", 0, 4096, "--preflight: the LoRA rank to be trained"),
        TD_OPT_D("lora-alpha", 0, &s->lora_alpha, "A", 0, 1e9, "--preflight: lora_alpha (default 2 x r)"),
        TD_OPT_D("learning-rate", 0, &s->lr, "LR", 0, 10, "--preflight: the run's learning rate (default 1e-5)"),
        {0}};
    td_cli cli = {PROG, "RUN_DIR [options]\n--preflight --model DIR --dataset-path FILE [options]",
                  "Finds the root of an RL collapse in a run folder: HF Trainer / TRL (checkpoint-N/,\n"
                  "trainer_state.json), verl (global_step_N/, its JSON-lines or TensorBoard log) or tidal-rl.\n"
                  "The run's curves go through tidal's collapse detector under TRL's and verl's names; the\n"
                  "checkpoints are diffed in the run's recipes and in fp16; a report weighs each hypothesis.",
                  "Ctrl-C stops after the diff batch in flight; the same command continues (finished diffs are\nkept in OUT/diffs/).",
                  opts, 0, 1};
    int nargs, rc = td_cli_parse(&cli, argc, argv, operands, &nargs);
    if (rc >= 0) return rc;
    s->run_dir = nargs ? operands[0] : NULL;
    if (!s->preflight && !s->run_dir) return td_cli_bad(&cli, "RUN_DIR", NULL, "missing (or give --preflight)");
    if (s->preflight && s->run_dir) return td_cli_bad(&cli, "--preflight", NULL, "takes no RUN_DIR: it checks a set-up before a run");
    if (s->preflight && (!s->model || !s->dataset)) return td_cli_bad(&cli, "--preflight", NULL, "needs --model DIR and --dataset-path FILE");
    if (s->adapter && s->lora_r) return td_cli_bad(&cli, "--lora-adapter", NULL, "contradicts --lora-r (an adapter has its rank)");
    if (!s->preflight && (s->adapter || s->lora_r)) return td_cli_bad(&cli, s->adapter ? "--lora-adapter" : "--lora-r", NULL, "applies to --preflight");
    if (s->lora_r && s->lora_alpha == 0) s->lora_alpha = 2.0 * s->lora_r;
    td_collapse_cfg_defaults(&s->collapse);
    td_error err = {{0}};
    if (o->collapse_spec && td_collapse_cfg_parse(&s->collapse, o->collapse_spec, &err)) return td_cli_bad(&cli, "--collapse", NULL, err.msg);
    if (!o->out_dir && s->preflight) return td_cli_bad(&cli, "--preflight", NULL, "needs -o DIR");
    if (o->out_dir) snprintf(o->outd, sizeof o->outd, "%s", o->out_dir);
    else snprintf(o->outd, sizeof o->outd, "%s/postmortem", s->run_dir);
    s->command = td_command_line(argc, argv);
    return -1;
}

/* what the command line leaves out: tidal-rl's recorded settings, else the defaults */
static void fill_defaults(td_pm_setup *s, const td_pm_rl_settings *rl)
{
    if (!s->model && rl->model[0]) s->model = rl->model;
    if (!s->dataset && rl->dataset[0]) s->dataset = rl->dataset;
    if (!s->train_recipe) s->train_recipe = rl->train_recipe[0] ? rl->train_recipe : "bf16-train";
    if (!s->rollout_recipe) s->rollout_recipe = rl->rollout_recipe[0] ? rl->rollout_recipe : "vllm-bf16";
    if (!s->max_completion) s->max_completion = rl->max_completion > 0 ? rl->max_completion : 128;
    if (rl->lora_sync[0] && !strcmp(rl->lora_sync, "adapter")) s->lora_sync = 1;
    s->train16 = td_pm_fp16_of(s->train_recipe, 1);
    s->rollout16 = td_pm_fp16_of(s->rollout_recipe, 0);
}

/* ---------------------------------------------------------------- the checkpoints to measure */

/* --checkpoints' steps, else td_pm_pick's choice; indices into pm->ck. 0, or the exit status */
static int pick_checkpoints(const pm_opts *o, const td_postmortem *pm, size_t *pick, size_t *npick)
{
    const td_pm_checkpoint *ck = pm->ck;
    size_t nck = pm->nck;
    *npick = 0;
    if (pm->set.preflight || o->no_measure) return 0;
    if (!o->checkpoints) {
        *npick = td_pm_pick(ck, nck, pm->events.onset_step, (size_t)o->max_checkpoints, pick);
        return 0;
    }
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", o->checkpoints);
    for (char *t = strtok(buf, ","); t && *npick < MAX_CK; t = strtok(NULL, ",")) {
        char *end;
        long long s = strtoll(t, &end, 10);
        size_t i = 0;
        while (i < nck && ck[i].step != s) i++;
        if (*end || i == nck) {
            fprintf(stderr, PROG ": --checkpoints: no checkpoint at step %s in %s (it has:", t, pm->set.run_dir);
            for (size_t j = 0; j < nck; j++) fprintf(stderr, " %lld", (long long)ck[j].step);
            fprintf(stderr, ")\n");
            return 2;
        }
        if (ck[i].unreadable) { fprintf(stderr, PROG ": %s: %s\n", ck[i].dir, ck[i].unreadable); return 1; }
        pick[(*npick)++] = i;
    }
    return 0;
}

/* what measuring the picked checkpoints needs: prompts, and the base of adapters (default: the
 * adapters' base_model_name_or_path when it is a local folder). 0, or the exit status */
static int check_inputs(td_postmortem *pm, const size_t *pick, size_t npick)
{
    if (npick && !pm->set.dataset) {
        fprintf(stderr, PROG ": the checkpoints are measured on prompts: give --dataset-path FILE (the run's dataset, "
                "TRL's shapes), or --no-measure for the curves only\n");
        return 2;
    }
    for (size_t i = 0; i < npick; i++) pm->any_adapter |= pm->ck[pick[i]].adapter;
    if (pm->any_adapter && !pm->set.model) {
        const char *b = "";
        for (size_t i = 0; i < npick; i++) if (pm->ck[pick[i]].adapter) b = pm->ck[pick[i]].base;
        if (b[0] && is_dir(b)) pm->set.model = b;
        else {
            fprintf(stderr, PROG ": the checkpoints are LoRA adapters of '%s', which is not a local folder: give "
                    "--model DIR (the base checkpoint)\n", b[0] ? b : "(no base_model_name_or_path)");
            return 2;
        }
    }
    return 0;
}

/* OUT and its parents. 0 or 1 (err: main's, as the steps before left it) */
static int make_out_dir(const char *outd, td_error *err)
{
    if (td_make_parent_dirs(outd, err) || (mkdir(outd, 0755) != 0 && errno != EEXIST)) {
        fprintf(stderr, PROG ": %s: cannot create: %s\n", outd, err->msg[0] ? err->msg : strerror(errno));
        return 1;
    }
    return 0;
}

/* ---------------------------------------------------------------- measuring */

/* the tokenizer the prompts go through: --model's, else the first full checkpoint's with one */
static const char *tokenizer_dir(const td_postmortem *pm, const size_t *pick, size_t npick)
{
    const char *tok_dir = pm->set.model;
    for (size_t i = 0; !tok_dir && i < npick; i++) {
        const td_pm_checkpoint *ck = &pm->ck[pick[i]];
        char q[4500];
        snprintf(q, sizeof q, "%s/tokenizer.json", ck->dir);
        if (!ck->adapter && is_file(q)) tok_dir = ck->dir;
    }
    return tok_dir;
}

/* the scale of the work, before it starts: the model's size; the ETA follows the first checkpoint */
static void print_scale(const char *tok_dir, const td_postmortem *pm, size_t total)
{
    char cp[4400];
    snprintf(cp, sizeof cp, "%s/config.json", tok_dir);
    td_config mc;
    if (td_config_parse(cp, &mc, NULL)) return;
    double np = (double)td_config_param_elems(&mc);
    fprintf(stderr, PROG ": %.3g parameters: %d sequences of up to %d new tokens per diff, %zu diffs; tidal-diff "
            "holds the weights as stored plus each recipe's prepared copies (about %.2g GiB at bf16), and on this "
            "CPU an 8B model takes minutes per prompt (--max-prompts, --device cuda)\n",
            np, (int)pm->nprompts, pm->set.max_completion, 2 * total, 3.0 * 2.0 * np / (1u << 30));
}

/* the picked checkpoints (or preflight's starting point) measured into pm->meas, the prompts
 * written and tokenised into OUT first. 0, or the exit status (TD_EXIT_STOPPED on Ctrl-C) */
static int measure_all(const pm_opts *o, td_postmortem *pm, const size_t *pick, size_t npick, int argc, char **argv,
                       td_error *err)
{
    const td_pm_setup *s = &pm->set;
    pm->meas = td_xcalloc(npick + 1, sizeof *pm->meas);
    if (!npick && !s->preflight) return 0;
    const char *tok_dir = tokenizer_dir(pm, pick, npick);
    if (!tok_dir) {
        fprintf(stderr, PROG ": no tokenizer.json in the checkpoints: give --model DIR (the base, with its tokenizer)\n");
        return 2;
    }
    char prompts[4600], tokens[4600], dd[4600];
    snprintf(prompts, sizeof prompts, "%s/prompts.jsonl", o->outd);
    snprintf(tokens, sizeof tokens, "%s/prompt_tokens.jsonl", o->outd);
    if (td_pm_write_prompts(s->dataset, s->max_prompts, s->seed, prompts, &pm->nprompts, err) ||
        td_pm_tokenize_prompts(tok_dir, prompts, tokens, err)) {
        fprintf(stderr, PROG ": %s\n", err->msg);
        return 1;
    }
    snprintf(dd, sizeof dd, "%s/diffs", o->outd);
    mkdir(dd, 0755);
    size_t total = s->preflight ? 1 : npick;
    fprintf(stderr, PROG ": measuring %zu %s x 2 recipe pairs (%s/%s and %s/%s) on %zu prompts x %d tokens\n", total,
            s->preflight ? "starting point" : "checkpoints", s->train_recipe, s->rollout_recipe, s->train16, s->rollout16,
            pm->nprompts, s->max_completion);
    print_scale(tok_dir, pm, total);
    for (size_t i = 0; i < total; i++) {
        td_pm_meas *m = &pm->meas[pm->nmeas];
        double t0 = omp_get_wtime();
        if (td_pm_measure(pm, s->preflight ? NULL : &pm->ck[pick[i]], tokens, dd, m, err)) {
            fprintf(stderr, PROG ": %s\n", err->msg);
            if (!*s->stop) return 1;
            td_stop_print_command(PROG, "continue (finished diffs are kept)", argc, argv, NULL, NULL);
            return TD_EXIT_STOPPED;
        }
        pm->nmeas++;
        double per = omp_get_wtime() - t0;
        fprintf(stderr, PROG ": checkpoint %zu/%zu (step %lld) measured in %.0f s; ETA %.0f s\n", i + 1, total,
                (long long)m->step, per, per * (double)(total - i - 1));
    }
    return 0;
}

/* ---------------------------------------------------------------- the outputs */

/* the console's summary: the drop and the verdict's readings, or preflight's alarms */
static void print_summary(const td_postmortem *pm, const char *outd)
{
    const td_pm_events *E = &pm->events;
    if (!pm->set.preflight) {
        if (E->drop_step >= 0) printf(PROG ": the reward dropped at step %lld (the detector confirmed it at step %lld)\n", (long long)E->onset_step, (long long)E->drop_step);
        else printf(PROG ": no reward drop\n");
        for (int i = 0; i < TD_PM_NHYP; i++) {
            const td_pm_hypothesis *h = &pm->hyp[pm->order[i]];
            printf("  %-16s %-9s %s\n", h->name, h->reading, strcmp(h->for_, "-") ? h->for_ : h->against);
        }
    } else {
        size_t na = json_array_size(pm->alarms);
        printf(PROG ": pre-flight: %zu alarm%s\n", na, na == 1 ? "" : "s");
        for (size_t i = 0; i < na; i++) printf("  %s\n", json_string_value(json_array_get(pm->alarms, i)));
    }
    printf(PROG ": report in %s/report.md\n", outd);
}

/* OUT/postmortem.json and OUT/report.md (written to report.md.tmp, then renamed), then the console:
 * postmortem.json with --json, else the summary. 0 or 1 */
static int write_outputs(const pm_opts *o, const td_postmortem *pm, double seconds)
{
    json_t *J = td_pm_json(pm, seconds);
    char fp[4800], fin[4800];
    int status = 1;
    snprintf(fp, sizeof fp, "%s/postmortem.json", o->outd);
    if (json_dump_file(J, fp, JSON_INDENT(2)) != 0) { fprintf(stderr, PROG ": %s: cannot write\n", fp); goto out; }
    snprintf(fp, sizeof fp, "%s/report.md.tmp", o->outd);
    FILE *f = fopen(fp, "w");
    if (!f) { fprintf(stderr, PROG ": %s: cannot create: %s\n", fp, strerror(errno)); goto out; }
    td_pm_print_markdown(f, pm);
    int werr = fclose(f) != 0;
    snprintf(fin, sizeof fin, "%s/report.md", o->outd);
    if (werr || rename(fp, fin) != 0) { fprintf(stderr, PROG ": %s: cannot write\n", fin); goto out; }
    if (o->json) {
        char *s = json_dumps(J, JSON_INDENT(2));
        printf("%s\n", s);
        free(s);
    } else {
        print_summary(pm, o->outd);
    }
    status = 0;
out:
    json_decref(J);
    return status;
}

/* ---------------------------------------------------------------- main */

int main(int argc, char **argv)
{
    pm_opts o;
    td_pm_setup set;
    int status = parse_options(argc, argv, &o, &set);
    if (status >= 0) return status;
    set.stop = td_stop_on_signals(PROG, "diff batch");
    td_postmortem pm;
    td_pm_init(&pm, &set);
    td_pm_rl_settings rl = {.steps_done = -1};
    td_error err = {{0}};
    size_t pick[MAX_CK], npick = 0;
    double t_start = 0;

    /* the run's log, its events, its checkpoints and (tidal-rl) its settings; what to measure */
    if (!pm.set.preflight && td_pm_open_run(&pm, &rl, &err)) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        status = 1;
        goto out;
    }
    fill_defaults(&pm.set, &rl);
    if ((status = pick_checkpoints(&o, &pm, pick, &npick)) || (status = check_inputs(&pm, pick, npick)) ||
        (status = make_out_dir(o.outd, &err)))
        goto out;

    /* measuring, and preflight's projection of LoRA's first updates */
    t_start = omp_get_wtime();
    if ((status = measure_all(&o, &pm, pick, npick, argc, argv, &err))) goto out;
    if (pm.set.preflight && pm.set.lora_r && td_pm_project(&pm, &err)) {
        fprintf(stderr, PROG ": %s\n", err.msg);
        status = 1;
        goto out;
    }

    /* the verdict, the figures, postmortem.json, report.md */
    td_pm_verdict(&pm);
    td_pm_figures(&pm, o.outd);
    status = write_outputs(&o, &pm, omp_get_wtime() - t_start);
out:
    td_postmortem_free(&pm);
    free(set.command);
    return status;
}
