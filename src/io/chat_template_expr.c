/* Chat templates, part 1b: expressions (tokens and Jinja's grammar; see chat_template_parse.c
 * for the precedence list). Every recursive descent goes through parse_primary_like, which
 * bounds the nesting, so hostile templates cannot exhaust the C stack. */
#include "chat_template_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- expression tokens */

static void put_utf8(char *o, size_t *k, unsigned long cp)
{
    if (cp < 0x80) o[(*k)++] = (char)cp;
    else if (cp < 0x800) { o[(*k)++] = (char)(0xC0 | cp >> 6); o[(*k)++] = (char)(0x80 | (cp & 63)); }
    else if (cp < 0x10000) {
        o[(*k)++] = (char)(0xE0 | cp >> 12); o[(*k)++] = (char)(0x80 | ((cp >> 6) & 63)); o[(*k)++] = (char)(0x80 | (cp & 63));
    } else {
        o[(*k)++] = (char)(0xF0 | cp >> 18); o[(*k)++] = (char)(0x80 | ((cp >> 12) & 63));
        o[(*k)++] = (char)(0x80 | ((cp >> 6) & 63)); o[(*k)++] = (char)(0x80 | (cp & 63));
    }
}

static int hexval(const char *s, int n, unsigned long *v)
{
    *v = 0;
    for (int i = 0; i < n; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        *v = *v * 16 + (unsigned long)d;
    }
    return 0;
}

/* A string literal's body with Python's unicode-escape rules (what Jinja applies): \n \t \r
 * \\ \' \" \a \b \f \v \xhh \uhhhh \Uhhhhhhhh \ooo; any other backslash stays as it is. */
static char *unescape(ct_arena *a, const char *s, size_t n, size_t *out_n)
{
    char *o = ct_alloc(a, n + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\' || i + 1 == n) { o[k++] = s[i]; continue; }
        char c = s[++i];
        unsigned long v;
        switch (c) {
        case 'n': o[k++] = '\n'; break;
        case 't': o[k++] = '\t'; break;
        case 'r': o[k++] = '\r'; break;
        case 'a': o[k++] = '\a'; break;
        case 'b': o[k++] = '\b'; break;
        case 'f': o[k++] = '\f'; break;
        case 'v': o[k++] = '\v'; break;
        case '\\': case '\'': case '"': o[k++] = c; break;
        case '\n': break;
        case 'x': case 'u': case 'U': {
            int w = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            if (i + (size_t)w < n && hexval(s + i + 1, w, &v) == 0 && v <= 0x10FFFF) {
                put_utf8(o, &k, v);
                i += (size_t)w;
            } else {
                o[k++] = '\\';
                o[k++] = c;
            }
            break;
        }
        default:
            if (c >= '0' && c <= '7') {
                v = 0;
                int d = 0;
                for (; d < 3 && i < n && s[i] >= '0' && s[i] <= '7'; d++, i++) v = v * 8 + (unsigned long)(s[i] - '0');
                i--;
                put_utf8(o, &k, v);
            } else {
                o[k++] = '\\';
                o[k++] = c;
            }
        }
    }
    o[k] = 0;
    *out_n = k;
    return o;
}

static const char *const OPS[] = {"//", "**", "==", "!=", "<=", ">=", "(", ")", "[", "]", "{", "}", ".", ",", ":",
                                  "|", "+", "-", "*", "/", "%", "~", "<", ">", "="};

