/* Chat templates, part 3: what values do, with Python's semantics where Jinja defers to
 * Python (see chat_template_values.h). Strings are UTF-8; indexing, slicing and length count
 * code points, and whitespace (strip, split, trim) is Python's str.isspace set. */
#include "chat_template_values.h"
#include "tidal/common.h"

#include <limits.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void ct_str_put(ct_str *s, const char *p, size_t n)
{
    if (s->n + n + 1 > s->cap) {
        s->cap = 2 * (s->n + n + 1) + 64;
        s->p = td_xrealloc(s->p, s->cap);
    }
    if (n) memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = 0;
}

static void put_cstr(ct_str *s, const char *p) { ct_str_put(s, p, strlen(p)); }

static json_t *str_new(const char *p, size_t n) { return json_stringn_nocheck(n ? p : "", n); }

const char *ct_type_name(json_t *v)
{
    if (!v) return "undefined value";
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "dict";
    case JSON_ARRAY: return "list";
    case JSON_STRING: return "string";
    case JSON_INTEGER: return "integer";
    case JSON_REAL: return "float";
    case JSON_TRUE: case JSON_FALSE: return "boolean";
    default: return "none";
    }
}

bool ct_truthy(json_t *v)
{
    if (!v) return false;
    switch (json_typeof(v)) {
    case JSON_OBJECT: return json_object_size(v) > 0;
    case JSON_ARRAY: return json_array_size(v) > 0;
    case JSON_STRING: return json_string_length(v) > 0;
    case JSON_INTEGER: return json_integer_value(v) != 0;
    case JSON_REAL: return json_real_value(v) != 0.0;
    case JSON_TRUE: return true;
    default: return false;
    }
}

/* ---------------------------------------------------------------- UTF-8 and whitespace */
static uint32_t utf8_next(const char *s, size_t n, size_t *adv)
{
    const unsigned char *u = (const unsigned char *)s;
    int len = u[0] < 0x80 ? 1 : u[0] < 0xE0 ? 2 : u[0] < 0xF0 ? 3 : 4;
    if ((size_t)len > n) len = 1;
    uint32_t cp = len == 1 ? u[0] : len == 2 ? u[0] & 0x1F : len == 3 ? u[0] & 0x0F : u[0] & 0x07;
    for (int i = 1; i < len; i++) cp = cp << 6 | (u[i] & 0x3F);
    *adv = (size_t)len;
    return cp;
}

static size_t utf8_count(const char *s, size_t n)
{
    size_t c = 0;
    for (size_t i = 0; i < n; i++) c += ((unsigned char)s[i] & 0xC0) != 0x80;
    return c;
}

/* Byte offset of code point k (k <= count). */
static size_t utf8_offset(const char *s, size_t n, size_t k)
{
    size_t i = 0;
    while (k && i < n) {
        size_t adv;
        utf8_next(s + i, n - i, &adv);
        i += adv;
        k--;
    }
    return i;
}

