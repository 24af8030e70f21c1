/* tidal-sweep's comparison report (include/tidal/sweep.h): every run's /steps, averaged over
 * the seeds of a configuration, as line plots and a Markdown table. */
#include "tidal/analysis.h"
#include "tidal/render.h"
#include "tidal/rl.h"
#include "tidal/runfile.h"
#include "tidal/sweep.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

enum { M_REWARD, M_ACC, M_K3, M_DLOGP, M_GNORM, M_ENT, M_ESS, M_CHI2, M_EVAL, M_DRIFT, M_FLIP, M_N };
static const int METRIC[M_N] = {TD_RLM_reward, TD_RLM_accuracy, TD_RLM_k3_kl, TD_RLM_logp_diff_mean,
                                TD_RLM_grad_norm, TD_RLM_entropy, TD_RLM_rollout_is_eff_sample_size,
                                TD_RLM_chi2_token, TD_RLM_eval_accuracy, TD_RLM_base_drift_max,
                                TD_RLM_routing_flip_rate};

typedef struct {
    const td_sweep_run *run;
    int n;                   /* steps */
    double *m[M_N];          /* (n) */
    int collapse;            /* first reward_drop step, -1 */
    int failed;              /* a read failed (the file changed under us: td_runfile_changed) */
    int finished;            /* the run reached max_steps (attribute finished) */
    int first[TD_CLP_NSIGNALS];
} run_data;

static int load_run(const td_sweep_run *r, run_data *d)
{
    memset(d, 0, sizeof *d);
    d->run = r;
    d->collapse = -1;
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", r->dir, TD_RL_RUNFILE);
    td_runfile *rf = td_runfile_open(p, 0, NULL);
    if (!rf) return -1;
    char col[128];
    snprintf(col, sizeof col, "/steps/%s", td_rl_metric_names[TD_RLM_reward]);
    int64_t n = td_runfile_rows(rf, col), fin = 0;
    if (n <= 0) { td_runfile_close(rf, NULL); return -1; }
    d->n = (int)n;
    td_runfile_get_i64(rf, "finished", &fin, NULL);
    d->finished = fin == 1;
    for (int i = 0; i < M_N; i++) {
        d->m[i] = td_xmalloc((size_t)n * sizeof(double));
        snprintf(col, sizeof col, "/steps/%s", td_rl_metric_names[METRIC[i]]);
        if (td_runfile_read(rf, col, TD_COL_F64, 0, n, d->m[i], NULL)) {
            for (int k = 0; k < n; k++) d->m[i][k] = NAN;
            d->failed = 1;
        }
    }
    td_runfile_close(rf, NULL);
    return 0;
}

static void free_run(run_data *d)
{
    for (int i = 0; i < M_N; i++) free(d->m[i]);
}

/* the marks, replayed through the detector with the file's configuration */
static void marks(const td_sweep_run *r, run_data *d)
{
    char p[4200];
    snprintf(p, sizeof p, "%s/%s", r->dir, TD_RL_RUNFILE);
    td_runfile *rf = td_runfile_open(p, 0, NULL);
    if (!rf) { d->failed = 1; return; }
    td_collapse_cfg cfg;
    td_collapse_cfg_defaults(&cfg);
    char *js = td_runfile_get_str(rf, "collapse_config", NULL);
    if (js) {   /* {"k":v,...} -> k=v,... */
        char spec[1024] = "";
        for (char *q = js; *q; q++)
            if (*q != '{' && *q != '}' && *q != '"') {
                size_t l = strlen(spec);
                if (l + 2 < sizeof spec) { spec[l] = *q == ':' ? '=' : *q; spec[l + 1] = 0; }
            }
        td_collapse_cfg_parse(&cfg, spec, NULL);
        free(js);
    }
    double *rows = td_xmalloc((size_t)d->n * TD_RLM_COUNT * sizeof(double)), *col = td_xmalloc((size_t)d->n * sizeof(double));
    for (int i = 0; i < TD_RLM_COUNT; i++) {
        char name[128];
        snprintf(name, sizeof name, "/steps/%s", td_rl_metric_names[i]);
        if (!td_runfile_exists(rf, name)) {   /* a column newer than the file: nan */
            for (int k = 0; k < d->n; k++) col[k] = NAN;
        } else if (td_runfile_read(rf, name, TD_COL_F64, 0, d->n, col, NULL)) {
            for (int k = 0; k < d->n; k++) col[k] = NAN;
            d->failed = 1;
        }
        for (int k = 0; k < d->n; k++) rows[(size_t)k * TD_RLM_COUNT + i] = col[k];
    }
    td_runfile_close(rf, NULL);
    td_collapse *det = td_collapse_new(&cfg);
    for (int k = 0; k < d->n; k++) td_collapse_push(det, rows + (size_t)k * TD_RLM_COUNT);
    for (int s = 0; s < TD_CLP_NSIGNALS; s++) d->first[s] = td_collapse_first(det, (td_collapse_signal)s);
    d->collapse = d->first[TD_CLP_REWARD];
    td_collapse_free(det);
    free(rows);
    free(col);
}

