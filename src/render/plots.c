/* The figures tidal-heatmap draws (include/tidal/render.h):
 *   seqpos   sequences × positions of |Δlogp| or KL(B‖A), pooled into cells (max or mean)
 *   layers   layers × positions of the per-layer relative error ‖h_a − h_b‖/‖h_a‖
 *   density  2-D histogram of p_a against p_b on log-log axes (GSL histogram2d), y = x dashed
 *   hist     histogram of Δlogp (GSL histogram), share of tokens on a log axis, runs overlaid
 *   steps    mismatch against the generation step (plot_steps.c)
 * Several runs: heatmaps are stacked (density side by side) on one shared colour scale, so
 * equal colours mean equal values across precisions. */
#include "render_internal.h"

#include <gsl/gsl_histogram.h>
#include <gsl/gsl_histogram2d.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static int ceil_div(long a, long b) { return (int)((a + b - 1) / b); }

void td_figure_title(td_canvas *c, td_font *font, const char *title, const char *subtitle)
{
    td_font_draw(font, c, c->w / 2, 10, TD_FONT_TITLE, 1, 0, 0, TD_BLACK, title);
    if (subtitle) td_font_draw(font, c, c->w / 2, 36, TD_FONT_TICK, 1, 0, 0, TD_GREY, subtitle);
}

static const char *base_name(const char *p) { return strrchr(p, '/') ? strrchr(p, '/') + 1 : p; }

static void panel_title(char *buf, size_t n, const td_run *r)
{
    snprintf(buf, n, "%s   (%s, %zu tokens, %zu sequences)", r->label, base_name(r->path), r->n, r->nseq);
}

/* Range of the finite cell values over all panels: [min positive (log) or min, max]. */
static void value_range(td_heat *h, size_t n, int log_scale, double *vmin, double *vmax)
{
    double lo = INFINITY, hi = -INFINITY;
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < (size_t)h[k].rows * (size_t)h[k].cols; i++) {
            double v = h[k].v[i];
            if (!isfinite(v) || (log_scale && v <= 0)) continue;
            if (v < lo) lo = v;
            if (v > hi) hi = v;
        }
    if (!isfinite(lo)) { lo = log_scale ? 1e-6 : 0; hi = log_scale ? 1 : 1; }
    if (log_scale && hi / lo > 1e8) lo = hi / 1e8;  // eight decades are all a colour bar can show
    if (!log_scale && lo > 0) lo = 0;  // linear scales of magnitudes start at 0
    if (!(hi > lo)) hi = log_scale ? lo * 10 : lo + 1;
    *vmin = lo;
    *vmax = hi;
}

/* Stacked heatmap panels with one colour bar. */
static td_canvas *stack_figure(td_font *font, td_heat *h, size_t n, int ph, int log_scale, const char *title,
                               const char *subtitle, const char *xlabel, const char *ylabel, const char *cbar)
{
    double vmin, vmax;
    value_range(h, n, log_scale, &vmin, &vmax);
    int stride = ph + 78;
    td_canvas *c = td_canvas_new(FIG_W, TOP + (int)n * stride + 4, TD_WHITE);
    td_figure_title(c, font, title, subtitle);
    for (size_t k = 0; k < n; k++) {
        int y = TOP + 22 + (int)k * stride;
        td_heat_draw(c, font, &h[k], ML, y, PW, ph, vmin, vmax, log_scale);
        td_font_draw(font, c, ML + PW / 2, y + ph + 24, TD_FONT_LABEL, 1, 0, 0, TD_BLACK, xlabel);
        td_font_draw(font, c, 14, y + ph / 2, TD_FONT_LABEL, 1, 1, 1, TD_BLACK, ylabel);
    }
    int cb_h = (int)n * stride - 78 > 120 ? (int)n * stride - 78 : 120;
    if (cb_h > c->h - TOP - 30) cb_h = c->h - TOP - 30;
    td_colorbar(c, font, ML + PW + 24, TOP + 22, 18, cb_h, vmin, vmax, log_scale, cbar);
    return c;
}

static int panel_height(int rows) { return rows * 4 < 140 ? 140 : rows * 4 > 300 ? 300 : rows * 4; }

