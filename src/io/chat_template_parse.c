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

json_t *ct_keep_const(ct_arena *a, json_t *v)
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

int ct_pfail(parser *P, int line, const char *fmt, const char *what)
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

bool ct_is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

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
            while (n && ct_is_ws(pos[n - 1])) n--;
        } else if (sign != '+' && kind != '{') {            /* lstrip_blocks */
            size_t l = n;
            while (l && pos[l - 1] != '\n') l--;
            bool blank = l < n;
            for (size_t i = l; i < n; i++) if (!ct_is_ws(pos[i])) blank = false;
            if ((l > 0 || line_starting) && blank) n = l;
        }
        if (n) add_seg(P, SEG_TEXT, line, pos, n);
        line = count_lines(src, (size_t)(pos - src), (size_t)(t - src), line);
        const char *in = t + 2 + (sign != 0), *close;
        if (kind == '#') {
            close = in;
            while (close + 1 < end && !(close[0] == '#' && close[1] == '}')) close++;
            if (close + 1 >= end) return ct_pfail(P, line, "%s", "comment \"{#\" is never closed with \"#}\"");
        } else {
            close = tag_end(in, end, kind == '{' ? "}}" : "%}");
            if (!close) return ct_pfail(P, line, "%s", kind == '{' ? "\"{{\" is never closed with \"}}\"" : "\"{%\" is never closed with \"%}\"");
        }
        char esign = close > in && (close[-1] == '-' || close[-1] == '+') ? close[-1] : 0;
        if (kind != '#') add_seg(P, kind == '{' ? SEG_VAR : SEG_BLOCK, line, in, (size_t)(close - in) - (esign != 0));
        const char *after = close + 2;
        if (esign == '-') {
            while (after < end && ct_is_ws(*after)) after++;
        } else if (esign != '+' && kind != '{' && after < end && *after == '\n') {   /* trim_blocks */
            after++;
        }
        line = count_lines(src, (size_t)(t - src), (size_t)(after - src), line);
        line_starting = after[-1] == '\n';
        pos = after;
    }
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
    while (i < s->n && ct_is_ws(s->s[i])) i++;
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
        ct_expr *c = ct_parse_expr(L, true);
        if (!c || ct_expect_end(L, "an if condition")) return -1;
        if (nc == 256) return ct_pfail(P, n->line, "%s", "more than 256 elif branches");
        conds[nc] = c;
        memset(&bodies[nc], 0, sizeof bodies[nc]);
        char kw[32];
        if (parse_body(P, &bodies[nc++], stops, kw, "if", n->line)) return -1;
        const seg *s = &P->segs[P->at++];
        if (strcmp(kw, "elif") == 0) {
            ct_lexer_init(L, P, s);
            ct_next(L);                                        /* "elif" */
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
        if (L->cur.kind != T_NAME || n->n_targets == 2) return ct_pfail(P, n->line, "%s", "for: expected one or two loop variable names");
        n->targets[n->n_targets++] = ct_strndup(P->arena, L->cur.s, L->cur.n);
        ct_next(L);
        if (!ct_accept_op(L, ",")) break;
    }
    if (!ct_accept_name(L, "in")) return ct_pfail(P, n->line, "%s", "for: expected \"in\"");
    if (!(n->expr = ct_parse_expr(L, false))) return -1;
    if (ct_accept_name(L, "if") && !(n->filter = ct_parse_expr(L, false))) return -1;
    if (ct_accept_name(L, "recursive")) return ct_pfail(P, n->line, "%s", "recursive for loops are not supported");
    if (ct_expect_end(L, "a for loop")) return -1;
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
    if (L->cur.kind != T_NAME) return ct_pfail(P, n->line, "%s", "set: expected a variable name");
    n->targets[0] = ct_strndup(P->arena, L->cur.s, L->cur.n);
    n->n_targets = 1;
    ct_next(L);
    if (ct_accept_op(L, ".")) {
        if (L->cur.kind != T_NAME) return ct_pfail(P, n->line, "%s", "set: expected an attribute name after \".\"");
        n->attr = ct_strndup(P->arena, L->cur.s, L->cur.n);
        ct_next(L);
    }
    if (ct_is_op(L, ",")) return ct_pfail(P, n->line, "%s", "set with several targets is not supported");
    if (!ct_accept_op(L, "="))
        return ct_pfail(P, n->line, "%s", "block assignments ({% set x %}...{% endset %}) are not supported");
    if (!(n->expr = ct_parse_expr(L, true))) return -1;
    return ct_expect_end(L, "a set statement");
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
            ct_lexer_init(&L, P, s);
            ct_node *n = node(P, S_OUT, s->line);
            if (!(n->expr = ct_parse_expr(&L, true)) || ct_expect_end(&L, "an expression")) return -1;
            body_put(P, b, n);
            P->at++;
            continue;
        }
        char kw[32];
        block_kw(s, kw);
        for (size_t i = 0; stops && stops[i]; i++)
            if (strcmp(kw, stops[i]) == 0) { strcpy(stop_kw, kw); return 0; }
        P->at++;
        ct_lexer_init(&L, P, s);
        ct_next(&L);                                           /* the keyword */
        ct_node *n;
        if (P->depth + 1 > MAX_DEPTH) return ct_pfail(P, s->line, "%s", "blocks nested too deeply");
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
            if (ct_expect_end(&L, kw)) return -1;
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
                return ct_pfail(P, s->line, "%s does not close any open block", what);
            return ct_pfail(P, s->line, "%s is not supported by tidal's Jinja subset (supported: if/elif/else, for, set, "
                         "break, continue, generation)", what);
        }
        P->depth--;
        body_put(P, b, n);
    }
    if (stops) {
        char what[64];
        snprintf(what, sizeof what, "\"%s\" opened here is never closed", opener);
        return ct_pfail(P, open_line, "%s", what);
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