/* mean over a config's seeds at each step (NaN where no seed has the step), smoothed by a
 * trailing moving average of `win` steps */
static double *config_mean(run_data *rd, int nr, int metric, int steps, int win)
{
    double *y = td_xmalloc((size_t)steps * sizeof(double)), *out = td_xmalloc((size_t)steps * sizeof(double));
    for (int k = 0; k < steps; k++) {
        double s = 0;
        int c = 0;
        for (int i = 0; i < nr; i++)
            if (k < rd[i].n && isfinite(rd[i].m[metric][k])) { s += rd[i].m[metric][k]; c++; }
        y[k] = c ? s / c : NAN;
    }
    for (int k = 0; k < steps; k++) {
        double s = 0;
        int c = 0;
        for (int j = k - win + 1; j <= k; j++) if (j >= 0 && isfinite(y[j])) { s += y[j]; c++; }
        out[k] = c ? s / c : NAN;
    }
    free(y);
    return out;
}

/* a sparse column (eval_accuracy: every eval_steps steps) as a line through its finite points:
 * x and y compressed in place, the count returned */
static size_t finite_points(double *x, double *y, size_t n)
{
    size_t m = 0;
    for (size_t i = 0; i < n; i++)
        if (isfinite(y[i])) { x[m] = x[i]; y[m] = y[i]; m++; }
    return m;
}

/* mean and sample standard deviation over the finite values of v (n), NaN when none */
static void mean_sd(const double *v, int n, double *mean, double *sd)
{
    double s = 0, q = 0;
    int c = 0;
    for (int i = 0; i < n; i++) if (isfinite(v[i])) { s += v[i]; c++; }
    *mean = c ? s / c : NAN;
    for (int i = 0; i < n; i++) if (isfinite(v[i])) q += (v[i] - *mean) * (v[i] - *mean);
    *sd = c > 1 ? sqrt(q / (c - 1)) : NAN;
}

/* the mean of the last k finite values of x (n), NaN when none */
static double last_finite_mean(const double *x, int n, int k)
{
    double s = 0;
    int c = 0;
    for (int i = n - 1; i >= 0 && c < k; i--) if (isfinite(x[i])) { s += x[i]; c++; }
    return c ? s / c : NAN;
}

/* a table cell: the value, or "—" where it is not defined (no finite value) */
static void cell(FILE *F, const char *fmt, double v)
{
    if (isfinite(v)) { fputc(' ', F); fprintf(F, fmt, v); fputs(" |", F); }
    else fputs(" — |", F);
}

/* mean ± sample sd over the seeds' finite values: "—" when none, the mean alone with "(1 seed)"
 * when one (a sample sd needs two) */
static void cell_mean_sd(FILE *F, const char *fmt_mean, const char *fmt_sd, const double *v, int n)
{
    double mu, sd;
    int c = 0;
    for (int i = 0; i < n; i++) c += isfinite(v[i]) != 0;
    mean_sd(v, n, &mu, &sd);
    if (!c) { fputs(" — |", F); return; }
    fputc(' ', F);
    fprintf(F, fmt_mean, mu);
    if (c == 1) fputs(" (1 seed)", F);
    else { fputs(" ± ", F); fprintf(F, fmt_sd, sd); }
    fputs(" |", F);
}

static double window_mean(const double *x, int n, int from, int to)
{
    double s = 0;
    int c = 0;
    for (int k = from < 0 ? 0 : from; k < to && k < n; k++) if (isfinite(x[k])) { s += x[k]; c++; }
    return c ? s / c : NAN;
}

