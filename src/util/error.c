/* Error reporting and checked allocation (see include/tidal/common.h). */
#include "tidal/common.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int td_fail(td_error *err, const char *fmt, ...)
{
    if (err) {
        /* formatted aside first: callers may pass err->msg itself as an argument, to wrap the
         * reason a callee gave ("%s (what tidal-rl needs)", err->msg) */
        char msg[sizeof err->msg];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        memcpy(err->msg, msg, sizeof msg);
    }
    return -1;
}

static void oom(size_t size, const char *file, int line)
{
    fprintf(stderr, "tidal: out of memory allocating %zu bytes at %s:%d\n", size, file, line);
    exit(2);
}

void *td_xmalloc_at(size_t size, const char *file, int line)
{
    void *p = malloc(size ? size : 1);
    if (!p) oom(size, file, line);
    return p;
}

void *td_xcalloc_at(size_t n, size_t size, const char *file, int line)
{
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) oom(n * size, file, line);
    return p;
}

void *td_xrealloc_at(void *p, size_t size, const char *file, int line)
{
    void *q = realloc(p, size ? size : 1);
    if (!q) oom(size, file, line);
    return q;
}
