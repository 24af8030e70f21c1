/* tidal — the post-mortem written out (include/tidal/postmortem.h): postmortem.json and report.md,
 * the run's curves and the checkpoints' measurements on one step axis, the verdict worded as
 * evidence, the thresholds and their sources. */
#include "tidal/postmortem.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define PROG "tidal-postmortem"

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static const char *fmtg(char *buf, size_t n, double v)
{
    if (!isfinite(v)) snprintf(buf, n, "n/a");
    else snprintf(buf, n, "%.3g", v);
    return buf;
}

/* ---------------------------------------------------------------- postmortem.json */

static json_t *diff_json(const td_pm_diff *d)
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

/* the run's log, its events and the checkpoints found, into J */
static void run_json(json_t *J, const td_postmortem *pm)
{
    const td_pm_curves *C = &pm->curves;
    const td_pm_events *E = &pm->events;
    json_object_set_new(J, "run_dir", json_string(pm->set.run_dir));
    json_object_set_new(J, "log_format", json_string(C->format));
    json_object_set_new(J, "log_source", json_string(C->source));
    json_object_set_new(J, "logged_steps", json_integer((json_int_t)C->n));
    json_object_set_new(J, "reward_key", json_string(C->key[E->reward_col]));
    /* the drop's step is where the reward fell (the onset); the detector confirms it later (its EMA and hold) */
    json_object_set_new(J, "reward_drop_step", E->onset_step >= 0 ? json_integer(E->onset_step) : json_null());
    json_object_set_new(J, "onset_step", E->onset_step >= 0 ? json_integer(E->onset_step) : json_null());
    json_object_set_new(J, "reward_drop_confirmed_step", E->drop_step >= 0 ? json_integer(E->drop_step) : json_null());
    json_object_set_new(J, "reward_initial", num(E->initial_reward));
    json_object_set_new(J, "reward_best_ema", num(E->best_reward));
    json_object_set_new(J, "reward_final_ema", num(E->final_reward));
    json_t *ev = json_array();
    for (size_t i = 0; i < E->n_ev; i++) {
        json_t *x = json_object();
        json_object_set_new(x, "event", json_string(E->ev[i].name));
        json_object_set_new(x, "step", json_integer(E->ev[i].step));
        json_object_set_new(x, "metric", json_string(E->ev[i].metric));
        json_object_set_new(x, "rule", json_string(E->ev[i].rule));
        json_object_set_new(x, "before_onset", json_boolean(td_pm_before_onset(E, &E->ev[i])));
        json_array_append_new(ev, x);
    }
    json_object_set_new(J, "events", ev);
    json_t *found = json_array();
    for (size_t i = 0; i < pm->nck; i++) {
        const td_pm_checkpoint *ck = &pm->ck[i];
        json_t *x = json_object();
        json_object_set_new(x, "step", json_integer(ck->step));
        json_object_set_new(x, "dir", json_string(ck->dir));
        json_object_set_new(x, "adapter", json_boolean(ck->adapter));
        if (ck->unreadable) json_object_set_new(x, "unreadable", json_string(ck->unreadable));
        json_array_append_new(found, x);
    }
    json_object_set_new(J, "checkpoints_found", found);
}

static json_t *meas_json(const td_pm_meas *m, const td_pm_setup *set)
{
    json_t *x = diff_json(&m->run);
    json_object_set_new(x, "step", json_integer(m->step));
    json_object_set_new(x, "recipes", json_pack("[ss]", set->train_recipe, set->rollout_recipe));
    json_object_set_new(x, "fp16", diff_json(&m->fp16));
    json_object_set_new(json_object_get(x, "fp16"), "recipes", json_pack("[ss]", set->train16, set->rollout16));
    json_object_set_new(x, "merge_survival", num(m->keep.surv));
    json_object_set_new(x, "merge_aligned", num(m->keep.aligned));
    json_object_set_new(x, "merge_changed_frac", num(m->keep.changed));
    json_object_set_new(x, "merge_survival_fp16", num(m->keep16.surv));
    json_object_set_new(x, "merge_aligned_fp16", num(m->keep16.aligned));
    json_object_set_new(x, "merge_changed_frac_fp16", num(m->keep16.changed));
    if (m->prev_step >= 0) {   /* the stretch since the checkpoint before */
        json_object_set_new(x, "update_since_step", json_integer(m->prev_step));
        json_object_set_new(x, "update_kept", num(m->upd.aligned));
        json_object_set_new(x, "update_kept_fp16", num(m->upd16.aligned));
        json_object_set_new(x, "update_changed_frac", num(m->upd.changed));
    }
    return x;
}