static td_canvas *plot_seqpos(const td_run *runs, size_t n, td_font *font, const td_plot_opts *o)
{
    int max_rows = o->max_rows > 0 ? o->max_rows : 300, max_cols = o->max_cols > 0 ? o->max_cols : PW;
    td_heat *h = td_xcalloc(n, sizeof *h);
    char (*titles)[256] = td_xcalloc(n, sizeof *titles);
    int fr_all = 1, fc_all = 1, ph = 140;
    for (size_t k = 0; k < n; k++) {
        const td_run *r = &runs[k];
        long cols_full = (long)r->max_pos + 1;
        int fr = ceil_div((long)r->nseq, max_rows), fc = ceil_div(cols_full, max_cols);
        int rows = ceil_div((long)r->nseq, fr), cols = ceil_div(cols_full, fc);
        size_t cells = (size_t)rows * (size_t)cols;
        double *v = td_xmalloc(cells * sizeof(double));
        int32_t *cnt = td_xcalloc(cells, sizeof(int32_t));
        for (size_t i = 0; i < cells; i++) v[i] = o->pool_mean ? 0 : -INFINITY;
        for (size_t i = 0; i < r->n; i++) {
            double x = o->metric_kl ? r->kl_ba[i] : fabs(r->dlogp[i]);
            if (!isfinite(x)) continue;
            size_t cell = (size_t)(r->seq[i] / fr) * (size_t)cols + (size_t)(r->pos[i] / fc);
            cnt[cell]++;
            if (o->pool_mean) v[cell] += x;
            else if (x > v[cell]) v[cell] = x;
        }
        for (size_t i = 0; i < cells; i++) v[i] = cnt[i] ? (o->pool_mean ? v[i] / cnt[i] : v[i]) : NAN;
        free(cnt);
        panel_title(titles[k], sizeof titles[k], r);
        h[k] = (td_heat){.rows = rows, .cols = cols, .v = v, .x0 = 0, .x1 = (double)cols * fc,
                         .y0 = -0.5, .y1 = (double)rows * fr - 0.5, .nan_col = {214, 214, 214}, .title = titles[k]};
        if (fr > fr_all) fr_all = fr;
        if (fc > fc_all) fc_all = fc;
        if (panel_height(rows) > ph) ph = panel_height(rows);
    }
    size_t nonpos = 0;  // cells a log scale cannot place (drawn white, said in the subtitle)
    for (size_t k = 0; k < n && o->log_scale; k++)
        for (size_t i = 0; i < (size_t)h[k].rows * (size_t)h[k].cols; i++) nonpos += h[k].v[i] <= 0;
    char title[512], sub[320], cell[96];
    const char *what = o->metric_kl ? "KL(B‖A) per token" : "|Δlogp| = |logp_B − logp_A| per token";
    snprintf(title, sizeof title, "%s", o->title ? o->title : what);
    if (fr_all == 1 && fc_all == 1) snprintf(cell, sizeof cell, "each cell one token");
    else snprintf(cell, sizeof cell, "each cell the %s over %d sequence%s × %d position%s", o->pool_mean ? "mean" : "max",
                  fr_all, fr_all > 1 ? "s" : "", fc_all, fc_all > 1 ? "s" : "");
    snprintf(sub, sizeof sub, "A = training path, B = inference path · %s · grey: no scored token (prompt or past "
             "the end)%s", cell, nonpos ? " · white: ≤ 0 (off a log scale)" : "");
    td_canvas *c = stack_figure(font, h, n, ph, o->log_scale, title, sub, "position in sequence (prompt + response)",
                                "sequence", o->metric_kl ? "KL(B‖A)" : "|Δlogp|");
    for (size_t k = 0; k < n; k++) free(h[k].v);
    free(h);
    free(titles);
    return c;
}

/* One run's rows x positions grid of per-token, per-row values val(r, i, row) (NaN: skipped), pooled
 * into cells of fc positions (max, or mean over the tokens at those positions); grey where no token. */
static double *row_grid(const td_run *r, int rows, double (*val)(const td_run *, size_t, int), int pool_mean,
                        int max_cols, int *cols_out, int *fc_out)
{
    int fc = ceil_div((long)r->max_pos + 1, max_cols), cols = ceil_div((long)r->max_pos + 1, fc);
    size_t cells = (size_t)rows * (size_t)cols;
    double *v = td_xmalloc(cells * sizeof(double));
    int64_t *cnt = td_xcalloc(cells, sizeof(int64_t));
    for (size_t i = 0; i < cells; i++) v[i] = pool_mean ? 0 : -INFINITY;
    for (size_t i = 0; i < r->n; i++) {
        int q = r->pos[i] / fc;
        for (int l = 0; l < rows; l++) {
            double x = val(r, i, l);
            size_t c = (size_t)l * (size_t)cols + (size_t)q;
            if (!isfinite(x)) continue;
            cnt[c]++;
            if (pool_mean) v[c] += x;
            else if (x > v[c]) v[c] = x;
        }
    }
    for (size_t c = 0; c < cells; c++) v[c] = cnt[c] ? (pool_mean ? v[c] / (double)cnt[c] : v[c]) : NAN;
    free(cnt);
    *cols_out = cols;
    *fc_out = fc;
    return v;
}

