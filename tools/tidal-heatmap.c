/* tidal-heatmap: PNG pictures of where the mismatch lives in one or more run files. */
#include "tidal/opts.h"
#include "tidal/render.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS 8

/* --plot: what to draw; "steps", the old name of positions (it counts generated tokens, not
 * optimiser steps), is still read so old commands work */
static const char *const KINDS[] = {"seqpos", "layers", "density", "hist", "positions", "routing", "training", "steps"};
enum { K_POSITIONS = 4, K_TRAINING = 6, K_STEPS = 7 };

static int parse_kind(void *dest, const char *v, char *why, size_t n)
{
    for (int i = 0; i < (int)(sizeof KINDS / sizeof KINDS[0]); i++)
        if (!strcmp(v, KINDS[i])) { *(int *)dest = i == K_STEPS ? K_POSITIONS : i; return 0; }
    return -1;
}

int main(int argc, char **argv)
{
    const char *runs[MAX_RUNS], *out = NULL, *font_path = NULL, *column = NULL;
    td_plot_opts o = {.kind = TD_PLOT_SEQPOS, .log_scale = 1};
    int kind = 0, scale = 0;
    td_opt opts[] = {
        TD_OPT_S("output", 'o', &out, "OUT.png", "the picture"),
        TD_OPT_FUN("plot", 0, &kind, "seqpos|layers|density|hist|positions|routing|training", parse_kind,
                   "seqpos, layers, density, hist, positions, routing or training", "what to draw (default seqpos):\n"
                 "seqpos    sequences x positions of |dlogp| (or --metric kl)\n"
                 "layers    layers x positions of the per-layer error\n"
                 "density   p_A against p_B on log-log axes\n"
                 "hist      histogram of dlogp (runs overlaid)\n"
                 "positions mean |dlogp| (or --metric kl) by position in the\n"
                 "          completion (generated token 0, 1, ...), one line\n"
                 "          per run (the old name 'steps' still works)\n"
                 "routing   MoE layers x positions: share of tokens whose\n"
                 "          expert set differs between the paths\n"
                 "training  tidal-rl runs (rl.h5): a /steps column (--column)\n"
                 "          against the optimiser step, one line per run, a\n"
                 "          ring at the collapse"),
        TD_OPT_C("metric", 0, &o.metric_kl, "dlogp|kl", "seqpos colour, positions y axis: |logp_B - logp_A| or\nKL(B||A) (default dlogp)"),
        TD_OPT_S("column", 0, &column, "NAME", "training: the /steps column drawn (default reward; e.g.\n"
                 "accuracy, eval_accuracy, k3_kl, grad_norm, entropy)"),
        TD_OPT_C("scale", 0, &scale, "log|linear", "colour scale of seqpos/layers (default log)"),
        TD_OPT_C("pool", 0, &o.pool_mean, "max|mean", "how large runs are pooled into cells (default max)"),
        TD_OPT_I("max-rows", 0, &o.max_rows, "N", 1, 4000, "cells per panel after pooling (default 300)"),
        TD_OPT_I("max-cols", 0, &o.max_cols, "N", 1, 4000, "(default 700)"),
        TD_OPT_D("range", 0, &o.hist_range, "R", 0, 1e30, "hist: x axis +-R (default 1.1 x the largest p99.9 of |dlogp|)"),
        TD_OPT_S("title", 0, &o.title, "TEXT", "figure title"),
        TD_OPT_S("font", 0, &font_path, "FILE.ttf", "font (default $TIDAL_FONT or DejaVu Sans)"),
        {0}};
    td_opt_get(opts, "output")->required = 1;
    td_opt_get(opts, "range")->lo_open = 1;
    td_cli cli = {"tidal-heatmap", "RUN.h5 [RUN.h5 ...] -o OUT.png [options]",
                  "PNG pictures of where the mismatch lives in one or more run files. Several runs: one figure,\n"
                  "one shared colour scale (compare precisions side by side).", NULL, opts, 1, MAX_RUNS};
    int nargs, rc0 = td_cli_parse(&cli, argc, argv, runs, &nargs);
    if (rc0 >= 0) return rc0;
    size_t n = (size_t)nargs;
    static const td_plot_kind kinds[] = {TD_PLOT_SEQPOS, TD_PLOT_LAYERS, TD_PLOT_DENSITY, TD_PLOT_HIST, TD_PLOT_STEPS,
                                         TD_PLOT_ROUTING};
    if (column && kind != K_TRAINING) return td_cli_bad(&cli, "--column", NULL, "applies to --plot training");
    o.log_scale = scale == 0;

    td_error err = {{0}};
    if (td_make_parent_dirs(out, &err)) { fprintf(stderr, "tidal-heatmap: %s\n", err.msg); return 1; }
    td_font *font = td_font_open(font_path, &err);
    if (!font) { fprintf(stderr, "tidal-heatmap: %s\n", err.msg); return 1; }
    if (kind == K_TRAINING) {   /* the run files' /steps, not their /tokens */
        td_canvas *c = td_plot_training(runs, n, column ? column : "reward", font, o.title, &err);
        char *cmd = td_command_line(argc, argv);
        const char *kv[] = {"Software", "tidal-heatmap " TD_VERSION, "command_line", cmd};
        int bad = !c || td_canvas_write_png(c, out, kv, 2, &err);
        if (bad) fprintf(stderr, "tidal-heatmap: %s\n", err.msg);
        free(cmd);
        td_canvas_free(c);
        td_font_close(font);
        return bad;
    }
    o.kind = kinds[kind];
    td_run *rs = td_xcalloc(n, sizeof *rs);
    int rc = 0;
    size_t loaded = 0;
    for (; loaded < n; loaded++)
        if (td_run_load(&rs[loaded], runs[loaded], o.kind == TD_PLOT_ROUTING ? 0 :
                        TD_RUN_PLOT | (o.kind == TD_PLOT_LAYERS ? TD_RUN_LAYERS : 0), &err)) { rc = 1; break; }
    td_canvas *c = rc ? NULL : td_plot(rs, n, font, &o, &err);
    if (!rc && !c) rc = 1;
    if (c) {
        char *cmd = td_command_line(argc, argv);
        const char *kv[] = {"Software", "tidal-heatmap " TD_VERSION, "command_line", cmd};
        if (td_canvas_write_png(c, out, kv, 2, &err)) rc = 1;
        free(cmd);
    }
    if (rc) fprintf(stderr, "tidal-heatmap: %s\n", err.msg);
    td_canvas_free(c);
    for (size_t i = 0; i < loaded; i++) td_run_free(&rs[i]);
    free(rs);
    td_font_close(font);
    return rc;
}