/* Python's str.isspace. */
static bool py_space(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static bool in_chars(uint32_t c, const char *chars, size_t nc)
{
    for (size_t i = 0; i < nc;) {
        size_t adv;
        if (utf8_next(chars + i, nc - i, &adv) == c) return true;
        i += adv;
    }
    return false;
}

/* strip(chars) on [*a, *b): chars NULL = whitespace. */
static void strip_range(const char *s, size_t *a, size_t *b, bool left, bool right, const char *chars, size_t nc)
{
    while (left && *a < *b) {
        size_t adv;
        uint32_t c = utf8_next(s + *a, *b - *a, &adv);
        if (chars ? !in_chars(c, chars, nc) : !py_space(c)) break;
        *a += adv;
    }
    while (right && *b > *a) {
        size_t k = *b - 1;
        while (k > *a && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
        size_t adv;
        uint32_t c = utf8_next(s + k, *b - k, &adv);
        if (chars ? !in_chars(c, chars, nc) : !py_space(c)) break;
        *b = k;
    }
}

/* ---------------------------------------------------------------- str() and tojson */
static void put_real(ct_str *s, double x)
{
    char buf[40];
    if (isnan(x)) { put_cstr(s, "nan"); return; }
    if (isinf(x)) { put_cstr(s, x > 0 ? "inf" : "-inf"); return; }
    for (int p = 1; p <= 17; p++) {                     /* shortest text that reads back (repr) */
        snprintf(buf, sizeof buf, "%.*g", p, x);
        if (strtod(buf, NULL) == x) break;
    }
    char *e = strchr(buf, 'e');
    if (e) {                                            /* Python writes 1e-05 as 1e-05, 1e+16 */
        put_cstr(s, buf);
        return;
    }
    put_cstr(s, buf);
    if (!strchr(buf, '.')) put_cstr(s, ".0");
}

static void put_repr_str(ct_str *s, const char *p, size_t n)
{
    bool sq = memchr(p, '\'', n) != NULL, dq = memchr(p, '"', n) != NULL;
    char q = sq && !dq ? '"' : '\'';
    ct_str_put(s, &q, 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char buf[8];
        if (c == '\\' || c == (unsigned char)q) { buf[0] = '\\'; buf[1] = (char)c; ct_str_put(s, buf, 2); }
        else if (c == '\n') put_cstr(s, "\\n");
        else if (c == '\r') put_cstr(s, "\\r");
        else if (c == '\t') put_cstr(s, "\\t");
        else if (c < 0x20 || c == 0x7F) { snprintf(buf, sizeof buf, "\\x%02x", c); put_cstr(s, buf); }
        else ct_str_put(s, p + i, 1);
    }
    ct_str_put(s, &q, 1);
}

static void put_repr(ct_str *s, json_t *v)
{
    if (json_is_string(v)) put_repr_str(s, json_string_value(v), json_string_length(v));
    else ct_to_str(s, v);
}

void ct_to_str(ct_str *s, json_t *v)
{
    char buf[32];
    if (!v) return;
    switch (json_typeof(v)) {
    case JSON_STRING: ct_str_put(s, json_string_value(v), json_string_length(v)); return;
    case JSON_INTEGER: snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v)); put_cstr(s, buf); return;
    case JSON_REAL: put_real(s, json_real_value(v)); return;
    case JSON_TRUE: put_cstr(s, "True"); return;
    case JSON_FALSE: put_cstr(s, "False"); return;
    case JSON_NULL: put_cstr(s, "None"); return;
    case JSON_ARRAY:
        put_cstr(s, "[");
        for (size_t i = 0; i < json_array_size(v); i++) {
            if (i) put_cstr(s, ", ");
            put_repr(s, json_array_get(v, i));
        }
        put_cstr(s, "]");
        return;
    case JSON_OBJECT: {
        put_cstr(s, "{");
        const char *k;
        json_t *x;
        size_t i = 0;
        json_object_foreach(v, k, x) {
            if (i++) put_cstr(s, ", ");
            put_repr_str(s, k, strlen(k));
            put_cstr(s, ": ");
            put_repr(s, x);
        }
        put_cstr(s, "}");
        return;
    }
    }
}

static void json_str(ct_str *s, const char *p, size_t n)
{
    put_cstr(s, "\"");
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        char buf[8];
        switch (c) {
        case '"': put_cstr(s, "\\\""); break;
        case '\\': put_cstr(s, "\\\\"); break;
        case '\n': put_cstr(s, "\\n"); break;
        case '\r': put_cstr(s, "\\r"); break;
        case '\t': put_cstr(s, "\\t"); break;
        case '\b': put_cstr(s, "\\b"); break;
        case '\f': put_cstr(s, "\\f"); break;
        default:
            if (c < 0x20) { snprintf(buf, sizeof buf, "\\u%04x", c); put_cstr(s, buf); }
            else ct_str_put(s, p + i, 1);
        }
    }
    put_cstr(s, "\"");
}

static void newline_indent(ct_str *s, int indent, int depth)
{
    put_cstr(s, "\n");
    for (int i = 0; i < indent * depth; i++) put_cstr(s, " ");
}