static double layer_err_at(const td_run *r, size_t i, int l) { return r->layer_err[i * r->n_layers + (size_t)l]; }

/* 1 where the predicting position chose another expert set on A than on B, 0 where it did not */
static double flip_at(const td_run *r, size_t i, int l)
{
    int8_t f = r->route_flip[i * r->n_moe_layers + (size_t)l];
    return f < 0 ? NAN : f == 2;
}

/* rows (layers or MoE layers) x positions, one panel per run */
static td_canvas *plot_rows(const td_run *runs, size_t n, td_font *font, const td_plot_opts *o, int routing,
                            td_error *err)
{
    for (size_t k = 0; k < n; k++)
        if (routing ? !runs[k].route_flip : !runs[k].layer_err) {
            td_fail(err, routing ? "%s: no routing in this run (/routing/flip is absent: tidal-diff records it on a "
                                   "mixture of experts)"
                                 : "%s: no per-layer errors in this run (/layers/rel_err is absent; tidal-diff --layers "
                                   "records them)", runs[k].path);
            return NULL;
        }
    int max_cols = o->max_cols > 0 ? o->max_cols : PW;
    td_heat *h = td_xcalloc(n, sizeof *h);
    char (*titles)[256] = td_xcalloc(n, sizeof *titles);
    int fc_all = 1, ph = 140;
    for (size_t k = 0; k < n; k++) {
        const td_run *r = &runs[k];
        int L = (int)(routing ? r->n_moe_layers : r->n_layers), cols, fc;
        double *v = row_grid(r, L, routing ? flip_at : layer_err_at, routing || o->pool_mean, max_cols, &cols, &fc);
        panel_title(titles[k], sizeof titles[k], r);
        h[k] = (td_heat){.rows = L, .cols = cols, .v = v, .x0 = 0, .x1 = (double)cols * fc, .y0 = -0.5,
                         .y1 = (double)L - 0.5, .flip = 1, .nan_col = {214, 214, 214}, .title = titles[k]};
        if (fc > fc_all) fc_all = fc;
        int want = L * 16 < 140 ? 140 : L * 16 > 300 ? 300 : L * 16;
        if (want > ph) ph = want;
    }
    char sub[256];
    td_canvas *c;
    if (routing) {
        snprintf(sub, sizeof sub, "share of the tokens at each position whose predicting position chose another "
                 "expert set on A than on B (%d position%s per cell) · grey: no token", fc_all, fc_all > 1 ? "s" : "");
        c = stack_figure(font, h, n, ph, 0, o->title ? o->title : "Routing flips between the paths", sub,
                         "position in sequence (prompt + response)", "MoE layer (0 = first)", "share flipped");
    } else {
        snprintf(sub, sizeof sub, "relative error of the residual stream after each layer, %s over the tokens at "
                 "each position (%d position%s per cell) · grey: no token", o->pool_mean ? "mean" : "max", fc_all,
                 fc_all > 1 ? "s" : "");
        c = stack_figure(font, h, n, ph, o->log_scale, o->title ? o->title : "Per-layer error ‖h_A − h_B‖ / ‖h_A‖",
                         sub, "position in sequence (prompt + response)", "layer (0 = first)", "‖h_A − h_B‖ / ‖h_A‖");
    }
    for (size_t k = 0; k < n; k++) free(h[k].v);
    free(h);
    free(titles);
    return c;
}

