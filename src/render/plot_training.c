/* training: tidal-rl runs' /steps column against the optimiser step, one line per run: the
 * per-step view of an RL run (tidal-sweep's report draws the same per configuration:
 * src/rl/sweep_report.c). x = /steps/step, as TensorBoard and metrics.jsonl count it; a ring at
 * the run's collapse_step (the detector's reward_drop). A sparse column (eval_*: every
 * --eval-steps steps) is joined through its finite points; the y axis is logarithmic when the
 * column is positive and spans more than two decades (k3_kl, grad_norm). */
#include "render_internal.h"
#include "tidal/rl.h"
#include "tidal/runfile.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    double *x, *y;
    size_t n;
    int marker;
} series;

static int load_series(const char *path, const char *column, series *s, td_error *err)
{
    memset(s, 0, sizeof *s);
    s->marker = -1;
    td_runfile *rf = td_runfile_open(path, 0, err);
    if (!rf) return -1;
    char *tool = td_runfile_get_str(rf, "tool", NULL), col[200];
    int ok = tool && !strcmp(tool, "tidal-rl");
    free(tool);
    if (!ok) {
        td_runfile_close(rf, NULL);
        return td_fail(err, "%s: not a tidal-rl run file (--plot training draws its /steps; a tidal-diff file's "
                       "mismatch by position in the completion is --plot positions)", path);
    }
    snprintf(col, sizeof col, "/steps/%s", column);
    int64_t n = td_runfile_exists(rf, col) ? td_runfile_rows(rf, col) : -1;
    if (n < 0) {
        td_runfile_close(rf, NULL);
        return td_fail(err, "%s: no /steps/%s (--column: a /steps column, docs/run-files.md; e.g. reward, accuracy, "
                       "eval_accuracy, k3_kl, grad_norm, entropy)", path, column);
    }
    s->x = td_xmalloc((size_t)(n ? n : 1) * sizeof(double));
    s->y = td_xmalloc((size_t)(n ? n : 1) * sizeof(double));
    int64_t cs = -1;
    if (td_runfile_read(rf, col, TD_COL_F64, 0, n, s->y, err) ||
        (td_runfile_exists(rf, "/steps/step") && td_runfile_read(rf, "/steps/step", TD_COL_F64, 0, n, s->x, err))) {
        td_runfile_close(rf, NULL);
        return -1;
    }
    if (!td_runfile_exists(rf, "/steps/step")) for (int64_t k = 0; k < n; k++) s->x[k] = (double)k;
    td_runfile_get_i64(rf, "collapse_step", &cs, NULL);
    td_runfile_close(rf, NULL);
    s->n = (size_t)n;
    s->marker = cs >= 0 && cs < n ? (int)cs : -1;
    return 0;
}

td_canvas *td_plot_training(const char *const *paths, size_t n, const char *column, td_font *font, const char *title,
                            td_error *err)
{
    series *s = td_xcalloc(n ? n : 1, sizeof *s);
    td_line *lines = td_xcalloc(n ? n : 1, sizeof *lines);
    td_canvas *cv = NULL;
    size_t loaded = 0, finite = 0, total = 0;
    double lo = INFINITY, hi = -INFINITY;
    for (; loaded < n; loaded++) {
        if (load_series(paths[loaded], column, &s[loaded], err)) goto done;
        for (size_t k = 0; k < s[loaded].n; k++)
            if (isfinite(s[loaded].y[k])) { lo = fmin(lo, s[loaded].y[k]); hi = fmax(hi, s[loaded].y[k]); finite++; }
        total += s[loaded].n;
    }
    if (!finite) {
        td_fail(err, "/steps/%s has no finite value in %s%s", column, n == 1 ? paths[0] : "any of the runs",
                total ? "" : " (no steps yet)");
        goto done;
    }
    int sparse = finite * 2 < total;   /* eval_*: the evaluated steps only, joined */
    for (size_t i = 0; i < n; i++) {
        if (sparse) {
            size_t m = 0;
            for (size_t k = 0; k < s[i].n; k++)
                if (isfinite(s[i].y[k])) { s[i].x[m] = s[i].x[k]; s[i].y[m] = s[i].y[k]; m++; }
            s[i].n = m;
            s[i].marker = -1;
        }
        lines[i] = (td_line){paths[i], s[i].x, s[i].y, s[i].n, (int)(i % 12), i >= 12 ? 6 : 0, s[i].marker, 0};
    }
    char t[300], sub[200];
    snprintf(t, sizeof t, "%s", title ? title : "");
    if (!title) snprintf(t, sizeof t, "%s against the optimiser step", column);
    snprintf(sub, sizeof sub, "%s; ring = the run's collapse (reward_drop)", sparse ? "the evaluated steps, joined"
                                                                                  : "one line per run, every step");
    td_lines_opts lo_opts = {t, sub, "optimiser step (/steps/step)", column, lo > 0 && hi > 100 * lo};
    cv = td_plot_lines(lines, n, font, &lo_opts);
done:
    for (size_t i = 0; i < n; i++) { free(s[i].x); free(s[i].y); }
    free(s);
    free(lines);
    return cv;
}