int ct_tojson(ct_str *s, json_t *v, int indent, int depth)
{
    char buf[32];
    if (depth > 200) return -1;
    switch (json_typeof(v)) {
    case JSON_STRING: json_str(s, json_string_value(v), json_string_length(v)); return 0;
    case JSON_INTEGER: snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v)); put_cstr(s, buf); return 0;
    case JSON_REAL: {
        double x = json_real_value(v);
        if (isnan(x)) put_cstr(s, "NaN");
        else if (isinf(x)) put_cstr(s, x > 0 ? "Infinity" : "-Infinity");
        else put_real(s, x);
        return 0;
    }
    case JSON_TRUE: put_cstr(s, "true"); return 0;
    case JSON_FALSE: put_cstr(s, "false"); return 0;
    case JSON_NULL: put_cstr(s, "null"); return 0;
    case JSON_ARRAY: case JSON_OBJECT: {
        bool obj = json_is_object(v);
        size_t n = obj ? json_object_size(v) : json_array_size(v);
        put_cstr(s, obj ? "{" : "[");
        if (n == 0) { put_cstr(s, obj ? "}" : "]"); return 0; }
        size_t i = 0;
        const char *k;
        json_t *x;
        void *iter = obj ? json_object_iter(v) : NULL;
        for (i = 0; i < n; i++) {
            if (i) put_cstr(s, indent >= 0 ? "," : ", ");
            if (indent >= 0) newline_indent(s, indent, depth + 1);
            if (obj) {
                k = json_object_iter_key(iter);
                x = json_object_iter_value(iter);
                iter = json_object_iter_next(v, iter);
                json_str(s, k, strlen(k));
                put_cstr(s, ": ");
            } else {
                x = json_array_get(v, i);
            }
            if (ct_tojson(s, x, indent, depth + 1)) return -1;
        }
        if (indent >= 0) newline_indent(s, indent, depth);
        put_cstr(s, obj ? "}" : "]");
        return 0;
    }
    }
    return -1;
}

/* ---------------------------------------------------------------- access */
json_t *ct_getattr(json_t *obj, const char *name)
{
    json_t *v = json_is_object(obj) ? json_object_get(obj, name) : NULL;
    return v ? json_incref(v) : NULL;
}

json_t *ct_getitem(json_t *obj, json_t *key)
{
    if (json_is_object(obj)) return json_is_string(key) ? ct_getattr(obj, json_string_value(key)) : NULL;
    if (!json_is_integer(key)) return NULL;
    long long i = json_integer_value(key);
    if (json_is_array(obj)) {
        long long n = (long long)json_array_size(obj);
        if (i < 0) i += n;
        json_t *v = i >= 0 && i < n ? json_array_get(obj, (size_t)i) : NULL;
        return v ? json_incref(v) : NULL;
    }
    if (json_is_string(obj)) {
        const char *s = json_string_value(obj);
        size_t bn = json_string_length(obj);
        long long n = (long long)utf8_count(s, bn);
        if (i < 0) i += n;
        if (i < 0 || i >= n) return NULL;
        size_t a = utf8_offset(s, bn, (size_t)i), adv;
        utf8_next(s + a, bn - a, &adv);
        return str_new(s + a, adv);
    }
    return NULL;
}

/* Python's slice.indices. */
static void slice_indices(long long n, json_t *lo, json_t *hi, long long step, long long *a, long long *b)
{
    bool up = step > 0;
    if (!lo || json_is_null(lo)) *a = up ? 0 : n - 1;
    else {
        *a = json_integer_value(lo);
        if (*a < 0) { *a += n; if (*a < 0) *a = up ? 0 : -1; }
        else if (*a >= n) *a = up ? n : n - 1;
    }
    if (!hi || json_is_null(hi)) *b = up ? n : -1;
    else {
        *b = json_integer_value(hi);
        if (*b < 0) { *b += n; if (*b < 0) *b = up ? 0 : -1; }
        else if (*b >= n) *b = up ? n : n - 1;
    }
}

int ct_slice(json_t *obj, json_t *lo, json_t *hi, json_t *step_v, json_t **out)
{
    long long step = step_v && json_is_integer(step_v) ? json_integer_value(step_v) : 1;
    if (step == 0) return -1;
    bool str = json_is_string(obj);
    if (!str && !json_is_array(obj)) return -1;
    const char *s = str ? json_string_value(obj) : NULL;
    size_t bn = str ? json_string_length(obj) : 0;
    long long n = str ? (long long)utf8_count(s, bn) : (long long)json_array_size(obj), a, b;
    slice_indices(n, lo, hi, step, &a, &b);
    json_t *arr = str ? NULL : json_array();
    ct_str acc = {0};
    for (long long i = a; step > 0 ? i < b : i > b; i += step) {
        if (str) {
            size_t o = utf8_offset(s, bn, (size_t)i), adv;
            utf8_next(s + o, bn - o, &adv);
            ct_str_put(&acc, s + o, adv);
        } else {
            json_array_append(arr, json_array_get(obj, (size_t)i));
        }
    }
    *out = str ? str_new(acc.p, acc.n) : arr;
    free(acc.p);
    return 0;
}