json_t *td_pm_json(const td_postmortem *pm, double seconds)
{
    const td_pm_setup *set = &pm->set;
    json_t *J = json_object();
    json_object_set_new(J, "command_line", json_string(set->command));
    json_object_set_new(J, "tool", json_string(PROG));
    json_object_set_new(J, "preflight", json_boolean(set->preflight));
    if (!set->preflight) run_json(J, pm);
    json_t *cks = json_array();
    for (size_t i = 0; i < pm->nmeas; i++) json_array_append_new(cks, meas_json(&pm->meas[i], set));
    json_object_set_new(J, "checkpoints", cks);
    if (pm->nproj) {
        json_t *pj = json_array();
        for (int s = 0; s < pm->nproj; s++) {
            const td_pm_keep *p = pm->proj[s];
            json_array_append_new(pj, json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "adam_steps", td_pm_proj_steps[s],
                                                "merge_survival", num(p[0].surv), "merge_aligned", num(p[0].aligned),
                                                "merge_changed_frac", num(p[0].changed), "merge_survival_fp16", num(p[1].surv),
                                                "merge_aligned_fp16", num(p[1].aligned),
                                                "merge_changed_frac_fp16", num(p[1].changed)));
        }
        json_object_set_new(J, "lora_projection", pj);
    }
    json_t *vj = json_array();
    for (int i = 0; i < TD_PM_NHYP && !set->preflight; i++) {
        const td_pm_hypothesis *h = &pm->hyp[pm->order[i]];
        json_array_append_new(vj, json_pack("{s:s, s:s, s:s, s:s, s:s, s:s}", "hypothesis", h->name, "question", h->question,
                                            "reading", h->reading, "for", h->for_, "against", h->against, "next", h->next));
    }
    json_object_set_new(J, "verdict", vj);
    json_object_set(J, "alarms", pm->alarms);
    json_object_set(J, "figures", pm->figures);
    json_object_set_new(J, "seconds", json_real(seconds));
    return J;
}

/* ---------------------------------------------------------------- report.md */

