/* tidal-report: statistics of one or more run files, side by side (GSL underneath).
 * The numbers are built once as JSON (td_report_run) and printed as a terminal table,
 * Markdown or JSON. */
#include "tidal/analysis.h"
#include "tidal/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MAX_RUNS 15
#define MAX_IS 32

static void usage(FILE *f)
{
    fprintf(f,
        "usage: tidal-report RUN.h5 [RUN.h5 ...] [options]\n"
        "  (several runs, e.g. bf16 / fp16 / fp8, are compared side by side in one table)\n"
        "  --json              print a JSON object per run (a list when several runs are given)\n"
        "  --markdown          print Markdown (tables, and the figures given by --figure)\n"
        "  --figure PATH       link a picture in the Markdown output (repeatable)\n"
        "  --is LEVEL:MODE:HI | LEVEL:MODE:LO:HI\n"
        "                      importance-sampling correction to simulate (repeatable); LEVEL token,\n"
        "                      sequence or geometric; MODE truncate (clamp into [LO,HI]) or mask\n"
        "                      (zero outside [LO,HI]). Default: token:truncate:2 token:mask:0.5:5\n"
        "                      (IcePop) sequence:truncate:3 sequence:mask:3 geometric:mask:0.999:1.001\n"
        "  --worst N           worst tokens and sequences listed (default 10)\n"
        "  --no-decode         print token ids even when the model has a tokenizer.json\n");
}

static char *decode_cb(void *ctx, const int32_t *ids, size_t n)
{
    return td_tokenizer_decode((const td_tokenizer *)ctx, ids, n, false, NULL);
}

int main(int argc, char **argv)
{
    const char *runs[MAX_RUNS], *figures[64];
    size_t n_runs = 0, n_fig = 0, n_is = 0;
    td_is_spec is[MAX_IS];
    int json = 0, md = 0, decode = 1;
    long worst = 10;
    td_error err = {{0}};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) { usage(stdout); return 0; }
        else if (!strcmp(a, "--json")) json = 1;
        else if (!strcmp(a, "--markdown")) md = 1;
        else if (!strcmp(a, "--no-decode")) decode = 0;
        else if (!strcmp(a, "--figure") && i + 1 < argc) { if (n_fig < 64) figures[n_fig++] = argv[++i]; }
        else if (!strcmp(a, "--worst") && i + 1 < argc) {
            char *end;
            worst = strtol(argv[++i], &end, 10);
            if (*end || worst < 0 || worst > 10000) { fprintf(stderr, "tidal-report: --worst %s: expected 0..10000\n", argv[i]); return 2; }
        } else if (!strcmp(a, "--is") && i + 1 < argc) {
            if (n_is == MAX_IS) { fprintf(stderr, "tidal-report: at most %d --is corrections\n", MAX_IS); return 2; }
            if (td_is_spec_parse(argv[++i], &is[n_is++], &err)) { fprintf(stderr, "tidal-report: %s\n", err.msg); return 2; }
        } else if (a[0] == '-' && a[1]) { fprintf(stderr, "tidal-report: unknown or incomplete option %s\n", a); usage(stderr); return 2; }
        else if (n_runs == MAX_RUNS) { fprintf(stderr, "tidal-report: at most %d runs side by side\n", MAX_RUNS); return 2; }
        else runs[n_runs++] = a;
    }
    if (!n_runs) { usage(stderr); return 2; }
    if (json && md) { fprintf(stderr, "tidal-report: --json and --markdown exclude each other\n"); return 2; }
    if (!n_is) {
        static const char *def[] = {"token:truncate:2", "token:mask:0.5:5", "sequence:truncate:3",
                                    "sequence:mask:3", "geometric:mask:0.999:1.001"};
        for (size_t k = 0; k < 5; k++) td_is_spec_parse(def[k], &is[n_is++], NULL);
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
        td_report_opts o = {.is = is, .n_is = n_is, .n_worst = (size_t)worst,
                            .decode = tok ? decode_cb : NULL, .decode_ctx = tok};
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
            td_report_print_markdown(stdout, reps, n_runs, figures, n_fig);
        } else {
            td_report_print_text(stdout, reps, n_runs);
        }
    }
    for (size_t i = 0; i < done; i++) json_decref(reps[i]);
    if (fflush(stdout) != 0) { fprintf(stderr, "tidal-report: cannot write the output\n"); rc = 1; }
    return rc;
}