static int write_fig(const td_sweep *s, const char *file, const td_line *lines, size_t n, td_font *font,
                     const td_lines_opts *lo, td_error *err)
{
    td_canvas *cv = td_plot_lines(lines, n, font, lo);
    char path[4300];
    snprintf(path, sizeof path, "%s/%s", s->report_dir, file);
    const char *kv[2] = {"sweep", s->path};
    int rc = td_canvas_write_png(cv, path, kv, 1, err);
    td_canvas_free(cv);
    return rc;
}

/* The seeds behind the means (the clean evaluation, eval_accuracy): per configuration, every
 * seed's line thin and their mean thick (eval_seeds-CONFIG.png), so that runs that die and runs
 * that live show as two bundles rather than one middling mean; and survival.png, the share of a
 * configuration's seeds alive against the step (Kaplan-Meier): a finished run whose last
 * evaluation finds no right answer (eval_accuracy 0) died at the first evaluation after its last
 * one that found some; a finished run that ends finding some survived; a run still going is
 * censored at its last evaluation that found some (it may yet come back). Drawn as steps. */
static int seed_figures(const td_sweep *s, run_data *rd, const int *have, const char **cfg, int ncfg, int steps,
                        td_font *font, td_error *err)
{
    int rc = 0;
    td_line *surv = td_xcalloc((size_t)ncfg, sizeof *surv);
    double *sx = td_xcalloc((size_t)ncfg * 2 * steps, sizeof(double)), *sy = td_xcalloc((size_t)ncfg * 2 * steps, sizeof(double));
    for (int c = 0; c < ncfg && !rc; c++) {
        td_line *lines = td_xcalloc(s->n + 1, sizeof *lines);
        double *bufx = td_xcalloc((s->n + 1) * (size_t)steps, sizeof(double));
        double *bufy = td_xcalloc((s->n + 1) * (size_t)steps, sizeof(double));
        double *sum = td_xcalloc((size_t)steps, sizeof(double));
        int *cnt = td_xcalloc((size_t)steps, sizeof(int)), *last_alive = td_xcalloc(s->n, sizeof(int));
        int *death = td_xcalloc(s->n, sizeof(int)), *censor = td_xcalloc(s->n, sizeof(int));
        size_t nl = 0;
        int nseed = 0;
        for (size_t i = 0; i < s->n; i++) {
            if (!have[i] || strcmp(s->runs[i].config, cfg[c])) continue;
            double *x = bufx + nl * steps, *y = bufy + nl * steps;
            size_t m = 0;
            last_alive[nseed] = -1;
            double final = NAN;
            for (int k = 0; k < rd[i].n && k < steps; k++) {
                double v = rd[i].m[M_EVAL][k];
                if (!isfinite(v)) continue;
                x[m] = k;
                y[m++] = v;
                sum[k] += v;
                cnt[k]++;
                if (v > 0) last_alive[nseed] = k;
                final = v;
            }
            death[nseed] = censor[nseed] = -1;
            if (rd[i].finished && final > 0) {
                censor[nseed] = steps;   /* survived to the end */
            } else if (rd[i].finished) {   /* died at the evaluation after the last right answer */
                for (size_t q = 0; q < m && death[nseed] < 0; q++)
                    if (x[q] > last_alive[nseed]) death[nseed] = (int)x[q];
            } else {
                censor[nseed] = last_alive[nseed] > 0 ? last_alive[nseed] : 0;
            }
            lines[nl] = (td_line){NULL, x, y, m, c % 12, 0, -1, 1};
            if (nl == 0) lines[nl].label = "one seed (thin)";
            nl++;
            nseed++;
        }
        double *mx = bufx + nl * steps, *my = bufy + nl * steps;
        size_t mm = 0;
        for (int k = 0; k < steps; k++)
            if (cnt[k]) { mx[mm] = k; my[mm++] = sum[k] / cnt[k]; }
        lines[nl++] = (td_line){"mean over the seeds (thick)", mx, my, mm, c % 12, 0, -1, 5};
        /* survival at every evaluated step (the steps where any seed was evaluated), as steps */
        double *vx = sx + (size_t)c * 2 * steps, *vy = sy + (size_t)c * 2 * steps;
        size_t vm = 0;
        double S = 1;
        for (int k = 0; k < steps; k++) {
            if (!cnt[k]) continue;
            int at_risk = 0, died = 0;
            for (int q = 0; q < nseed; q++) {
                at_risk += death[q] >= k || censor[q] >= k;
                died += death[q] == k;
            }
            if (at_risk) S *= 1.0 - (double)died / at_risk;
            if (vm) { vx[vm] = k; vy[vm] = vy[vm - 1]; vm++; }   /* the level holds until this step */
            vx[vm] = k;
            vy[vm++] = S;
        }
        surv[c] = (td_line){cfg[c], vx, vy, vm, c % 12, c >= 12 ? 6 : 0, -1, 0};
        char title[300], subt[300], file[300];
        snprintf(title, sizeof title, "Clean evaluation, %s: every seed and their mean", cfg[c]);
        snprintf(subt, sizeof subt, "%d seeds; the trainer's greedy accuracy on held-out records at each evaluation", nseed);
        snprintf(file, sizeof file, "eval_seeds-%s.png", cfg[c]);
        for (char *q = file; *q; q++) if (*q == '/' || *q == ' ') *q = '_';
        td_lines_opts lo = {title, subt, "step", "eval_accuracy", 0};
        rc = write_fig(s, file, lines, nl, font, &lo, err);
        free(lines); free(bufx); free(bufy); free(sum); free(cnt); free(last_alive); free(death); free(censor);
    }
    if (!rc) {
        td_lines_opts lo = {"Runs alive against step (Kaplan-Meier)", "a run dies at the evaluation after its last "
                            "right answer (eval_accuracy 0 to its end); runs still going are censored", "step",
                            "share of seeds alive", 0};
        rc = write_fig(s, "survival.png", surv, (size_t)ncfg, font, &lo, err);
    }
    free(surv); free(sx); free(sy);
    return rc;
}

