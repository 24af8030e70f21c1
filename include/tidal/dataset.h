/* tidal — dataset files as TRL users hold them: one JSON object per record, in
 *   .jsonl       JSON Lines (what datasets' Dataset.to_json writes, whatever the extension),
 *   .json        a JSON array of records, or JSON Lines,
 *   .json.gz     either of the two, gzip-compressed (any file may be: zlib reads plain files
 *                as they are).
 * The format is sniffed from the text, not the name: a first character '[' is an array, anything
 * else is JSON Lines. A UTF-8 byte-order mark is skipped; empty lines are skipped. Errors name the
 * file and the line (of the uncompressed text): invalid JSON with its column, a record that is
 * not an object, a directory given as the file, a file with no records.
 * What a record must hold is the caller's business (tasks.h for the built-in tasks, rl.h for
 * tidal-rl's own prompts). */
#ifndef TIDAL_DATASET_H
#define TIDAL_DATASET_H

#include "tidal/common.h"

#include <jansson.h>

TD_BEGIN_DECLS

typedef struct {
    json_t *obj;    /* the record (an object; owned by the array)                    */
    long line;      /* line of the uncompressed text where it starts (1-based)        */
} td_record;

/* Reads every record of path. *out (caller frees with td_records_free). 0 or -1 + err. */
int td_records_read(const char *path, td_record **out, size_t *n, td_error *err);
void td_records_free(td_record *r, size_t n);

TD_END_DECLS

#endif
