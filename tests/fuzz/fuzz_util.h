/* Shared helpers of the fuzz targets (tests/fuzz/fuzz_*.c, built by `make fuzz` with clang's
 * libFuzzer + ASan + UBSan). tidal's loaders take paths, so each input is written to a file in
 * a private temporary directory made once per process, then given to the public loader. */
#ifndef TIDAL_FUZZ_UTIL_H
#define TIDAL_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The private directory ($TMPDIR/tidal-fuzz-XXXXXX), removed at exit. */
static char fz_dir[512];

static __attribute__((unused)) void fz_cleanup(void)
{
    if (!fz_dir[0]) return;
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", fz_dir);
    if (system(cmd) != 0) { /* nothing more to do */ }
}

static __attribute__((unused)) const char *fz_tmpdir(void)
{
    if (fz_dir[0]) return fz_dir;
    const char *t = getenv("TMPDIR");
    snprintf(fz_dir, sizeof fz_dir, "%s/tidal-fuzz-XXXXXX", t && *t ? t : "/tmp");
    if (!mkdtemp(fz_dir)) { perror("mkdtemp"); abort(); }
    atexit(fz_cleanup);
    return fz_dir;
}

/* DIR/name, in a static buffer per call site (callers copy when they need two). */
static __attribute__((unused)) void fz_path(char *out, size_t cap, const char *name)
{
    snprintf(out, cap, "%s/%s", fz_tmpdir(), name);
}

/* Writes n bytes to DIR/name; returns the path in out. */
static __attribute__((unused)) void fz_write(char *out, size_t cap, const char *name, const void *data, size_t n)
{
    fz_path(out, cap, name);
    FILE *f = fopen(out, "wb");
    if (!f) { perror(out); abort(); }
    if (n && fwrite(data, 1, n, f) != n) { perror(out); abort(); }
    if (fclose(f) != 0) { perror(out); abort(); }
}

#endif
