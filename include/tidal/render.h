/* tidal — pictures of run files: an RGB canvas written through libpng, a perceptual colour
 * map, text through FreeType, and the plots tidal-heatmap draws.
 *
 * Coordinates are pixels, origin top-left, x to the right, y down.
 */
#ifndef TIDAL_RENDER_H
#define TIDAL_RENDER_H

#include "tidal/analysis.h"
#include "tidal/common.h"

#include <stdint.h>

TD_BEGIN_DECLS

typedef struct {
    int w, h;
    uint8_t *rgb;  // (h, w, 3)
} td_canvas;

typedef struct { uint8_t r, g, b; } td_rgb;

td_canvas *td_canvas_new(int w, int h, td_rgb bg);
void td_canvas_free(td_canvas *c);
void td_canvas_rect(td_canvas *c, int x, int y, int w, int h, td_rgb col);        // filled, clipped
void td_canvas_line(td_canvas *c, int x0, int y0, int x1, int y1, td_rgb col, int dash);  // dash 0 = solid
/* Writes an 8-bit RGB PNG; each (key, value) pair becomes a tEXt/iTXt chunk (e.g.
 * "command_line"). The file is written to PATH.tmp and renamed, so a failed write leaves no
 * half-written picture behind. */
int td_canvas_write_png(const td_canvas *c, const char *path, const char *const *kv, size_t n_kv, td_error *err);

/* Viridis-like perceptual colour map (matplotlib's viridis at 9 anchors, interpolated in
 * RGB): t in [0, 1], clamped; NaN gives no-data grey. */
td_rgb td_viridis(double t);

/* Text through FreeType. path NULL: $TIDAL_FONT, else DejaVu Sans from fonts-dejavu-core. */
typedef struct td_font td_font;
td_font *td_font_open(const char *path, td_error *err);
void td_font_close(td_font *f);
/* Advance width in pixels of UTF-8 text at a pixel size. */
int td_font_width(td_font *f, int px, const char *text);
/* Draws text anchored at (x, y): ha 0 left / 1 centre / 2 right of x, va 0 top / 1 middle /
 * 2 bottom of y; rot90 = 1 writes bottom-to-top (a y-axis label), anchors then refer to the
 * rotated box. */
void td_font_draw(td_font *f, td_canvas *c, int x, int y, int px, int ha, int va, int rot90, td_rgb col,
                  const char *text);

/* ---------------------------------------------------------------- plots */

typedef enum { TD_PLOT_SEQPOS = 0, TD_PLOT_LAYERS, TD_PLOT_DENSITY, TD_PLOT_HIST, TD_PLOT_STEPS, TD_PLOT_ROUTING } td_plot_kind;

typedef struct {
    td_plot_kind kind;
    int metric_kl;         // seqpos, steps: 0 = |Δlogp|, 1 = KL(B‖A)
    int log_scale;         // colour scale of seqpos / layers (density is always log counts)
    int pool_mean;         // pooling of large runs into cells: 0 = max, 1 = mean
    int max_rows, max_cols;// cells per heatmap panel after pooling (0: defaults 300 x 720)
    double hist_range;     // hist: x range ±R; 0 = 1.1 × the largest p99.9 of |Δlogp| over runs
    const char *title;     // NULL: generated from the plot and the runs
} td_plot_opts;

/* Draws one figure of n runs (panels share one colour scale, or one histogram overlays all). */
td_canvas *td_plot(const td_run *runs, size_t n, td_font *font, const td_plot_opts *o, td_error *err);

/* ---------------------------------------------------------------- line plots against a step */

/* One line: n points (x[i], y[i]); a non-finite y leaves a gap; on a log axis y <= 0 is drawn on
 * a band marked "≤ 0" below the axis (never dropped).
 * marker >= 0: a ring at point index marker (e.g. the step a collapse was marked). */
typedef struct {
    const char *label;
    const double *x, *y;
    size_t n;
    int colour;            // index into a 12-colour palette
    int dash;              // 0 solid, else dash length in pixels
    int marker;            // -1 none
    int width;             // line width in pixels (0: 2, the default); a NULL label: no legend entry
} td_line;

typedef struct {
    const char *title, *subtitle, *xlabel, *ylabel;
    int log_y;
} td_lines_opts;

/* A figure of lines over a shared x axis with a legend below (tidal-sweep's reports). */
td_canvas *td_plot_lines(const td_line *lines, size_t n, td_font *font, const td_lines_opts *o);

/* tidal-heatmap --plot training: the /steps column `column` of n tidal-rl run files against the
 * optimiser step, one line per run, a ring at each run's collapse_step (src/render/plot_training.c).
 * title NULL: "COLUMN against the optimiser step". NULL + err: not a tidal-rl file, no such column,
 * no finite value. */
td_canvas *td_plot_training(const char *const *paths, size_t n, const char *column, td_font *font, const char *title,
                            td_error *err);

TD_END_DECLS

#endif
