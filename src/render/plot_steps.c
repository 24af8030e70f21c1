/* positions (--plot positions; its old name "steps"): the mismatch against the position within
 * the completion (the generated token's index, /tokens/step; not an optimiser step), one line
 * per run: drift that grows along a rollout (KV cache error, long-range attention) shows as a
 * rising line. y = mean |Δlogp| (or KL(B‖A)) over the response tokens at that position, log
 * axis; positions with fewer than MIN_TOKENS tokens (the tail where only a few sequences are
 * still generating) are left out rather than drawn as noise. */
#include "render_internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { MIN_TOKENS = 3, PH = 340 };

/* Mean of the metric per step 0..S-1 (NaN where fewer than MIN_TOKENS tokens). */
static double *step_means(const td_run *r, int metric_kl, int S)
{
    double *sum = td_xcalloc((size_t)S, sizeof(double)), *cnt = td_xcalloc((size_t)S, sizeof(double));
    for (size_t i = 0; i < r->n; i++) {
        int s = r->step[i];
        double v = metric_kl ? r->kl_ba[i] : fabs(r->dlogp[i]);
        if (s < 0 || s >= S || !isfinite(v)) continue;
        sum[s] += v;
        cnt[s] += 1;
    }
    for (int s = 0; s < S; s++) sum[s] = cnt[s] >= MIN_TOKENS ? sum[s] / cnt[s] : NAN;
    free(cnt);
    return sum;
}

td_canvas *td_plot_steps(const td_run *runs, size_t n, td_font *font, const td_plot_opts *o)
{
    int S = 1;
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < runs[k].n; i++) if (runs[k].step[i] + 1 > S) S = runs[k].step[i] + 1;
    double **m = td_xmalloc(n * sizeof *m), vmin = INFINITY, vmax = 0;
    int zeros = 0;   /* a mean of exactly 0 (an exact-match run) goes on a band marked "0" below the log axis */
    for (size_t k = 0; k < n; k++) {
        m[k] = step_means(&runs[k], o->metric_kl, S);
        for (int s = 0; s < S; s++) {
            if (m[k][s] > 0) { vmin = fmin(vmin, m[k][s]); vmax = fmax(vmax, m[k][s]); }
            else if (m[k][s] == 0) zeros = 1;
        }
    }
    if (!(vmax > 0)) { vmin = 1e-9; vmax = 1e-8; }   /* nothing positive: an empty, labelled axis */
    double l0 = floor(log10(vmin)), l1 = ceil(log10(vmax) + 1e-9);
    if (l1 <= l0) l1 = l0 + 1;
    td_canvas *c = td_canvas_new(FIG_W, TOP + 22 + PH + 64 + 20 * (int)n, TD_WHITE);
    const char *what = o->metric_kl ? "KL(B‖A)" : "|Δlogp|";
    char title[128], sub[256];
    snprintf(title, sizeof title, "Mean %s by position in the completion", what);
    snprintf(sub, sizeof sub, "response tokens only; position 0 = the first generated token; positions with fewer "
             "than %d tokens left out", MIN_TOKENS);
    td_figure_title(c, font, o->title ? o->title : title, sub);
    int x = ML, y = TOP + 22, W = PW + 100;
    double x1 = S > 1 ? S - 1 : 1;
    td_frame(c, x, y, W, PH);
    td_axis_ticks(c, font, x, y, W, PH, 1, 0, x1, 0, 0);
    int ZB = zeros ? TD_ZERO_BAND : 0, DH = PH - ZB;
    td_axis_ticks(c, font, x, y, W, DH, 0, l0, l1, 1, 1);
    if (zeros) td_zero_band(c, font, x, y, W, PH, ZB, "0");
    for (size_t k = 0; k < n; k++) {
        td_rgb col = TD_PALETTE[k % 6];
        int px = -1, py = -1;
        for (int s = 0; s < S; s++) {
            double v = m[k][s];
            if (!(v >= 0)) { px = -1; continue; }   /* a gap, not a line through missing steps */
            int cx = x + (int)lround(s / x1 * (W - 1));
            int cy = v == 0 ? td_zero_band_y(y, PH, ZB) : y + DH - 1 - (int)lround((log10(v) - l0) / (l1 - l0) * (DH - 1));
            if (px >= 0) { td_canvas_line(c, px, py, cx, cy, col, 0); td_canvas_line(c, px, py + 1, cx, cy + 1, col, 0); }
            else td_canvas_rect(c, cx - 1, cy - 1, 3, 3, col);
            px = cx;
            py = cy;
        }
        char lab[320];
        snprintf(lab, sizeof lab, "%s (%zu tokens)", runs[k].label, runs[k].n);
        int ly = y + PH + 58 + (int)k * 20;
        td_canvas_rect(c, x + 12, ly - 2, 22, 4, col);
        td_font_draw(font, c, x + 40, ly, TD_FONT_TICK, 0, 1, 0, TD_BLACK, lab);
        free(m[k]);
    }
    free(m);
    td_font_draw(font, c, x + W / 2, y + PH + 24, TD_FONT_LABEL, 1, 0, 0, TD_BLACK, "position in the completion (generated token index)");
    snprintf(title, sizeof title, "mean %s", what);
    td_font_draw(font, c, 14, y + PH / 2, TD_FONT_LABEL, 1, 1, 1, TD_BLACK, title);
    return c;
}
