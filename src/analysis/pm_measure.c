/* tidal — the post-mortem's measurements (include/tidal/postmortem.h): the prompts sampled and
 * tokenised once, each checkpoint diffed in the run's recipes and in their FP16 counterfactual
 * (one tidal-diff run file per checkpoint and pair, resumed when it exists), what an engine copy
 * keeps of an adapter, and --preflight's projection of LoRA's first updates. */
#include "tidal/analysis.h"
#include "tidal/checkpoint.h"
#include "tidal/dataset.h"
#include "tidal/diff.h"
#include "tidal/postmortem.h"
#include "tidal/rng.h"
#include "tidal/runfile.h"
#include "tidal/seqset.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#define PROG "tidal-postmortem"

const int td_pm_proj_steps[TD_PM_NPROJ] = {1, 10, 100};

static int is_file(const char *p) { struct stat st; return stat(p, &st) == 0 && S_ISREG(st.st_mode); }

const char *td_pm_fp16_of(const char *name, int train)
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

int td_pm_write_prompts(const char *dataset, int max_prompts, unsigned long long seed, const char *path, size_t *n_out,
                        td_error *err)
{
    td_record *recs;
    size_t n;
    if (td_records_read(dataset, &recs, &n, err)) return -1;
    if (!n) { td_records_free(recs, n); return td_fail(err, "%s: no records", dataset); }
    size_t *idx = td_xmalloc(n * sizeof *idx), k = (size_t)max_prompts < n ? (size_t)max_prompts : n;
    for (size_t i = 0; i < n; i++) idx[i] = i;
    td_rng g;
    td_rng_seed(&g, seed);
    for (size_t i = 0; i < k; i++) {   /* a partial Fisher-Yates shuffle: the first k drawn */
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
        /* a built-in task's record as {"text"}: tokenised as tidal-rl and tidal-sft tokenise it */
        if (task && json_is_string(p)) json_object_set(out, "text", p);
        else if (p) json_object_set(out, "prompt", p);
        else if (m) json_object_set(out, "messages", m);
        else rc = td_fail(err, "%s:%ld: no \"prompt\" or \"messages\" (TRL's dataset shapes)", dataset, recs[idx[i]].line);
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

int td_pm_tokenize_prompts(const char *tok_dir, const char *in, const char *out, td_error *err)
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

/* ---------------------------------------------------------------- one diff */

static void diff_nan(td_pm_diff *d)
{
    memset(d, 0, sizeof *d);
    d->mean = d->p99 = d->max = d->k3 = d->kl = d->seq_abs_mean = d->seq_abs_max = d->seq_ess = d->tok_ess = d->is_mean =
        d->chi2 = NAN;
}

/* a run file's numbers over its completion tokens (a file that cannot be read is said on stderr:
 * d->ok 0) */
static void summarise(const char *path, td_pm_diff *d)
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
static int diff_one(const td_pm_setup *set, const char *model_dir, const char *lora_dir, const char *prompts,
                    const char *ra, const char *rb, const char *out, td_pm_diff *d, td_error *err)
{
    td_diff_opts D = {.model_dir = model_dir, .prompts_path = prompts, .out_path = out, .recipe_a_arg = ra,
                      .recipe_b_arg = rb, .max_new_tokens = set->max_completion, .batch = 8, .shard_n = 1,
                      .stop_at_eos = 1, .sampling = td_sampling_default(), .seed = set->seed, .lora_dir = lora_dir,
                      .command_line = set->command, .stop = set->stop, .rollout_logprobs = "raw", .device = set->device};
    if (lora_dir) D.lora_merge_b = set->lora_sync ? TD_LORA_PUNICA : TD_LORA_MERGED;
    D.resume = is_file(out);
    if (td_recipe_resolve(ra, &D.recipe_a, err) || td_recipe_resolve(rb, &D.recipe_b, err)) return -1;
    td_diff_summary s;
    if (td_diff_run(&D, &s, err)) return -1;
    snprintf(d->file, sizeof d->file, "%s", out);
    summarise(out, d);
    return 0;
}

/* ---------------------------------------------------------------- what an engine copy keeps */

/* what a rollout-recipe (the run's engine) and an fp16 engine copy keep of an adapter, and of the
 * update since prev_dir's adapter (NULL: none); failures said on stderr, the numbers left NaN */
static void survival(const char *base_dir, const char *adapter_dir, const char *prev_dir, const char *rb, td_pm_keep *k,
                     td_pm_keep *k16, td_pm_keep *st, td_pm_keep *st16)
{
    td_error err;
    td_model *m = td_model_load(base_dir, &err);
    if (!m) { fprintf(stderr, PROG ": merge survival: %s\n", err.msg); return; }
    td_lora *lo = td_lora_load(adapter_dir, &m->cfg, &err);
    td_recipe r1, r2;
    if (lo && !td_recipe_resolve(rb, &r1, &err) && !td_recipe_resolve(td_pm_fp16_of(rb, 0), &r2, &err)) {
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

int td_pm_measure(const td_postmortem *pm, const td_pm_checkpoint *ck, const char *tokens, const char *diffs_dir,
                  td_pm_meas *m, td_error *err)
{
    const td_pm_setup *set = &pm->set;
    diff_nan(&m->run);
    diff_nan(&m->fp16);
    m->keep = m->keep16 = m->upd = m->upd16 = (td_pm_keep){NAN, NAN, NAN};
    m->prev_step = -1;
    m->ck = ck;
    const char *model_dir, *lora_dir = NULL;
    if (!ck) {   /* --preflight's starting point */
        m->step = 0;
        model_dir = set->model;
        lora_dir = set->adapter;
    } else {
        m->step = ck->step;
        model_dir = ck->adapter ? set->model : ck->dir;
        lora_dir = ck->adapter ? ck->dir : NULL;
    }
    char f1[4800], f2[4800];
    snprintf(f1, sizeof f1, "%s/step-%lld-%s.h5", diffs_dir, (long long)m->step, "run");
    snprintf(f2, sizeof f2, "%s/step-%lld-%s.h5", diffs_dir, (long long)m->step, "fp16");
    if (diff_one(set, model_dir, lora_dir, tokens, set->train_recipe, set->rollout_recipe, f1, &m->run, err) ||
        diff_one(set, model_dir, lora_dir, tokens, set->train16, set->rollout16, f2, &m->fp16, err))
        return -1;
    const char *prev_dir = NULL;
    if (ck && ck > pm->ck && ck[-1].adapter && !ck[-1].unreadable) {   /* the adapter checkpoint before this one */
        prev_dir = ck[-1].dir;
        m->prev_step = ck[-1].step;
    }
    if (lora_dir) survival(set->model, lora_dir, prev_dir, set->rollout_recipe, &m->keep, &m->keep16, &m->upd, &m->upd16);
    return 0;
}

/* ---------------------------------------------------------------- --preflight's projection */

int td_pm_project(td_postmortem *pm, td_error *err)
{
    const td_pm_setup *set = &pm->set;
    td_model *base = td_model_load(set->model, err);
    td_recipe r1, r2;
    if (!base || td_recipe_resolve(set->rollout_recipe, &r1, err) || td_recipe_resolve(set->rollout16, &r2, err)) {
        td_model_free(base);
        return -1;
    }
    int rc = 0;
    for (int s = 0; s < TD_PM_NPROJ && !rc; s++) {
        td_pm_keep *a = &pm->proj[s][0], *b = &pm->proj[s][1];
        if (td_pm_lora_projected(base, &base->cfg, set->lora_r, set->lora_alpha, set->lr, td_pm_proj_steps[s], set->seed,
                                 &r1, &a->surv, &a->aligned, &a->changed, err) ||
            td_pm_lora_projected(base, &base->cfg, set->lora_r, set->lora_alpha, set->lr, td_pm_proj_steps[s], set->seed,
                                 &r2, &b->surv, &b->aligned, &b->changed, err))
            rc = -1;
        else
            pm->nproj++;
    }
    td_model_free(base);
    return rc;
}
