/* Chat templates, part 2: running the tree (see include/tidal/chat_template.h).
 *
 * Values are jansson values (strings, numbers, true/false/null, arrays, objects); NULL stands
 * for Jinja's Undefined. Every value an evaluation returns is a new reference. Semantics are
 * Python's where Jinja defers to Python: truthiness, ==, `in`, str() of values, str methods
 * (code-point indexing, Unicode whitespace for strip/split/trim). Scoping is Jinja's: a loop
 * body has its own scope per iteration, so `set` inside a loop does not leak out of it
 * (namespace() objects are how templates carry state out, and they work here). */
#include "tidal/chat_template.h"
#include "chat_template_internal.h"
#include "chat_template_values.h"

#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct td_chat_template {
    ct_arena arena;
    ct_body body;
};

typedef struct scope scope;
struct scope {
    json_t *vars;
    scope *parent;
};

enum { FLOW_NONE, FLOW_BREAK, FLOW_CONTINUE };

typedef struct {
    ct_str out;
    scope *sc;
    int flow;
    int failed;
    int depth;            /* expression evaluation depth (long operator chains nest) */
    td_error *err;
} ctx;

static int efail(ctx *C, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int efail(ctx *C, int line, const char *fmt, ...)
{
    if (!C->failed) {
        char msg[400];
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(msg, sizeof msg, fmt, ap);
        va_end(ap);
        td_fail(C->err, "chat template line %d: %s", line, msg);
    }
    C->failed = 1;
    return -1;
}

static json_t *lookup(ctx *C, const char *name)
{
    for (scope *s = C->sc; s; s = s->parent) {
        json_t *v = json_object_get(s->vars, name);
        if (v) return json_incref(v);
    }
    return NULL;
}

static bool is_function(const char *name)
{
    static const char *const fns[] = {"namespace", "raise_exception", "strftime_now", "range", "dict"};
    for (size_t i = 0; i < sizeof fns / sizeof fns[0]; i++) if (!strcmp(name, fns[i])) return true;
    return false;
}

static int eval(ctx *C, const ct_expr *e, json_t **out);

/* Evaluates e; an Undefined result is an error naming `what` it was needed for. */
static int eval_def(ctx *C, const ct_expr *e, json_t **out, const char *what)
{
    if (eval(C, e, out)) return -1;
    if (!*out) {
        char name[80] = "a value";
        if (e->kind == E_NAME) snprintf(name, sizeof name, "\"%s\"", e->name);
        else if (e->kind == E_ATTR) snprintf(name, sizeof name, "attribute \"%s\"", e->name);
        return efail(C, e->line, "%s is undefined (needed %s)", name, what);
    }
    return 0;
}

/* ---------------------------------------------------------------- calls */
static json_t *kwarg(ctx *C, const ct_expr *e, const char *name, int *rc)
{
    for (size_t i = 0; i < e->n_kw; i++)
        if (!strcmp(e->kw_names[i], name)) {
            json_t *v;
            if (eval(C, e->kw_vals[i], &v)) { *rc = -1; return NULL; }
            return v;
        }
    return NULL;
}

/* Positional arguments evaluated into args (new references); n must equal e->n_args. */
static int eval_args(ctx *C, const ct_expr *e, json_t **args, size_t max, size_t min, const char *what)
{
    if (e->n_args < min || e->n_args > max)
        return efail(C, e->line, "%s takes %zu to %zu arguments, given %zu", what, min, max, e->n_args);
    for (size_t i = 0; i < e->n_args; i++) {
        if (eval(C, e->args[i], &args[i])) {
            for (size_t k = 0; k < i; k++) json_decref(args[k]);
            return -1;
        }
    }
    return 0;
}

static void decref_all(json_t **v, size_t n)
{
    for (size_t i = 0; i < n; i++) json_decref(v[i]);
}

static int call_function(ctx *C, const ct_expr *e, const char *name, json_t **out)
{
    json_t *a[3] = {NULL, NULL, NULL};
    if (!strcmp(name, "namespace") || !strcmp(name, "dict")) {
        if (e->n_args) return efail(C, e->line, "%s() takes keyword arguments only", name);
        json_t *o = json_object();
        for (size_t i = 0; i < e->n_kw; i++) {
            json_t *v;
            if (eval(C, e->kw_vals[i], &v)) { json_decref(o); return -1; }
            json_object_set_new(o, e->kw_names[i], v ? v : json_null());
        }
        *out = o;
        return 0;
    }
    if (!strcmp(name, "raise_exception")) {
        if (eval_args(C, e, a, 1, 1, "raise_exception()")) return -1;
        ct_str s = {0};
        ct_to_str(&s, a[0]);
        json_decref(a[0]);
        int rc = efail(C, e->line, "the template raised an error: %s", s.p ? s.p : "");
        free(s.p);
        return rc;
    }
    if (!strcmp(name, "strftime_now")) {
        if (eval_args(C, e, a, 1, 1, "strftime_now()")) return -1;
        if (!json_is_string(a[0])) { json_decref(a[0]); return efail(C, e->line, "strftime_now() needs a format string"); }
        const char *epoch = getenv("SOURCE_DATE_EPOCH");
        time_t t = epoch && *epoch ? (time_t)strtoll(epoch, NULL, 10) : time(NULL);
        struct tm tm;
        if (epoch && *epoch) gmtime_r(&t, &tm);
        else localtime_r(&t, &tm);
        char buf[256];
        size_t n = strftime(buf, sizeof buf, json_string_value(a[0]), &tm);
        json_decref(a[0]);
        *out = json_stringn_nocheck(buf, n);
        return 0;
    }
    if (!strcmp(name, "range")) {
        if (eval_args(C, e, a, 3, 1, "range()")) return -1;
        long long v[3] = {0, 0, 1};
        for (size_t i = 0; i < e->n_args; i++) {
            if (!json_is_integer(a[i])) { decref_all(a, e->n_args); return efail(C, e->line, "range() needs integers"); }
            v[i] = json_integer_value(a[i]);
        }
        decref_all(a, e->n_args);
        long long lo = e->n_args == 1 ? 0 : v[0], hi = e->n_args == 1 ? v[0] : v[1], st = e->n_args == 3 ? v[2] : 1;
        if (st == 0) return efail(C, e->line, "range() step must not be zero");
        json_t *l = json_array();
        for (long long i = lo; st > 0 ? i < hi : i > hi; i += st) {
            if (json_array_size(l) >= 100000) { json_decref(l); return efail(C, e->line, "range() longer than 100000"); }
            json_array_append_new(l, json_integer(i));
        }
        *out = l;
        return 0;
    }
    return efail(C, e->line, "\"%s\" is not a function tidal's Jinja subset knows (namespace, raise_exception, "
                 "strftime_now, range, dict)", name);
}

static int call_method(ctx *C, const ct_expr *e, json_t *self, const char *m, json_t **out)
{
    json_t *a[3] = {NULL, NULL, NULL};
    if (json_is_object(self)) {
        if (!strcmp(m, "items") || !strcmp(m, "keys") || !strcmp(m, "values")) {
            if (e->n_args) return efail(C, e->line, "%s() takes no arguments", m);
            *out = ct_dict_view(self, m[0]);
            return 0;
        }
        if (!strcmp(m, "get")) {
            if (eval_args(C, e, a, 2, 1, "get()")) return -1;
            json_t *v = json_is_string(a[0]) ? json_object_get(self, json_string_value(a[0])) : NULL;
            *out = v ? json_incref(v) : a[1] ? json_incref(a[1]) : json_null();
            decref_all(a, e->n_args);
            return 0;
        }
        return efail(C, e->line, "dict method \"%s\" is not supported", m);
    }
    if (!json_is_string(self)) return efail(C, e->line, "method \"%s\" called on a %s", m, ct_type_name(self));
    if (eval_args(C, e, a, 3, 0, m)) return -1;
    int rc = ct_str_method(self, m, a, e->n_args, out);
    decref_all(a, e->n_args);
    if (rc == -2) return efail(C, e->line, "string method \"%s\" is not supported", m);
    if (rc) return efail(C, e->line, "bad arguments to string method \"%s\"", m);
    return 0;
}

/* ---------------------------------------------------------------- filters and tests */
static int apply_filter(ctx *C, const ct_expr *e, json_t **out)
{
    const char *f = e->name;
    json_t *v;
    if (eval(C, e->a, &v)) return -1;
    json_t *a[3] = {NULL, NULL, NULL};
    int rc = 0;
    if (!strcmp(f, "default") || !strcmp(f, "d")) {
        if (eval_args(C, e, a, 2, 0, "default")) { json_decref(v); return -1; }
        bool use = !v || (e->n_args == 2 && ct_truthy(a[1]) && !ct_truthy(v));
        if (use) { json_decref(v); v = a[0] ? json_incref(a[0]) : json_stringn_nocheck("", 0); }
        decref_all(a, e->n_args);
        *out = v;
        return 0;
    }
    if (!strcmp(f, "tojson")) {
        int krc = 0;
        json_t *ind = kwarg(C, e, "indent", &krc);
        if (krc) { json_decref(v); return -1; }
        if (e->n_args && eval(C, e->args[0], &ind)) { json_decref(v); return -1; }
        int indent = json_is_integer(ind) ? (int)json_integer_value(ind) : -1;
        json_decref(ind);
        if (!v) return efail(C, e->line, "tojson of an undefined value");
        ct_str s = {0};
        if (ct_tojson(&s, v, indent, 0)) { json_decref(v); free(s.p); return efail(C, e->line, "tojson of a value JSON cannot hold"); }
        *out = json_stringn_nocheck(s.p ? s.p : "", s.n);
        free(s.p);
        json_decref(v);
        return 0;
    }
    if (!strcmp(f, "string")) { ct_str s = {0}; ct_to_str(&s, v); *out = json_stringn_nocheck(s.p ? s.p : "", s.n); free(s.p); json_decref(v); return 0; }
    if (!v && (!strcmp(f, "length") || !strcmp(f, "count"))) { *out = json_integer(0); return 0; }
    if (!v) return efail(C, e->line, "filter \"%s\" applied to an undefined value", f);
    if (e->n_args > 3) { json_decref(v); return efail(C, e->line, "filter \"%s\" given too many arguments", f); }
    for (size_t i = 0; i < e->n_args; i++)
        if (eval(C, e->args[i], &a[i])) { decref_all(a, i); json_decref(v); return -1; }
    json_t *attr = NULL;
    if (!strcmp(f, "map")) {
        int krc = 0;
        attr = kwarg(C, e, "attribute", &krc);
        if (krc) { decref_all(a, e->n_args); json_decref(v); return -1; }
    }
    rc = ct_filter(f, v, a, e->n_args, attr, out);
    json_decref(attr);
    decref_all(a, e->n_args);
    json_decref(v);
    if (rc == -2) return efail(C, e->line, "filter \"%s\" is not supported by tidal's Jinja subset", f);
    if (rc) return efail(C, e->line, "filter \"%s\" cannot apply to this value or these arguments", f);
    return 0;
}

static int apply_test(ctx *C, const ct_expr *e, json_t **out)
{
    json_t *v;
    if (e->a->kind == E_NAME && (!strcmp(e->name, "defined") || !strcmp(e->name, "undefined"))) {
        v = lookup(C, e->a->name);
        bool defined = v || is_function(e->a->name);
        json_decref(v);
        *out = json_boolean(defined == (e->name[0] == 'd') ? !e->negate : e->negate);
        return 0;
    }
    if (eval(C, e->a, &v)) return -1;
    json_t *arg = NULL;
    if (e->n_args > 1) { json_decref(v); return efail(C, e->line, "test \"%s\" takes at most one argument", e->name); }
    if (e->n_args && eval(C, e->args[0], &arg)) { json_decref(v); return -1; }
    int r = ct_test(e->name, v, arg);
    json_decref(v);
    json_decref(arg);
    if (r < 0) return efail(C, e->line, "test \"%s\" is not supported by tidal's Jinja subset", e->name);
    *out = json_boolean(e->negate ? !r : r);
    return 0;
}

/* ---------------------------------------------------------------- expressions */
static int eval_binary(ctx *C, const ct_expr *e, json_t **out)
{
    const char *op = e->name;
    json_t *a, *b;
    if (!strcmp(op, "and") || !strcmp(op, "or")) {
        if (eval(C, e->a, &a)) return -1;
        if (ct_truthy(a) == (op[0] == 'o')) { *out = a; return 0; }
        json_decref(a);
        return eval(C, e->b, out);
    }
    if (eval(C, e->a, &a)) return -1;
    if (eval(C, e->b, &b)) { json_decref(a); return -1; }
    int rc = ct_binary(op, a, b, out);
    const char *ta = ct_type_name(a), *tb = ct_type_name(b);   /* static strings */
    json_decref(a);
    json_decref(b);
    if (rc == -3) return efail(C, e->line, "division by zero");
    if (rc == -4) return efail(C, e->line, "operator \"%s\": the result is too large (tidal's integers are 64-bit)", op);
    if (rc) return efail(C, e->line, "operator \"%s\" cannot apply to %s and %s", op, ta, tb);
    return 0;
}

static int eval_at(ctx *C, const ct_expr *e, json_t **out);

static int eval(ctx *C, const ct_expr *e, json_t **out)
{
    *out = NULL;
    if (++C->depth > 2000) { C->depth--; return efail(C, e->line, "expression nested too deeply to evaluate"); }
    int rc = eval_at(C, e, out);
    C->depth--;
    return rc;
}

static int eval_at(ctx *C, const ct_expr *e, json_t **out)
{
    json_t *a = NULL, *b = NULL;
    switch (e->kind) {
    case E_CONST:
        *out = json_incref(e->value);
        return 0;
    case E_NAME:
        *out = lookup(C, e->name);
        return 0;
    case E_LIST: case E_DICT: {
        json_t *r = e->kind == E_LIST ? json_array() : json_object();
        for (size_t i = 0; i < e->n_args; i += e->kind == E_LIST ? 1 : 2) {
            if (eval(C, e->args[i], &a)) { json_decref(r); return -1; }
            if (e->kind == E_LIST) { json_array_append_new(r, a ? a : json_null()); continue; }
            if (!json_is_string(a)) { json_decref(a); json_decref(r); return efail(C, e->line, "dict keys must be strings"); }
            if (eval(C, e->args[i + 1], &b)) { json_decref(a); json_decref(r); return -1; }
            json_object_set_new(r, json_string_value(a), b ? b : json_null());
            json_decref(a);
        }
        *out = r;
        return 0;
    }
    case E_ATTR: case E_INDEX: {
        char what[96];
        snprintf(what, sizeof what, e->kind == E_ATTR ? "to read its attribute \"%s\"" : "to index it%s",
                 e->kind == E_ATTR ? e->name : "");
        if (eval_def(C, e->a, &a, what)) return -1;
        if (e->kind == E_ATTR) {
            *out = ct_getattr(a, e->name);
        } else {
            if (eval(C, e->b, &b)) { json_decref(a); return -1; }
            *out = ct_getitem(a, b);
            json_decref(b);
        }
        bool bad = !json_is_object(a) && !json_is_array(a) && !json_is_string(a);
        const char *ty = ct_type_name(a);
        json_decref(a);
        if (bad && e->kind == E_INDEX) return efail(C, e->line, "a %s cannot be indexed", ty);
        return 0;
    }
    case E_SLICE: {
        if (eval_def(C, e->a, &a, "to slice it")) return -1;
        json_t *p[3] = {NULL, NULL, NULL};
        for (int i = 0; i < 3; i++) {
            if (e->args[i] && eval(C, e->args[i], &p[i])) { decref_all(p, 3); json_decref(a); return -1; }
            if (p[i] && !json_is_integer(p[i]) && !json_is_null(p[i])) { decref_all(p, 3); json_decref(a); return efail(C, e->line, "slice bounds must be integers"); }
        }
        int rc = ct_slice(a, p[0], p[1], p[2], out);
        decref_all(p, 3);
        json_decref(a);
        if (rc) return efail(C, e->line, "this value cannot be sliced (or the step is zero)");
        return 0;
    }
    case E_CALL:
        if (e->a->kind == E_NAME) return call_function(C, e, e->a->name, out);
        if (e->a->kind == E_ATTR) {
            char what[96];
            snprintf(what, sizeof what, "to call its method \"%s\"", e->a->name);
            if (eval_def(C, e->a->a, &a, what)) return -1;
            int rc = call_method(C, e, a, e->a->name, out);
            json_decref(a);
            return rc;
        }
        return efail(C, e->line, "only named functions and methods can be called");
    case E_FILTER:
        return apply_filter(C, e, out);
    case E_TEST:
        return apply_test(C, e, out);
    case E_UNARY:
        if (eval(C, e->a, &a)) return -1;
        if (e->name[0] == 'n') { *out = json_boolean(!ct_truthy(a)); json_decref(a); return 0; }
        if (!json_is_number(a)) { const char *ty = ct_type_name(a); json_decref(a); return efail(C, e->line, "unary %s of a %s", e->name, ty); }
        if (e->name[0] == '+') { *out = a; return 0; }
        if (json_is_integer(a) && json_integer_value(a) == LLONG_MIN) { json_decref(a); return efail(C, e->line, "unary - overflows"); }
        *out = json_is_integer(a) ? json_integer(-json_integer_value(a)) : json_real(-json_real_value(a));
        json_decref(a);
        return 0;
    case E_BINARY:
        return eval_binary(C, e, out);
    case E_COND:
        if (eval(C, e->b, &a)) return -1;
        bool t = ct_truthy(a);
        json_decref(a);
        if (t) return eval(C, e->a, out);
        if (e->c) return eval(C, e->c, out);
        return 0;                                        /* no else: Undefined, as Jinja */
    }
    return efail(C, e->line, "unknown expression");
}

/* ---------------------------------------------------------------- statements */
static int exec_body(ctx *C, const ct_body *b);

static int exec_for(ctx *C, const ct_node *n)
{
    json_t *it;
    if (eval(C, n->expr, &it)) return -1;
    json_t *items = it ? ct_iterable(it) : json_array();     /* Undefined iterates as empty */
    if (!items) { const char *ty = ct_type_name(it); json_decref(it); return efail(C, n->line, "a %s cannot be looped over", ty); }
    json_decref(it);
    scope outer = {json_object(), C->sc};
    int rc = 0;
    if (n->filter) {                                          /* loop filter: before loop counting */
        json_t *kept = json_array();
        for (size_t i = 0; i < json_array_size(items) && !rc; i++) {
            json_t *x = json_array_get(items, i);
            scope s = {json_object(), C->sc};
            rc = ct_bind_targets(s.vars, n->targets, n->n_targets, x);
            C->sc = &s;
            json_t *c = NULL;
            if (!rc) rc = eval(C, n->filter, &c);
            C->sc = s.parent;
            if (!rc && ct_truthy(c)) json_array_append(kept, x);
            json_decref(c);
            json_decref(s.vars);
        }
        json_decref(items);
        items = kept;
    }
    size_t len = json_array_size(items);
    for (size_t i = 0; i < len && !rc; i++) {
        json_t *x = json_array_get(items, i);
        scope s = {json_object(), &outer};
        if (ct_bind_targets(s.vars, n->targets, n->n_targets, x)) {
            json_decref(s.vars);
            rc = efail(C, n->line, "cannot unpack a loop item into %zu variables", n->n_targets);
            break;
        }
        json_object_set_new(s.vars, "loop", ct_loop_object(i, len, items));
        C->sc = &s;
        rc = exec_body(C, &n->bodies[0]);
        C->sc = outer.parent;
        json_decref(s.vars);
        int flow = C->flow;
        C->flow = FLOW_NONE;
        if (flow == FLOW_BREAK) break;
    }
    if (!rc && len == 0 && n->has_else) rc = exec_body(C, &n->bodies[1]);
    json_decref(items);
    json_decref(outer.vars);
    return rc;
}

static int exec_node(ctx *C, const ct_node *n)
{
    json_t *v;
    switch (n->kind) {
    case S_TEXT:
        ct_str_put(&C->out, n->text, n->text_len);
        return 0;
    case S_OUT:
        if (eval(C, n->expr, &v)) return -1;
        ct_to_str(&C->out, v);
        json_decref(v);
        return 0;
    case S_IF:
        for (size_t i = 0; i < n->n_conds; i++) {
            if (eval(C, n->conds[i], &v)) return -1;
            bool t = ct_truthy(v);
            json_decref(v);
            if (t) return exec_body(C, &n->bodies[i]);
        }
        return n->has_else ? exec_body(C, &n->bodies[n->n_conds]) : 0;
    case S_FOR:
        return exec_for(C, n);
    case S_SET:
        if (eval(C, n->expr, &v)) return -1;
        if (n->attr) {
            json_t *ns = lookup(C, n->targets[0]);
            if (!json_is_object(ns)) {
                json_decref(ns);
                json_decref(v);
                return efail(C, n->line, "set %s.%s: \"%s\" is not a namespace()", n->targets[0], n->attr, n->targets[0]);
            }
            json_object_set_new(ns, n->attr, v ? v : json_null());
            json_decref(ns);
            return 0;
        }
        if (v) json_object_set_new(C->sc->vars, n->targets[0], v);
        else json_object_del(C->sc->vars, n->targets[0]);
        return 0;
    case S_BREAK: case S_CONTINUE:
        C->flow = n->kind == S_BREAK ? FLOW_BREAK : FLOW_CONTINUE;
        return 0;
    case S_BLOCK:
        return exec_body(C, &n->body);
    }
    return 0;
}

static int exec_body(ctx *C, const ct_body *b)
{
    for (size_t i = 0; i < b->n; i++) {
        if (exec_node(C, b->items[i])) return -1;
        if (C->flow != FLOW_NONE) return 0;
    }
    return 0;
}

/* ---------------------------------------------------------------- API */
td_chat_template *td_chat_template_parse(const char *text, size_t len, td_error *err)
{
    td_chat_template *t = td_xcalloc(1, sizeof *t);
    if (ct_parse(text, len, &t->arena, &t->body, err)) {
        td_chat_template_free(t);
        return NULL;
    }
    return t;
}

void td_chat_template_free(td_chat_template *t)
{
    if (!t) return;
    ct_arena_free(&t->arena);
    free(t);
}

int td_chat_template_render(const td_chat_template *t, json_t *messages, bool add_generation_prompt,
                            json_t *vars, char **out, size_t *out_len, td_error *err)
{
    ctx C = {.err = err};
    scope root = {json_object(), NULL};
    if (json_is_object(vars)) json_object_update(root.vars, vars);
    json_object_set(root.vars, "messages", messages);
    json_object_set_new(root.vars, "add_generation_prompt", json_boolean(add_generation_prompt));
    C.sc = &root;
    int rc = exec_body(&C, &t->body);
    json_decref(root.vars);
    if (rc) {
        free(C.out.p);
        *out = NULL;
        if (out_len) *out_len = 0;
        return -1;
    }
    ct_str_put(&C.out, "", 0);
    *out = C.out.p;
    if (out_len) *out_len = C.out.n;
    return 0;
}
