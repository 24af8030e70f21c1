/* tidal-export — a run file's rows as CSV, for pandas (pd.read_csv), R or a spreadsheet,
 * without h5py.
 *
 *   tidal-export RUN.h5 [--group tokens|seqs|progress|steps] [-o OUT.csv]
 *   tidal-export RUN.h5 --attr NAME
 *
 * One column per dataset of the group (1-D datasets; /layers/rel_err is 2-D and is left out),
 * in name order, one line per row; numbers in %.17g (doubles round-trip exactly, integers print
 * as integers, NaN as "nan", which pandas reads as NaN). --attr prints one root attribute (a
 * string as it is, an integer, a double in %.17g): with --group steps, what the GPU scripts read
 * from sft.h5 / rl.h5 where the python has no h5py (tests/py/runfile_read.py). */
#include "tidal/opts.h"
#include "tidal/runfile.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CHUNK 65536

int main(int argc, char **argv)
{
    const char *run_path[1] = {NULL}, *out = NULL, *attr = NULL;
    int group = 0;
    td_opt opts[] = {
        TD_OPT_C("group", 0, &group, "tokens|seqs|progress|steps", "which rows: one per scored token (default), per\n"
                 "sequence, per completed batch, per optimiser step\n(sft.h5, rl.h5)"),
        TD_OPT_S("output", 'o', &out, "OUT.csv", "write there (default stdout)"),
        TD_OPT_S("attr", 0, &attr, "NAME", "print the root attribute NAME instead (exit 1 if absent)"),
        {0}};
    td_cli cli = {"tidal-export", "RUN.h5 [--group tokens|seqs|progress|steps] [-o OUT.csv] | RUN.h5 --attr NAME",
                  "A run file's rows as CSV (header: the dataset names; reports/SCHEMA.md says what each is):\n"
                  "  pandas.read_csv(\"tokens.csv\")", NULL, opts, 1, 1};
    int nargs, rc = td_cli_parse(&cli, argc, argv, run_path, &nargs);
    if (rc >= 0) return rc;
    static const char *groups[] = {"/tokens", "/seqs", "/progress", "/steps"};
    td_error err;
    td_runfile *rf = td_runfile_open(run_path[0], 0, &err);
    if (!rf) { fprintf(stderr, "tidal-export: %s\n", err.msg); return 1; }
    if (attr) {   /* a string, else an integer, else a double */
        char *sv = td_runfile_get_str(rf, attr, &err);
        int64_t iv;
        double dv;
        rc = 0;
        if (sv) printf("%s\n", sv);
        else if (!td_runfile_get_i64(rf, attr, &iv, &err)) printf("%lld\n", (long long)iv);
        else if (!td_runfile_get_f64(rf, attr, &dv, &err)) printf("%.17g\n", dv);
        else { fprintf(stderr, "tidal-export: %s: no root attribute '%s'\n", run_path[0], attr); rc = 1; }
        free(sv);
        td_runfile_close(rf, NULL);
        return rc;
    }
    /* every column, however many the group holds (a fixed cap once dropped /steps' last ones) */
    size_t n = td_runfile_list(rf, groups[group], NULL, 0), nc = 0;
    char **names = td_xcalloc(n ? n : 1, sizeof *names), (*path)[128] = td_xcalloc(n ? n : 1, sizeof *path);
    size_t got = td_runfile_list(rf, groups[group], names, n);
    if (got < n) n = got;
    int64_t rows = -1;
    for (size_t i = 0; i < n; i++) {
        snprintf(path[nc], sizeof path[nc], "%s/%s", groups[group], names[i]);
        free(names[i]);
        if (td_runfile_width(rf, path[nc]) != 1) continue;
        int64_t r = td_runfile_rows(rf, path[nc]);
        if (r < 0 || (rows >= 0 && r != rows)) {
            fprintf(stderr, "tidal-export: %s: %s has %lld rows, the group's other columns %lld (corrupt file?)\n",
                    run_path[0], path[nc], (long long)r, (long long)rows);
            for (size_t j = i + 1; j < n; j++) free(names[j]);
            free(names); free(path);
            td_runfile_close(rf, NULL);
            return 1;
        }
        rows = r;
        nc++;
    }
    free(names);
    if (!nc) {
        fprintf(stderr, "tidal-export: %s: no %s group (is this a tidal run file?)\n", run_path[0], groups[group]);
        td_runfile_close(rf, NULL);
        free(path);
        return 1;
    }
    if (out && td_make_parent_dirs(out, &err)) { fprintf(stderr, "tidal-export: %s\n", err.msg); td_runfile_close(rf, NULL); free(path); return 1; }
    FILE *f = out ? fopen(out, "w") : stdout;
    if (!f) { fprintf(stderr, "tidal-export: %s: cannot create\n", out); td_runfile_close(rf, NULL); free(path); return 1; }
    for (size_t c = 0; c < nc; c++) fprintf(f, "%s%s", c ? "," : "", strrchr(path[c], '/') + 1);
    fputc('\n', f);
    double *buf = td_xmalloc(nc * CHUNK * sizeof(double));
    for (int64_t r0 = 0; r0 < rows && rc < 0; r0 += CHUNK) {
        int64_t k = rows - r0 < CHUNK ? rows - r0 : CHUNK;
        for (size_t c = 0; c < nc && rc < 0; c++)
            if (td_runfile_read(rf, path[c], TD_COL_F64, r0, k, buf + c * CHUNK, &err)) rc = 1;
        for (int64_t i = 0; i < k && rc < 0; i++)
            for (size_t c = 0; c < nc; c++) fprintf(f, c + 1 < nc ? "%.17g," : "%.17g\n", buf[c * CHUNK + i]);
    }
    free(buf);
    free(path);
    td_runfile_close(rf, NULL);
    if (rc == 1) fprintf(stderr, "tidal-export: %s\n", err.msg);
    if ((out ? fclose(f) : fflush(f)) != 0) { fprintf(stderr, "tidal-export: %s: write failed\n", out ? out : "stdout"); rc = 1; }
    if (rc == 1 && out) remove(out);
    return rc == 1 ? 1 : 0;
}
