/* safetensors writer (streaming; see checkpoint.h for the layout).
 *
 * Tensors are declared up front so the header, which precedes the data, can be written first;
 * data is then written with pwrite at each tensor's offset, so a caller can produce tensors in
 * any order and in pieces without holding the whole model in memory. */
#include "tidal/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct {
    char *name;
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    size_t nbytes;
    size_t offset;            /* in the data area */
    size_t written;           /* bytes written so far */
} wtensor;

struct td_st_writer {
    char *path, *tmp;
    json_t *meta;
    wtensor *t;
    size_t n, cap;
    int fd;                   /* -1 before begin */
    size_t data_start;        /* 8 + header length */
    bool finished;
};

td_st_writer *td_st_writer_new(const char *path)
{
    td_st_writer *w = td_xcalloc(1, sizeof *w);
    w->path = strdup(path);
    w->tmp = td_xmalloc(strlen(path) + 5);
    sprintf(w->tmp, "%s.tmp", path);
    w->meta = json_object();
    json_object_set_new(w->meta, "format", json_string("pt"));
    w->fd = -1;
    return w;
}

int td_st_writer_meta(td_st_writer *w, const char *key, const char *value, td_error *err)
{
    if (w->fd >= 0) return td_fail(err, "%s: metadata must be set before writing starts", w->path);
    json_t *s = json_stringn(value, strlen(value));
    if (!s) return td_fail(err, "%s: metadata \"%s\" is not valid UTF-8", w->path, key);
    json_object_set_new(w->meta, key, s);
    return 0;
}

int td_st_writer_declare(td_st_writer *w, const char *name, td_dtype dt, int ndim, const int64_t *shape,
                         td_error *err)
{
    if (w->fd >= 0) return td_fail(err, "%s: tensor '%s' declared after writing started", w->path, name);
    if ((unsigned)dt >= TD_DT_COUNT && dt != TD_DT_I64) return td_fail(err, "%s: tensor '%s': bad dtype", w->path, name);
    if (ndim < 0 || ndim > TD_MAX_DIMS) return td_fail(err, "%s: tensor '%s': %d dimensions", w->path, name, ndim);
    if (strcmp(name, "__metadata__") == 0 || !*name) return td_fail(err, "%s: bad tensor name '%s'", w->path, name);
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0) return td_fail(err, "%s: tensor '%s' declared twice", w->path, name);
    size_t nbytes = td_dtype_size(dt);
    for (int i = 0; i < ndim; i++)
        if (shape[i] < 0 || __builtin_mul_overflow(nbytes, (size_t)shape[i], &nbytes))
            return td_fail(err, "%s: tensor '%s': shape negative or too large", w->path, name);
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        wtensor *nt = realloc(w->t, w->cap * sizeof *nt);
        if (!nt) return td_fail(err, "%s: out of memory", w->path);
        w->t = nt;
    }
    wtensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    t->name = strdup(name);
    t->dtype = dt;
    t->ndim = ndim;
    memcpy(t->shape, shape, (size_t)ndim * sizeof *shape);
    t->nbytes = nbytes;
    return 0;
}

static int full_pwrite(td_st_writer *w, const void *buf, size_t n, size_t off, td_error *err)
{
    const uint8_t *p = buf;
    while (n) {
        ssize_t k = pwrite(w->fd, p, n, (off_t)off);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return td_fail(err, "%s: write failed: %s", w->tmp, k < 0 ? strerror(errno) : "no progress");
        p += k; n -= (size_t)k; off += (size_t)k;
    }
    return 0;
}