json_t *ct_dict_view(json_t *obj, char which)
{
    json_t *r = json_array();
    const char *k;
    json_t *v;
    json_object_foreach(obj, k, v) {
        if (which == 'k') json_array_append_new(r, json_string_nocheck(k));
        else if (which == 'v') json_array_append(r, v);
        else json_array_append_new(r, json_pack("[sO]", k, v));
    }
    return r;
}

json_t *ct_iterable(json_t *v)
{
    if (json_is_array(v)) return json_incref(v);
    if (json_is_object(v)) return ct_dict_view(v, 'k');
    if (json_is_string(v)) {
        json_t *r = json_array();
        const char *s = json_string_value(v);
        size_t n = json_string_length(v);
        for (size_t i = 0, adv; i < n; i += adv) {
            utf8_next(s + i, n - i, &adv);
            json_array_append_new(r, str_new(s + i, adv));
        }
        return r;
    }
    return NULL;
}

json_t *ct_loop_object(size_t i, size_t len, json_t *items)
{
    json_t *l = json_pack("{sIsIsIsIsbsbsI}", "index0", (json_int_t)i, "index", (json_int_t)i + 1,
                          "revindex", (json_int_t)(len - i), "revindex0", (json_int_t)(len - i - 1),
                          "first", i == 0, "last", i + 1 == len, "length", (json_int_t)len);
    if (i > 0) json_object_set(l, "previtem", json_array_get(items, i - 1));
    if (i + 1 < len) json_object_set(l, "nextitem", json_array_get(items, i + 1));
    return l;
}

int ct_bind_targets(json_t *vars, const char *const *targets, size_t n, json_t *item)
{
    if (n == 1) return json_object_set(vars, targets[0], item);
    if (!json_is_array(item) || json_array_size(item) != n) return -1;
    for (size_t k = 0; k < n; k++) json_object_set(vars, targets[k], json_array_get(item, k));
    return 0;
}

/* ---------------------------------------------------------------- operators */
static bool py_equal(json_t *a, json_t *b)
{
    if (!a || !b) return !a && !b;
    bool na = json_is_number(a) || json_is_boolean(a), nb = json_is_number(b) || json_is_boolean(b);
    if (na && nb) {
        double x = json_is_boolean(a) ? json_is_true(a) : json_number_value(a);
        double y = json_is_boolean(b) ? json_is_true(b) : json_number_value(b);
        if (json_is_integer(a) && json_is_integer(b)) return json_integer_value(a) == json_integer_value(b);
        return x == y;
    }
    if (json_typeof(a) != json_typeof(b)) return false;
    if (json_is_array(a)) {
        if (json_array_size(a) != json_array_size(b)) return false;
        for (size_t i = 0; i < json_array_size(a); i++)
            if (!py_equal(json_array_get(a, i), json_array_get(b, i))) return false;
        return true;
    }
    if (json_is_object(a)) {
        if (json_object_size(a) != json_object_size(b)) return false;
        const char *k;
        json_t *v;
        json_object_foreach(a, k, v) if (!py_equal(v, json_object_get(b, k))) return false;
        return true;
    }
    return json_equal(a, b);
}

static int py_contains(json_t *hay, json_t *needle, bool *r)
{
    if (json_is_string(hay)) {
        if (!json_is_string(needle)) return -1;
        *r = memmem(json_string_value(hay), json_string_length(hay), json_string_value(needle), json_string_length(needle)) != NULL;
        return 0;
    }
    if (json_is_array(hay)) {
        *r = false;
        for (size_t i = 0; i < json_array_size(hay) && !*r; i++) *r = py_equal(json_array_get(hay, i), needle);
        return 0;
    }
    if (json_is_object(hay)) {
        *r = json_is_string(needle) && json_object_get(hay, json_string_value(needle));
        return 0;
    }
    return -1;
}

static int str_cmp(json_t *a, json_t *b)
{
    size_t na = json_string_length(a), nb = json_string_length(b);
    int c = memcmp(json_string_value(a), json_string_value(b), na < nb ? na : nb);   /* UTF-8 order = code points */
    return c ? c : (na > nb) - (na < nb);
}

