/* tidal — the post-mortem's figures (include/tidal/postmortem.h): the run's logged curves on its
 * step axis, a ring at the drop's onset, and the checkpoints' |dlogp| in the run's recipes and in
 * fp16. Each PNG records the command line; one that cannot be drawn or written is left out. */
#include "tidal/postmortem.h"
#include "tidal/render.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* one line plot of the log keys (those the log has, at most 8) against the step, a ring at the
 * drop's onset */
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

/* the checkpoints measured: mean and p99 |dlogp| in the run's recipes and in fp16, a ring at the
 * first at or after the onset */
static void plot_checkpoints(const td_postmortem *pm, const char *path, td_font *font, json_t *figs)
{
    const td_pm_setup *set = &pm->set;
    const td_pm_meas *M = pm->meas;
    size_t nm = pm->nmeas;
    double *x = td_xmalloc(nm * sizeof(double)), *y1 = td_xmalloc(nm * sizeof(double)), *y2 = td_xmalloc(nm * sizeof(double));
    double *y3 = td_xmalloc(nm * sizeof(double)), *y4 = td_xmalloc(nm * sizeof(double));
    int mk1 = -1;
    for (size_t i = 0; i < nm; i++) {
        x[i] = (double)M[i].step;
        y1[i] = M[i].run.mean; y2[i] = M[i].fp16.mean; y3[i] = M[i].run.p99; y4[i] = M[i].fp16.p99;
        if (mk1 < 0 && pm->events.onset_step >= 0 && M[i].step >= pm->events.onset_step) mk1 = (int)i;
    }
    char l1[300], l2[300], l3[300], l4[300];
    snprintf(l1, sizeof l1, "mean |dlogp| %s/%s", set->train_recipe, set->rollout_recipe);
    snprintf(l2, sizeof l2, "mean |dlogp| %s/%s", set->train16, set->rollout16);
    snprintf(l3, sizeof l3, "p99 |dlogp| %s/%s", set->train_recipe, set->rollout_recipe);
    snprintf(l4, sizeof l4, "p99 |dlogp| %s/%s", set->train16, set->rollout16);
    td_line L[4] = {{l1, x, y1, nm, 0, 0, mk1, 0}, {l2, x, y2, nm, 1, 0, -1, 0}, {l3, x, y3, nm, 0, 6, -1, 0}, {l4, x, y4, nm, 1, 6, -1, 0}};
    td_lines_opts lo = {"the checkpoints measured", "solid: mean, dashed: p99; ring: the first at or after the onset", "step", "|dlogp| (nats)", 1};
    td_canvas *cv = td_plot_lines(L, 4, font, &lo);
    const char *kv[] = {"command_line", set->command};
    td_error err;
    if (cv && !td_canvas_write_png(cv, path, kv, 1, &err)) json_array_append_new(figs, json_string("checkpoints.png"));
    td_canvas_free(cv);
    free(x); free(y1); free(y2); free(y3); free(y4);
}

void td_pm_figures(td_postmortem *pm, const char *out_dir)
{
    const td_pm_curves *C = &pm->curves;
    const td_pm_events *E = &pm->events;
    const char *cmd = pm->set.command;
    json_decref(pm->figures);
    json_t *figs = pm->figures = json_array();
    td_error err;
    td_font *font = td_font_open(NULL, &err);
    char fp[4800];
    if (font && !pm->set.preflight) {
        const char *rk[] = {C->key[E->reward_col], "eval_accuracy", "reward_std"};
        snprintf(fp, sizeof fp, "%s/reward.png", out_dir);
        plot_keys(C, E, rk, 3, "reward", 0, fp, font, cmd, figs);
        const char *pk[] = {"entropy", "actor/entropy", "grad_norm", "actor/grad_norm"};
        snprintf(fp, sizeof fp, "%s/entropy_grad.png", out_dir);
        plot_keys(C, E, pk, 4, "entropy and gradient norm", 1, fp, font, cmd, figs);
        const char *mk[] = {"k3_kl", "rollout_corr/k3_kl", "logp_diff_mean", "sampling/sampling_logp_difference/mean",
                            "rollout_corr/kl", "sampling/importance_sampling_ratio/min"};
        snprintf(fp, sizeof fp, "%s/mismatch_log.png", out_dir);
        plot_keys(C, E, mk, 6, "the mismatch the run logged", 1, fp, font, cmd, figs);
        const char *lk[] = {"response_length_mean", "completions/mean_length", "response_length/mean",
                            "response_length_clip_ratio", "completions/clipped_ratio"};
        snprintf(fp, sizeof fp, "%s/length.png", out_dir);
        plot_keys(C, E, lk, 5, "completion length", 1, fp, font, cmd, figs);
        if (pm->nmeas) {
            snprintf(fp, sizeof fp, "%s/checkpoints.png", out_dir);
            plot_checkpoints(pm, fp, font, figs);
        }
    }
    if (font) td_font_close(font);
}
