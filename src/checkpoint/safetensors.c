/* safetensors reader: maps one file and validates its header against the file.
 *
 * File = u64 LE header length N | N bytes of JSON | data area (size D = file - 8 - N).
 * Each tensor entry {"dtype", "shape", "data_offsets": [b, e]} must satisfy
 *   0 <= b <= e <= D,  e - b == prod(shape) * sizeof(dtype)  (computed overflow-checked),
 * and no two tensors' byte ranges may overlap. Only then do we hand out pointers into the map.
 * Nothing is allocated in proportion to a number read from the file before that number has
 * been bounded by the file size.
 */
#include "ckpt_internal.h"

#include <stdlib.h>
#include <string.h>

/* Reads a JSON integer that must be a non-negative int64. */
static int get_u64(json_t *v, uint64_t *out)
{
    if (!json_is_integer(v)) return -1;
    json_int_t x = json_integer_value(v);
    if (x < 0) return -1;
    *out = (uint64_t)x;
    return 0;
}

static int parse_entry(const char *path, const char *name, json_t *e, size_t data_size,
                       td_tensor *t, td_error *err)
{
    if (!json_is_object(e))
        return td_fail(err, "%s: tensor '%s': header entry is not a JSON object", path, name);
    json_t *jd = json_object_get(e, "dtype"), *js = json_object_get(e, "shape"),
           *jo = json_object_get(e, "data_offsets");
    if (!json_is_string(jd))
        return td_fail(err, "%s: tensor '%s': missing or non-string \"dtype\"", path, name);
    int dt = td_dtype_from_name(json_string_value(jd));
    if (dt < 0)
        return td_fail(err, "%s: tensor '%s': unsupported dtype \"%s\" (tidal reads F32, F16, BF16, F8_E4M3)",
                       path, name, json_string_value(jd));
    if (!json_is_array(js))
        return td_fail(err, "%s: tensor '%s': missing or non-array \"shape\"", path, name);
    size_t nd = json_array_size(js);
    if (nd > TD_MAX_DIMS)
        return td_fail(err, "%s: tensor '%s': %zu dimensions, tidal accepts at most %d",
                       path, name, nd, TD_MAX_DIMS);
    size_t numel = 1;
    bool overflow = false;
    for (size_t i = 0; i < nd; i++) {
        uint64_t d;
        if (get_u64(json_array_get(js, i), &d) != 0)
            return td_fail(err, "%s: tensor '%s': shape[%zu] is not a non-negative integer", path, name, i);
        t->shape[i] = (int64_t)d;
        if (d > SIZE_MAX || __builtin_mul_overflow(numel, (size_t)d, &numel)) overflow = true;
    }
    size_t nbytes = 0;
    if (overflow || __builtin_mul_overflow(numel, td_dtype_size(dt), &nbytes))
        return td_fail(err, "%s: tensor '%s': shape is absurd (element count x %zu bytes overflows 64 bits)",
                       path, name, td_dtype_size(dt));
    uint64_t b, en;
    if (!json_is_array(jo) || json_array_size(jo) != 2 || get_u64(json_array_get(jo, 0), &b) != 0 ||
        get_u64(json_array_get(jo, 1), &en) != 0)
        return td_fail(err, "%s: tensor '%s': \"data_offsets\" must be [begin, end] non-negative integers",
                       path, name);
    if (b > en || en > data_size)
        return td_fail(err, "%s: tensor '%s': data_offsets [%llu, %llu] outside the data area of %zu bytes",
                       path, name, (unsigned long long)b, (unsigned long long)en, data_size);
    if (en - b != nbytes)
        return td_fail(err, "%s: tensor '%s': shape x dtype is %zu bytes but data_offsets span %llu",
                       path, name, nbytes, (unsigned long long)(en - b));
    t->dtype = (td_dtype)dt;
    t->ndim = (int)nd;
    t->numel = numel;
    t->nbytes = nbytes;
    t->data = (const uint8_t *)(uintptr_t)b;   /* offset for now; rebased once all are checked */
    return 0;
}

static int cmp_by_offset(const void *a, const void *b)
{
    const td_tensor *x = *(const td_tensor *const *)a, *y = *(const td_tensor *const *)b;
    uintptr_t ox = (uintptr_t)x->data, oy = (uintptr_t)y->data;
    return ox < oy ? -1 : ox > oy;
}

