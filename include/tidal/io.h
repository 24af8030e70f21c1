/* tidal — file helpers shared by every reader: whole-file reads with a size limit, read-only
 * memory maps, JSON files (jansson) with errors that name the file, line and column. */
#ifndef TIDAL_IO_H
#define TIDAL_IO_H

#include "tidal/common.h"

#include <jansson.h>

TD_BEGIN_DECLS

/* Reads a whole file into a NUL-terminated buffer (caller frees). Refuses files larger than
 * max_bytes, so a bad path cannot make tidal read gigabytes. NULL + err on failure. */
char *td_read_file(const char *path, size_t max_bytes, size_t *len_out, td_error *err);

/* Read-only memory map of a whole file. */
typedef struct {
    const uint8_t *data;
    size_t size;
} td_mmap;
int  td_mmap_open(td_mmap *m, const char *path, td_error *err);
void td_mmap_close(td_mmap *m);

/* json_loadb, except that integers beyond 64 bits (which jansson refuses: "too big integer")
 * are read as JSON reals of the same value, as Python's json reads them into floats' range.
 * Every reader of JSON that other tools wrote goes through this or the two below. */
json_t *td_json_loadb(const char *text, size_t len, size_t flags, json_error_t *je);
/* je->text for a parse of ONE line of a JSON Lines file: jansson's "near end of file" means the
 * end of that line there, so it is rewritten to say so (the file may go on for many lines). */
const char *td_json_line_error(json_error_t *je);
/* Parses a JSON file (rejecting duplicate keys, widening big integers as td_json_loadb);
 * NULL + "PATH:LINE:COL: what" on failure. */
json_t *td_json_load_file(const char *path, td_error *err);
/* Parses JSON text that came from `what` (a file name, or "header of X") the same way. */
json_t *td_json_load_text(const char *text, size_t len, const char *what, td_error *err);

TD_END_DECLS

#endif
