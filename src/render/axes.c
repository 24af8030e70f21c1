/* Axes, ticks, heatmap panels and colour bars shared by the plots (src/render/plots.c). */
#include "render_internal.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

const td_rgb TD_BLACK = {0, 0, 0}, TD_WHITE = {255, 255, 255}, TD_GREY = {110, 110, 110};

/* Ticks at 1, 2 or 5 × 10^k covering [lo, hi], about `target` of them. Returns the count. */
int td_nice_ticks(double lo, double hi, int target, double *ticks, int max)
{
    if (!(hi > lo)) { ticks[0] = lo; return 1; }
    double raw = (hi - lo) / target, mag = pow(10, floor(log10(raw))), step;
    double r = raw / mag;
    step = (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
    int n = 0;
    for (double t = ceil(lo / step - 1e-9) * step; t <= hi + step * 1e-9 && n < max; t += step)
        ticks[n++] = fabs(t) < step * 1e-9 ? 0 : t;
    return n;
}

/* Tick values for a log axis over [lo, hi] (lo > 0): whole decades when it spans at least
 * 1.5 of them (every k-th decade if many), else the 1, 2, 5 multiples inside. */
int td_log_ticks(double lo, double hi, double *ticks, int max)
{
    double l0 = log10(lo), l1 = log10(hi);
    int n = 0;
    if (l1 - l0 >= 1.5) {
        int step = (int)ceil((l1 - l0) / 6);
        for (int e = (int)ceil(l0 - 1e-9); e <= l1 + 1e-9 && n < max; e++)
            if (e % step == 0) ticks[n++] = pow(10, e);
        return n;
    }
    static const double m[3] = {1, 2, 5};
    for (int e = (int)floor(l0); e <= (int)ceil(l1); e++)
        for (int k = 0; k < 3 && n < max; k++) {
            double v = m[k] * pow(10, e);
            if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) ticks[n++] = v;
        }
    if (n < 3) {  // a narrow range (less than a factor 5): plain ticks, evenly spaced in value
        double t[64];
        int nt = td_nice_ticks(lo, hi, 4, t, 64);
        n = 0;
        for (int i = 0; i < nt && n < max; i++) if (t[i] > 0) ticks[n++] = t[i];
    }
    return n;
}

void td_fmt_tick(char *buf, size_t n, double v)
{
    if (v == 0) snprintf(buf, n, "0");
    else if (fabs(v) >= 1e-3 && fabs(v) < 1e5) snprintf(buf, n, "%.4g", v);
    else snprintf(buf, n, "%.2g", v);
}

/* "10⁻³" for a decade exponent, with Unicode superscripts (DejaVu Sans has them). */
void td_fmt_decade(char *buf, size_t n, int e)
{
    static const char *sup[10] = {"⁰", "¹", "²", "³", "⁴", "⁵", "⁶", "⁷", "⁸", "⁹"};
    char digits[16];
    snprintf(digits, sizeof digits, "%d", e < 0 ? -e : e);
    size_t o = (size_t)snprintf(buf, n, "10%s", e < 0 ? "⁻" : "");
    for (char *d = digits; *d && o + 4 < n; d++) o += (size_t)snprintf(buf + o, n - o, "%s", sup[*d - '0']);
}

/* Position in [0, 1] of v on the colour scale. */
double td_scale_pos(double v, double vmin, double vmax, int log_scale)
{
    if (isnan(v)) return NAN;
    if (log_scale) {
        if (v <= vmin) return 0;
        return (log10(v) - log10(vmin)) / (log10(vmax) - log10(vmin));
    }
    return vmax > vmin ? (v - vmin) / (vmax - vmin) : 0.5;
}

void td_frame(td_canvas *c, int x, int y, int w, int h)
{
    td_canvas_line(c, x - 1, y - 1, x + w, y - 1, TD_BLACK, 0);
    td_canvas_line(c, x - 1, y + h, x + w, y + h, TD_BLACK, 0);
    td_canvas_line(c, x - 1, y - 1, x - 1, y + h, TD_BLACK, 0);
    td_canvas_line(c, x + w, y - 1, x + w, y + h, TD_BLACK, 0);
}

void td_zero_band(td_canvas *c, td_font *font, int x, int y, int w, int h, int zb, const char *label)
{
    int yz = td_zero_band_y(y, h, zb);
    td_canvas_line(c, x, y + h - zb, x + w - 1, y + h - zb, TD_GREY, 1);
    td_canvas_line(c, x - 5, yz, x - 1, yz, TD_BLACK, 0);
    td_font_draw(font, c, x - 7, yz, TD_FONT_TICK, 2, 1, 0, TD_BLACK, label);
}

/* Ticks along the bottom (horizontal = 1) or the left edge of a box, data range [d0, d1]
 * mapped onto the box; decades = 1 labels integer ticks t as 10^t. flip: d0 at the bottom. */