int ct_binary(const char *op, json_t *a, json_t *b, json_t **out)
{
    *out = NULL;
    if (!strcmp(op, "==") || !strcmp(op, "!=")) { *out = json_boolean(py_equal(a, b) == (op[0] == '=')); return 0; }
    if (!strcmp(op, "in") || !strcmp(op, "not in")) {
        bool r;
        if (!b || py_contains(b, a, &r)) return -1;
        *out = json_boolean(r == (op[0] == 'i'));
        return 0;
    }
    if (!strcmp(op, "~")) {
        ct_str s = {0};
        ct_to_str(&s, a);
        ct_to_str(&s, b);
        *out = str_new(s.p, s.n);
        free(s.p);
        return 0;
    }
    if (!a || !b) return -1;
    bool num = (json_is_number(a) || json_is_boolean(a)) && (json_is_number(b) || json_is_boolean(b));
    bool ints = (json_is_integer(a) || json_is_boolean(a)) && (json_is_integer(b) || json_is_boolean(b));
    double x = json_is_boolean(a) ? json_is_true(a) : json_number_value(a);
    double y = json_is_boolean(b) ? json_is_true(b) : json_number_value(b);
    long long i = json_is_boolean(a) ? json_is_true(a) : json_integer_value(a);
    long long j = json_is_boolean(b) ? json_is_true(b) : json_integer_value(b);
    if (op[0] == '<' || op[0] == '>') {
        int c;
        if (num) c = (x > y) - (x < y);
        else if (json_is_string(a) && json_is_string(b)) c = str_cmp(a, b);
        else return -1;
        bool r = op[0] == '<' ? (op[1] ? c <= 0 : c < 0) : (op[1] ? c >= 0 : c > 0);
        *out = json_boolean(r);
        return 0;
    }
    if (!strcmp(op, "+")) {
        if (json_is_string(a) && json_is_string(b)) {
            ct_str s = {0};
            ct_str_put(&s, json_string_value(a), json_string_length(a));
            ct_str_put(&s, json_string_value(b), json_string_length(b));
            *out = str_new(s.p, s.n);
            free(s.p);
            return 0;
        }
        if (json_is_array(a) && json_is_array(b)) {
            *out = json_copy(a);
            json_array_extend(*out, b);
            return 0;
        }
        if (!num) return -1;
        long long sum;
        if (ints && __builtin_add_overflow(i, j, &sum)) return -4;
        *out = ints ? json_integer(sum) : json_real(x + y);
        return 0;
    }
    if (!strcmp(op, "*") && json_is_string(a) && json_is_integer(b)) {
        ct_str s = {0};
        ct_str_put(&s, "", 0);
        if (j > 0 && json_string_length(a) * (unsigned long long)j > (1u << 24)) { free(s.p); return -4; }
        for (long long k = 0; k < j; k++) ct_str_put(&s, json_string_value(a), json_string_length(a));
        *out = str_new(s.p, s.n);
        free(s.p);
        return 0;
    }
    if (!num) return -1;
    long long r;
    if (!strcmp(op, "-")) {
        if (ints && __builtin_sub_overflow(i, j, &r)) return -4;
        *out = ints ? json_integer(r) : json_real(x - y);
        return 0;
    }
    if (!strcmp(op, "*")) {
        if (ints && __builtin_mul_overflow(i, j, &r)) return -4;
        *out = ints ? json_integer(r) : json_real(x * y);
        return 0;
    }
    if (!strcmp(op, "**")) {
        double p = pow(x, y);
        if (ints && j >= 0 && !(fabs(p) < 9.2e18)) return -4;
        *out = ints && j >= 0 ? json_integer((long long)llround(p)) : json_real(p);
        return 0;
    }
    if (y == 0) return -3;
    if (!strcmp(op, "/")) { *out = json_real(x / y); return 0; }
    if (!strcmp(op, "//")) {
        if (ints && i == LLONG_MIN && j == -1) return -4;
        if (ints) { long long q = i / j; if ((i % j != 0) && ((i < 0) != (j < 0))) q--; *out = json_integer(q); }
        else *out = json_real(floor(x / y));
        return 0;
    }
    if (!strcmp(op, "%")) {
        if (ints && j == -1) { *out = json_integer(0); return 0; }
        if (ints) { r = i % j; if (r && ((r < 0) != (j < 0))) r += j; *out = json_integer(r); }
        else { double m = fmod(x, y); if (m != 0 && ((m < 0) != (y < 0))) m += y; *out = json_real(m); }
        return 0;
    }
    return -1;
}

