/* Chat templates, part 1: template text -> statement tree -> expression trees.
 *
 * Lexing follows Jinja2 as transformers configures it for chat templates
 * (ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)), default delimiters:
 *   - "\r\n" and "\r" become "\n"; one trailing newline of the template is dropped
 *     (keep_trailing_newline=False);
 *   - "{%-", "{{-", "{#-" strip all whitespace before the tag, "-%}", "-}}", "-#}" all after;
 *   - trim_blocks: the first newline after a "%}" or "#}" is dropped;
 *   - lstrip_blocks: spaces and tabs between a line start and "{%" / "{#" are dropped;
 *   - "{%+" / "+%}" turn both off for that side.
 * Expressions follow Jinja's grammar and precedence:
 *   cond-expr (a if b else c) < or < and < not < comparisons (== != < <= > >= in, not in)
 *   < + - < ~ < * / // % < unary - + < ** < primary with postfix . [] () and | filters, is tests. */
#include "chat_template_internal.h"

#include <stdlib.h>
#include <string.h>

/* ---------------------------------------------------------------- arena */
struct ct_chunk { ct_chunk *next; size_t used, cap; _Alignas(16) unsigned char data[]; };

void *ct_alloc(ct_arena *a, size_t n)
{
    n = (n + 15) & ~(size_t)15;
    if (!a->chunks || a->chunks->used + n > a->chunks->cap) {
        size_t cap = n > 65536 ? n : 65536;
        ct_chunk *c = td_xmalloc(sizeof *c + cap);
        c->next = a->chunks;
        c->used = 0;
        c->cap = cap;
        a->chunks = c;
    }
    void *p = a->chunks->data + a->chunks->used;
    a->chunks->used += n;
    memset(p, 0, n);
    return p;
}

