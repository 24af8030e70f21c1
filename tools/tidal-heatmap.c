/* tidal-heatmap: PNG pictures of where the mismatch lives in one or more run files. */
#include "tidal/render.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_RUNS 8

static void usage(FILE *f)
{
    fprintf(f,
        "usage: tidal-heatmap RUN.h5 [RUN.h5 ...] -o OUT.png [options]\n"
        "  --plot seqpos|layers|density|hist   what to draw (default seqpos):\n"
        "        seqpos   sequences x positions of |dlogp| (or --metric kl)\n"
        "        layers   layers x positions of the per-layer error (/layers/rel_err)\n"
        "        density  p_A against p_B on log-log axes\n"
        "        hist     histogram of dlogp (runs overlaid)\n"
        "  --metric dlogp|kl       seqpos colour: |logp_B - logp_A| or KL(B||A) (default dlogp)\n"
        "  --scale log|linear      colour scale of seqpos/layers (default log)\n"
        "  --pool max|mean         how large runs are pooled into cells (default max)\n"
        "  --max-rows N --max-cols N   cells per panel after pooling (default 300 x 700)\n"
        "  --range R               hist: x axis +-R (default 1.1 x the largest p99.9 of |dlogp|)\n"
        "  --title TEXT            figure title\n"
        "  --font FILE.ttf         font (default $TIDAL_FONT or DejaVu Sans)\n"
        "  several runs: one figure, one shared colour scale (compare precisions side by side)\n");
}

static int parse_int(const char *opt, const char *s, int lo, int hi, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < lo || v > hi) { fprintf(stderr, "tidal-heatmap: %s %s: expected %d..%d\n", opt, s, lo, hi); return -1; }
    *out = (int)v;
    return 0;
}

/* The command line as one shell-like string, recorded in the PNG. */
static char *join_args(int argc, char **argv)
{
    size_t len = 1;
    for (int i = 0; i < argc; i++) len += strlen(argv[i]) * 4 + 3;
    char *s = malloc(len), *p = s;
    for (int i = 0; i < argc; i++) {
        int quote = strpbrk(argv[i], " \t'\"$\\") != NULL || !argv[i][0];
        if (i) *p++ = ' ';
        if (quote) *p++ = '\'';
        for (const char *a = argv[i]; *a; a++) {
            if (*a == '\'') { memcpy(p, "'\\''", 4); p += 4; }
            else *p++ = *a;
        }
        if (quote) *p++ = '\'';
    }
    *p = 0;
    return s;
}

int main(int argc, char **argv)
{
    const char *runs[MAX_RUNS], *out = NULL, *font_path = NULL;
    size_t n = 0;
    td_plot_opts o = {.kind = TD_PLOT_SEQPOS, .log_scale = 1};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        if (a[0] != '-' || !a[1]) {
            if (n == MAX_RUNS) { fprintf(stderr, "tidal-heatmap: at most %d runs in one figure\n", MAX_RUNS); return 2; }
            runs[n++] = a;
            continue;
        }
        if (!v) { fprintf(stderr, "tidal-heatmap: %s needs a value (or is unknown)\n", a); usage(stderr); return 2; }
        i++;
        if (!strcmp(a, "-o")) out = v;
        else if (!strcmp(a, "--plot")) {
            if (!strcmp(v, "seqpos")) o.kind = TD_PLOT_SEQPOS;
            else if (!strcmp(v, "layers")) o.kind = TD_PLOT_LAYERS;
            else if (!strcmp(v, "density")) o.kind = TD_PLOT_DENSITY;
            else if (!strcmp(v, "hist")) o.kind = TD_PLOT_HIST;
            else { fprintf(stderr, "tidal-heatmap: --plot %s: expected seqpos, layers, density or hist\n", v); return 2; }
        } else if (!strcmp(a, "--metric")) {
            if (!strcmp(v, "dlogp")) o.metric_kl = 0;
            else if (!strcmp(v, "kl")) o.metric_kl = 1;
            else { fprintf(stderr, "tidal-heatmap: --metric %s: expected dlogp or kl\n", v); return 2; }
        } else if (!strcmp(a, "--scale")) {
            if (!strcmp(v, "log")) o.log_scale = 1;
            else if (!strcmp(v, "linear")) o.log_scale = 0;
            else { fprintf(stderr, "tidal-heatmap: --scale %s: expected log or linear\n", v); return 2; }
        } else if (!strcmp(a, "--pool")) {
            if (!strcmp(v, "max")) o.pool_mean = 0;
            else if (!strcmp(v, "mean")) o.pool_mean = 1;
            else { fprintf(stderr, "tidal-heatmap: --pool %s: expected max or mean\n", v); return 2; }
        } else if (!strcmp(a, "--max-rows")) { if (parse_int(a, v, 1, 4000, &o.max_rows)) return 2; }
        else if (!strcmp(a, "--max-cols")) { if (parse_int(a, v, 1, 4000, &o.max_cols)) return 2; }
        else if (!strcmp(a, "--range")) {
            char *end;
            o.hist_range = strtod(v, &end);
            if (*end || !(o.hist_range > 0)) { fprintf(stderr, "tidal-heatmap: --range %s: expected a number > 0\n", v); return 2; }
        } else if (!strcmp(a, "--title")) o.title = v;
        else if (!strcmp(a, "--font")) font_path = v;
        else { fprintf(stderr, "tidal-heatmap: unknown option %s\n", a); usage(stderr); return 2; }
    }
    if (!n || !out) { usage(stderr); return 2; }

    td_error err = {{0}};
    td_font *font = td_font_open(font_path, &err);
    if (!font) { fprintf(stderr, "tidal-heatmap: %s\n", err.msg); return 1; }
    td_run *rs = td_xcalloc(n, sizeof *rs);
    int rc = 0;
    size_t loaded = 0;
    for (; loaded < n; loaded++)
        if (td_run_load(&rs[loaded], runs[loaded], TD_RUN_PLOT | (o.kind == TD_PLOT_LAYERS ? TD_RUN_LAYERS : 0), &err)) { rc = 1; break; }
    td_canvas *c = rc ? NULL : td_plot(rs, n, font, &o, &err);
    if (!rc && !c) rc = 1;
    if (c) {
        char *cmd = join_args(argc, argv);
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
