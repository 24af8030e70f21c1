/* A resume refused for its settings names only the settings that differ, each with both values
 * (include/tidal/opts.h: td_settings_diff). */
#include "tidal/opts.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    char *buf;
    size_t cap, len;
    int n;
} out_buf;

static void put(out_buf *b, const char *fmt, ...)
{
    if (b->len >= b->cap) return;
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->buf + b->len, b->cap - b->len, fmt, ap);
    va_end(ap);
    if (k > 0) b->len = b->len + (size_t)k < b->cap ? b->len + (size_t)k : b->cap - 1;
}

static const td_setting_flag *lookup(const td_setting_flag *flags, const char *key)
{
    for (const td_setting_flag *f = flags; f && f->key; f++)
        if (!strcmp(f->key, key)) return f;
    return NULL;
}

/* A value as it is written on a command line: numbers in their shortest exact form. */
static void value_text(const json_t *v, const td_setting_flag *f, char *out, size_t n)
{
    long long i = -1;
    if (!v) { snprintf(out, n, "(not set)"); return; }
    if (json_is_boolean(v)) i = json_is_true(v);
    else if (json_is_integer(v)) i = json_integer_value(v);
    if (i >= 0 && f && f->choices) {   /* an index into "keep|drop" */
        const char *c = f->choices;
        for (long long k = 0; k < i && c; k++) c = strchr(c, '|') ? strchr(c, '|') + 1 : NULL;
        if (c) { snprintf(out, n, "%.*s", (int)strcspn(c, "|"), c); return; }
    }
    if (json_is_boolean(v)) snprintf(out, n, "%s", json_is_true(v) ? "true" : "false");
    else if (json_is_integer(v)) snprintf(out, n, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v)) {
        double d = json_real_value(v);
        for (int p = 6; p <= 17; p++) {
            snprintf(out, n, "%.*g", p, d);
            if (strtod(out, NULL) == d) break;
        }
    } else if (json_is_string(v)) snprintf(out, n, "%s", json_string_length(v) ? json_string_value(v) : "''");
    else if (json_is_null(v)) snprintf(out, n, "null");
    else {
        char *s = json_dumps(v, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENCODE_ANY);
        snprintf(out, n, "%s", s ? s : "?");
        free(s);
    }
}

/* the option a key stands for: the table's, else --key with '_' read as '-'; then the member
 * below it, if any ("--recipe-b (gemm.accum)") */
static void flag_text(const td_setting_flag *f, const char *top, const char *sub, char *out, size_t n)
{
    char dashed[128];
    snprintf(dashed, sizeof dashed, "--%s", top);
    for (char *c = dashed; *c; c++) if (*c == '_') *c = '-';
    const char *flag = f ? f->flag : dashed;
    if (sub) snprintf(out, n, "%s (%s)", flag, sub);
    else snprintf(out, n, "%s", flag);
}

static int equal_values(const json_t *a, const json_t *b)
{
    if (!a || !b) return a == b;
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal((json_t *)a, (json_t *)b);
}

static void compare(const json_t *run, const json_t *now, const char *top, const char *prefix,
                    const td_setting_flag *flags, const char *const *ignore, out_buf *b);

static void compare_key(const char *key, const json_t *a, const json_t *c, const char *top, const char *prefix,
                        const td_setting_flag *flags, const char *const *ignore, out_buf *b)
{
    char path[256];
    snprintf(path, sizeof path, "%s%s%s", prefix ? prefix : "", prefix ? "." : "", key);
    for (const char *const *i = ignore; i && *i; i++) if (!strcmp(*i, path)) return;
    if (equal_values(a, c)) return;
    const char *t = top ? top : key;   /* the top-level key the path is under */
    /* two named objects (recipes) of different names: the names say it */
    json_t *na = json_object_get(a, "name"), *nc = json_object_get(c, "name");
    if (json_is_object(a) && json_is_object(c) && !(json_is_string(na) && json_is_string(nc) && !json_equal(na, nc))) {
        compare(a, c, t, path, flags, ignore, b);
        return;
    }
    if (json_is_object(a) && json_is_object(c)) { a = na; c = nc; }
    /* the path's own entry ("sampling.top_p"), else the top key's with the path below it */
    const td_setting_flag *f = lookup(flags, path);
    const char *sub = !f && prefix ? path + strlen(t) + 1 : NULL;
    if (!f) f = lookup(flags, t);
    char fl[320], va[512], vc[512];
    flag_text(f, t, sub, fl, sizeof fl);
    value_text(a, sub ? NULL : f, va, sizeof va);   /* a choice list names the key itself only */
    value_text(c, sub ? NULL : f, vc, sizeof vc);
    put(b, "  %s: run has %s, command gives %s\n", fl, va, vc);
    b->n++;
}

static void compare(const json_t *run, const json_t *now, const char *top, const char *prefix,
                    const td_setting_flag *flags, const char *const *ignore, out_buf *b)
{
    const char *key;
    json_t *v;
    /* the run's keys in order, then the ones only this command has */
    json_object_foreach((json_t *)run, key, v) compare_key(key, v, json_object_get(now, key), top, prefix, flags, ignore, b);
    json_object_foreach((json_t *)now, key, v)
        if (!json_object_get(run, key)) compare_key(key, NULL, v, top, prefix, flags, ignore, b);
}

int td_settings_diff(const char *run, const char *now, const td_setting_flag *flags, const char *const *ignore,
                     char *buf, size_t cap)
{
    json_t *a = json_loads(run ? run : "", JSON_DECODE_ANY, NULL), *c = json_loads(now ? now : "", JSON_DECODE_ANY, NULL);
    int n = -1;
    if (cap) buf[0] = 0;
    if (json_is_object(a) && json_is_object(c)) {
        out_buf b = {buf, cap, 0, 0};
        compare(a, c, NULL, NULL, flags, ignore, &b);
        n = b.n;
        if (b.len && buf[b.len - 1] == '\n') buf[b.len - 1] = 0;   /* the caller ends the message */
    }
    json_decref(a);
    json_decref(c);
    return n;
}
