/* tidal — TensorBoard event files written by hand (include/tidal/tfevents.h has the format):
 * CRC-32C, the TFRecord framing, the few protobuf fields of an Event, and the cut-back a
 * --resume makes. */
#include "tidal/opts.h"
#include "tidal/tfevents.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- CRC-32C: byte-wise table of the reflected polynomial ---- */
static uint32_t crc_table[256];

static void crc_init(void)
{
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
        crc_table[i] = c;
    }
}

uint32_t td_crc32c(const void *data, size_t n)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, crc_init);
    const unsigned char *p = data;
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) c = crc_table[(c ^ p[i]) & 0xFF] ^ (c >> 8);
    return c ^ 0xFFFFFFFFu;
}

uint32_t td_crc32c_mask(uint32_t crc)
{
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

/* ---- protobuf, the wire types an Event uses ---- */
typedef struct {
    unsigned char *p;
    size_t n, cap;
} buf_t;

static void put(buf_t *b, const void *src, size_t n)
{
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2 + 64;
        b->p = td_xrealloc(b->p, b->cap);
    }
    memcpy(b->p + b->n, src, n);
    b->n += n;
}

static void put_varint(buf_t *b, uint64_t v)
{
    unsigned char t[10];
    int n = 0;
    do {
        t[n++] = (unsigned char)((v & 0x7F) | (v > 0x7F ? 0x80 : 0));
        v >>= 7;
    } while (v);
    put(b, t, (size_t)n);
}

static void put_le(buf_t *b, uint64_t v, int bytes)
{
    unsigned char t[8];
    for (int i = 0; i < bytes; i++) t[i] = (unsigned char)(v >> (8 * i));
    put(b, t, (size_t)bytes);
}

enum { WT_VARINT = 0, WT_FIXED64 = 1, WT_LEN = 2, WT_FIXED32 = 5 };

static void put_key(buf_t *b, int field, int wire) { put_varint(b, (uint64_t)(field << 3 | wire)); }

static void put_double(buf_t *b, int field, double v)
{
    uint64_t u;
    memcpy(&u, &v, 8);
    put_key(b, field, WT_FIXED64);
    put_le(b, u, 8);
}

static void put_bytes(buf_t *b, int field, const void *s, size_t n)
{
    put_key(b, field, WT_LEN);
    put_varint(b, n);
    put(b, s, n);
}

/* Summary.Value {tag = 1, simple_value = 2} */
static void put_value(buf_t *b, const char *tag, float v)
{
    size_t tl = strlen(tag);
    buf_t m = {0};
    put_bytes(&m, 1, tag, tl);
    uint32_t u;
    memcpy(&u, &v, 4);
    put_key(&m, 2, WT_FIXED32);
    put_le(&m, u, 4);
    put_bytes(b, 1, m.p, m.n);
    free(m.p);
}

/* ---- the file ---- */
struct td_tfevents {
    FILE *f;
    char path[4400];
};

const char *td_tfevents_path(const td_tfevents *w) { return w->path; }

static int write_record(td_tfevents *w, const buf_t *data, td_error *err)
{
    buf_t r = {0};
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)data->n >> (8 * i));
    put(&r, len, 8);
    put_le(&r, td_crc32c_mask(td_crc32c(len, 8)), 4);
    put(&r, data->p, data->n);
    put_le(&r, td_crc32c_mask(td_crc32c(data->p, data->n)), 4);
    int ok = fwrite(r.p, 1, r.n, w->f) == r.n && fflush(w->f) == 0;
    free(r.p);
    return ok ? 0 : td_fail(err, "%s: cannot write: %s", w->path, strerror(errno));
}

static int make_dirs(const char *dir, td_error *err)
{
    char probe[4200];
    snprintf(probe, sizeof probe, "%s/.", dir);   /* td_make_parent_dirs makes the dirname's folders */
    return td_make_parent_dirs(probe, err);
}