void ct_next(lexer *L)
{
    while (L->p < L->end && ct_is_ws(*L->p)) L->p++;
    tok *t = &L->cur;
    memset(t, 0, sizeof *t);
    if (L->p >= L->end) { t->kind = T_END; return; }
    const char *p = L->p;
    if ((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || *p == '_') {
        const char *q = p;
        while (q < L->end && ((*q >= 'a' && *q <= 'z') || (*q >= 'A' && *q <= 'Z') || *q == '_' || (*q >= '0' && *q <= '9'))) q++;
        *t = (tok){T_NAME, p, (size_t)(q - p), 0, 0};
        L->p = q;
        return;
    }
    if (*p >= '0' && *p <= '9') {
        const char *q = p;
        bool is_float = false;
        while (q < L->end && ((*q >= '0' && *q <= '9') || *q == '_')) q++;
        if (q + 1 < L->end && *q == '.' && q[1] >= '0' && q[1] <= '9') {
            is_float = true;
            q++;
            while (q < L->end && *q >= '0' && *q <= '9') q++;
        }
        if (q < L->end && (*q == 'e' || *q == 'E')) {
            const char *r = q + 1;
            if (r < L->end && (*r == '+' || *r == '-')) r++;
            if (r < L->end && *r >= '0' && *r <= '9') {
                is_float = true;
                q = r;
                while (q < L->end && *q >= '0' && *q <= '9') q++;
            }
        }
        char buf[64];
        size_t n = 0;
        for (const char *r = p; r < q && n < sizeof buf - 1; r++) if (*r != '_') buf[n++] = *r;
        buf[n] = 0;
        if (is_float) *t = (tok){T_FLOAT, p, (size_t)(q - p), strtod(buf, NULL), 0};
        else *t = (tok){T_INT, p, (size_t)(q - p), 0, strtoll(buf, NULL, 10)};
        L->p = q;
        return;
    }
    if (*p == '\'' || *p == '"') {
        const char *q = p + 1;
        while (q < L->end && *q != *p) q += *q == '\\' ? 2 : 1;
        if (q >= L->end) {
            ct_pfail(L->P, L->line, "%s", "string literal is never closed");
            t->kind = T_END;
            L->p = L->end;
            return;
        }
        size_t n;
        t->kind = T_STR;
        t->s = unescape(L->P->arena, p + 1, (size_t)(q - p - 1), &n);
        t->n = n;
        L->p = q + 1;
        return;
    }
    for (size_t i = 0; i < sizeof OPS / sizeof OPS[0]; i++) {
        size_t n = strlen(OPS[i]);
        if ((size_t)(L->end - p) >= n && memcmp(p, OPS[i], n) == 0) {
            *t = (tok){T_OP, p, n, 0, 0};
            L->p = p + n;
            return;
        }
    }
    char what[8] = {*p, 0};
    ct_pfail(L->P, L->line, "unexpected character \"%s\" in an expression", what);
    t->kind = T_END;
    L->p = L->end;
}

bool ct_is_op(const lexer *L, const char *op)
{
    return L->cur.kind == T_OP && L->cur.n == strlen(op) && memcmp(L->cur.s, op, L->cur.n) == 0;
}

bool ct_is_name(const lexer *L, const char *name)
{
    return L->cur.kind == T_NAME && L->cur.n == strlen(name) && memcmp(L->cur.s, name, L->cur.n) == 0;
}

bool ct_accept_op(lexer *L, const char *op)
{
    if (!ct_is_op(L, op)) return false;
    ct_next(L);
    return true;
}

bool ct_accept_name(lexer *L, const char *name)
{
    if (!ct_is_name(L, name)) return false;
    ct_next(L);
    return true;
}

static int expect_op(lexer *L, const char *op)
{
    if (ct_accept_op(L, op)) return 0;
    return ct_pfail(L->P, L->line, "expected \"%s\" in an expression", op);
}

/* ---------------------------------------------------------------- expressions */
static ct_expr *mk(lexer *L, ct_ekind k)
{
    ct_expr *e = ct_alloc(L->P->arena, sizeof *e);
    e->kind = k;
    e->line = L->line;
    return e;
}

ct_expr *ct_parse_expr(lexer *L, bool with_cond);
static ct_expr *parse_unary(lexer *L);
static ct_expr *parse_not(lexer *L);
static ct_expr *parse_primary_like(lexer *L, ct_expr *(*f)(lexer *));

typedef struct {
    ct_expr **v;
    size_t n, cap;
} expr_vec;

static void vec_put(parser *P, expr_vec *v, ct_expr *e)
{
    if (v->n == v->cap) {
        size_t cap = v->cap ? 2 * v->cap : 4;
        ct_expr **nv = ct_alloc(P->arena, cap * sizeof *nv);
        if (v->n) memcpy(nv, v->v, v->n * sizeof *nv);
        v->v = nv;
        v->cap = cap;
    }
    v->v[v->n++] = e;
}

/* (a, b, name=c) after the opening parenthesis. */
static int parse_args(lexer *L, ct_expr *e)
{
    expr_vec pos = {0}, kv = {0};
    const char **names = NULL;
    size_t n_names = 0, cap_names = 0;
    while (!ct_is_op(L, ")")) {
        if (L->cur.kind == T_NAME && L->p < L->end) {
            /* name=value: look ahead for a single "=" */
            const char *q = L->p;
            while (q < L->end && ct_is_ws(*q)) q++;
            if (q < L->end && *q == '=' && !(q + 1 < L->end && q[1] == '=')) {
                if (n_names == cap_names) {
                    cap_names = cap_names ? 2 * cap_names : 4;
                    const char **nn = ct_alloc(L->P->arena, cap_names * sizeof *nn);
                    if (n_names) memcpy(nn, names, n_names * sizeof *nn);
                    names = nn;
                }
                names[n_names++] = ct_strndup(L->P->arena, L->cur.s, L->cur.n);
                ct_next(L);
                ct_next(L);                                    /* "=" */
                ct_expr *v = ct_parse_expr(L, true);
                if (!v) return -1;
                vec_put(L->P, &kv, v);
                if (!ct_accept_op(L, ",")) break;
                continue;
            }
        }
        ct_expr *a = ct_parse_expr(L, true);
        if (!a) return -1;
        vec_put(L->P, &pos, a);
        if (!ct_accept_op(L, ",")) break;
    }
    if (expect_op(L, ")")) return -1;
    e->args = pos.v;
    e->n_args = pos.n;
    e->kw_names = names;
    e->kw_vals = kv.v;
    e->n_kw = kv.n;
    return 0;
}

static ct_expr *parse_primary_at(lexer *L);

/* Every recursive descent goes through here, so nesting is bounded (the C stack is). */
static ct_expr *parse_primary_like(lexer *L, ct_expr *(*f)(lexer *))
{
    if (++L->P->depth > MAX_DEPTH) {
        ct_pfail(L->P, L->line, "%s", "expression nested too deeply");
        return NULL;
    }
    ct_expr *e = f(L);
    L->P->depth--;
    return e;
}

static ct_expr *parse_primary(lexer *L) { return parse_primary_like(L, parse_primary_at); }

static ct_expr *parse_primary_at(lexer *L)
{
    tok t = L->cur;
    if (t.kind == T_STR) {
        ct_expr *e = mk(L, E_CONST);
        e->value = ct_keep_const(L->P->arena, json_stringn_nocheck(t.s, t.n));
        ct_next(L);
        while (L->cur.kind == T_STR) {                      /* adjacent literals concatenate */
            const char *s0 = json_string_value(e->value);
            size_t n0 = json_string_length(e->value);
            char *cat = ct_alloc(L->P->arena, n0 + L->cur.n + 1);
            memcpy(cat, s0, n0);
            memcpy(cat + n0, L->cur.s, L->cur.n);
            e->value = ct_keep_const(L->P->arena, json_stringn_nocheck(cat, n0 + L->cur.n));
            ct_next(L);
        }
        return e;
    }
    if (t.kind == T_INT || t.kind == T_FLOAT) {
        ct_expr *e = mk(L, E_CONST);
        e->value = ct_keep_const(L->P->arena, t.kind == T_INT ? json_integer(t.i) : json_real(t.f));
        ct_next(L);
        return e;
    }
    if (t.kind == T_NAME) {
        static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
        for (int i = 0; i < 6; i++)
            if (ct_is_name(L, consts[i])) {
                ct_expr *e = mk(L, E_CONST);
                e->value = ct_keep_const(L->P->arena, i < 2 ? json_true() : i < 4 ? json_false() : json_null());
                ct_next(L);
                return e;
            }
        ct_expr *e = mk(L, E_NAME);
        e->name = ct_strndup(L->P->arena, t.s, t.n);
        ct_next(L);
        return e;
    }
    if (ct_accept_op(L, "(")) {
        ct_expr *first = ct_is_op(L, ")") ? NULL : ct_parse_expr(L, true);
        if (!first && !ct_is_op(L, ")")) return NULL;
        if (first && !ct_is_op(L, ",")) {
            if (expect_op(L, ")")) return NULL;
            return first;
        }
        ct_expr *e = mk(L, E_LIST);                          /* a tuple: a list here */
        expr_vec v = {0};
        if (first) vec_put(L->P, &v, first);
        while (ct_accept_op(L, ",") && !ct_is_op(L, ")")) {
            ct_expr *a = ct_parse_expr(L, true);
            if (!a) return NULL;
            vec_put(L->P, &v, a);
        }
        if (expect_op(L, ")")) return NULL;
        e->args = v.v;
        e->n_args = v.n;
        return e;
    }
    if (ct_is_op(L, "[") || ct_is_op(L, "{")) {
        bool dict = ct_is_op(L, "{");
        ct_next(L);
        ct_expr *e = mk(L, dict ? E_DICT : E_LIST);
        expr_vec v = {0};
        while (!ct_is_op(L, dict ? "}" : "]")) {
            ct_expr *a = ct_parse_expr(L, true);
            if (!a) return NULL;
            vec_put(L->P, &v, a);
            if (dict) {
                if (expect_op(L, ":")) return NULL;
                ct_expr *b = ct_parse_expr(L, true);
                if (!b) return NULL;
                vec_put(L->P, &v, b);
            }
            if (!ct_accept_op(L, ",")) break;
        }
        if (expect_op(L, dict ? "}" : "]")) return NULL;
        e->args = v.v;
        e->n_args = v.n;
        return e;
    }
    if (t.kind == T_END) { ct_pfail(L->P, L->line, "%s", "expression ends too early"); return NULL; }
    char what[40];
    snprintf(what, sizeof what, "%.*s", (int)(t.n < 30 ? t.n : 30), t.s);
    ct_pfail(L->P, L->line, "unexpected \"%s\" in an expression", what);
    return NULL;
}

/* Postfix: .name, [index or slice], (call args). */
static ct_expr *parse_postfix(lexer *L, ct_expr *e)
{
    while (e) {
        if (ct_accept_op(L, ".")) {
            if (L->cur.kind != T_NAME && L->cur.kind != T_INT) { ct_pfail(L->P, L->line, "%s", "expected a name after \".\""); return NULL; }
            ct_expr *a = mk(L, E_ATTR);
            a->a = e;
            a->name = ct_strndup(L->P->arena, L->cur.s, L->cur.n);
            ct_next(L);
            e = a;
        } else if (ct_accept_op(L, "[")) {
            ct_expr *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            for (;;) {
                if (!ct_is_op(L, ":") && !ct_is_op(L, "]")) {
                    if (!(parts[k] = ct_parse_expr(L, true))) return NULL;
                }
                if (k < 2 && ct_accept_op(L, ":")) { slice = true; k++; continue; }
                break;
            }
            if (expect_op(L, "]")) return NULL;
            ct_expr *a = mk(L, slice ? E_SLICE : E_INDEX);
            a->a = e;
            if (slice) {
                a->args = ct_alloc(L->P->arena, 3 * sizeof *a->args);
                memcpy(a->args, parts, sizeof parts);
                a->n_args = 3;
            } else {
                if (!parts[0]) { ct_pfail(L->P, L->line, "%s", "empty subscript \"[]\""); return NULL; }
                a->b = parts[0];
            }
            e = a;
        } else if (ct_accept_op(L, "(")) {
            ct_expr *c = mk(L, E_CALL);
            c->a = e;
            if (parse_args(L, c)) return NULL;
            e = c;
        } else {
            return e;
        }
    }
    return e;
}

/* | filter(args) and is [not] test(args), applied left to right after the postfix. */
static ct_expr *parse_filters(lexer *L, ct_expr *e)
{
    while (e) {
        if (ct_accept_op(L, "|")) {
            if (L->cur.kind != T_NAME) { ct_pfail(L->P, L->line, "%s", "expected a filter name after \"|\""); return NULL; }
            ct_expr *f = mk(L, E_FILTER);
            f->a = e;
            f->name = ct_strndup(L->P->arena, L->cur.s, L->cur.n);
            ct_next(L);
            if (ct_accept_op(L, "(") && parse_args(L, f)) return NULL;
            e = f;
        } else if (ct_accept_name(L, "is")) {
            ct_expr *t = mk(L, E_TEST);
            t->a = e;
            t->negate = ct_accept_name(L, "not");
            if (L->cur.kind != T_NAME) { ct_pfail(L->P, L->line, "%s", "expected a test name after \"is\""); return NULL; }
            t->name = ct_strndup(L->P->arena, L->cur.s, L->cur.n);
            ct_next(L);
            if (ct_accept_op(L, "(")) {
                if (parse_args(L, t)) return NULL;
            } else if (L->cur.kind == T_STR || L->cur.kind == T_INT || L->cur.kind == T_FLOAT ||
                       (L->cur.kind == T_NAME && !ct_is_name(L, "and") && !ct_is_name(L, "or") && !ct_is_name(L, "else") &&
                        !ct_is_name(L, "if") && !ct_is_name(L, "in") && !ct_is_name(L, "is") && !ct_is_name(L, "not"))) {
                /* "is equalto 'x'", "is sameas none": one argument without parentheses */
                ct_expr *arg = parse_primary(L);
                if (!arg) return NULL;
                t->args = ct_alloc(L->P->arena, sizeof *t->args);
                t->args[0] = arg;
                t->n_args = 1;
            }
            e = t;
        } else {
            return e;
        }
    }
    return e;
}

static ct_expr *binary(lexer *L, const char *op, ct_expr *a, ct_expr *b)
{
    if (!a || !b) return NULL;
    ct_expr *e = mk(L, E_BINARY);
    e->name = op;
    e->a = a;
    e->b = b;
    return e;
}

static ct_expr *parse_pow(lexer *L)
{
    ct_expr *e = parse_filters(L, parse_postfix(L, parse_primary(L)));
    while (e && ct_accept_op(L, "**")) e = binary(L, "**", e, parse_primary_like(L, parse_unary));
    return e;
}

static ct_expr *parse_unary(lexer *L)
{
    if (ct_is_op(L, "-") || ct_is_op(L, "+")) {
        const char *op = ct_is_op(L, "-") ? "-" : "+";
        ct_next(L);
        ct_expr *e = mk(L, E_UNARY);
        e->name = op;
        e->a = parse_primary_like(L, parse_unary);
        return e->a ? parse_filters(L, e) : NULL;
    }
    return parse_pow(L);
}

static ct_expr *parse_mul(lexer *L)
{
    ct_expr *e = parse_unary(L);
    for (;;) {
        const char *op = ct_is_op(L, "*") ? "*" : ct_is_op(L, "//") ? "//" : ct_is_op(L, "/") ? "/" : ct_is_op(L, "%") ? "%" : NULL;
        if (!op || !e) return e;
        ct_next(L);
        e = binary(L, op, e, parse_unary(L));
    }
}

static ct_expr *parse_concat(lexer *L)
{
    ct_expr *e = parse_mul(L);
    while (e && ct_accept_op(L, "~")) e = binary(L, "~", e, parse_mul(L));
    return e;
}

static ct_expr *parse_add(lexer *L)
{
    ct_expr *e = parse_concat(L);
    for (;;) {
        const char *op = ct_is_op(L, "+") ? "+" : ct_is_op(L, "-") ? "-" : NULL;
        if (!op || !e) return e;
        ct_next(L);
        e = binary(L, op, e, parse_concat(L));
    }
}

static ct_expr *parse_compare(lexer *L)
{
    ct_expr *e = parse_add(L);
    for (;;) {
        static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        const char *op = NULL;
        for (int i = 0; i < 6 && !op; i++) if (ct_is_op(L, ops[i])) op = ops[i];
        if (op) ct_next(L);
        else if (ct_accept_name(L, "in")) op = "in";
        else if (ct_is_name(L, "not") && L->p < L->end) {
            const char *q = L->p;
            while (q < L->end && ct_is_ws(*q)) q++;
            if (L->end - q >= 2 && q[0] == 'i' && q[1] == 'n' && (L->end - q == 2 || !((q[2] >= 'a' && q[2] <= 'z') || q[2] == '_'))) {
                ct_next(L);
                ct_next(L);
                op = "not in";
            }
        }
        if (!op || !e) return e;
        e = binary(L, op, e, parse_add(L));
    }
}

static ct_expr *parse_not(lexer *L)
{
    if (ct_accept_name(L, "not")) {
        ct_expr *e = mk(L, E_UNARY);
        e->name = "not";
        e->a = parse_primary_like(L, parse_not);
        return e->a ? e : NULL;
    }
    return parse_compare(L);
}

static ct_expr *parse_and(lexer *L)
{
    ct_expr *e = parse_not(L);
    while (e && ct_accept_name(L, "and")) e = binary(L, "and", e, parse_not(L));
    return e;
}

static ct_expr *parse_or(lexer *L)
{
    ct_expr *e = parse_and(L);
    while (e && ct_accept_name(L, "or")) e = binary(L, "or", e, parse_and(L));
    return e;
}

ct_expr *ct_parse_expr(lexer *L, bool with_cond)
{
    ct_expr *e = parse_or(L);
    while (e && with_cond && ct_accept_name(L, "if")) {
        ct_expr *c = mk(L, E_COND);
        c->a = e;
        if (!(c->b = parse_or(L))) return NULL;
        if (ct_accept_name(L, "else") && !(c->c = ct_parse_expr(L, false))) return NULL;
        e = c;
    }
    return e;
}

void ct_lexer_init(lexer *L, parser *P, const seg *s)
{
    L->P = P;
    L->line = s->line;
    L->p = s->s;
    L->end = s->s + s->n;
    ct_next(L);
}

int ct_expect_end(lexer *L, const char *what)
{
    if (L->cur.kind == T_END) return 0;
    char t[40];
    snprintf(t, sizeof t, "%.*s", (int)(L->cur.n < 30 ? L->cur.n : 30), L->cur.s ? L->cur.s : "");
    char msg[120];
    snprintf(msg, sizeof msg, "unexpected \"%s\" after %s", t, what);
    return ct_pfail(L->P, L->line, "%s", msg);
}