static td_canvas *plot_density(const td_run *runs, size_t n, td_font *font, const td_plot_opts *o)
{
    enum { NB = 150, SIDE = 300, GAP = 84 };
    /* common axis range in log10 p: from the smallest finite log-prob (down to 10^-12) to 1 */
    /* one axis range for p_A and p_B (so p_B = p_A is the diagonal), fitted to the data with a
     * 5 % margin, floored at 10^-12 (smaller probabilities are counted in the edge cells) */
    double lo = INFINITY, hi = -INFINITY;
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < runs[k].n; i++) {
            double a = runs[k].logp_a[i] / M_LN10, b = runs[k].logp_b[i] / M_LN10;
            if (isfinite(a)) { lo = a < lo ? a : lo; hi = a > hi ? a : hi; }
            if (isfinite(b)) { lo = b < lo ? b : lo; hi = b > hi ? b : hi; }
        }
    if (!isfinite(lo)) { lo = -1; hi = 0; }
    if (lo < -12) lo = -12;
    double pad = 0.05 * (hi - lo > 0.1 ? hi - lo : 0.1);
    lo -= pad;
    hi = hi + pad > 0 ? 0 : hi + pad;
    td_heat *h = td_xcalloc(n, sizeof *h);
    char (*titles)[256] = td_xcalloc(n, sizeof *titles);
    for (size_t k = 0; k < n; k++) {
        gsl_histogram2d *g = gsl_histogram2d_alloc(NB, NB);
        gsl_histogram2d_set_ranges_uniform(g, lo, hi + 1e-12, lo, hi + 1e-12);
        const td_run *r = &runs[k];
        for (size_t i = 0; i < r->n; i++) {
            double a = r->logp_a[i] / M_LN10, b = r->logp_b[i] / M_LN10;
            if (!isfinite(a) || !isfinite(b)) continue;
            /* below the axis: counted in the edge cell, so nothing silently disappears */
            a = a < lo ? lo : a > hi ? hi : a;
            b = b < lo ? lo : b > hi ? hi : b;
            gsl_histogram2d_increment(g, a, b);
        }
        double *v = td_xmalloc((size_t)NB * NB * sizeof(double));
        for (int y = 0; y < NB; y++)      // heat row y (flipped: 0 at the bottom) = p_b bin
            for (int x = 0; x < NB; x++) {
                double cnt = gsl_histogram2d_get(g, (size_t)x, (size_t)y);
                v[(size_t)y * NB + x] = cnt > 0 ? cnt : NAN;
            }
        gsl_histogram2d_free(g);
        snprintf(titles[k], sizeof titles[k], "%s", r->label);
        h[k] = (td_heat){.rows = NB, .cols = NB, .v = v, .x0 = lo, .x1 = hi, .y0 = lo, .y1 = hi, .flip = 1,
                         .decades = 1, .nan_col = TD_WHITE, .title = titles[k]};
    }
    double vmin, vmax;
    value_range(h, n, 1, &vmin, &vmax);
    if (vmin > 1) vmin = 1;
    int W = ML + (int)n * (SIDE + GAP) + 70;
    if (W < 640) W = 640;
    td_canvas *c = td_canvas_new(W, TOP + 22 + SIDE + 60, TD_WHITE);
    td_figure_title(c, font, o->title ? o->title : "Token probability: training path (A) against inference path (B)",
                 "each scored token counted once at (p_A, p_B) on log-log axes · dashed: p_B = p_A · white: no token");
    for (size_t k = 0; k < n; k++) {
        int x = ML + (int)k * (SIDE + GAP), y = TOP + 22;
        td_heat_draw(c, font, &h[k], x, y, SIDE, SIDE, vmin, vmax, 1);
        td_canvas_line(c, x, y + SIDE - 1, x + SIDE - 1, y, TD_GREY, 4);
        td_font_draw(font, c, x + SIDE / 2, y + SIDE + 26, TD_FONT_LABEL, 1, 0, 0, TD_BLACK, "p_A (training path)");
        td_font_draw(font, c, x - 62, y + SIDE / 2, TD_FONT_LABEL, 1, 1, 1, TD_BLACK, "p_B (inference path)");
        free(h[k].v);
    }
    td_colorbar(c, font, W - 110, TOP + 22, 18, SIDE, vmin, vmax, 1, "tokens per cell");
    free(h);
    free(titles);
    return c;
}

const td_rgb TD_PALETTE[6] = {{31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189}, {140, 86, 75}};