/* ---------------------------------------------------------------- string methods */
static bool opt_str(json_t **args, size_t n, size_t k, const char **s, size_t *len)
{
    *s = NULL;
    *len = 0;
    if (n <= k || json_is_null(args[k])) return true;
    if (!json_is_string(args[k])) return false;
    *s = json_string_value(args[k]);
    *len = json_string_length(args[k]);
    return true;
}

static int split(const char *s, size_t n, const char *sep, size_t ns, long long maxsplit, json_t **out)
{
    json_t *r = json_array();
    if (sep) {
        if (!ns) { json_decref(r); return -1; }
        size_t a = 0;
        for (long long k = 0; maxsplit < 0 || k < maxsplit; k++) {
            const char *hit = memmem(s + a, n - a, sep, ns);
            if (!hit) break;
            json_array_append_new(r, str_new(s + a, (size_t)(hit - (s + a))));
            a = (size_t)(hit - s) + ns;
        }
        json_array_append_new(r, str_new(s + a, n - a));
    } else {                                              /* runs of whitespace, ends ignored */
        size_t i = 0;
        long long k = 0;
        for (;;) {
            size_t a = i, b = n;
            strip_range(s, &a, &b, true, false, NULL, 0);
            i = a;
            if (i >= n) break;
            if (maxsplit >= 0 && k == maxsplit) {
                size_t e = n;
                strip_range(s, &i, &e, false, true, NULL, 0);
                json_array_append_new(r, str_new(s + i, e - i));
                break;
            }
            size_t j = i, adv;
            while (j < n && !py_space(utf8_next(s + j, n - j, &adv))) j += adv;
            json_array_append_new(r, str_new(s + i, j - i));
            k++;
            i = j;
        }
    }
    *out = r;
    return 0;
}

int ct_str_method(json_t *self, const char *m, json_t **args, size_t n, json_t **out)
{
    const char *s = json_string_value(self);
    size_t len = json_string_length(self);
    const char *x;
    size_t nx;
    if (!strcmp(m, "startswith") || !strcmp(m, "endswith")) {
        if (n != 1) return -1;
        json_t *list = json_is_array(args[0]) ? args[0] : NULL;
        bool r = false;
        for (size_t k = 0; k < (list ? json_array_size(list) : 1) && !r; k++) {
            json_t *p = list ? json_array_get(list, k) : args[0];
            if (!json_is_string(p)) return -1;
            x = json_string_value(p);
            nx = json_string_length(p);
            r = nx <= len && memcmp(m[0] == 's' ? s : s + len - nx, x, nx) == 0;
        }
        *out = json_boolean(r);
        return 0;
    }
    if (!strcmp(m, "strip") || !strcmp(m, "lstrip") || !strcmp(m, "rstrip")) {
        if (n > 1 || !opt_str(args, n, 0, &x, &nx)) return -1;
        size_t a = 0, b = len;
        strip_range(s, &a, &b, m[0] != 'r', m[0] != 'l', x, nx);
        *out = str_new(s + a, b - a);
        return 0;
    }
    if (!strcmp(m, "split")) {
        if (n > 2 || !opt_str(args, n, 0, &x, &nx) || (n == 2 && !json_is_integer(args[1]))) return -1;
        return split(s, len, x, nx, n == 2 ? json_integer_value(args[1]) : -1, out);
    }
    if (!strcmp(m, "lower") || !strcmp(m, "upper")) {
        if (n) return -1;
        char *c = td_xmalloc(len + 1);
        for (size_t i = 0; i < len; i++) {
            char ch = s[i];
            c[i] = m[0] == 'l' ? (ch >= 'A' && ch <= 'Z' ? ch + 32 : ch) : (ch >= 'a' && ch <= 'z' ? ch - 32 : ch);
        }
        *out = str_new(c, len);
        free(c);
        return 0;
    }
    if (!strcmp(m, "replace")) {
        if (n < 2 || n > 3 || !json_is_string(args[0]) || !json_is_string(args[1]) || (n == 3 && !json_is_integer(args[2]))) return -1;
        const char *old = json_string_value(args[0]), *nw = json_string_value(args[1]);
        size_t no = json_string_length(args[0]), nn = json_string_length(args[1]);
        long long count = n == 3 ? json_integer_value(args[2]) : -1;
        ct_str r = {0};
        ct_str_put(&r, "", 0);
        size_t i = 0;
        for (long long k = 0; i <= len && (count < 0 || k < count); k++) {
            const char *hit = no ? memmem(s + i, len - i, old, no) : (i <= len ? s + i : NULL);
            if (!hit) break;
            ct_str_put(&r, s + i, (size_t)(hit - (s + i)));
            ct_str_put(&r, nw, nn);
            size_t at = (size_t)(hit - s);
            if (!no) {                                  /* "" matches between every character */
                if (at >= len) { i = len + 1; break; }
                size_t adv;
                utf8_next(s + at, len - at, &adv);
                ct_str_put(&r, s + at, adv);
                i = at + adv;
            } else {
                i = at + no;
            }
        }
        if (i <= len) ct_str_put(&r, s + i, len - i);
        *out = str_new(r.p, r.n);
        free(r.p);
        return 0;
    }
    if (!strcmp(m, "find")) {
        if (n != 1 || !json_is_string(args[0])) return -1;
        const char *hit = memmem(s, len, json_string_value(args[0]), json_string_length(args[0]));
        *out = json_integer(hit ? (json_int_t)utf8_count(s, (size_t)(hit - s)) : -1);
        return 0;
    }
    return -2;
}

