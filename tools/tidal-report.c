/* tidal-report: statistics of one or more run files, side by side (GSL underneath).
 * The numbers are built once as JSON (td_report_run) and printed as a terminal table,
 * Markdown or JSON. */
#include "tidal/analysis.h"
#include "tidal/opts.h"
#include "tidal/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_RUNS 15
#define MAX_IS 32

typedef struct {
    const char *items[64];
    size_t n;
} figure_list;

typedef struct {
    td_is_spec items[MAX_IS];
    size_t n;
} is_list;

static int add_figure(void *dest, const char *v, char *why, size_t n)
{
    figure_list *l = dest;
    if (l->n == 64) { snprintf(why, n, "at most 64 figures"); return -1; }
    l->items[l->n++] = v;
    return 0;
}

static int add_is(void *dest, const char *v, char *why, size_t n)
{
    is_list *l = dest;
    td_error err = {{0}};
    if (l->n == MAX_IS) { snprintf(why, n, "at most %d corrections", MAX_IS); return -1; }
    if (td_is_spec_parse(v, &l->items[l->n], &err)) { snprintf(why, n, "LEVEL:MODE:HI or LEVEL:MODE:LO:HI (%s)", err.msg); return -1; }
    l->n++;
    return 0;
}

static char *decode_cb(void *ctx, const int32_t *ids, size_t n)
{
    return td_tokenizer_decode((const td_tokenizer *)ctx, ids, n, false, NULL);
}

int main(int argc, char **argv)
{
    const char *runs[MAX_RUNS + 1];
    figure_list fig = {{0}, 0};
    is_list is = {{{0}}, 0};
    int json = 0, md = 0, decode = 1, worst = 10;
    td_error err = {{0}};
    td_opt opts[] = {
        TD_OPT_F("json", 0, &json, 1, "print a JSON object per run (a list when several runs are given)"),
        TD_OPT_F("markdown", 0, &md, 1, "print Markdown (tables, and the figures given by --figure)"),
        TD_OPT_FUN("figure", 0, &fig, "PATH", add_figure, "a path", "link a picture in the Markdown output (repeatable)"),
        TD_OPT_FUN("is", 0, &is, "SPEC", add_is, "LEVEL:MODE:HI or LEVEL:MODE:LO:HI",
                   "importance-sampling correction to simulate (repeatable):\n"
                   "LEVEL:MODE:HI | LEVEL:MODE:LO:HI; LEVEL token, sequence or\n"
                   "geometric; MODE truncate (clamp into [LO,HI]) or mask (zero\n"
                   "outside [LO,HI]). Default: token:truncate:2 token:mask:0.5:5\n"
                   "(IcePop) sequence:truncate:3 sequence:mask:3\ngeometric:mask:0.999:1.001"),
        TD_OPT_I("worst", 0, &worst, "N", 0, 10000, "worst tokens and sequences listed (default 10)"),
        TD_OPT_F("no-decode", 0, &decode, 0, "print token ids even when the model has a tokenizer.json\n"
                 "(without one, worst sequences show the text the run stored)"),
        {0}};
    td_cli cli = {"tidal-report", "RUN.h5 [RUN.h5 ...] [options]",
                  "Statistics of one or more run files (e.g. bf16 / fp16 / fp8), side by side in one table.\n"
                  "Columns are titled by recipe names, or by file names when two runs share them.",
                  NULL, opts, 1, MAX_RUNS};
    int nargs, rc0 = td_cli_parse(&cli, argc, argv, runs, &nargs);
    if (rc0 >= 0) return rc0;
    size_t n_runs = (size_t)nargs, n_is = is.n;
    if (json && md) return td_cli_bad(&cli, "--json", NULL, "not together with --markdown");
    if (!n_is) {
        static const char *def[] = {"token:truncate:2", "token:mask:0.5:5", "sequence:truncate:3",
                                    "sequence:mask:3", "geometric:mask:0.999:1.001"};
        for (size_t k = 0; k < 5; k++) td_is_spec_parse(def[k], &is.items[n_is++], NULL);
    }

    json_t *reps[MAX_RUNS];
    int rc = 0;
    size_t done = 0;
    for (; done < n_runs; done++) {
        td_run run;
        if (td_run_load(&run, runs[done], TD_RUN_LAYERS, &err)) { fprintf(stderr, "tidal-report: %s\n", err.msg); rc = 1; break; }
        td_tokenizer *tok = NULL;
        if (decode && run.model_path[0]) {
            char tp[4096];
            snprintf(tp, sizeof tp, "%s/tokenizer.json", run.model_path);
            if (access(tp, R_OK) == 0) {
                tok = td_tokenizer_load(tp, &err);
                if (!tok) fprintf(stderr, "tidal-report: warning: %s; printing token ids\n", err.msg);
            }
        }
        td_report_opts o = {.is = is.items, .n_is = n_is, .n_worst = (size_t)worst,
                            .decode = tok ? decode_cb : NULL, .decode_ctx = tok, .stored_text = decode};
        reps[done] = td_report_run(&run, &o, &err);
        td_tokenizer_free(tok);
        td_run_free(&run);
        if (!reps[done]) { fprintf(stderr, "tidal-report: %s\n", err.msg); rc = 1; break; }
    }
    if (!rc) {
        if (json) {
            json_t *out = n_runs == 1 ? json_incref(reps[0]) : json_array();
            if (n_runs > 1) for (size_t i = 0; i < n_runs; i++) json_array_append(out, reps[i]);
            json_dumpf(out, stdout, JSON_INDENT(1) | JSON_REAL_PRECISION(17));
            fputc('\n', stdout);
            json_decref(out);
        } else if (md) {
            td_report_print_markdown(stdout, reps, n_runs, fig.items, fig.n);
        } else {
            td_report_print_text(stdout, reps, n_runs);
        }
    }
    for (size_t i = 0; i < done; i++) json_decref(reps[i]);
    if (fflush(stdout) != 0) { fprintf(stderr, "tidal-report: cannot write the output\n"); rc = 1; }
    return rc;
}
