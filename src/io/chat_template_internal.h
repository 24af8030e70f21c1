/* Internal to the chat-template interpreter (chat_template_parse.c builds the tree,
 * chat_template.c runs it). See include/tidal/chat_template.h for what is supported. */
#ifndef TIDAL_CHAT_TEMPLATE_INTERNAL_H
#define TIDAL_CHAT_TEMPLATE_INTERNAL_H

#include "tidal/common.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* ---- expressions ---- */
typedef enum {
    E_CONST,      /* value: a literal (string, number, true/false/none)                   */
    E_NAME,       /* name                                                                  */
    E_LIST,       /* [a, b] or (a, b): args                                                */
    E_DICT,       /* {k: v}: args as k0, v0, k1, v1, ...                                   */
    E_ATTR,       /* a.name                                                                */
    E_INDEX,      /* a[b]                                                                  */
    E_SLICE,      /* a[b:c:d]: args a, b, c, d (NULL = omitted)                            */
    E_CALL,       /* a(args, name=kwargs): a is E_NAME (function) or E_ATTR (method)       */
    E_FILTER,     /* a | name(args, kwargs)                                                */
    E_TEST,       /* a is [not] name(args)                                                 */
    E_UNARY,      /* op a: "not", "-", "+"                                                 */
    E_BINARY,     /* a op b: or and == != < <= > >= in "not in" + - ~ * / // % **          */
    E_COND,       /* a if b else c                                                         */
} ct_ekind;

typedef struct ct_expr ct_expr;
struct ct_expr {
    ct_ekind kind;
    int line;
    const char *name;          /* NAME/ATTR/FILTER/TEST/call name; operator for UNARY/BINARY */
    json_t *value;             /* CONST                                                      */
    ct_expr *a, *b, *c;        /* operands                                                   */
    ct_expr **args;            /* LIST, DICT, CALL, FILTER, TEST, SLICE                      */
    size_t n_args;
    const char **kw_names;     /* CALL, FILTER: keyword arguments                            */
    ct_expr **kw_vals;
    size_t n_kw;
    bool negate;               /* TEST: "is not"                                             */
};

/* ---- statements ---- */
typedef enum { S_TEXT, S_OUT, S_IF, S_FOR, S_SET, S_BREAK, S_CONTINUE, S_BLOCK } ct_skind;

typedef struct ct_node ct_node;
typedef struct {
    ct_node **items;
    size_t n;
} ct_body;

struct ct_node {
    ct_skind kind;
    int line;
    const char *text;          /* TEXT (text_len bytes)                                       */
    size_t text_len;
    ct_expr *expr;             /* OUT, SET value, FOR iterable                                */
    /* IF: conds[i] guards bodies[i]; a final else is bodies[n_conds] when has_else.
     * FOR: bodies[0] is the loop body, bodies[1] the else body (has_else).              */
    ct_expr **conds;
    size_t n_conds;
    ct_body *bodies;
    bool has_else;
    const char *targets[2];    /* FOR: loop variables (1 or 2); SET: name, or object.attr    */
    size_t n_targets;
    const char *attr;          /* SET ns.attr = ...: the attribute                            */
    ct_expr *filter;           /* FOR ... if filter                                           */
    ct_body body;              /* BLOCK (generation): its contents                            */
};

/* Everything a parsed template owns lives in one arena, freed at once. */
typedef struct ct_chunk ct_chunk;
typedef struct {
    ct_chunk *chunks;
    json_t **consts;
    size_t n_consts, cap_consts;
} ct_arena;

void *ct_alloc(ct_arena *a, size_t n);
char *ct_strndup(ct_arena *a, const char *s, size_t n);
void ct_arena_free(ct_arena *a);
json_t *ct_keep_const(ct_arena *a, json_t *v);     /* owned by the arena from now on */


/* ---- parsing state shared by the template and expression parsers ---- */
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

int ct_pfail(parser *P, int line, const char *fmt, const char *what);
bool ct_is_ws(char c);
void ct_lexer_init(lexer *L, parser *P, const seg *s);
void ct_next(lexer *L);
bool ct_is_op(const lexer *L, const char *op);
bool ct_is_name(const lexer *L, const char *name);
bool ct_accept_op(lexer *L, const char *op);
bool ct_accept_name(lexer *L, const char *name);
int ct_expect_end(lexer *L, const char *what);
ct_expr *ct_parse_expr(lexer *L, bool with_cond);

/* Parses template text into a body; 0, or -1 + err naming the line and the problem. */
int ct_parse(const char *src, size_t len, ct_arena *arena, ct_body *out, td_error *err);

#endif
