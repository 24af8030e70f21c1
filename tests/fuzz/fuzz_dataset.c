/* Fuzz target: dataset files (td_records_read): JSON Lines or a JSON array, a BOM, and the same
 * bytes read through zlib (gzip seeds in the corpus: a damaged or truncated stream must be an
 * error, never a crash). Every record returned must be an object with a line in the text. */
#include "fuzz_util.h"
#include "tidal/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    fz_write(path, sizeof path, "data.json.gz", data, size);
    td_record *r;
    size_t n;
    td_error err;
    if (td_records_read(path, &r, &n, &err) != 0) return 0;
    for (size_t i = 0; i < n; i++)
        if (!json_is_object(r[i].obj) || r[i].line < 0) abort();
    td_records_free(r, n);
    return 0;
}
