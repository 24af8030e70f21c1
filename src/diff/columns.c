/* Growable column buffers (see columns.h). */
#include "columns.h"

#include <stdlib.h>
#include <string.h>

void td_columns_init(td_column *cols, const td_colspec *spec, size_t n)
{
    for (size_t i = 0; i < n; i++) cols[i] = (td_column){spec[i].path, spec[i].type, 0, 0, NULL};
}

void td_column_push(td_column *c, const void *value)
{
    size_t sz = td_coltype_size(c->type);
    if (c->n == c->cap) {
        c->cap = c->cap ? 2 * c->cap : 1024;
        c->data = td_xrealloc(c->data, c->cap * sz);
    }
    memcpy((char *)c->data + c->n * sz, value, sz);
    c->n++;
}

void td_column_push_n(td_column *c, const void *values, size_t n)
{
    size_t sz = td_coltype_size(c->type);
    if (c->n + n > c->cap) {
        while (c->n + n > c->cap) c->cap = c->cap ? 2 * c->cap : 1024;
        c->data = td_xrealloc(c->data, c->cap * sz);
    }
    if (n) memcpy((char *)c->data + c->n * sz, values, n * sz);
    c->n += n;
}

void td_column_push_i64(td_column *c, int64_t v) { td_column_push(c, &v); }
void td_column_push_i32(td_column *c, int32_t v) { td_column_push(c, &v); }
void td_column_push_i8(td_column *c, int8_t v) { td_column_push(c, &v); }
void td_column_push_f64(td_column *c, double v) { td_column_push(c, &v); }

void td_columns_clear(td_column *cols, size_t n)
{
    for (size_t i = 0; i < n; i++) cols[i].n = 0;
}

void td_columns_free(td_column *cols, size_t n)
{
    for (size_t i = 0; i < n; i++) { free(cols[i].data); cols[i].data = NULL; cols[i].n = cols[i].cap = 0; }
}

int td_columns_write(td_runfile *rf, td_column *cols, size_t n, td_error *err)
{
    for (size_t i = 0; i < n; i++)
        if (td_runfile_append(rf, cols[i].path, cols[i].type, 1, cols[i].data, cols[i].n, err)) return -1;
    return 0;
}