/* ---------------------------------------------------------------- filters and tests */
int ct_test(const char *t, json_t *v, json_t *arg)
{
    if (!strcmp(t, "defined")) return v != NULL;
    if (!strcmp(t, "undefined")) return v == NULL;
    if (!strcmp(t, "none")) return v && json_is_null(v);
    if (!strcmp(t, "string")) return json_is_string(v);
    if (!strcmp(t, "number")) return json_is_number(v);
    if (!strcmp(t, "integer")) return json_is_integer(v);
    if (!strcmp(t, "float")) return json_is_real(v);
    if (!strcmp(t, "boolean")) return json_is_boolean(v);
    if (!strcmp(t, "true")) return json_is_true(v);
    if (!strcmp(t, "false")) return json_is_false(v);
    if (!strcmp(t, "mapping")) return json_is_object(v);
    if (!strcmp(t, "iterable")) return json_is_array(v) || json_is_object(v) || json_is_string(v);
    if (!strcmp(t, "sequence")) return json_is_array(v) || json_is_object(v) || json_is_string(v);
    if (!strcmp(t, "equalto") || !strcmp(t, "eq") || !strcmp(t, "==")) return py_equal(v, arg);
    if (!strcmp(t, "ne") || !strcmp(t, "!=")) return !py_equal(v, arg);
    if (!strcmp(t, "sameas")) return (v && arg && json_typeof(v) == json_typeof(arg) && (json_is_null(v) || json_is_boolean(v))) ? 1 : v == arg;
    if (!strcmp(t, "odd") || !strcmp(t, "even")) return json_is_integer(v) && (json_integer_value(v) % 2 != 0) == (t[0] == 'o');
    if (!strcmp(t, "in")) { bool r = false; return arg && py_contains(arg, v, &r) == 0 && r; }
    return -1;
}

static json_t *select_items(json_t *v, json_t **args, size_t n, bool keep, json_t *attr_name)
{
    json_t *items = ct_iterable(v);
    if (!items) return NULL;
    json_t *r = json_array();
    const char *test = n && json_is_string(args[0]) ? json_string_value(args[0]) : NULL;
    for (size_t i = 0; i < json_array_size(items); i++) {
        json_t *x = json_array_get(items, i), *subject = x;
        if (attr_name) subject = ct_getattr(x, json_string_value(attr_name));
        int t = test ? ct_test(test, attr_name ? subject : x, n > 1 ? args[1] : NULL) : ct_truthy(subject);
        if (attr_name) json_decref(subject);
        if (t < 0) { json_decref(items); json_decref(r); return NULL; }
        if ((t == 1) == keep) json_array_append(r, x);
    }
    json_decref(items);
    return r;
}