/* the log read, the drop, the events in step order */
static void md_drop(FILE *f, const td_postmortem *pm)
{
    const td_pm_curves *C = &pm->curves;
    const td_pm_events *E = &pm->events;
    char b1[32], b2[32], b3[32];
    fprintf(f, "# Post-mortem of %s\n\n", pm->set.run_dir);
    fprintf(f, "Read: %s (%s), %zu logged steps (%lld to %lld), %zu keys; the detector ran over the %zu with a reward "
            "(`%s`).\n\n", C->source, C->format, C->n, C->n ? (long long)C->step[0] : 0LL, C->n ? (long long)C->step[C->n - 1] : 0LL,
            C->nk, E->rows_used, C->key[E->reward_col]);
    fprintf(f, "## The drop\n\n");
    if (E->drop_step >= 0)
        fprintf(f, "The reward fell: its EMA went from a best of %s to %s (first logged value %s). The detector confirmed the "
                "drop at step **%lld**; the final descent began at step **%lld** (onset: the first step after the last one "
                "whose reward was within %.2g of the best EMA).\n\n",
                fmtg(b1, 32, E->best_reward), fmtg(b2, 32, E->final_reward), fmtg(b3, 32, E->initial_reward), (long long)E->drop_step,
                (long long)E->onset_step, 0.5 * pm->set.collapse.drop_abs);
    else
        fprintf(f, "No reward drop by the detector's rule (EMA best %s, final %s, first value %s): the rest is read as "
                "a health check, not as causes.\n\n", fmtg(b1, 32, E->best_reward), fmtg(b2, 32, E->final_reward), fmtg(b3, 32, E->initial_reward));
    fprintf(f, "## Events, in step order\n\n| step | event | on | rule | before the onset |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < E->n_ev; i++)
        fprintf(f, "| %lld | %s | `%s` | %s | %s |\n", (long long)E->ev[i].step, E->ev[i].name, E->ev[i].metric, E->ev[i].rule,
                td_pm_before_onset(E, &E->ev[i]) ? "yes" : "no");
    if (!E->n_ev) fprintf(f, "| - | none | | | |\n");
    fprintf(f, "\n");
}

/* the checkpoints measured (or preflight's starting point), one row each */
static void md_measured(FILE *f, const td_postmortem *pm)
{
    const td_pm_setup *o = &pm->set;
    fprintf(f, "## %s\n\ntidal-diff on %zu prompts of %s (seed %llu), %d tokens each, the trainer's recipe against the "
            "engine's: **%s / %s** (the run's) and **%s / %s** (the FP16 counterfactual).%s\n\n",
            o->preflight ? "The starting point measured" : "The checkpoints measured", pm->nprompts, o->dataset, o->seed,
            o->max_completion, o->train_recipe, o->rollout_recipe, o->train16, o->rollout16,
            pm->any_adapter || o->adapter ? (o->lora_sync ? " The engine runs the adapter as vLLM's LoRA kernels do."
                                                           : " The engine runs merged weights (TRL's merge-unmerge drift cannot be "
                                                             "rebuilt from saved adapters: `merged` stands for it).") : "");
    fprintf(f, "| step | tokens | mean \\|dlogp\\| | p99 | max | k3 | seq \\|log W\\| mean | seq ESS | fp16 mean \\|dlogp\\| | "
            "fp16 k3 | fp16 seq ESS | adapter kept (%s) | adapter kept (fp16) | last update kept (%s) | last update kept (fp16) |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n", o->rollout_recipe, o->rollout_recipe);
    for (size_t i = 0; i < pm->nmeas; i++) {
        const td_pm_meas *m = &pm->meas[i];
        char b1[32], b2[32], b3[32], b4[32], b5[32], b6[32], b7[32];
        char c1[32], c2[32], c3[32], c4[32], c5[32], c6[32];
        fprintf(f, "| %lld | %zu | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", (long long)m->step, m->run.tokens,
                fmtg(b1, 32, m->run.mean), fmtg(b2, 32, m->run.p99), fmtg(b3, 32, m->run.max), fmtg(b4, 32, m->run.k3),
                fmtg(b5, 32, m->run.seq_abs_mean), fmtg(b6, 32, m->run.seq_ess), fmtg(b7, 32, m->fp16.mean),
                fmtg(c1, 32, m->fp16.k3), fmtg(c2, 32, m->fp16.seq_ess), fmtg(c3, 32, m->keep.aligned), fmtg(c4, 32, m->keep16.aligned),
                fmtg(c5, 32, m->upd.aligned), fmtg(c6, 32, m->upd16.aligned));
    }
    fprintf(f, "\nAdapter kept: the share of the whole adapter's update a merged engine copy keeps (its component "
            "along the update); last update kept: the same for the update since the checkpoint before this one "
            "(the engine sees only what survives its weights' rounding).\n");
    fprintf(f, "\nEach row's run files: `diffs/step-N-run.h5`, `diffs/step-N-fp16.h5` (`tidal-report` and `tidal-heatmap` read "
            "them).\n\n");
}

/* how many checkpoints the folder holds (a run folder only) */
static void md_found(FILE *f, const td_postmortem *pm)
{
    const td_pm_checkpoint *ck = pm->ck;
    if (pm->nck) {
        size_t bad = 0;
        for (size_t i = 0; i < pm->nck; i++) bad += ck[i].unreadable != NULL;
        fprintf(f, "Checkpoints in the folder: %zu (%zu measured", pm->nck, pm->nmeas);
        if (bad) fprintf(f, "; %zu unreadable: %s: %s", bad, ck[0].unreadable ? ck[0].dir : "", ck[0].unreadable ? ck[0].unreadable : "see postmortem.json");
        fprintf(f, ").\n\n");
    } else {
        fprintf(f, "The folder holds no checkpoint: only the curves could be read (HF Trainer: `save_steps`; tidal-rl: "
                "`--save-steps`).\n\n");
    }
}

/* preflight: LoRA's first updates as the engine copy keeps them */
static void md_projection(FILE *f, const td_postmortem *pm)
{
    const td_pm_setup *o = &pm->set;
    char b1[32], b2[32], b3[32], b4[32];
    fprintf(f, "## LoRA's first updates in the engine's weights (projected)\n\nAssumption: PEFT's initialisation (lora_A "
            "U(-1/sqrt(in), 1/sqrt(in)), lora_B 0) and Adam steps that move every element of lora_B by the learning rate "
            "(%.3g) in a fixed random direction; rank %d, alpha %g. Share of the update an engine copy keeps (its component along the update, <E(D(W + dW)) - E(W), dW> / |dW|^2):\n\n"
            "| Adam steps | %s | changed weights | fp16 | changed weights (fp16) |\n|---|---|---|---|---|\n",
            o->lr, o->lora_r, o->lora_alpha, o->rollout_recipe);
    for (int s = 0; s < pm->nproj; s++)
        fprintf(f, "| %d | %s | %s | %s | %s |\n", td_pm_proj_steps[s], fmtg(b1, 32, pm->proj[s][0].aligned),
                fmtg(b2, 32, pm->proj[s][0].changed), fmtg(b3, 32, pm->proj[s][1].aligned), fmtg(b4, 32, pm->proj[s][1].changed));
    fprintf(f, "\n");
}

/* preflight: the alarms crossed */
static void md_alarms(FILE *f, const td_postmortem *pm)
{
    fprintf(f, "## Alarms crossed\n\n");
    size_t na = json_array_size(pm->alarms);
    for (size_t i = 0; i < na; i++) fprintf(f, "- %s\n", json_string_value(json_array_get(pm->alarms, i)));
    if (!na) fprintf(f, "None of verl's rollout-correction health checks (mean IS weight in [0.5, 2], ESS >= 0.3, |kl| <= 0.1, "
                     "chi2_token <= 1) is crossed at the start, and LoRA's projected updates survive the engine's rounding.\n");
    fprintf(f, "\n");
}

/* a run folder: the verdict table and what to try next */
static void md_verdict(FILE *f, const td_postmortem *pm)
{
    fprintf(f, "## Verdict (evidence, not certainty)\n\n| hypothesis | reading | for | against |\n|---|---|---|---|\n");
    for (int i = 0; i < TD_PM_NHYP; i++) {
        const td_pm_hypothesis *h = &pm->hyp[pm->order[i]];
        fprintf(f, "| %s: %s | **%s** | %s | %s |\n", h->name, h->question, h->reading, h->for_, h->against);
    }
    fprintf(f, "\n## What to try next, ranked by that evidence\n\n");
    int k = 1;
    for (int i = 0; i < TD_PM_NHYP; i++) {
        const td_pm_hypothesis *h = &pm->hyp[pm->order[i]];
        if (!strcmp(h->reading, "supported") || !strcmp(h->reading, "mixed")) fprintf(f, "%d. (%s) %s\n", k++, h->name, h->next);
    }
    if (k == 1) fprintf(f, "No hypothesis has evidence before the drop. Measure more checkpoints around it (`--checkpoints`), "
                        "and compare the run with an exact-match control (tidal-rl --exact-match) at the same learning rate.\n");
    fprintf(f, "\n");
}

/* the figures, the thresholds and their sources, what the numbers do not show */
static void md_tail(FILE *f, const td_postmortem *pm)
{
    size_t nf = json_array_size(pm->figures);
    if (nf) {
        fprintf(f, "## Figures\n\n");
        for (size_t i = 0; i < nf; i++)
            fprintf(f, "![%s](%s)\n", json_string_value(json_array_get(pm->figures, i)), json_string_value(json_array_get(pm->figures, i)));
        fprintf(f, "\n");
    }
    char *cj = td_collapse_cfg_json(&pm->set.collapse);
    fprintf(f, "## Thresholds and their sources\n\n- tidal's collapse detector (RL.md section 5; `--collapse`): %s\n"
            "- verl's rollout-correction health checks: mean IS weight outside [0.5, 2], ESS < 0.3, |kl| > 0.1, chi2_token > 1\n"
            "- the post-mortem's own: mean completion length > 1.5x its early median for 3 logged steps; TRL's mean |logp "
            "difference| > %.0fx its early median; a checkpoint's mean |dlogp| >= 3x the first checkpoint's; an engine copy "
            "keeping < 0.5 of the adapter's update (its component along the update, tidal-rl's merge_aligned)\n\n", cj,
            pm->set.collapse.k3_factor);
    free(cj);
    fprintf(f, "## What these numbers do not show\n\nThe events are correlations in time on one run; a precursor before the drop "
            "is evidence, not proof, of a cause. The checkpoints are measured on %zu prompts in recipes that model the engines "
            "(the run's own kernels may differ); TRL's merge-unmerge drift and an engine's own batching are not rebuilt. A log "
            "that records a value every logging_steps gives the steps of its rows, not of the optimiser's every step.\n\n",
            pm->nprompts);
    fprintf(f, "Made by `%s`.\n", pm->set.command);
}

void td_pm_print_markdown(FILE *f, const td_postmortem *pm)
{
    const td_pm_setup *o = &pm->set;
    if (o->preflight) fprintf(f, "# Pre-flight check of %s%s%s\n\n", o->model, o->adapter ? " + " : "", o->adapter ? o->adapter : "");
    else md_drop(f, pm);
    if (pm->nmeas) md_measured(f, pm);
    if (!o->preflight) md_found(f, pm);
    if (pm->nproj) md_projection(f, pm);
    if (o->preflight) md_alarms(f, pm);
    else md_verdict(f, pm);
    md_tail(f, pm);
}