td_tfevents *td_tfevents_create(const char *dir, td_error *err)
{
    if (make_dirs(dir, err)) return NULL;
    char host[256] = "localhost";
    if (gethostname(host, sizeof host - 1) != 0 || !host[0]) snprintf(host, sizeof host, "localhost");
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    td_tfevents *w = td_xcalloc(1, sizeof *w);
    /* the name TF's writer gives (events.out.tfevents.%010d.<host>) and torch's pid suffix; a
     * name taken (two invocations in one second) gets a counter */
    int fd = -1;
    for (int k = 0; k < 1000 && fd < 0; k++) {
        int n = snprintf(w->path, sizeof w->path, "%s/events.out.tfevents.%010lld.%s.%d", dir, (long long)time(NULL),
                         host, (int)getpid());
        if (k) snprintf(w->path + n, sizeof w->path - (size_t)n, ".%d", k);
        fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno != EEXIST) break;
    }
    if (fd < 0 || !(w->f = fdopen(fd, "wb"))) {
        td_fail(err, "%s: cannot create: %s", w->path, strerror(errno));
        if (fd >= 0) close(fd);
        free(w);
        return NULL;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    buf_t e = {0};
    put_double(&e, 1, (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec);
    put_bytes(&e, 3, "brain.Event:2", 13);
    int rc = write_record(w, &e, err);
    free(e.p);
    if (rc) {
        td_tfevents_close(w, NULL);
        return NULL;
    }
    return w;
}

int td_tfevents_scalars(td_tfevents *w, int64_t step, double wall_time, const char *const *tags, const float *values,
                        int n, td_error *err)
{
    buf_t s = {0}, e = {0};
    for (int i = 0; i < n; i++) put_value(&s, tags[i], values[i]);
    put_double(&e, 1, wall_time);
    put_key(&e, 2, WT_VARINT);
    put_varint(&e, (uint64_t)step);   /* int64: a negative step is its 10-byte two's complement */
    put_bytes(&e, 5, s.p, s.n);
    int rc = write_record(w, &e, err);
    free(s.p);
    free(e.p);
    return rc;
}

int td_tfevents_close(td_tfevents *w, td_error *err)
{
    if (!w) return 0;
    int rc = w->f && fclose(w->f) != 0 ? td_fail(err, "%s: cannot write: %s", w->path, strerror(errno)) : 0;
    free(w);
    return rc;
}

/* ---- cutting back ---- */
static int get_varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
    *v = 0;
    for (int s = 0; s < 64 && *p < end; s += 7) {
        unsigned char c = *(*p)++;
        *v |= (uint64_t)(c & 0x7F) << s;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

/* An Event's step (0 when absent) and whether it is the file_version record; -1 if malformed. */
static int event_step(const unsigned char *p, size_t n, int64_t *step, int *is_version)
{
    const unsigned char *end = p + n;
    *step = 0;
    *is_version = 0;
    while (p < end) {
        uint64_t key, v;
        if (get_varint(&p, end, &key)) return -1;
        switch ((int)(key & 7)) {
        case WT_VARINT:
            if (get_varint(&p, end, &v)) return -1;
            if (key >> 3 == 2) *step = (int64_t)v;
            break;
        case WT_FIXED64: if (end - p < 8) return -1; p += 8; break;
        case WT_FIXED32: if (end - p < 4) return -1; p += 4; break;
        case WT_LEN:
            if (get_varint(&p, end, &v) || v > (uint64_t)(end - p)) return -1;
            if (key >> 3 == 3) *is_version = 1;
            p += v;
            break;
        default: return -1;
        }
    }
    return 0;
}

static uint32_t le32(const unsigned char *p) { return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24; }

/* Cuts one file at its first record of step >= keep_below (or torn); removes it when no step
 * record is left. */
static int trim_file(const char *path, int64_t keep_below, td_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return td_fail(err, "%s: cannot read: %s", path, strerror(errno));
    long keep = 0;
    int steps_kept = 0;
    unsigned char head[12], *data = NULL;
    size_t cap = 0;
    for (;;) {
        if (fread(head, 1, 12, f) != 12) break;
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)head[i] << (8 * i);
        if (td_crc32c_mask(td_crc32c(head, 8)) != le32(head + 8) || n > (1u << 30)) break;
        if (n + 4 > cap) { cap = (size_t)n + 4; data = td_xrealloc(data, cap); }
        if (fread(data, 1, (size_t)n + 4, f) != n + 4) break;
        if (td_crc32c_mask(td_crc32c(data, (size_t)n)) != le32(data + n)) break;
        int64_t step;
        int version;
        if (event_step(data, (size_t)n, &step, &version)) break;
        if (!version) {
            if (step >= keep_below) break;
            steps_kept++;
        }
        keep = ftell(f);
    }
    int rerr = ferror(f);
    fclose(f);
    free(data);
    if (rerr) return td_fail(err, "%s: cannot read: %s", path, strerror(errno));
    if (!steps_kept) {
        if (remove(path) != 0) return td_fail(err, "%s: cannot remove: %s", path, strerror(errno));
        return 0;
    }
    struct stat st;
    if (stat(path, &st) == 0 && st.st_size == keep) return 0;
    if (truncate(path, keep) != 0) return td_fail(err, "%s: cannot truncate to %ld bytes: %s", path, keep, strerror(errno));
    return 0;
}

int td_tfevents_trim(const char *dir, int64_t keep_below, td_error *err)
{
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? 0 : td_fail(err, "%s: cannot list: %s", dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while (rc == 0 && (e = readdir(d))) {
        if (strncmp(e->d_name, "events.out.tfevents.", 20) != 0) continue;
        char path[4400];
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        struct stat st;
        if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) continue;
        rc = trim_file(path, keep_below, err);
    }
    closedir(d);
    return rc;
}

/* ---- reading ---- */

/* A length-delimited field's bytes, or a varint/fixed value, one at a time. */
typedef struct {
    int field, wt;
    uint64_t v;                 /* varint, fixed32, fixed64 */
    const unsigned char *p;     /* WT_LEN: bytes */
    size_t n;
} pb_field;

static int pb_next(const unsigned char **p, const unsigned char *end, pb_field *f)
{
    uint64_t key;
    if (get_varint(p, end, &key)) return -1;
    f->field = (int)(key >> 3);
    f->wt = (int)(key & 7);
    f->p = NULL;
    f->n = 0;
    switch (f->wt) {
    case WT_VARINT: return get_varint(p, end, &f->v);
    case WT_FIXED64:
        if (end - *p < 8) return -1;
        f->v = 0;
        for (int i = 0; i < 8; i++) f->v |= (uint64_t)(*p)[i] << (8 * i);
        *p += 8;
        return 0;
    case WT_FIXED32:
        if (end - *p < 4) return -1;
        f->v = le32(*p);
        *p += 4;
        return 0;
    case WT_LEN:
        if (get_varint(p, end, &f->v) || f->v > (uint64_t)(end - *p)) return -1;
        f->p = *p;
        f->n = (size_t)f->v;
        *p += f->n;
        return 0;
    default: return -1;
    }
}

static double f32_of(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
static double f64_of(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }

/* A TensorProto holding one float or double (dtype 1 DT_FLOAT, 2 DT_DOUBLE); 0 + *v, or -1. */
static int tensor_scalar(const unsigned char *p, size_t n, double *v)
{
    const unsigned char *end = p + n;
    int dtype = 0, have = 0;
    double x = NAN;
    while (p < end) {
        pb_field f;
        if (pb_next(&p, end, &f)) return -1;
        if (f.field == 1 && f.wt == WT_VARINT) dtype = (int)f.v;
        else if (f.field == 4 && f.wt == WT_LEN) {   /* tensor_content: raw little-endian */
            if (f.n == 4) { x = f32_of(le32(f.p)); have = 1; }
            else if (f.n == 8) { uint64_t u = 0; for (int i = 0; i < 8; i++) u |= (uint64_t)f.p[i] << (8 * i); x = f64_of(u); have = 1; }
        } else if (f.field == 5 && f.wt == WT_FIXED32) { x = f32_of((uint32_t)f.v); have = 1; }
        else if (f.field == 5 && f.wt == WT_LEN && f.n == 4) { x = f32_of(le32(f.p)); have = 1; }   /* packed */
        else if (f.field == 6 && f.wt == WT_FIXED64) { x = f64_of(f.v); have = 1; }
        else if (f.field == 6 && f.wt == WT_LEN && f.n == 8) {
            uint64_t u = 0;
            for (int i = 0; i < 8; i++) u |= (uint64_t)f.p[i] << (8 * i);
            x = f64_of(u); have = 1;
        }
    }
    if (!have || (dtype != 0 && dtype != 1 && dtype != 2)) return -1;
    *v = x;
    return 0;
}

/* One Summary.Value: tag (1), simple_value (2), tensor (8). */
static int value_scalar(const unsigned char *p, size_t n, char *tag, size_t tagcap, double *v)
{
    const unsigned char *end = p + n;
    int have = 0;
    tag[0] = 0;
    while (p < end) {
        pb_field f;
        if (pb_next(&p, end, &f)) return -1;
        if (f.field == 1 && f.wt == WT_LEN) {
            size_t k = f.n < tagcap - 1 ? f.n : tagcap - 1;
            memcpy(tag, f.p, k);
            tag[k] = 0;
        } else if (f.field == 2 && f.wt == WT_FIXED32) { *v = f32_of((uint32_t)f.v); have = 1; }
        else if (f.field == 8 && f.wt == WT_LEN && !have) have = tensor_scalar(f.p, f.n, v) == 0;
    }
    return have && tag[0] ? 0 : -1;
}

int td_tfevents_read(const char *path, td_tfevents_scalar_fn fn, void *ctx, td_error *err)
{
    FILE *f = fopen(path, "rb");
    if (!f) return td_fail(err, "%s: cannot read: %s", path, strerror(errno));
    unsigned char head[12], *data = NULL;
    size_t cap = 0;
    int rc = 0;
    long off = 0;
    for (;;) {
        size_t got = fread(head, 1, 12, f);
        if (got == 0) break;
        if (got != 12) break;   /* torn header: a writer stopped here */
        uint64_t n = 0;
        for (int i = 0; i < 8; i++) n |= (uint64_t)head[i] << (8 * i);
        if (td_crc32c_mask(td_crc32c(head, 8)) != le32(head + 8) || n > (1u << 30)) {
            rc = td_fail(err, "%s: byte %ld: not a TFRecord (length CRC mismatch): not a TensorBoard events file, or "
                         "damaged", path, off);
            break;
        }
        if (n + 4 > cap) { cap = (size_t)n + 4; data = td_xrealloc(data, cap); }
        if (fread(data, 1, (size_t)n + 4, f) != n + 4) break;   /* torn last record */
        if (td_crc32c_mask(td_crc32c(data, (size_t)n)) != le32(data + n)) {
            rc = td_fail(err, "%s: byte %ld: record data CRC mismatch (damaged events file)", path, off);
            break;
        }
        off += 12 + (long)n + 4;
        const unsigned char *p = data, *end = data + n;
        int64_t step = 0;
        const unsigned char *sum = NULL;
        size_t sum_n = 0;
        int bad = 0;
        while (p < end && !bad) {
            pb_field fl;
            if (pb_next(&p, end, &fl)) { bad = 1; break; }
            if (fl.field == 2 && fl.wt == WT_VARINT) step = (int64_t)fl.v;
            else if (fl.field == 5 && fl.wt == WT_LEN) { sum = fl.p; sum_n = fl.n; }
        }
        if (bad) {
            rc = td_fail(err, "%s: byte %ld: malformed Event record", path, off);
            break;
        }
        const unsigned char *q = sum, *qend = sum ? sum + sum_n : NULL;
        while (q && q < qend && !rc) {
            pb_field fv;
            if (pb_next(&q, qend, &fv)) break;
            if (fv.field != 1 || fv.wt != WT_LEN) continue;
            char tag[256];
            double v = NAN;
            if (value_scalar(fv.p, fv.n, tag, sizeof tag, &v) == 0) rc = fn(ctx, step, tag, v);
        }
        if (rc) break;
    }
    fclose(f);
    free(data);
    return rc;
}