char *ct_strndup(ct_arena *a, const char *s, size_t n)
{
    char *d = ct_alloc(a, n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

static json_t *keep_const(ct_arena *a, json_t *v)
{
    if (a->n_consts == a->cap_consts) {
        a->cap_consts = a->cap_consts ? 2 * a->cap_consts : 64;
        a->consts = td_xrealloc(a->consts, a->cap_consts * sizeof *a->consts);
    }
    return a->consts[a->n_consts++] = v;
}

void ct_arena_free(ct_arena *a)
{
    while (a->chunks) {
        ct_chunk *c = a->chunks;
        a->chunks = c->next;
        free(c);
    }
    for (size_t i = 0; i < a->n_consts; i++) json_decref(a->consts[i]);
    free(a->consts);
    memset(a, 0, sizeof *a);
}

/* ---------------------------------------------------------------- template lexing */
typedef enum { SEG_TEXT, SEG_VAR, SEG_BLOCK } seg_kind;
typedef struct {
    seg_kind kind;
    int line;
    const char *s;     /* TEXT: the text; VAR/BLOCK: the tag's inner source */
    size_t n;
} seg;

typedef struct {
    ct_arena *arena;
    td_error *err;
    seg *segs;
    size_t n_segs, cap_segs, at;
    int failed;
    int depth;         /* nesting of blocks and of parenthesised / bracketed expressions */
} parser;

enum { MAX_DEPTH = 64 };   /* published templates nest 4 deep; this bounds the C stack */

static int pfail(parser *P, int line, const char *fmt, const char *what)
{
    if (!P->failed) {
        char msg[300];
        snprintf(msg, sizeof msg, fmt, what);
        td_fail(P->err, "chat template line %d: %s", line, msg);
    }
    P->failed = 1;
    return -1;
}

static void add_seg(parser *P, seg_kind k, int line, const char *s, size_t n)
{
    if (P->n_segs == P->cap_segs) {
        P->cap_segs = P->cap_segs ? 2 * P->cap_segs : 64;
        P->segs = td_xrealloc(P->segs, P->cap_segs * sizeof *P->segs);
    }
    P->segs[P->n_segs++] = (seg){k, line, s, n};
}

static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

static int count_lines(const char *s, size_t from, size_t to, int line)
{
    for (size_t i = from; i < to; i++) line += s[i] == '\n';
    return line;
}

/* End of a tag: the position of `close` ("}}" or "%}") outside string literals. */
static const char *tag_end(const char *p, const char *end, const char *close)
{
    char q = 0;
    for (; p + 1 < end; p++) {
        if (q) {
            if (*p == '\\') p++;
            else if (*p == q) q = 0;
        } else if (*p == '\'' || *p == '"') {
            q = *p;
        } else if (p[0] == close[0] && p[1] == close[1]) {
            return p;
        }
    }
    return NULL;
}

static int lex_template(parser *P, const char *src, size_t len)
{
    const char *end = src + len, *pos = src;
    bool line_starting = true;
    int line = 1;
    for (;;) {
        const char *t = pos;
        while (t + 1 < end && !(t[0] == '{' && (t[1] == '{' || t[1] == '%' || t[1] == '#'))) t++;
        if (t + 1 >= end) {
            if (end > pos) add_seg(P, SEG_TEXT, line, pos, (size_t)(end - pos));
            return 0;
        }
        char kind = t[1], sign = t + 2 < end && (t[2] == '-' || t[2] == '+') ? t[2] : 0;
        size_t n = (size_t)(t - pos);
        if (sign == '-') {
            while (n && is_ws(pos[n - 1])) n--;
        } else if (sign != '+' && kind != '{') {            /* lstrip_blocks */
            size_t l = n;
            while (l && pos[l - 1] != '\n') l--;
            bool blank = l < n;
            for (size_t i = l; i < n; i++) if (!is_ws(pos[i])) blank = false;
            if ((l > 0 || line_starting) && blank) n = l;
        }
        if (n) add_seg(P, SEG_TEXT, line, pos, n);
        line = count_lines(src, (size_t)(pos - src), (size_t)(t - src), line);
        const char *in = t + 2 + (sign != 0), *close;
        if (kind == '#') {
            close = in;
            while (close + 1 < end && !(close[0] == '#' && close[1] == '}')) close++;
            if (close + 1 >= end) return pfail(P, line, "%s", "comment \"{#\" is never closed with \"#}\"");
        } else {
            close = tag_end(in, end, kind == '{' ? "}}" : "%}");
            if (!close) return pfail(P, line, "%s", kind == '{' ? "\"{{\" is never closed with \"}}\"" : "\"{%\" is never closed with \"%}\"");
        }
        char esign = close > in && (close[-1] == '-' || close[-1] == '+') ? close[-1] : 0;
        if (kind != '#') add_seg(P, kind == '{' ? SEG_VAR : SEG_BLOCK, line, in, (size_t)(close - in) - (esign != 0));
        const char *after = close + 2;
        if (esign == '-') {
            while (after < end && is_ws(*after)) after++;
        } else if (esign != '+' && kind != '{' && after < end && *after == '\n') {   /* trim_blocks */
            after++;
        }
        line = count_lines(src, (size_t)(t - src), (size_t)(after - src), line);
        line_starting = after[-1] == '\n';
        pos = after;
    }
}

/* ---------------------------------------------------------------- expression tokens */
typedef enum { T_END, T_NAME, T_STR, T_INT, T_FLOAT, T_OP } tok_kind;
typedef struct {
    tok_kind kind;
    const char *s;     /* NAME / OP: source text; STR: unescaped (arena) */
    size_t n;
    double f;
    long long i;
} tok;

typedef struct {
    parser *P;
    int line;
    const char *p, *end;
    tok cur;
} lexer;

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

static void next(lexer *L)
{
    while (L->p < L->end && is_ws(*L->p)) L->p++;
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
            pfail(L->P, L->line, "%s", "string literal is never closed");
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
    pfail(L->P, L->line, "unexpected character \"%s\" in an expression", what);
    t->kind = T_END;
    L->p = L->end;
}

static bool is_op(const lexer *L, const char *op)
{
    return L->cur.kind == T_OP && L->cur.n == strlen(op) && memcmp(L->cur.s, op, L->cur.n) == 0;
}

static bool is_name(const lexer *L, const char *name)
{
    return L->cur.kind == T_NAME && L->cur.n == strlen(name) && memcmp(L->cur.s, name, L->cur.n) == 0;
}

static bool accept_op(lexer *L, const char *op)
{
    if (!is_op(L, op)) return false;
    next(L);
    return true;
}

static bool accept_name(lexer *L, const char *name)
{
    if (!is_name(L, name)) return false;
    next(L);
    return true;
}

static int expect_op(lexer *L, const char *op)
{
    if (accept_op(L, op)) return 0;
    return pfail(L->P, L->line, "expected \"%s\" in an expression", op);
}

/* ---------------------------------------------------------------- expressions */
static ct_expr *mk(lexer *L, ct_ekind k)
{
    ct_expr *e = ct_alloc(L->P->arena, sizeof *e);
    e->kind = k;
    e->line = L->line;
    return e;
}

static ct_expr *parse_expr(lexer *L, bool with_cond);
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
    while (!is_op(L, ")")) {
        if (L->cur.kind == T_NAME && L->p < L->end) {
            /* name=value: look ahead for a single "=" */
            const char *q = L->p;
            while (q < L->end && is_ws(*q)) q++;
            if (q < L->end && *q == '=' && !(q + 1 < L->end && q[1] == '=')) {
                if (n_names == cap_names) {
                    cap_names = cap_names ? 2 * cap_names : 4;
                    const char **nn = ct_alloc(L->P->arena, cap_names * sizeof *nn);
                    if (n_names) memcpy(nn, names, n_names * sizeof *nn);
                    names = nn;
                }
                names[n_names++] = ct_strndup(L->P->arena, L->cur.s, L->cur.n);
                next(L);
                next(L);                                    /* "=" */
                ct_expr *v = parse_expr(L, true);
                if (!v) return -1;
                vec_put(L->P, &kv, v);
                if (!accept_op(L, ",")) break;
                continue;
            }
        }
        ct_expr *a = parse_expr(L, true);
        if (!a) return -1;
        vec_put(L->P, &pos, a);
        if (!accept_op(L, ",")) break;
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
        pfail(L->P, L->line, "%s", "expression nested too deeply");
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
        e->value = keep_const(L->P->arena, json_stringn_nocheck(t.s, t.n));
        next(L);
        while (L->cur.kind == T_STR) {                      /* adjacent literals concatenate */
            const char *s0 = json_string_value(e->value);
            size_t n0 = json_string_length(e->value);
            char *cat = ct_alloc(L->P->arena, n0 + L->cur.n + 1);
            memcpy(cat, s0, n0);
            memcpy(cat + n0, L->cur.s, L->cur.n);
            e->value = keep_const(L->P->arena, json_stringn_nocheck(cat, n0 + L->cur.n));
            next(L);
        }
        return e;
    }
    if (t.kind == T_INT || t.kind == T_FLOAT) {
        ct_expr *e = mk(L, E_CONST);
        e->value = keep_const(L->P->arena, t.kind == T_INT ? json_integer(t.i) : json_real(t.f));
        next(L);
        return e;
    }
    if (t.kind == T_NAME) {
        static const char *const consts[] = {"true", "True", "false", "False", "none", "None"};
        for (int i = 0; i < 6; i++)
            if (is_name(L, consts[i])) {
                ct_expr *e = mk(L, E_CONST);
                e->value = keep_const(L->P->arena, i < 2 ? json_true() : i < 4 ? json_false() : json_null());
                next(L);
                return e;
            }
        ct_expr *e = mk(L, E_NAME);
        e->name = ct_strndup(L->P->arena, t.s, t.n);
        next(L);
        return e;
    }
    if (accept_op(L, "(")) {
        ct_expr *first = is_op(L, ")") ? NULL : parse_expr(L, true);
        if (!first && !is_op(L, ")")) return NULL;
        if (first && !is_op(L, ",")) {
            if (expect_op(L, ")")) return NULL;
            return first;
        }
        ct_expr *e = mk(L, E_LIST);                          /* a tuple: a list here */
        expr_vec v = {0};
        if (first) vec_put(L->P, &v, first);
        while (accept_op(L, ",") && !is_op(L, ")")) {
            ct_expr *a = parse_expr(L, true);
            if (!a) return NULL;
            vec_put(L->P, &v, a);
        }
        if (expect_op(L, ")")) return NULL;
        e->args = v.v;
        e->n_args = v.n;
        return e;
    }
    if (is_op(L, "[") || is_op(L, "{")) {
        bool dict = is_op(L, "{");
        next(L);
        ct_expr *e = mk(L, dict ? E_DICT : E_LIST);
        expr_vec v = {0};
        while (!is_op(L, dict ? "}" : "]")) {
            ct_expr *a = parse_expr(L, true);
            if (!a) return NULL;
            vec_put(L->P, &v, a);
            if (dict) {
                if (expect_op(L, ":")) return NULL;
                ct_expr *b = parse_expr(L, true);
                if (!b) return NULL;
                vec_put(L->P, &v, b);
            }
            if (!accept_op(L, ",")) break;
        }
        if (expect_op(L, dict ? "}" : "]")) return NULL;
        e->args = v.v;
        e->n_args = v.n;
        return e;
    }
    if (t.kind == T_END) { pfail(L->P, L->line, "%s", "expression ends too early"); return NULL; }
    char what[40];
    snprintf(what, sizeof what, "%.*s", (int)(t.n < 30 ? t.n : 30), t.s);
    pfail(L->P, L->line, "unexpected \"%s\" in an expression", what);
    return NULL;
}

/* Postfix: .name, [index or slice], (call args). */
static ct_expr *parse_postfix(lexer *L, ct_expr *e)
{
    while (e) {
        if (accept_op(L, ".")) {
            if (L->cur.kind != T_NAME && L->cur.kind != T_INT) { pfail(L->P, L->line, "%s", "expected a name after \".\""); return NULL; }
            ct_expr *a = mk(L, E_ATTR);
            a->a = e;
            a->name = ct_strndup(L->P->arena, L->cur.s, L->cur.n);
            next(L);
            e = a;
        } else if (accept_op(L, "[")) {
            ct_expr *parts[3] = {NULL, NULL, NULL};
            int k = 0;
            bool slice = false;
            for (;;) {
                if (!is_op(L, ":") && !is_op(L, "]")) {
                    if (!(parts[k] = parse_expr(L, true))) return NULL;
                }
                if (k < 2 && accept_op(L, ":")) { slice = true; k++; continue; }
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
                if (!parts[0]) { pfail(L->P, L->line, "%s", "empty subscript \"[]\""); return NULL; }
                a->b = parts[0];
            }
            e = a;
        } else if (accept_op(L, "(")) {
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
        if (accept_op(L, "|")) {
            if (L->cur.kind != T_NAME) { pfail(L->P, L->line, "%s", "expected a filter name after \"|\""); return NULL; }
            ct_expr *f = mk(L, E_FILTER);
            f->a = e;
            f->name = ct_strndup(L->P->arena, L->cur.s, L->cur.n);
            next(L);
            if (accept_op(L, "(") && parse_args(L, f)) return NULL;
            e = f;
        } else if (accept_name(L, "is")) {
            ct_expr *t = mk(L, E_TEST);
            t->a = e;
            t->negate = accept_name(L, "not");
            if (L->cur.kind != T_NAME) { pfail(L->P, L->line, "%s", "expected a test name after \"is\""); return NULL; }
            t->name = ct_strndup(L->P->arena, L->cur.s, L->cur.n);
            next(L);
            if (accept_op(L, "(")) {
                if (parse_args(L, t)) return NULL;
            } else if (L->cur.kind == T_STR || L->cur.kind == T_INT || L->cur.kind == T_FLOAT ||
                       (L->cur.kind == T_NAME && !is_name(L, "and") && !is_name(L, "or") && !is_name(L, "else") &&
                        !is_name(L, "if") && !is_name(L, "in") && !is_name(L, "is") && !is_name(L, "not"))) {
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
    while (e && accept_op(L, "**")) e = binary(L, "**", e, parse_primary_like(L, parse_unary));
    return e;
}

static ct_expr *parse_unary(lexer *L)
{
    if (is_op(L, "-") || is_op(L, "+")) {
        const char *op = is_op(L, "-") ? "-" : "+";
        next(L);
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
        const char *op = is_op(L, "*") ? "*" : is_op(L, "//") ? "//" : is_op(L, "/") ? "/" : is_op(L, "%") ? "%" : NULL;
        if (!op || !e) return e;
        next(L);
        e = binary(L, op, e, parse_unary(L));
    }
}

static ct_expr *parse_concat(lexer *L)
{
    ct_expr *e = parse_mul(L);
    while (e && accept_op(L, "~")) e = binary(L, "~", e, parse_mul(L));
    return e;
}

static ct_expr *parse_add(lexer *L)
{
    ct_expr *e = parse_concat(L);
    for (;;) {
        const char *op = is_op(L, "+") ? "+" : is_op(L, "-") ? "-" : NULL;
        if (!op || !e) return e;
        next(L);
        e = binary(L, op, e, parse_concat(L));
    }
}

static ct_expr *parse_compare(lexer *L)
{
    ct_expr *e = parse_add(L);
    for (;;) {
        static const char *const ops[] = {"==", "!=", "<=", ">=", "<", ">"};
        const char *op = NULL;
        for (int i = 0; i < 6 && !op; i++) if (is_op(L, ops[i])) op = ops[i];
        if (op) next(L);
        else if (accept_name(L, "in")) op = "in";
        else if (is_name(L, "not") && L->p < L->end) {
            const char *q = L->p;
            while (q < L->end && is_ws(*q)) q++;
            if (L->end - q >= 2 && q[0] == 'i' && q[1] == 'n' && (L->end - q == 2 || !((q[2] >= 'a' && q[2] <= 'z') || q[2] == '_'))) {
                next(L);
                next(L);
                op = "not in";
            }
        }
        if (!op || !e) return e;
        e = binary(L, op, e, parse_add(L));
    }
}

static ct_expr *parse_not(lexer *L)
{
    if (accept_name(L, "not")) {
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
    while (e && accept_name(L, "and")) e = binary(L, "and", e, parse_not(L));
    return e;
}

static ct_expr *parse_or(lexer *L)
{
    ct_expr *e = parse_and(L);
    while (e && accept_name(L, "or")) e = binary(L, "or", e, parse_and(L));
    return e;
}

static ct_expr *parse_expr(lexer *L, bool with_cond)
{
    ct_expr *e = parse_or(L);
    while (e && with_cond && accept_name(L, "if")) {
        ct_expr *c = mk(L, E_COND);
        c->a = e;
        if (!(c->b = parse_or(L))) return NULL;
        if (accept_name(L, "else") && !(c->c = parse_expr(L, false))) return NULL;
        e = c;
    }
    return e;
}

static void lexer_init(lexer *L, parser *P, const seg *s)
{
    L->P = P;
    L->line = s->line;
    L->p = s->s;
    L->end = s->s + s->n;
    next(L);
}

static int expect_end(lexer *L, const char *what)
{
    if (L->cur.kind == T_END) return 0;
    char t[40];
    snprintf(t, sizeof t, "%.*s", (int)(L->cur.n < 30 ? L->cur.n : 30), L->cur.s ? L->cur.s : "");
    char msg[120];
    snprintf(msg, sizeof msg, "unexpected \"%s\" after %s", t, what);
    return pfail(L->P, L->line, "%s", msg);
}

/* ---------------------------------------------------------------- statements */
static void body_put(parser *P, ct_body *b, ct_node *n)
{
    if ((b->n & (b->n - 1)) == 0) {                 /* capacity doubles at powers of two */
        size_t cap = b->n ? 2 * b->n : 1;
        ct_node **v = ct_alloc(P->arena, cap * sizeof *v);
        if (b->n) memcpy(v, b->items, b->n * sizeof *v);
        b->items = v;
    }
    b->items[b->n++] = n;
}

/* The keyword of a block segment ("if", "endfor", ...), into kw. */
static void block_kw(const seg *s, char kw[32])
{
    size_t i = 0, k = 0;
    while (i < s->n && is_ws(s->s[i])) i++;
    while (i < s->n && k < 31 && ((s->s[i] >= 'a' && s->s[i] <= 'z') || s->s[i] == '_')) kw[k++] = s->s[i++];
    kw[k] = 0;
}

/* Parses segments into b until a block whose keyword is in `stops` (left unconsumed; its
 * keyword goes to stop_kw), or the end (stops == NULL). */
static int parse_body(parser *P, ct_body *b, const char *const *stops, char stop_kw[32], const char *opener, int open_line);

static ct_node *node(parser *P, ct_skind k, int line)
{
    ct_node *n = ct_alloc(P->arena, sizeof *n);
    n->kind = k;
    n->line = line;
    return n;
}

static int parse_if(parser *P, lexer *L, ct_node *n)
{
    static const char *const stops[] = {"elif", "else", "endif", NULL};
    ct_expr *conds[256];
    ct_body bodies[257];
    size_t nc = 0;
    for (;;) {
        ct_expr *c = parse_expr(L, true);
        if (!c || expect_end(L, "an if condition")) return -1;
        if (nc == 256) return pfail(P, n->line, "%s", "more than 256 elif branches");
        conds[nc] = c;
        memset(&bodies[nc], 0, sizeof bodies[nc]);
        char kw[32];
        if (parse_body(P, &bodies[nc++], stops, kw, "if", n->line)) return -1;
        const seg *s = &P->segs[P->at++];
        if (strcmp(kw, "elif") == 0) {
            lexer_init(L, P, s);
            next(L);                                        /* "elif" */
            continue;
        }
        if (strcmp(kw, "else") == 0) {
            memset(&bodies[nc], 0, sizeof bodies[nc]);
            static const char *const end_only[] = {"endif", NULL};
            if (parse_body(P, &bodies[nc], end_only, kw, "if", n->line)) return -1;
            P->at++;
            n->has_else = true;
        }
        break;
    }
    n->conds = ct_alloc(P->arena, nc * sizeof *n->conds);
    memcpy(n->conds, conds, nc * sizeof *conds);
    n->n_conds = nc;
    n->bodies = ct_alloc(P->arena, (nc + 1) * sizeof *n->bodies);
    memcpy(n->bodies, bodies, (nc + n->has_else) * sizeof *bodies);
    return 0;
}

static int parse_for(parser *P, lexer *L, ct_node *n)
{
    for (;;) {
        if (L->cur.kind != T_NAME || n->n_targets == 2) return pfail(P, n->line, "%s", "for: expected one or two loop variable names");
        n->targets[n->n_targets++] = ct_strndup(P->arena, L->cur.s, L->cur.n);
        next(L);
        if (!accept_op(L, ",")) break;
    }
    if (!accept_name(L, "in")) return pfail(P, n->line, "%s", "for: expected \"in\"");
    if (!(n->expr = parse_expr(L, false))) return -1;
    if (accept_name(L, "if") && !(n->filter = parse_expr(L, false))) return -1;
    if (accept_name(L, "recursive")) return pfail(P, n->line, "%s", "recursive for loops are not supported");
    if (expect_end(L, "a for loop")) return -1;
    static const char *const stops[] = {"else", "endfor", NULL};
    n->bodies = ct_alloc(P->arena, 2 * sizeof *n->bodies);
    char kw[32];
    if (parse_body(P, &n->bodies[0], stops, kw, "for", n->line)) return -1;
    P->at++;
    if (strcmp(kw, "else") == 0) {
        static const char *const end_only[] = {"endfor", NULL};
        if (parse_body(P, &n->bodies[1], end_only, kw, "for", n->line)) return -1;
        P->at++;
        n->has_else = true;
    }
    return 0;
}

static int parse_set(parser *P, lexer *L, ct_node *n)
{
    if (L->cur.kind != T_NAME) return pfail(P, n->line, "%s", "set: expected a variable name");
    n->targets[0] = ct_strndup(P->arena, L->cur.s, L->cur.n);
    n->n_targets = 1;
    next(L);
    if (accept_op(L, ".")) {
        if (L->cur.kind != T_NAME) return pfail(P, n->line, "%s", "set: expected an attribute name after \".\"");
        n->attr = ct_strndup(P->arena, L->cur.s, L->cur.n);
        next(L);
    }
    if (is_op(L, ",")) return pfail(P, n->line, "%s", "set with several targets is not supported");
    if (!accept_op(L, "="))
        return pfail(P, n->line, "%s", "block assignments ({% set x %}...{% endset %}) are not supported");
    if (!(n->expr = parse_expr(L, true))) return -1;
    return expect_end(L, "a set statement");
}

static int parse_body(parser *P, ct_body *b, const char *const *stops, char stop_kw[32], const char *opener, int open_line)
{
    while (P->at < P->n_segs) {
        const seg *s = &P->segs[P->at];
        if (s->kind == SEG_TEXT) {
            ct_node *n = node(P, S_TEXT, s->line);
            n->text = s->s;
            n->text_len = s->n;
            body_put(P, b, n);
            P->at++;
            continue;
        }
        lexer L;
        if (s->kind == SEG_VAR) {
            lexer_init(&L, P, s);
            ct_node *n = node(P, S_OUT, s->line);
            if (!(n->expr = parse_expr(&L, true)) || expect_end(&L, "an expression")) return -1;
            body_put(P, b, n);
            P->at++;
            continue;
        }
        char kw[32];
        block_kw(s, kw);
        for (size_t i = 0; stops && stops[i]; i++)
            if (strcmp(kw, stops[i]) == 0) { strcpy(stop_kw, kw); return 0; }
        P->at++;
        lexer_init(&L, P, s);
        next(&L);                                           /* the keyword */
        ct_node *n;
        if (P->depth + 1 > MAX_DEPTH) return pfail(P, s->line, "%s", "blocks nested too deeply");
        P->depth++;
        if (strcmp(kw, "if") == 0) {
            n = node(P, S_IF, s->line);
            if (parse_if(P, &L, n)) return -1;
        } else if (strcmp(kw, "for") == 0) {
            n = node(P, S_FOR, s->line);
            if (parse_for(P, &L, n)) return -1;
        } else if (strcmp(kw, "set") == 0) {
            n = node(P, S_SET, s->line);
            if (parse_set(P, &L, n)) return -1;
        } else if (strcmp(kw, "break") == 0 || strcmp(kw, "continue") == 0) {
            n = node(P, kw[0] == 'b' ? S_BREAK : S_CONTINUE, s->line);
            if (expect_end(&L, kw)) return -1;
        } else if (strcmp(kw, "generation") == 0) {          /* transformers' assistant-mask marker */
            n = node(P, S_BLOCK, s->line);
            static const char *const end_only[] = {"endgeneration", NULL};
            char k2[32];
            if (parse_body(P, &n->body, end_only, k2, "generation", s->line)) return -1;
            P->at++;
        } else {
            char what[80];
            if (kw[0]) snprintf(what, sizeof what, "the tag \"%s\"", kw);
            else snprintf(what, sizeof what, "a tag without a keyword");
            if (strncmp(kw, "end", 3) == 0 || strcmp(kw, "else") == 0 || strcmp(kw, "elif") == 0)
                return pfail(P, s->line, "%s does not close any open block", what);
            return pfail(P, s->line, "%s is not supported by tidal's Jinja subset (supported: if/elif/else, for, set, "
                         "break, continue, generation)", what);
        }
        P->depth--;
        body_put(P, b, n);
    }
    if (stops) {
        char what[64];
        snprintf(what, sizeof what, "\"%s\" opened here is never closed", opener);
        return pfail(P, open_line, "%s", what);
    }
    return 0;
}

int ct_parse(const char *src, size_t len, ct_arena *arena, ct_body *out, td_error *err)
{
    /* newlines normalised, one trailing newline dropped (Jinja's keep_trailing_newline=False) */
    char *text = ct_alloc(arena, len + 1);
    size_t n = 0;
    for (size_t i = 0; i < len; i++) {
        if (src[i] == '\r') {
            text[n++] = '\n';
            if (i + 1 < len && src[i + 1] == '\n') i++;
        } else {
            text[n++] = src[i];
        }
    }
    if (n && text[n - 1] == '\n') n--;
    parser P = {.arena = arena, .err = err};
    memset(out, 0, sizeof *out);
    int rc = lex_template(&P, text, n);
    if (rc == 0) rc = parse_body(&P, out, NULL, NULL, NULL, 0);
    free(P.segs);
    return rc || P.failed ? -1 : 0;
}