void td_axis_ticks(td_canvas *c, td_font *font, int x, int y, int w, int h, int horizontal, double d0, double d1,
                   int decades, int flip)
{
    double t[64];
    int nt;
    if (decades) {  // data are log10 values: ticks at 10^k (or 1-2-5 multiples) in log units
        nt = td_log_ticks(pow(10, d0 < d1 ? d0 : d1), pow(10, d0 < d1 ? d1 : d0), t, 64);
        for (int i = 0; i < nt; i++) t[i] = log10(t[i]);
    } else {
        nt = td_nice_ticks(d0 < d1 ? d0 : d1, d0 < d1 ? d1 : d0, horizontal ? 8 : 5, t, 64);
    }
    char lab[64];
    int last_right = -1000000;  // right edge of the last horizontal label drawn
    for (int i = 0; i < nt; i++) {
        double f = (t[i] - d0) / (d1 - d0);
        if (decades && fabs(t[i] - round(t[i])) < 1e-9) td_fmt_decade(lab, sizeof lab, (int)round(t[i]));
        else td_fmt_tick(lab, sizeof lab, decades ? pow(10, t[i]) : t[i]);
        if (horizontal) {
            int px = x + (int)lround(f * (w - 1));
            td_canvas_line(c, px, y + h, px, y + h + 4, TD_BLACK, 0);
            int lw = td_font_width(font, TD_FONT_TICK, lab);
            if (px - lw / 2 < last_right + 8) continue;  // labels must not run into each other
            td_font_draw(font, c, px, y + h + 6, TD_FONT_TICK, 1, 0, 0, TD_BLACK, lab);
            last_right = px + lw / 2;
        } else {
            int py = flip ? y + h - 1 - (int)lround(f * (h - 1)) : y + (int)lround(f * (h - 1));
            td_canvas_line(c, x - 5, py, x - 1, py, TD_BLACK, 0);
            td_font_draw(font, c, x - 7, py, TD_FONT_TICK, 2, 1, 0, TD_BLACK, lab);
        }
    }
}

void td_heat_draw(td_canvas *c, td_font *font, const td_heat *hm, int x, int y, int w, int h, double vmin,
                  double vmax, int log_scale)
{
    for (int py = 0; py < h; py++) {
        int r = hm->flip ? (int)((long)(h - 1 - py) * hm->rows / h) : (int)((long)py * hm->rows / h);
        for (int px = 0; px < w; px++) {
            int q = (int)((long)px * hm->cols / w);
            double v = hm->v[(size_t)r * (size_t)hm->cols + (size_t)q];
            /* a log scale cannot show v <= 0 (e.g. a KL sum that rounded below zero): white */
            td_rgb col = isnan(v) ? hm->nan_col : (log_scale && v <= 0) ? TD_WHITE
                                                 : td_viridis(td_scale_pos(v, vmin, vmax, log_scale));
            uint8_t *p = c->rgb + 3 * ((size_t)(y + py) * (size_t)c->w + (size_t)(x + px));
            p[0] = col.r; p[1] = col.g; p[2] = col.b;
        }
    }
    td_frame(c, x, y, w, h);
    td_axis_ticks(c, font, x, y, w, h, 1, hm->x0, hm->x1, hm->decades, 0);
    td_axis_ticks(c, font, x, y, w, h, 0, hm->y0, hm->y1, hm->decades, hm->flip);
    if (hm->title) td_font_draw(font, c, x, y - 6, TD_FONT_LABEL, 0, 2, 0, TD_BLACK, hm->title);
}

void td_colorbar(td_canvas *c, td_font *font, int x, int y, int w, int h, double vmin, double vmax, int log_scale,
                 const char *label)
{
    for (int py = 0; py < h; py++) {
        td_rgb col = td_viridis(1.0 - (double)py / (h - 1));
        td_canvas_rect(c, x, y + py, w, 1, col);
    }
    td_frame(c, x, y, w, h);
    char lab[64];
    double t[64];
    int nt;
    if (log_scale) {
        double l0 = log10(vmin), l1 = log10(vmax);
        nt = td_log_ticks(vmin, vmax, t, 64);
        for (int i = 0; i < nt; i++) {
            double lt = log10(t[i]), f = (lt - l0) / (l1 - l0);
            int py = y + h - 1 - (int)lround(f * (h - 1));
            if (fabs(lt - round(lt)) < 1e-9) td_fmt_decade(lab, sizeof lab, (int)round(lt));
            else td_fmt_tick(lab, sizeof lab, t[i]);
            td_canvas_line(c, x + w, py, x + w + 4, py, TD_BLACK, 0);
            td_font_draw(font, c, x + w + 7, py, TD_FONT_TICK, 0, 1, 0, TD_BLACK, lab);
        }
    } else {
        nt = td_nice_ticks(vmin, vmax, 5, t, 64);
        for (int i = 0; i < nt; i++) {
            double f = vmax > vmin ? (t[i] - vmin) / (vmax - vmin) : 0.5;
            int py = y + h - 1 - (int)lround(f * (h - 1));
            td_fmt_tick(lab, sizeof lab, t[i]);
            td_canvas_line(c, x + w, py, x + w + 4, py, TD_BLACK, 0);
            td_font_draw(font, c, x + w + 7, py, TD_FONT_TICK, 0, 1, 0, TD_BLACK, lab);
        }
    }
    td_font_draw(font, c, x + w + 74, y + h / 2, TD_FONT_LABEL, 1, 1, 1, TD_BLACK, label);
}
