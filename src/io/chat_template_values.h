/* Chat templates, part 3: the values' Python semantics (internal; see chat_template_values.c).
 * Values are jansson values, NULL = Jinja's Undefined. Functions returning json_t* return new
 * references. */
#ifndef TIDAL_CHAT_TEMPLATE_VALUES_H
#define TIDAL_CHAT_TEMPLATE_VALUES_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct {
    char *p;
    size_t n, cap;
} ct_str;

void ct_str_put(ct_str *s, const char *p, size_t n);

const char *ct_type_name(json_t *v);
bool ct_truthy(json_t *v);
/* Python str(v) appended to s ("" for Undefined, None, True, 1.5, ['a', 1], {'k': 'v'}). */
void ct_to_str(ct_str *s, json_t *v);
/* Python json.dumps(v, ensure_ascii=False, indent=indent or None) appended to s. */
int ct_tojson(ct_str *s, json_t *v, int indent, int depth);

json_t *ct_getattr(json_t *obj, const char *name);        /* dict key; Undefined if none */
json_t *ct_getitem(json_t *obj, json_t *key);             /* list[int], dict[str], str[int] */
int ct_slice(json_t *obj, json_t *lo, json_t *hi, json_t *step, json_t **out);
json_t *ct_iterable(json_t *v);                           /* items as an array; NULL if none */
json_t *ct_dict_view(json_t *obj, char which);            /* 'i'tems, 'k'eys, 'v'alues */
json_t *ct_loop_object(size_t i, size_t len, json_t *items);
int ct_bind_targets(json_t *vars, const char *const *targets, size_t n, json_t *item);

/* 0 ok; -1 the operation does not apply to these values; -3 division by zero; -4 the result
 * is past 64-bit integers (or 16 MiB of text). */
int ct_binary(const char *op, json_t *a, json_t *b, json_t **out);
/* 0 ok; -1 bad arguments; -2 unknown method / filter. */
int ct_str_method(json_t *self, const char *m, json_t **args, size_t n, json_t **out);
int ct_filter(const char *f, json_t *v, json_t **args, size_t n, json_t *attr, json_t **out);
/* 1 true, 0 false, -1 unknown test. */
int ct_test(const char *name, json_t *v, json_t *arg);

#endif
