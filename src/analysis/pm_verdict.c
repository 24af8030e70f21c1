/* tidal — the post-mortem's verdict (include/tidal/postmortem.h): six hypotheses of a collapse,
 * each weighed on the events before and after the drop's onset and on the checkpoints measured,
 * worded as evidence; and the health checks a --preflight set-up already crosses.
 *
 * Thresholds and their sources (the report lists them):
 *   a logged mismatch "rose" when the median of its last 10 logged values up to the onset is >= 3x
 *   the median of its first 20; a checkpoint's mean |dlogp| >= 3x the first checkpoint's; tidal's
 *   dose-response (reports/rl section 3) saw no harm up to k3 1.6e-2 / mean |dlogp| 3.8e-2 on a
 *   0.8M-parameter model; an engine copy keeping < 0.5 of the adapter's update rounded it away
 *   (>= 0.9: kept); verl's rollout-correction health checks: mean IS weight in [0.5, 2], ESS >= 0.3,
 *   |kl| <= 0.1, chi2_token <= 1. */
#include "tidal/analysis.h"
#include "tidal/postmortem.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *fmtg(char *buf, size_t n, double v)
{
    if (!isfinite(v)) snprintf(buf, n, "n/a");
    else snprintf(buf, n, "%.3g", v);
    return buf;
}

int td_pm_before_onset(const td_pm_events *e, const td_pm_event *v)
{
    return v && (e->onset_step < 0 || v->step <= e->onset_step);
}

static const td_pm_event *first_event(const td_pm_events *e, const char *name)
{
    for (size_t i = 0; i < e->n_ev; i++)
        if (!strcmp(e->ev[i].name, name)) return &e->ev[i];
    return NULL;
}

/* index of each hypothesis in td_postmortem.hyp */
enum { H_MISMATCH, H_ADAPTER, H_ENTROPY, H_LR, H_TRUNCATION, H_DEAD };

