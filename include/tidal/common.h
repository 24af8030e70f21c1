/* tidal — common definitions: C/C++ linkage guards and the error-reporting convention.
 *
 * Library functions report failure by returning a non-zero td_status (or NULL) after filling a
 * td_error with a message that names the file, the field and what was expected. Tools print
 * that message and exit non-zero. Nothing in libtidal calls exit().
 */
#ifndef TIDAL_COMMON_H
#define TIDAL_COMMON_H

#ifdef __cplusplus
#define TD_BEGIN_DECLS extern "C" {
#define TD_END_DECLS }
#else
#define TD_BEGIN_DECLS
#define TD_END_DECLS
#endif

#include <stddef.h>
#include <stdint.h>

TD_BEGIN_DECLS

#define TD_VERSION "0.1.0"

typedef struct {
    char msg[1024];
} td_error;

/* Formats a message into err (if not NULL) and returns -1, so callers can write
 * `return td_fail(err, "%s: header length %llu past end of file", path, n);` */
int td_fail(td_error *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Allocation that reports the caller's file and line and exits: for sizes the program itself
 * decided, never for sizes read from a file (those are validated against the file first). */
void *td_xmalloc_at(size_t size, const char *file, int line);
void *td_xcalloc_at(size_t n, size_t size, const char *file, int line);
void *td_xrealloc_at(void *p, size_t size, const char *file, int line);
#define td_xmalloc(sz) td_xmalloc_at((sz), __FILE__, __LINE__)
#define td_xrealloc(p, sz) td_xrealloc_at((p), (sz), __FILE__, __LINE__)
#define td_xcalloc(n, sz) td_xcalloc_at((n), (sz), __FILE__, __LINE__)

/* argv as one shell-quoted string (caller frees): recorded in every output file. */
char *td_command_line(int argc, char **argv);

TD_END_DECLS

#endif
