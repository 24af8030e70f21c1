/* Line plots of metrics against a step, one line per run or configuration, a legend below
 * (include/tidal/render.h td_plot_lines; tidal-sweep's comparison report). */
#include "render_internal.h"

#include <math.h>
#include <stdio.h>

enum { PH = 380, LEG_ROW = 20 };

/* matplotlib's tab10 and two darker tones: distinguishable lines for up to 12 configurations */
static const td_rgb LINE_PALETTE[12] = {
    {31, 119, 180}, {255, 127, 14}, {44, 160, 44}, {214, 39, 40}, {148, 103, 189}, {140, 86, 75},
    {227, 119, 194}, {127, 127, 127}, {188, 189, 34}, {23, 190, 207}, {0, 0, 0}, {120, 60, 0}};

/* On a log axis a value <= 0 has no place: rather than drop it (a series of zeros would just
 * vanish while its legend entry stays), such values go on a band below the axis marked "≤ 0",
 * set off by a dashed line, and the lines run into it. */
static int ok_value(double v) { return isfinite(v); }

td_canvas *td_plot_lines(const td_line *lines, size_t n, td_font *font, const td_lines_opts *o)
{
    double x0 = INFINITY, x1 = -INFINITY, y0 = INFINITY, y1 = -INFINITY;
    int zeros = 0;
    for (size_t k = 0; k < n; k++)
        for (size_t i = 0; i < lines[k].n; i++) {
            double y = lines[k].y[i];
            if (!ok_value(y)) continue;
            x0 = fmin(x0, lines[k].x[i]);
            x1 = fmax(x1, lines[k].x[i]);
            if (o->log_y && y <= 0) { zeros = 1; continue; }
            double v = o->log_y ? log10(y) : y;
            y0 = fmin(y0, v);
            y1 = fmax(y1, v);
        }
    if (!(x1 > x0)) { x0 = 0; x1 = x0 + 1; }
    if (!isfinite(y0)) { y0 = 0; y1 = 1; }
    if (o->log_y) { y0 = floor(y0); y1 = ceil(y1 + 1e-9); if (y1 <= y0) y1 = y0 + 1; }
    else { double pad = (y1 - y0) * 0.05; if (pad <= 0) pad = fabs(y0) * 0.05 + 1e-9; y0 -= pad; y1 += pad; }
    size_t labelled = 0, li = 0;   /* legend entries: the lines with a label */
    for (size_t k = 0; k < n; k++) labelled += lines[k].label != NULL;
    int cols = 2, rows = (int)((labelled + cols - 1) / cols);
    td_canvas *c = td_canvas_new(FIG_W, TOP + 22 + PH + 64 + LEG_ROW * rows, TD_WHITE);
    td_figure_title(c, font, o->title ? o->title : "", o->subtitle);
    int x = ML, y = TOP + 22, W = PW + 100;
    td_frame(c, x, y, W, PH);
    td_axis_ticks(c, font, x, y, W, PH, 1, x0, x1, 0, 0);
    int ZB = zeros ? TD_ZERO_BAND : 0, DH = PH - ZB;   /* the data's height above the zero band */
    td_axis_ticks(c, font, x, y, W, DH, 0, y0, y1, o->log_y, 1);
    if (zeros) td_zero_band(c, font, x, y, W, PH, ZB, "≤ 0");
    for (size_t k = 0; k < n; k++) {
        const td_line *L = &lines[k];
        td_rgb col = LINE_PALETTE[L->colour % 12];
        int px = -1, py = -1;
        for (size_t i = 0; i < L->n; i++) {
            double yv = L->y[i];
            if (!ok_value(yv)) { px = -1; continue; }
            int cx = x + (int)lround((L->x[i] - x0) / (x1 - x0) * (W - 1));
            int cy;
            if (o->log_y && yv <= 0) {
                cy = td_zero_band_y(y, PH, ZB);
            } else {
                double v = o->log_y ? log10(yv) : yv;
                cy = y + DH - 1 - (int)lround((v - y0) / (y1 - y0) * (DH - 1));
            }
            if (px >= 0) {
                int w = L->width > 0 ? L->width : 2;
                for (int t = 0; t < w; t++)   /* rows py .. py + w - 1 around the default two */
                    td_canvas_line(c, px, py + t - (w - 1) / 2, cx, cy + t - (w - 1) / 2, col, L->dash);
            }
            if ((int)i == L->marker) {   /* a ring: the marked step */
                for (int a = 0; a < 24; a++) {
                    double t0 = a * M_PI / 12, t1 = (a + 1) * M_PI / 12;
                    td_canvas_line(c, cx + (int)lround(7 * cos(t0)), cy + (int)lround(7 * sin(t0)),
                                   cx + (int)lround(7 * cos(t1)), cy + (int)lround(7 * sin(t1)), col, 0);
                }
            }
            px = cx;
            py = cy;
        }
        if (!L->label) continue;   /* no legend entry */
        int lx = x + 12 + (int)(li % cols) * (W / cols), ly = y + PH + 58 + (int)(li / cols) * LEG_ROW;
        li++;
        td_canvas_line(c, lx, ly, lx + 22, ly, col, L->dash);
        td_canvas_line(c, lx, ly + 1, lx + 22, ly + 1, col, L->dash);
        td_font_draw(font, c, lx + 28, ly, TD_FONT_TICK, 0, 1, 0, TD_BLACK, L->label);
    }
    td_font_draw(font, c, x + W / 2, y + PH + 24, TD_FONT_LABEL, 1, 0, 0, TD_BLACK, o->xlabel ? o->xlabel : "step");
    td_font_draw(font, c, 14, y + PH / 2, TD_FONT_LABEL, 1, 1, 1, TD_BLACK, o->ylabel ? o->ylabel : "");
    return c;
}
