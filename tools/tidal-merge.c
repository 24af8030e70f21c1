/* tidal-merge — join the run files of `tidal-diff --shard K/N` jobs into one.
 *
 *   tidal-merge -o ALL.h5 part0.h5 part1.h5 ...
 *
 * The parts must come from one run (same model, recipes, sampling, seed, batch): their
 * attributes are compared. Every shard 0..N-1 once, each finished (--allow-partial merges a
 * subset on purpose and records it in the file). Rows are concatenated part after part and
 * row references shifted. */
#include "tidal/diff.h"
#include "tidal/opts.h"

#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    const char *out = NULL;
    int force = 0, allow_partial = 0, nargs;
    td_opt opts[] = {
        TD_OPT_S("output", 'o', &out, "OUT.h5", "the merged run file"),
        TD_OPT_F("force", 'f', &force, 1, "replace an existing OUT.h5 (kept if the merge fails)"),
        TD_OPT_F("allow-partial", 0, &allow_partial, 1, "merge an incomplete set of shards (missing or unfinished\n"
                 "parts); recorded in the root attribute `partial`"),
        {0}};
    opts[0].required = 1;
    td_cli cli = {"tidal-merge", "-o OUT.h5 [--force] [--allow-partial] PART.h5...",
                  "Joins the run files of tidal-diff --shard K/N jobs. Every shard K of N must be there once and\n"
                  "finished; the parts must share model, recipes, sampling, seed and batch.", NULL, opts, 1, -1};
    const char **parts = td_xmalloc((size_t)argc * sizeof *parts);
    int rc = td_cli_parse(&cli, argc, argv, parts, &nargs);
    if (rc >= 0) { free(parts); return rc; }
    td_error err;
    if (td_make_parent_dirs(out, &err)) { fprintf(stderr, "tidal-merge: %s\n", err.msg); free(parts); return 1; }
    char *cmd = td_command_line(argc, argv);
    rc = td_runfile_merge(out, parts, nargs, cmd, force, allow_partial, &err);
    free(cmd);
    free(parts);
    if (rc) {
        fprintf(stderr, "tidal-merge: %s\n", err.msg);
        return 1;
    }
    printf("tidal-merge: wrote %s from %d parts%s\n", out, nargs, allow_partial ? " (--allow-partial)" : "");
    return 0;
}
