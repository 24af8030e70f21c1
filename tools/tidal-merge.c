/* tidal-merge — join the run files of `tidal-diff --shard K/N` jobs into one.
 *
 *   tidal-merge -o ALL.h5 part0.h5 part1.h5 ...
 *
 * The parts must come from one run (same model, recipes, sampling, seed, batch): their
 * attributes are compared. Rows are concatenated part after part and row references shifted. */
#include "tidal/diff.h"

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>

int main(int argc, char **argv)
{
    const char *out = NULL;
    int force = 0, c;
    static const struct option longs[] = {{"output", required_argument, 0, 'o'}, {"force", no_argument, 0, 'f'},
                                          {"help", no_argument, 0, 'h'}, {0, 0, 0, 0}};
    while ((c = getopt_long(argc, argv, "o:fh", longs, NULL)) != -1) {
        if (c == 'o') out = optarg;
        else if (c == 'f') force = 1;
        else {
            fprintf(c == 'h' ? stdout : stderr, "usage: tidal-merge -o OUT.h5 [--force] PART.h5...\n");
            return c == 'h' ? 0 : 2;
        }
    }
    if (!out || optind >= argc) {
        fprintf(stderr, "usage: tidal-merge -o OUT.h5 [--force] PART.h5...\n");
        return 2;
    }
    char *cmd = td_command_line(argc, argv);
    td_error err;
    int rc = td_runfile_merge(out, (const char *const *)argv + optind, argc - optind, cmd, force, &err);
    free(cmd);
    if (rc) {
        fprintf(stderr, "tidal-merge: %s\n", err.msg);
        return 1;
    }
    printf("tidal-merge: wrote %s from %d parts\n", out, argc - optind);
    return 0;
}