int ct_filter(const char *f, json_t *v, json_t **args, size_t n, json_t *attr, json_t **out)
{
    *out = NULL;
    if (!strcmp(f, "trim")) {
        if (!json_is_string(v) || n > 1) return -1;
        return ct_str_method(v, "strip", args, n, out);
    }
    if (!strcmp(f, "lower") || !strcmp(f, "upper")) return json_is_string(v) && !n ? ct_str_method(v, f, args, 0, out) : -1;
    if (!strcmp(f, "replace")) return json_is_string(v) ? ct_str_method(v, f, args, n, out) : -1;
    if (!strcmp(f, "capitalize")) {
        if (!json_is_string(v)) return -1;
        json_t *low;
        ct_str_method(v, "lower", NULL, 0, &low);
        size_t n_low = json_string_length(low);
        char *c = td_xmalloc(n_low + 1);
        memcpy(c, json_string_value(low), n_low + 1);
        if (c[0] >= 'a' && c[0] <= 'z') c[0] -= 32;
        *out = str_new(c, n_low);
        free(c);
        json_decref(low);
        return 0;
    }
    if (!strcmp(f, "length") || !strcmp(f, "count")) {
        if (json_is_string(v)) *out = json_integer((json_int_t)utf8_count(json_string_value(v), json_string_length(v)));
        else if (json_is_array(v)) *out = json_integer((json_int_t)json_array_size(v));
        else if (json_is_object(v)) *out = json_integer((json_int_t)json_object_size(v));
        else return -1;
        return 0;
    }
    if (!strcmp(f, "items")) { if (!json_is_object(v)) return -1; *out = ct_dict_view(v, 'i'); return 0; }
    if (!strcmp(f, "list")) { *out = ct_iterable(v); return *out ? 0 : -1; }
    if (!strcmp(f, "first") || !strcmp(f, "last")) {
        json_t *items = ct_iterable(v);
        if (!items) return -1;
        size_t k = json_array_size(items);
        json_t *x = k ? json_array_get(items, f[0] == 'f' ? 0 : k - 1) : NULL;
        *out = x ? json_incref(x) : NULL;
        json_decref(items);
        return 0;
    }
    if (!strcmp(f, "join")) {
        json_t *items = ct_iterable(v);
        if (!items || (n && !json_is_string(args[0]))) { json_decref(items); return -1; }
        ct_str s = {0};
        ct_str_put(&s, "", 0);
        for (size_t i = 0; i < json_array_size(items); i++) {
            if (i && n) ct_str_put(&s, json_string_value(args[0]), json_string_length(args[0]));
            ct_to_str(&s, json_array_get(items, i));
        }
        *out = str_new(s.p, s.n);
        free(s.p);
        json_decref(items);
        return 0;
    }
    if (!strcmp(f, "select") || !strcmp(f, "reject")) {
        *out = select_items(v, args, n, f[0] == 's', NULL);
        return *out ? 0 : -1;
    }
    if (!strcmp(f, "selectattr") || !strcmp(f, "rejectattr")) {
        if (!n || !json_is_string(args[0])) return -1;
        *out = select_items(v, args + 1, n - 1, f[0] == 's', args[0]);
        return *out ? 0 : -1;
    }
    if (!strcmp(f, "map")) {
        json_t *items = ct_iterable(v);
        if (!items || !json_is_string(attr)) { json_decref(items); return -1; }
        json_t *r = json_array();
        for (size_t i = 0; i < json_array_size(items); i++) {
            json_t *x = ct_getattr(json_array_get(items, i), json_string_value(attr));
            json_array_append_new(r, x ? x : json_null());
        }
        json_decref(items);
        *out = r;
        return 0;
    }
    if (!strcmp(f, "int")) {
        if (json_is_integer(v)) *out = json_incref(v);
        else if (json_is_real(v) && fabs(json_real_value(v)) < 9.2e18) *out = json_integer((json_int_t)json_real_value(v));
        else if (json_is_real(v)) return -1;
        else if (json_is_string(v)) *out = json_integer(strtoll(json_string_value(v), NULL, 10));
        else *out = json_integer(0);
        return 0;
    }
    if (!strcmp(f, "float")) {
        *out = json_real(json_is_number(v) ? json_number_value(v) : json_is_string(v) ? strtod(json_string_value(v), NULL) : 0.0);
        return 0;
    }
    if (!strcmp(f, "abs")) {
        if (json_is_integer(v) && json_integer_value(v) == LLONG_MIN) return -1;
        if (json_is_integer(v)) *out = json_integer(llabs(json_integer_value(v)));
        else if (json_is_real(v)) *out = json_real(fabs(json_real_value(v)));
        else return -1;
        return 0;
    }
    return -2;
}