static td_canvas *plot_hist(const td_run *runs, size_t n, td_font *font, const td_plot_opts *o)
{
    enum { NB = 101, PH = 340 };
    double R = o->hist_range;
    if (!(R > 0)) {  // 1.1 × the largest p99.9 of |Δlogp|: the bulk, not one outlier, sets the axis
        for (size_t k = 0; k < n; k++) {
            double *a = td_xmalloc(runs[k].n * sizeof(double));
            size_t m = 0;
            for (size_t i = 0; i < runs[k].n; i++) if (isfinite(runs[k].dlogp[i])) a[m++] = fabs(runs[k].dlogp[i]);
            if (m) {
                double q = td_quantile_select(a, m, 0.999);
                if (q > R) R = q;
            }
            free(a);
        }
        R = R > 0 ? 1.1 * R : 1e-6;
    }
    double *share = td_xmalloc(n * NB * sizeof(double)), smin = 1, smax = 0;
    size_t *outside = td_xcalloc(n, sizeof(size_t));
    for (size_t k = 0; k < n; k++) {
        gsl_histogram *g = gsl_histogram_alloc(NB);
        gsl_histogram_set_ranges_uniform(g, -R, R * (1 + 1e-12));
        size_t m = 0;
        for (size_t i = 0; i < runs[k].n; i++) {
            double d = runs[k].dlogp[i];
            if (!isfinite(d)) continue;
            m++;
            if (d < -R || d > R) outside[k]++;
            gsl_histogram_increment(g, d < -R ? -R : d > R ? R : d);  // tails land in the edge bins
        }
        for (int b = 0; b < NB; b++) {
            double s = m ? gsl_histogram_get(g, (size_t)b) / (double)m : 0;
            share[k * NB + b] = s;
            if (s > 0 && s < smin) smin = s;
            if (s > smax) smax = s;
        }
        gsl_histogram_free(g);
    }
    double l0 = floor(log10(smin)), l1 = smax > 0 ? ceil(log10(smax) + 1e-9) : 0;
    if (l1 > 0) l1 = 0;
    if (l1 <= l0) l0 = l1 - 1;
    td_canvas *c = td_canvas_new(FIG_W, TOP + 22 + PH + 64 + 20 * (int)n, TD_WHITE);
    char sub[256];
    snprintf(sub, sizeof sub, "share of scored tokens per bin (%d bins over ±%.3g; tokens beyond are counted in the "
             "end bins)", NB, R);
    td_figure_title(c, font, o->title ? o->title : "Histogram of Δlogp = logp_B − logp_A", sub);
    int x = ML, y = TOP + 22, W = PW + 100;
    td_frame(c, x, y, W, PH);
    td_axis_ticks(c, font, x, y, W, PH, 1, -R, R, 0, 0);
    td_axis_ticks(c, font, x, y, W, PH, 0, l0, l1, 1, 1);
    td_canvas_line(c, x + W / 2, y, x + W / 2, y + PH - 1, TD_GREY, 3);
    for (size_t k = 0; k < n; k++) {
        td_rgb col = TD_PALETTE[k % 6];
        int prev_y = -1;
        for (int b = 0; b < NB; b++) {
            double s = share[k * NB + b];
            int bx0 = x + (int)((long)b * W / NB), bx1 = x + (int)((long)(b + 1) * W / NB);
            int by = s > 0 ? y + PH - 1 - (int)lround((log10(s) - l0) / (l1 - l0) * (PH - 1)) : y + PH - 1;
            if (by < y) by = y;
            if (prev_y >= 0) td_canvas_line(c, bx0, prev_y, bx0, by, col, 0);
            td_canvas_line(c, bx0, by, bx1, by, col, 0);
            td_canvas_line(c, bx0, by + 1, bx1, by + 1, col, 0);  // two pixels thick
            prev_y = by;
        }
        char lab[320];
        snprintf(lab, sizeof lab, "%s (%zu tokens%s)", runs[k].label, runs[k].n, outside[k] ? ", some beyond the axis" : "");
        /* legend under the axis label, where it hides no data */
        int ly = y + PH + 58 + (int)k * 20;
        td_canvas_rect(c, x + 12, ly - 2, 22, 4, col);
        td_font_draw(font, c, x + 40, ly, TD_FONT_TICK, 0, 1, 0, TD_BLACK, lab);
    }
    td_font_draw(font, c, x + W / 2, y + PH + 24, TD_FONT_LABEL, 1, 0, 0, TD_BLACK, "Δlogp = logp_B − logp_A (B = inference path)");
    td_font_draw(font, c, 14, y + PH / 2, TD_FONT_LABEL, 1, 1, 1, TD_BLACK, "share of tokens");
    free(share);
    free(outside);
    return c;
}

td_canvas *td_plot(const td_run *runs, size_t n, td_font *font, const td_plot_opts *o, td_error *err)
{
    if (!n) { td_fail(err, "no runs to draw"); return NULL; }
    switch (o->kind) {
    case TD_PLOT_SEQPOS: return plot_seqpos(runs, n, font, o);
    case TD_PLOT_LAYERS: return plot_rows(runs, n, font, o, 0, err);
    case TD_PLOT_ROUTING: return plot_rows(runs, n, font, o, 1, err);
    case TD_PLOT_DENSITY: return plot_density(runs, n, font, o);
    case TD_PLOT_HIST: return plot_hist(runs, n, font, o);
    case TD_PLOT_STEPS: return td_plot_steps(runs, n, font, o);
    }
    td_fail(err, "unknown plot kind %d", (int)o->kind);
    return NULL;
}
