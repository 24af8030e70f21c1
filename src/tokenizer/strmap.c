/* Growable buffers and the string → id hash map behind vocabularies and added tokens. */
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void *tk_xrealloc_at(void *p, size_t size, const char *file, int line)
{
    void *q = realloc(p, size ? size : 1);
    if (!q) {
        fprintf(stderr, "tidal: out of memory growing a buffer to %zu bytes at %s:%d\n", size, file, line);
        exit(2);
    }
    return q;
}

void tk_buf_put(tk_buf *b, const void *s, size_t n)
{
    if (b->n + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n + 1) cap *= 2;
        b->p = tk_xrealloc(b->p, cap);
        b->cap = cap;
    }
    if (n) memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = 0;
}

void tk_ids_put(tk_ids *v, int32_t id)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 64;
        v->p = tk_xrealloc(v->p, cap * sizeof *v->p);
        v->cap = cap;
    }
    v->p[v->n++] = id;
}

/* 64-bit FNV-1a over 8-byte words then a final mix: short keys (most tokens are 1-8 bytes)
 * cost one or two multiply rounds. */
uint64_t tk_hash(const void *s, size_t n)
{
    const uint8_t *p = s;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xff51afd7ed558ccdull);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        h ^= h >> 29;
        p += 8; n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, p, n);
    h = (h ^ w) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 32;
    h *= 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static void strmap_grow(tk_strmap *m)
{
    size_t cap = m->cap ? 2 * m->cap : 64;
    tk_entry *e = td_xcalloc(cap, sizeof *e);
    for (size_t i = 0; i < m->cap; i++) {
        if (!m->e[i].key) continue;
        size_t j = tk_hash(m->e[i].key, m->e[i].len) & (cap - 1);
        while (e[j].key) j = (j + 1) & (cap - 1);
        e[j] = m->e[i];
    }
    free(m->e);
    m->e = e;
    m->cap = cap;
}

bool tk_strmap_put(tk_strmap *m, const char *key, size_t len, int32_t val)
{
    if (2 * (m->n + 1) > m->cap) strmap_grow(m);
    size_t j = tk_hash(key, len) & (m->cap - 1);
    while (m->e[j].key) {
        if (m->e[j].len == len && memcmp(m->e[j].key, key, len) == 0) return false;
        j = (j + 1) & (m->cap - 1);
    }
    char *k = td_xmalloc(len + 1);
    memcpy(k, key, len);
    k[len] = 0;
    m->e[j] = (tk_entry){k, (uint32_t)len, val};
    m->n++;
    return true;
}

int32_t tk_strmap_get(const tk_strmap *m, const char *key, size_t len)
{
    if (!m->cap) return -1;
    size_t j = tk_hash(key, len) & (m->cap - 1);
    while (m->e[j].key) {
        if (m->e[j].len == len && memcmp(m->e[j].key, key, len) == 0) return m->e[j].val;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

void tk_strmap_free(tk_strmap *m)
{
    for (size_t i = 0; i < m->cap; i++) free((void *)m->e[i].key);
    free(m->e);
    memset(m, 0, sizeof *m);
}