static const td_pm_hypothesis HYPOTHESES[TD_PM_NHYP] = {
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

/* the log's events: before the onset for the hypothesis, after it against */
static void evidence_from_events(td_pm_hypothesis *H, const td_pm_events *E)
{
    static const struct { int h; const char *ev; } map[] = {
        {H_MISMATCH, "logp_diff_rise"}, {H_MISMATCH, "is_extreme"}, {H_ENTROPY, "entropy"}, {H_LR, "grad_spike"},
        {H_LR, "lr_change"}, {H_TRUNCATION, "length"}, {H_TRUNCATION, "length_surge"}, {H_DEAD, "dead"}};
    for (size_t k = 0; k < sizeof map / sizeof *map; k++) {
        const td_pm_event *v = first_event(E, map[k].ev);
        td_pm_hypothesis *h = &H[map[k].h];
        if (v && td_pm_before_onset(E, v)) {
            size_t l = strlen(h->for_);
            snprintf(h->for_ + l, sizeof h->for_ - l, "%s%s at step %lld (%s)", l ? "; " : "", v->name, (long long)v->step, v->metric);
            if (h->first < 0 || v->step < h->first) h->first = v->step;
        } else if (v) {
            size_t l = strlen(h->against);
            snprintf(h->against + l, sizeof h->against - l, "%s%s only at step %lld, after the onset", l ? "; " : "", v->name, (long long)v->step);
        }
    }
}

/* the logged mismatch's medians (early: the first 20 logged values up to the onset, late: the last
 * 10 up to it, end: the last 10 of the run) weighed for and against */
static void weigh_logged_mismatch(td_pm_hypothesis *h, const td_pm_curves *C, const td_pm_events *E, int col,
                                  const double *v, size_t m, size_t upto)
{
    size_t nb = upto < 20 ? (upto + 1) / 2 : 20, na = upto - nb < 10 ? upto - nb : 10;
    double *w = td_xmalloc(m * sizeof *w);
    memcpy(w, v, nb * sizeof *w);
    double early = td_quantile_select(w, nb, 0.5);
    memcpy(w, v + upto - na, na * sizeof *w);
    double late = na ? td_quantile_select(w, na, 0.5) : NAN;
    free(w);
    char b1[32], b2[32];
    size_t l;
    if (isfinite(late) && early > 0 && late >= 3 * early) {
        l = strlen(h->for_);
        snprintf(h->for_ + l, sizeof h->for_ - l, "%slogged %s: median %s over the last %zu logged steps up to the %s vs %s "
                 "over the first %zu (x%.1f)", l ? "; " : "", C->key[col], fmtg(b1, 32, late), na,
                 E->onset_step >= 0 ? "onset" : "end", fmtg(b2, 32, early), nb, late / early);
        int64_t st = E->onset_step >= 0 ? E->onset_step : C->step[C->n - 1];
        if (h->first < 0 || st < h->first) h->first = st;
        /* its level against tidal's dose-response (reports/rl section 3: no harm up to k3 1.6e-2,
         * mean |dlogp| 3.8e-2, on a 0.8M-parameter model; harm from k3 0.28, |dlogp| 0.36) */
        int is_k3 = strstr(C->key[col], "k3") != NULL;
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
                 "%s over the first %zu (x%.2f, < x3)", l ? "; " : "", C->key[col], fmtg(b1, 32, late), na,
                 E->onset_step >= 0 ? "onset" : "end", fmtg(b2, 32, early), nb, late / early);
        if (E->onset_step >= 0 && m > upto) {   /* and after the drop: a consequence? */
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

/* mismatch from the log: sustained, not a single-step mark (the detector's mismatch signal fires on
 * one step, and on k3 at the noise level): the median of the last 10 logged values up to the onset
 * (the end without a drop) against the median of the first 20 */
static void evidence_from_logged_mismatch(td_pm_hypothesis *h, const td_pm_curves *C, const td_pm_events *E)
{
    static const char *const mk[] = {"k3_kl", "rollout_corr/k3_kl", "logp_diff_mean", "sampling/sampling_logp_difference/mean", NULL};
    int col = -1;
    for (int i = 0; mk[i] && col < 0; i++) col = td_pm_key(C, mk[i]);
    if (col < 0) return;
    double *v = td_xmalloc((C->n ? C->n : 1) * sizeof *v);
    size_t m = 0, upto = 0;
    for (size_t i = 0; i < C->n; i++) {
        double x = C->v[(size_t)col * C->n + i];
        if (!isfinite(x)) continue;
        if (E->onset_step < 0 || C->step[i] <= E->onset_step) upto = m + 1;
        v[m++] = x;
    }
    if (m >= 4 && upto >= 2) weigh_logged_mismatch(h, C, E, col, v, m, upto);
    free(v);
}

/* mismatch from the checkpoints: the last measured before the onset against the first */
static void evidence_from_checkpoints(td_pm_hypothesis *h, const td_pm_meas *M, size_t nm, const td_pm_events *E)
{
    if (nm < 2 || !M[0].run.ok) return;
    double first = M[0].run.mean, before = NAN, after = NAN;
    int64_t sb = -1, sa = -1;
    for (size_t i = 1; i < nm; i++) {
        if (!M[i].run.ok) continue;
        if (E->onset_step < 0 || M[i].step <= E->onset_step) { before = M[i].run.mean; sb = M[i].step; }
        else if (sa < 0 || M[i].run.mean > after) { after = M[i].run.mean; sa = M[i].step; }   /* the largest after it */
    }
    char b1[32], b2[32];
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
        if (after >= 3 * first && !(isfinite(before) && before >= 3 * first))
            snprintf(h->against + l, sizeof h->against - l, "%sit rose only after the onset (x%.1f at step %lld): a consequence "
                     "more than a cause", l ? "; " : "", after / first, (long long)sa);
    }
}

/* adapter rounding: what the engine copy kept of each adapter, and of the updates between
 * checkpoints as the engine saw them */
static void evidence_from_adapters(td_pm_hypothesis *h, const td_pm_meas *M, size_t nm, const char *rollout_recipe)
{
    char b1[32], b2[32];
    size_t l;
    for (size_t i = 0; i < nm; i++) {
        if (!isfinite(M[i].keep.aligned)) continue;
        if (M[i].keep.aligned < 0.5) {
            l = strlen(h->for_);
            snprintf(h->for_ + l, sizeof h->for_ - l, "%sstep %lld: a %s engine keeps %s of the adapter's update (fp16: %s)", l ? "; " : "",
                     (long long)M[i].step, rollout_recipe, fmtg(b1, 32, M[i].keep.aligned), fmtg(b2, 32, M[i].keep16.aligned));
            if (h->first < 0) h->first = M[i].step;
        } else if (i == 0 || M[i].keep.aligned >= 0.9) {
            l = strlen(h->against);
            if (l < 200)
                snprintf(h->against + l, sizeof h->against - l, "%sstep %lld: it keeps %s", l ? "; " : "", (long long)M[i].step, fmtg(b1, 32, M[i].keep.aligned));
        }
    }
    for (size_t i = 0; i < nm; i++) {
        if (!isfinite(M[i].upd.aligned)) continue;
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
}

static int reading_rank(const td_pm_hypothesis *h)
{
    return strcmp(h->reading, "supported") ? (strcmp(h->reading, "mixed") ? 2 : 1) : 0;
}

/* each hypothesis's reading from its evidence; the order: supported first, earliest evidence first */
static void readings_and_order(td_pm_hypothesis *H, int *order, int any_adapter)
{
    for (int i = 0; i < TD_PM_NHYP; i++) {
        td_pm_hypothesis *h = &H[i];
        snprintf(h->reading, sizeof h->reading, "%s", h->for_[0] ? (h->against[0] ? "mixed" : "supported") : (h->against[0] ? "against" : "no data"));
        if (!h->for_[0]) snprintf(h->for_, sizeof h->for_, "-");
        if (!h->against[0]) snprintf(h->against, sizeof h->against, i == H_ADAPTER && !any_adapter ? "not a LoRA run (or no adapter measured)" : "-");
    }
    for (int i = 0; i < TD_PM_NHYP; i++) order[i] = i;
    for (int i = 1; i < TD_PM_NHYP; i++)   /* an insertion sort, stable */
        for (int j = i; j > 0; j--) {
            const td_pm_hypothesis *a = &H[order[j - 1]], *b = &H[order[j]];
            int ka = reading_rank(a), kb = reading_rank(b);
            int64_t fa = a->first < 0 ? INT64_MAX : a->first, fb = b->first < 0 ? INT64_MAX : b->first;
            if (kb < ka || (kb == ka && fb < fa)) { int t = order[j]; order[j] = order[j - 1]; order[j - 1] = t; }
            else break;
        }
}

/* verl's rollout-correction health checks on preflight's step-0 diff; LoRA's projected update kept
 * below 0.5 */
static json_t *alarms(const td_postmortem *pm)
{
    json_t *a = json_array();
    for (size_t i = 0; i < pm->nmeas && pm->set.preflight; i++) {
        const td_pm_diff *d = &pm->meas[i].run;
        if (!d->ok) continue;
        char b[200];
        if (d->is_mean < 0.5 || d->is_mean > 2) { snprintf(b, sizeof b, "mean IS weight %.3g outside [0.5, 2]", d->is_mean); json_array_append_new(a, json_string(b)); }
        if (d->tok_ess < 0.3) { snprintf(b, sizeof b, "token ESS %.3g < 0.3", d->tok_ess); json_array_append_new(a, json_string(b)); }
        if (fabs(d->kl) > 0.1) { snprintf(b, sizeof b, "|kl| %.3g > 0.1", d->kl); json_array_append_new(a, json_string(b)); }
        if (d->chi2 > 1) { snprintf(b, sizeof b, "chi2_token %.3g > 1", d->chi2); json_array_append_new(a, json_string(b)); }
        if (d->seq_ess < 0.3) {
            snprintf(b, sizeof b, "sequence ESS %.3g < 0.3 at %d tokens", d->seq_ess, pm->set.max_completion);
            json_array_append_new(a, json_string(b));
        }
    }
    for (int s = 0; s < pm->nproj; s++)
        if (pm->proj[s][0].aligned < 0.5) {
            char b[240];
            snprintf(b, sizeof b, "after %d Adam step(s) a %s engine copy keeps %.3g of the adapter's update (fp16: %.3g)",
                     td_pm_proj_steps[s], pm->set.rollout_recipe, pm->proj[s][0].aligned, pm->proj[s][1].aligned);
            json_array_append_new(a, json_string(b));
        }
    return a;
}

void td_pm_verdict(td_postmortem *pm)
{
    td_pm_hypothesis *H = pm->hyp;
    memcpy(H, HYPOTHESES, sizeof HYPOTHESES);
    evidence_from_events(H, &pm->events);
    if (!pm->set.preflight) evidence_from_logged_mismatch(&H[H_MISMATCH], &pm->curves, &pm->events);
    evidence_from_checkpoints(&H[H_MISMATCH], pm->meas, pm->nmeas, &pm->events);
    evidence_from_adapters(&H[H_ADAPTER], pm->meas, pm->nmeas, pm->set.rollout_recipe);
    readings_and_order(H, pm->order, pm->any_adapter);
    json_decref(pm->alarms);
    pm->alarms = alarms(pm);
}