int td_st_load_shard(td_checkpoint *ck, const char *path, td_error *err)
{
    td_shard sh = {0};
    if (td_mmap_open(&sh.map, path, err) != 0) return -1;
    const uint8_t *p = sh.map.data;
    size_t size = sh.map.size;
    json_t *hdr = NULL;
    if (size < 8) {
        td_fail(err, "%s: truncated: %zu bytes, a safetensors file starts with an 8-byte header length",
                path, size);
        goto fail;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | p[i];
    if (n > size - 8) {
        td_fail(err, "%s: header length %llu past end of file (%zu bytes; truncated or not safetensors)",
                path, (unsigned long long)n, size);
        goto fail;
    }
    if (n > TD_ST_MAX_HEADER) {
        td_fail(err, "%s: header length %llu is over the %zu-byte limit", path,
                (unsigned long long)n, TD_ST_MAX_HEADER);
        goto fail;
    }
    char what[4200];
    snprintf(what, sizeof what, "%s (safetensors header)", path);
    hdr = td_json_load_text((const char *)p + 8, (size_t)n, what, err);
    if (!hdr) goto fail;
    if (!json_is_object(hdr)) {
        td_fail(err, "%s: safetensors header is not a JSON object", path);
        goto fail;
    }
    size_t data_size = size - 8 - (size_t)n;
    const uint8_t *data = p + 8 + n;

    size_t first = ck->n_tensors, count = json_object_size(hdr);
    if (ck->n_tensors + count > ck->cap_tensors) {
        /* count is bounded by the header length, itself bounded by the file */
        size_t cap = ck->cap_tensors * 2 > ck->n_tensors + count ? ck->cap_tensors * 2 : ck->n_tensors + count;
        td_tensor *nt = realloc(ck->tensors, cap * sizeof *nt);
        if (!nt) { td_fail(err, "%s: out of memory for %zu tensor entries", path, cap); goto fail; }
        ck->tensors = nt;
        ck->cap_tensors = cap;
    }
    const char *key;
    json_t *val;
    json_object_foreach(hdr, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val) && !json_is_null(val)) {
                td_fail(err, "%s: \"__metadata__\" is not an object", path);
                goto fail_tensors;
            }
            if (json_is_object(val)) sh.meta = json_incref(val);
            continue;
        }
        td_tensor *t = &ck->tensors[ck->n_tensors];
        memset(t, 0, sizeof *t);
        if (parse_entry(path, key, val, data_size, t, err) != 0) goto fail_tensors;
        t->name = strdup(key);
        t->shard = ck->n_shards;
        ck->n_tensors++;
    }

    /* overlap check: sort this shard's entries by begin offset, each must start at or after the
     * previous one's end (empty tensors occupy nothing) */
    size_t m = ck->n_tensors - first;
    td_tensor **order = malloc((m ? m : 1) * sizeof *order);
    if (!order) { td_fail(err, "%s: out of memory", path); goto fail_tensors; }
    for (size_t i = 0; i < m; i++) order[i] = &ck->tensors[first + i];
    qsort(order, m, sizeof *order, cmp_by_offset);
    for (size_t i = 1; i < m; i++) {
        uintptr_t prev_end = (uintptr_t)order[i - 1]->data + order[i - 1]->nbytes;
        if (order[i]->nbytes && order[i - 1]->nbytes && (uintptr_t)order[i]->data < prev_end) {
            td_fail(err, "%s: tensors '%s' and '%s' overlap in the data area (offsets %llu..%llu and %llu..)",
                    path, order[i - 1]->name, order[i]->name,
                    (unsigned long long)(uintptr_t)order[i - 1]->data, (unsigned long long)prev_end,
                    (unsigned long long)(uintptr_t)order[i]->data);
            free(order);
            goto fail_tensors;
        }
    }
    free(order);
    for (size_t i = first; i < ck->n_tensors; i++)
        ck->tensors[i].data = data + (uintptr_t)ck->tensors[i].data;

    json_decref(hdr);
    td_shard *ns = realloc(ck->shards, (size_t)(ck->n_shards + 1) * sizeof *ns);
    if (!ns) { td_fail(err, "%s: out of memory", path); hdr = NULL; goto fail_tensors; }
    ck->shards = ns;
    sh.path = strdup(path);
    ck->shards[ck->n_shards++] = sh;
    return 0;

fail_tensors:
    for (size_t i = first; i < ck->n_tensors; i++) free(ck->tensors[i].name);
    ck->n_tensors = first;
fail:
    if (hdr) json_decref(hdr);
    if (sh.meta) json_decref(sh.meta);
    td_mmap_close(&sh.map);
    return -1;
}