int td_sweep_report(const td_sweep *s, FILE *out, td_error *err)
{
    run_data *rd = td_xcalloc(s->n ? s->n : 1, sizeof *rd);
    int *have = td_xcalloc(s->n ? s->n : 1, sizeof(int)), steps = 0;
    for (size_t i = 0; i < s->n; i++) {
        char p[4200];
        snprintf(p, sizeof p, "%s/%s", s->runs[i].dir, TD_RL_RUNFILE);
        for (int attempt = 0;; attempt++) {   /* a run being written: read it again if it changed under us */
            td_runfile_stamp stamp;
            td_runfile_stamp_take(p, &stamp);
            have[i] = load_run(&s->runs[i], &rd[i]) == 0;
            if (have[i]) marks(&s->runs[i], &rd[i]);
            if (!have[i] || !rd[i].failed || attempt == 20 || !td_runfile_changed(p, &stamp)) break;
            free_run(&rd[i]);
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
        }
        if (have[i] && rd[i].n > steps) steps = rd[i].n;
    }
    /* configurations in first-seen order */
    const char **cfg = td_xcalloc(s->n ? s->n : 1, sizeof(char *));
    int ncfg = 0;
    for (size_t i = 0; i < s->n; i++) {
        if (!have[i]) continue;
        int seen = 0;
        for (int c = 0; c < ncfg; c++) seen |= !strcmp(cfg[c], s->runs[i].config);
        if (!seen) cfg[ncfg++] = s->runs[i].config;
    }
    if (!ncfg) { free(rd); free(have); free(cfg); return td_fail(err, "%s: no run has an rl.h5 yet", s->output_dir); }
    if (mkdir(s->report_dir, 0755) && errno != EEXIST) {
        free(rd); free(have); free(cfg);
        return td_fail(err, "%s: cannot create: %s", s->report_dir, strerror(errno));
    }
    td_font *font = td_font_open(NULL, err);
    if (!font) { free(rd); free(have); free(cfg); return -1; }
    /* optional: figures of columns only some runs have (clean evaluation, LoRA base drift, MoE
     * routing flips) are drawn when a run has a finite value in them */
    static const struct { int metric; const char *file, *title, *ylabel; int log_y, sparse, optional; } FIGS[] = {
        {M_REWARD, "reward.png", "Reward against step", "mean reward", 0, 0, 0},
        {M_ACC, "accuracy.png", "Exact-answer accuracy against step", "accuracy", 0, 0, 0},
        {M_K3, "mismatch.png", "Training/rollout mismatch (verl k3_kl) against step", "k3_kl (nats)", 1, 0, 0},
        {M_GNORM, "grad_norm.png", "Gradient norm (pre-clip) against step", "grad_norm", 1, 0, 0},
        {M_ENT, "entropy.png", "Policy entropy against step", "entropy (nats)", 0, 0, 0},
        {M_ESS, "is_ess.png", "Token IS-weight ESS fraction against step", "ESS fraction", 0, 0, 0},
        {M_EVAL, "eval_accuracy.png", "Clean evaluation: the trainer's greedy accuracy against step",
         "eval_accuracy", 0, 1, 1},
        {M_DRIFT, "base_drift.png", "LoRA base-weight drift: max |W_t − W_0| of the frozen weights",
         "base_drift_max", 1, 0, 1},
        {M_FLIP, "routing_flips.png", "MoE routing flips, rollout against trainer (under R3: the trainer's "
         "router's would-be choice)", "routing_flip_rate", 1, 0, 1}};
    int has[M_N] = {0};
    for (size_t i = 0; i < s->n; i++)
        for (int mi = 0; have[i] && mi < M_N; mi++)
            for (int k = 0; k < rd[i].n && !has[mi]; k++) has[mi] = isfinite(rd[i].m[mi][k]);
    double *xs = td_xmalloc((size_t)steps * sizeof(double));
    for (int k = 0; k < steps; k++) xs[k] = k;
    int rc = 0;
    for (size_t f = 0; f < sizeof FIGS / sizeof FIGS[0] && !rc; f++) {
        if (FIGS[f].optional && !has[FIGS[f].metric]) continue;
        td_line *lines = td_xcalloc((size_t)ncfg, sizeof *lines);
        run_data *sub = td_xmalloc(s->n * sizeof *sub);
        int nl = 0;   /* an optional figure leaves out configurations without a value (dense runs' flips) */
        for (int c = 0; c < ncfg; c++) {
            int nr = 0, mark = -1;
            for (size_t i = 0; i < s->n; i++)
                if (have[i] && !strcmp(s->runs[i].config, cfg[c])) {
                    sub[nr++] = rd[i];
                    if (rd[i].collapse >= 0 && (mark < 0 || rd[i].collapse < mark)) mark = rd[i].collapse;
                }
            double *y = config_mean(sub, nr, FIGS[f].metric, steps, FIGS[f].sparse ? 1 : 5), *x = xs;
            size_t np = (size_t)steps;
            if (FIGS[f].sparse) {   /* the evaluated steps only, joined */
                x = td_xmalloc((size_t)steps * sizeof(double));
                memcpy(x, xs, (size_t)steps * sizeof(double));
                np = finite_points(x, y, np);
                mark = -1;
            }
            int any = 0;
            for (size_t k = 0; k < np && !any; k++) any = isfinite(y[k]);
            if (FIGS[f].optional && !any) {
                free(y);
                if (x != xs) free(x);
                continue;
            }
            lines[nl++] = (td_line){cfg[c], x, y, np, c % 12, c >= 12 ? 6 : 0, mark, 0};
        }
        char sub_t[256];
        snprintf(sub_t, sizeof sub_t, FIGS[f].sparse ? "mean over seeds at each evaluation"
                                                     : "mean over seeds, 5-step trailing average; ring = first collapse "
                                                       "(reward_drop) of any seed");
        td_lines_opts lo = {FIGS[f].title, sub_t, "step", FIGS[f].ylabel, FIGS[f].log_y};
        td_canvas *cv = td_plot_lines(lines, (size_t)nl, font, &lo);
        char path[4300];
        snprintf(path, sizeof path, "%s/%s", s->report_dir, FIGS[f].file);
        const char *kv[2] = {"sweep", s->path};
        rc = td_canvas_write_png(cv, path, kv, 1, err);
        td_canvas_free(cv);
        for (int c = 0; c < nl; c++) {
            free((double *)lines[c].y);
            if (lines[c].x != xs) free((double *)lines[c].x);
        }
        free(lines);
        free(sub);
    }
    if (!rc && has[M_EVAL]) rc = seed_figures(s, rd, have, cfg, ncfg, steps, font, err);
    /* outcome against mismatch: one point per configuration (seeds averaged): x = log10 of the
     * run-mean |dlogp|, y = the final reward; the exact-match control (0) has no place on it */
    if (!rc) {
        td_line *pts = td_xcalloc((size_t)ncfg, sizeof *pts);
        double *px = td_xcalloc((size_t)ncfg, sizeof(double)), *py = td_xcalloc((size_t)ncfg, sizeof(double));
        size_t np = 0;
        for (int c = 0; c < ncfg; c++) {
            double mx = 0, fr = 0;
            int nr = 0;
            for (size_t i = 0; i < s->n; i++)
                if (have[i] && !strcmp(s->runs[i].config, cfg[c])) {
                    mx += window_mean(rd[i].m[M_DLOGP], rd[i].n, 0, rd[i].n);
                    fr += window_mean(rd[i].m[M_REWARD], rd[i].n, rd[i].n - 10, rd[i].n);
                    nr++;
                }
            if (!(mx > 0)) continue;
            px[np] = log10(mx / nr);
            py[np] = fr / nr;
            pts[np] = (td_line){cfg[c], &px[np], &py[np], 1, c % 12, 0, 0, 0};
            np++;
        }
        td_lines_opts lo = {"Final reward against the mismatch", "one ring per configuration: x = log10 of the mean |Δlogp| "
                            "over the run, y = mean reward of the last 10 steps (seeds averaged)",
                            "log10 mean |Δlogp| (nats)", "final reward", 0};
        td_canvas *cv = td_plot_lines(pts, np, font, &lo);
        char path[4300];
        snprintf(path, sizeof path, "%s/outcome.png", s->report_dir);
        const char *kv[2] = {"sweep", s->path};
        rc = td_canvas_write_png(cv, path, kv, 1, err);
        td_canvas_free(cv);
        free(pts); free(px); free(py);
    }
    /* the table */
    char mdp[4300];
    snprintf(mdp, sizeof mdp, "%s/table.md", s->report_dir);
    FILE *md = rc ? NULL : fopen(mdp, "w");
    if (!rc && !md) rc = td_fail(err, "%s: cannot write", mdp);
    FILE *outs[2] = {md, out};
    for (int o = 0; o < 2 && !rc; o++) {
        FILE *F = outs[o];
        if (!F) continue;
        fprintf(F, "| configuration | seeds | steps | collapse step (reward_drop) per seed | first precursor | "
                "final acc | best acc | final reward | k3_kl step 0 | k3_kl last | mean abs dlogp step 0 | "
                "mean abs dlogp last | min IS ESS | median grad norm |%s%s\n",
                has[M_EVAL] ? " final clean acc (mean ± sd) | clean acc per seed |" : "",
                has[M_DRIFT] ? " base drift max at the end (mean ± sd) |" : "");
        fprintf(F, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|%s%s\n", has[M_EVAL] ? "---|---|" : "",
                has[M_DRIFT] ? "---|" : "");
        for (int c = 0; c < ncfg; c++) {
            char col[256] = "", pre[256] = "", evs[256] = "";
            double fa = 0, ba = 0, fr = 0, k0 = 0, k1 = 0, d0 = 0, d1 = 0, ess = INFINITY, gmed = 0;
            double *ev = td_xmalloc(s->n * sizeof(double)), *dr = td_xmalloc(s->n * sizeof(double));
            int nr = 0, n = 0, nb = 0;   /* nb: seeds with a full 10-step window (best acc) */
            for (size_t i = 0; i < s->n; i++) {
                if (!have[i] || strcmp(s->runs[i].config, cfg[c])) continue;
                run_data *d = &rd[i];
                char one[32];
                snprintf(one, sizeof one, "%s%s", nr ? " / " : "", d->collapse >= 0 ? "" : "—");
                if (d->collapse >= 0) snprintf(one, sizeof one, "%s%d", nr ? " / " : "", d->collapse);
                strncat(col, one, sizeof col - strlen(col) - 1);
                int best_sig = -1, best_at = -1;
                for (int sg = 1; sg < TD_CLP_NSIGNALS; sg++)
                    if (d->first[sg] >= 0 && (best_at < 0 || d->first[sg] < best_at)) { best_at = d->first[sg]; best_sig = sg; }
                snprintf(one, sizeof one, "%s%s", nr ? " / " : "", best_sig >= 0 ? "" : "—");
                if (best_sig >= 0) snprintf(one, sizeof one, "%s%s@%d", nr ? " / " : "", td_collapse_signal_names[best_sig], best_at);
                strncat(pre, one, sizeof pre - strlen(pre) - 1);
                fa += window_mean(d->m[M_ACC], d->n, d->n - 10, d->n);
                fr += window_mean(d->m[M_REWARD], d->n, d->n - 10, d->n);
                if (d->n >= 10) {   /* full windows only: a partial one (the first steps) is no 10-step mean */
                    double b = 0;
                    for (int k = 9; k < d->n; k++) b = fmax(b, window_mean(d->m[M_ACC], d->n, k - 9, k + 1));
                    ba += b;
                    nb++;
                }
                k0 += d->m[M_K3][0];
                k1 += window_mean(d->m[M_K3], d->n, d->n - 10, d->n);
                d0 += d->m[M_DLOGP][0];
                d1 += window_mean(d->m[M_DLOGP], d->n, d->n - 10, d->n);
                for (int k = 0; k < d->n; k++) if (isfinite(d->m[M_ESS][k])) ess = fmin(ess, d->m[M_ESS][k]);
                double *g = td_xmalloc((size_t)d->n * sizeof(double));
                memcpy(g, d->m[M_GNORM], (size_t)d->n * sizeof(double));
                int m = 0;
                for (int k = 0; k < d->n; k++) if (isfinite(g[k])) g[m++] = g[k];
                if (m) gmed += td_quantile_select(g, (size_t)m, 0.5);
                free(g);
                n = n > d->n ? n : d->n;
                ev[nr] = last_finite_mean(d->m[M_EVAL], d->n, 2);
                dr[nr] = last_finite_mean(d->m[M_DRIFT], d->n, 1);
                snprintf(one, sizeof one, "%s%.2f", nr ? " / " : "", ev[nr]);
                if (!isfinite(ev[nr])) snprintf(one, sizeof one, "%s—", nr ? " / " : "");
                strncat(evs, one, sizeof evs - strlen(evs) - 1);
                nr++;
            }
            fprintf(F, "| %s | %d | %d | %s | %s |", cfg[c], nr, n, col, pre);
            cell(F, "%.3f", fa / nr);
            cell(F, "%.3f", nb ? ba / nb : NAN);
            cell(F, "%.3f", fr / nr);
            cell(F, "%.2e", k0 / nr);
            cell(F, "%.2e", k1 / nr);
            cell(F, "%.2e", d0 / nr);
            cell(F, "%.2e", d1 / nr);
            cell(F, "%.3f", ess);
            cell(F, "%.3g", gmed / nr);
            if (has[M_EVAL]) {
                cell_mean_sd(F, "%.3f", "%.3f", ev, nr);
                fprintf(F, " %s |", evs);
            }
            if (has[M_DRIFT]) cell_mean_sd(F, "%.2e", "%.1e", dr, nr);
            fputc('\n', F);
            free(ev); free(dr);
        }
        fprintf(F, "\nfinal = mean of the last 10 steps (of all, in a shorter run); best acc = best mean of 10 "
                "consecutive steps (— in a run of fewer than 10 steps; seeds with 10 averaged); mismatch 'last' = mean of "
                "the last 10 steps; values averaged over seeds; collapse and precursors: the detector's marks "
                "(include/tidal/rl.h). — = not defined (no finite value: not measured, or full fine-tuning's base "
                "drift); one seed has no sd, marked (1 seed).%s%s\n",
                has[M_EVAL] ? " Final clean acc: per seed the mean of its last two evaluations (--eval-steps: the "
                              "trainer's greedy accuracy on held-out records), then mean ± sample sd over seeds." : "",
                has[M_DRIFT] ? " Base drift: max |W_t − W_0| of the frozen LoRA base at the last step (0 unless the "
                               "sync is merge-unmerge)." : "");
    }
    if (md) fclose(md);
    td_font_close(font);
    for (size_t i = 0; i < s->n; i++) if (have[i]) free_run(&rd[i]);
    free(rd); free(have); free(cfg); free(xs);
    return rc;
}
