/* Growable column buffers for one batch of run-file rows (internal to the diff job). */
#ifndef TIDAL_DIFF_COLUMNS_H
#define TIDAL_DIFF_COLUMNS_H

#include "tidal/runschema.h"

typedef struct {
    const char *path;     /* dataset path, e.g. "/tokens/logp_a" */
    td_coltype type;
    size_t n, cap;
    void *data;
} td_column;

/* Empty buffers for the schema's columns spec[0..n). */
void td_columns_init(td_column *cols, const td_colspec *spec, size_t n);
void td_column_push(td_column *c, const void *value);
void td_column_push_n(td_column *c, const void *values, size_t n);
void td_column_push_i64(td_column *c, int64_t v);
void td_column_push_i32(td_column *c, int32_t v);
void td_column_push_i8(td_column *c, int8_t v);
void td_column_push_f64(td_column *c, double v);
void td_columns_clear(td_column *cols, size_t n);
void td_columns_free(td_column *cols, size_t n);
/* Appends every column's rows to the run file (same row count expected per group). */
int td_columns_write(td_runfile *rf, td_column *cols, size_t n, td_error *err);

#endif
