/* Internal pieces of src/render: axes, ticks, heatmap panels, colour bars. */
#ifndef TIDAL_RENDER_INTERNAL_H
#define TIDAL_RENDER_INTERNAL_H

#include "tidal/render.h"

enum { TD_FONT_TITLE = 18, TD_FONT_LABEL = 14, TD_FONT_TICK = 12 };
/* figure geometry: width, left margin, plot width, top of the first panel */
enum { FIG_W = 960, ML = 92, PW = 700, TOP = 78 };
extern const td_rgb TD_PALETTE[6];   /* line colours of overlaid runs */
void td_figure_title(td_canvas *c, td_font *font, const char *title, const char *subtitle);
/* steps: mean mismatch per generation step, one line per run (plot_steps.c) */
td_canvas *td_plot_steps(const td_run *runs, size_t n, td_font *font, const td_plot_opts *o);
extern const td_rgb TD_BLACK, TD_WHITE, TD_GREY;

/* A matrix of cells drawn into a box: rows top to bottom (flip: bottom to top), columns left
 * to right, NaN cells in nan_col. Axis data ranges: columns span [x0, x1], rows [y0, y1]. */
typedef struct {
    int rows, cols;
    double *v;             // (rows, cols)
    double x0, x1, y0, y1;
    int flip;              // row 0 at the bottom
    int decades;           // axis values are log10: label ticks as 10^k
    td_rgb nan_col;
    const char *title;     // drawn above the box, left-aligned
} td_heat;

int  td_nice_ticks(double lo, double hi, int target, double *ticks, int max);
int  td_log_ticks(double lo, double hi, double *ticks, int max);
void td_fmt_tick(char *buf, size_t n, double v);
void td_fmt_decade(char *buf, size_t n, int e);
double td_scale_pos(double v, double vmin, double vmax, int log_scale);
void td_frame(td_canvas *c, int x, int y, int w, int h);
/* The band under a log y axis (box x, y, w, h; its bottom zb pixels) where values <= 0 are drawn
 * instead of being dropped: a dashed line sets it off, a tick at its middle says `label`. The
 * band's row is td_zero_band_y. */
enum { TD_ZERO_BAND = 26 };
void td_zero_band(td_canvas *c, td_font *font, int x, int y, int w, int h, int zb, const char *label);
static inline int td_zero_band_y(int y, int h, int zb) { return y + h - zb / 2; }
void td_axis_ticks(td_canvas *c, td_font *font, int x, int y, int w, int h, int horizontal, double d0, double d1,
                   int decades, int flip);
void td_heat_draw(td_canvas *c, td_font *font, const td_heat *hm, int x, int y, int w, int h, double vmin,
                  double vmax, int log_scale);
void td_colorbar(td_canvas *c, td_font *font, int x, int y, int w, int h, double vmin, double vmax, int log_scale,
                 const char *label);

#endif