int td_st_writer_begin(td_st_writer *w, td_error *err)
{
    if (w->fd >= 0) return td_fail(err, "%s: begin called twice", w->path);
    /* Layout: widest element size first, declaration order within a size (a stable selection
     * over the 4 sizes), contiguous: every tensor then starts at a multiple of its element
     * size because everything before it is a multiple of that size. */
    size_t off = 0;
    json_t *h = json_object();
    json_object_set(h, "__metadata__", w->meta);
    static const size_t sizes[] = {8, 4, 2, 1};
    for (int s = 0; s < 4; s++)
        for (size_t i = 0; i < w->n; i++) {
            wtensor *t = &w->t[i];
            if (td_dtype_size(t->dtype) != sizes[s]) continue;
            t->offset = off;
            if (__builtin_add_overflow(off, t->nbytes, &off)) {
                json_decref(h);
                return td_fail(err, "%s: total size overflows", w->path);
            }
        }
    for (size_t i = 0; i < w->n; i++) {
        wtensor *t = &w->t[i];
        json_t *shape = json_array();
        for (int d = 0; d < t->ndim; d++) json_array_append_new(shape, json_integer(t->shape[d]));
        json_object_set_new(h, t->name,
                            json_pack("{s:s, s:o, s:[I, I]}", "dtype", td_dtype_name(t->dtype), "shape", shape,
                                      "data_offsets", (json_int_t)t->offset, (json_int_t)(t->offset + t->nbytes)));
    }
    char *text = json_dumps(h, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(h);
    if (!text) return td_fail(err, "%s: cannot encode header", w->path);
    size_t len = strlen(text), padded = (len + 7) / 8 * 8;   /* data area starts 8-aligned */
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (w->fd < 0) { free(text); return td_fail(err, "%s: cannot create: %s", w->tmp, strerror(errno)); }
    uint8_t *buf = td_xmalloc(8 + padded);
    for (int i = 0; i < 8; i++) buf[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(buf + 8, text, len);
    memset(buf + 8 + len, ' ', padded - len);
    free(text);
    int rc = full_pwrite(w, buf, 8 + padded, 0, err);
    free(buf);
    w->data_start = 8 + padded;
    /* size the file now so a tensor written out of order leaves no hole at the end */
    if (rc == 0 && ftruncate(w->fd, (off_t)(w->data_start + off)) != 0)
        rc = td_fail(err, "%s: cannot size file to %zu bytes: %s", w->tmp, w->data_start + off, strerror(errno));
    return rc;
}

static wtensor *lookup(td_st_writer *w, const char *name, td_error *err)
{
    if (w->fd < 0) { td_fail(err, "%s: write before td_st_writer_begin", w->path); return NULL; }
    for (size_t i = 0; i < w->n; i++)
        if (strcmp(w->t[i].name, name) == 0) return &w->t[i];
    td_fail(err, "%s: tensor '%s' was not declared", w->path, name);
    return NULL;
}

int td_st_writer_write_raw(td_st_writer *w, const char *name, const void *bytes, size_t nbytes, td_error *err)
{
    wtensor *t = lookup(w, name, err);
    if (!t) return -1;
    if (nbytes > t->nbytes - t->written)
        return td_fail(err, "%s: tensor '%s': %zu bytes written past its %zu", w->path, name,
                       t->written + nbytes, t->nbytes);
    if (full_pwrite(w, bytes, nbytes, w->data_start + t->offset + t->written, err) != 0) return -1;
    t->written += nbytes;
    return 0;
}

int td_st_writer_write_f32(td_st_writer *w, const char *name, const float *x, size_t n, td_error *err)
{
    wtensor *t = lookup(w, name, err);
    if (!t) return -1;
    if (t->dtype == TD_DT_I64) return td_fail(err, "%s: tensor '%s' is I64: write it raw", w->path, name);
    size_t es = td_dtype_size(t->dtype);
    enum { CH = 1 << 14 };
    uint32_t buf[CH];
    for (size_t i = 0; i < n; i += CH) {
        size_t m = n - i < CH ? n - i : CH;
        td_encode_row(td_dtype_format(t->dtype), x + i, buf, m, TD_SATFINITE);
        if (td_st_writer_write_raw(w, name, buf, m * es, err) != 0) return -1;
    }
    return 0;
}

int td_st_writer_finish(td_st_writer *w, td_error *err)
{
    if (w->fd < 0 && td_st_writer_begin(w, err) != 0) return -1;   /* empty file: header only */
    for (size_t i = 0; i < w->n; i++)
        if (w->t[i].written != w->t[i].nbytes)
            return td_fail(err, "%s: tensor '%s' has %zu of its %zu bytes written", w->path, w->t[i].name,
                           w->t[i].written, w->t[i].nbytes);
    /* on disk before it takes its real name: a rename over unwritten data is a torn file after a crash */
    if (fsync(w->fd) != 0) return td_fail(err, "%s: fsync failed: %s", w->tmp, strerror(errno));
    if (close(w->fd) != 0) { w->fd = -2; return td_fail(err, "%s: close failed: %s", w->tmp, strerror(errno)); }
    w->fd = -2;   /* closed, still "begun" */
    if (rename(w->tmp, w->path) != 0) return td_fail(err, "%s: rename from %s failed: %s", w->path, w->tmp, strerror(errno));
    w->finished = true;
    return 0;
}

void td_st_writer_free(td_st_writer *w)
{
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    if (w->fd != -1 && !w->finished) unlink(w->tmp);
    for (size_t i = 0; i < w->n; i++) free(w->t[i].name);
    free(w->t);
    json_decref(w->meta);
    free(w->path);
    free(w->tmp);
    free(w);
}
