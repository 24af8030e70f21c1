/* Pre-tokenizers: Split (regex or literal, five delimiter behaviours, invert), ByteLevel
 * (prefix space, GPT-2 regex, byte → character mapping), Digits, and Sequence of those.
 *
 * HF compiles its regexes with Oniguruma; tidal uses PCRE2 (UTF + UCP, JIT). The two agree on
 * \p{L}, \p{N}, (?i:...), lookahead and quantifiers; they differ in what \s means and tidal
 * rewrites it to Oniguruma's meaning before compiling (see tk_regex_compile). Matches are
 * enumerated as the onig crate's find_iter does: an empty match right after the previous
 * match is skipped by advancing one character. Empty pieces are dropped after every step, as
 * HF's PreTokenizedString::split does. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

/* Unicode White_Space, the set Oniguruma's \s matches on UTF-8 text. PCRE2's \s under UCP is
 * \p{Z} ∪ \h ∪ \v, which adds U+180E (a format character since Unicode 6.3) and so differs. */
static const char WS_CLASS[] =
    "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}\\x{205F}\\x{3000}";

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Oniguruma's \w on Unicode text: letters, marks, numbers, connector punctuation (PCRE2's UCP
 * \w is letters, numbers and '_' only). */
static const char WORD_CLASS[] = "\\p{L}\\p{M}\\p{N}\\p{Pc}";

/* Rewrites Oniguruma escapes whose PCRE2 meaning differs: \s \S (White_Space, above), \w \W
 * (above), \h \H (hexadecimal digit in Oniguruma, horizontal space in PCRE2), \v (vertical
 * tab only in Oniguruma, any vertical space in PCRE2) and \uHHHH (a code point; PCRE2: \x{HHHH}). Returns -1 for a negated one (\S \W \H)
 * inside a character class, which a positive class cannot express. Known remaining
 * differences, none used by the tokenizers tidal targets: \b and POSIX classes follow PCRE2's
 * UCP definitions, and Oniguruma's \w inside brackets leaves out No (e.g. '²'). */
static int onig_rewrite(const char *p, size_t n, tk_buf *out)
{
    bool in_class = false;
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            i++;
            if (e == 'Q') {                                   // \Q...\E: literal, copied as is
                const char *end = NULL;
                for (size_t k = i + 1; k + 1 < n; k++) if (p[k] == '\\' && p[k + 1] == 'E') { end = p + k; break; }
                size_t stop = end ? (size_t)(end - p) + 2 : n;
                tk_buf_put(out, p + i - 1, stop - (i - 1));
                i = stop - 1;
                continue;
            }
            if (e == 'v') { tk_buf_put(out, "\\x0B", 4); continue; }
            if (e == 'u' && i + 4 < n && strspn(p + i + 1, "0123456789abcdefABCDEF") >= 4) {   // \uHHHH
                tk_buf_put(out, "\\x{", 3);
                tk_buf_put(out, p + i + 1, 4);
                tk_buf_put(out, "}", 1);
                i += 4;
                continue;
            }
            const char *cls = e == 's' || e == 'S' ? WS_CLASS : e == 'w' || e == 'W' ? WORD_CLASS
                            : e == 'h' || e == 'H' ? "0-9a-fA-F" : NULL;
            if (!cls) { tk_buf_put(out, p + i - 1, 2); continue; }
            bool neg = e == 'S' || e == 'H' || e == 'W';
            if (in_class) {
                if (neg) return -1;
                tk_buf_put(out, cls, strlen(cls));
            } else {
                tk_buf_put(out, neg ? "[^" : "[", neg ? 2 : 1);
                tk_buf_put(out, cls, strlen(cls));
                tk_buf_put(out, "]", 1);
            }
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            tk_buf_put(out, p + i, 1);
            if (i + 1 < n && p[i + 1] == '^') tk_buf_put(out, p + ++i, 1);
            if (i + 1 < n && p[i + 1] == ']') tk_buf_put(out, p + ++i, 1);   // leading ] is literal
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {       // [:alpha:]
            const char *end = strstr(p + i, ":]");
            size_t stop = end && (size_t)(end - p) < n ? (size_t)(end - p) + 2 : i + 1;
            tk_buf_put(out, p + i, stop - i);
            i = stop - 1;
            continue;
        }
        if (in_class && c == ']') in_class = false;
        tk_buf_put(out, p + i, 1);
    }
    return 0;
}

pcre2_code *tk_regex_compile(const char *pattern, size_t len, bool literal, const char *path, td_error *err)
{
    tk_buf pat = {0};
    uint32_t opts = PCRE2_UTF;
    if (literal) {
        opts |= PCRE2_LITERAL;            // (PCRE2 refuses UCP together with LITERAL)
        tk_buf_put(&pat, pattern, len);
    } else {
        opts |= PCRE2_UCP | PCRE2_MULTILINE;  // Ruby syntax (Oniguruma's default): ^ and $ are line anchors
        if (onig_rewrite(pattern, len, &pat)) {
            td_fail(err, "%s: regex \"%.*s\": \\S, \\W or \\H inside a character class is not supported", path,
                    (int)len, pattern);
            free(pat.p);
            return NULL;
        }
    }
    int ec;
    PCRE2_SIZE eo;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(pat.p ? pat.p : ""), pat.n, opts, &ec, &eo, NULL);
    free(pat.p);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(ec, msg, sizeof msg);
        td_fail(err, "%s: regex \"%.*s\" does not compile at offset %zu: %s", path, (int)len, pattern, (size_t)eo, msg);
        return NULL;
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE);   // falls back to the interpreter if JIT is unavailable
    return re;
}

/* ---- loading ---- */
static int behavior_of(const char *s)
{
    static const char *names[] = {"Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous"};
    for (int i = 0; i < 5; i++) if (strcmp(s, names[i]) == 0) return i;
    return -1;
}

static int push_step(tk_pretok **steps, size_t *n, tk_pretok st)
{
    *steps = tk_xrealloc(*steps, (*n + 1) * sizeof **steps);
    (*steps)[(*n)++] = st;
    return 0;
}

int tk_pretok_load(json_t *j, const char *path, tk_pretok **steps, size_t *n, td_error *err)
{
    if (!j || json_is_null(j)) return 0;
    json_t *type = json_object_get(j, "type");
    if (!json_is_object(j) || !json_is_string(type))
        return td_fail(err, "%s: pre_tokenizer must be null or an object with a string \"type\"", path);
    const char *t = json_string_value(type);
    tk_pretok st = {0};
    if (strcmp(t, "Sequence") == 0) {
        json_t *list = json_object_get(j, "pretokenizers");
        if (!json_is_array(list)) return td_fail(err, "%s: pre_tokenizer Sequence needs a \"pretokenizers\" array", path);
        for (size_t i = 0; i < json_array_size(list); i++)
            if (tk_pretok_load(json_array_get(list, i), path, steps, n, err)) return -1;
        return 0;
    }
    if (strcmp(t, "Split") == 0) {
        json_t *pat = json_object_get(j, "pattern"), *beh = json_object_get(j, "behavior");
        json_t *re = json_object_get(pat, "Regex"), *lit = json_object_get(pat, "String");
        json_t *src = re ? re : lit;
        if (!json_is_object(pat) || !json_is_string(src))
            return td_fail(err, "%s: pre_tokenizer Split: \"pattern\" must be {\"Regex\": ...} or {\"String\": ...}", path);
        if (!json_is_string(beh) || (st.behavior = behavior_of(json_string_value(beh))) < 0)
            return td_fail(err, "%s: pre_tokenizer Split: \"behavior\" must be one of Removed, Isolated, "
                           "MergedWithPrevious, MergedWithNext, Contiguous", path);
        st.kind = PT_SPLIT;
        st.invert = json_is_true(json_object_get(j, "invert"));
        st.re = tk_regex_compile(json_string_value(src), json_string_length(src), src == lit, path, err);
        return st.re ? push_step(steps, n, st) : -1;
    }
    if (strcmp(t, "ByteLevel") == 0) {
        json_t *ur = json_object_get(j, "use_regex");
        st.kind = PT_BYTELEVEL;
        st.add_prefix_space = json_is_true(json_object_get(j, "add_prefix_space"));
        st.behavior = SB_ISOLATED;
        if (!ur || json_is_true(ur)) {
            st.re = tk_regex_compile(GPT2_REGEX, strlen(GPT2_REGEX), false, path, err);
            if (!st.re) return -1;
        }
        return push_step(steps, n, st);
    }
    if (strcmp(t, "Digits") == 0) {
        st.kind = PT_DIGITS;
        st.behavior = json_is_true(json_object_get(j, "individual_digits")) ? SB_ISOLATED : SB_CONTIGUOUS;
        st.re = tk_regex_compile("\\p{N}", 5, false, path, err);   // Rust char::is_numeric: Nd, Nl, No
        return st.re ? push_step(steps, n, st) : -1;
    }
    return td_fail(err, "%s: pre_tokenizer type \"%s\" is not supported (tidal reads Sequence, Split, ByteLevel, "
                   "Digits)", path, t);
}

void tk_pretok_free(tk_pretok *steps, size_t n)
{
    for (size_t i = 0; i < n; i++) pcre2_code_free(steps[i].re);
    free(steps);
}

/* ---- running ---- */
void tk_pretok_state_init(tk_pretok_state *st)
{
    memset(st, 0, sizeof *st);
}

void tk_pretok_state_free(tk_pretok_state *st)
{
    for (int i = 0; i < 2; i++) { free(st->buf[i].p); free(st->sp[i]); }
    if (st->md) pcre2_match_data_free(st->md);
    if (st->mctx) pcre2_match_context_free(st->mctx);
    if (st->jit) pcre2_jit_stack_free(st->jit);
}

static void span_put(tk_pretok_state *st, int k, size_t off, size_t len)
{
    if (st->nsp[k] == st->capsp[k]) {
        st->capsp[k] = st->capsp[k] ? 2 * st->capsp[k] : 256;
        st->sp[k] = tk_xrealloc(st->sp[k], st->capsp[k] * sizeof *st->sp[k]);
    }
    st->sp[k][st->nsp[k]++] = (tk_span){off, len};
}

/* (offsets, is_match) events of one piece, before the delimiter behaviour is applied. */
typedef struct { size_t a, b; bool m; } ev;
typedef struct { ev *p; size_t n, cap; } evs;

static void ev_put(evs *v, size_t a, size_t b, bool m)
{
    if (v->n == v->cap) {
        v->cap = v->cap ? 2 * v->cap : 64;
        v->p = tk_xrealloc(v->p, v->cap * sizeof *v->p);
    }
    v->p[v->n++] = (ev){a, b, m};
}

static int find_matches(const pcre2_code *re, const char *s, size_t n, tk_pretok_state *st, evs *out, td_error *err)
{
    size_t prev = 0, last_end = 0;
    bool have_last = false;
    size_t last_match_end = 0;
    while (last_end <= n) {
        int rc = pcre2_match(re, (PCRE2_SPTR)s, n, last_end, PCRE2_NO_UTF_CHECK, st->md, st->mctx);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            PCRE2_UCHAR msg[256];
            pcre2_get_error_message(rc, msg, sizeof msg);
            return td_fail(err, "pre-tokenizer regex failed on a %zu-byte piece: %s", n, msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(st->md);
        size_t a = ov[0], b = ov[1];
        if (a == b && have_last && last_match_end == b) {   // onig find_iter: skip, advance one character
            if (last_end >= n) break;
            size_t adv;
            tk_utf8_next((const uint8_t *)s + last_end, &adv);
            last_end += adv;
            continue;
        }
        last_end = b;
        have_last = true;
        last_match_end = b;
        if (prev != a) ev_put(out, prev, a, false);
        ev_put(out, a, b, true);
        prev = b;
        if (a == b && b >= n) break;
    }
    if (prev != n) ev_put(out, prev, n, false);
    return 0;
}

/* Applies SplitDelimiterBehavior to the events (HF NormalizedString::split) and appends the
 * kept pieces (base + offsets) to span list k. */
static void apply_behavior(evs *e, int behavior, bool invert, tk_pretok_state *st, int k, size_t base)
{
    if (invert) for (size_t i = 0; i < e->n; i++) e->p[i].m = !e->p[i].m;
    size_t w = 0;                                  // compacted result in e->p[0..w), m = "remove"
    bool prevm = false;
    switch (behavior) {
    case SB_ISOLATED:
        for (size_t i = 0; i < e->n; i++) e->p[w++] = (ev){e->p[i].a, e->p[i].b, false};
        break;
    case SB_REMOVED:
        for (size_t i = 0; i < e->n; i++) e->p[w++] = e->p[i];
        break;
    case SB_MERGED_PREV:
        for (size_t i = 0; i < e->n; i++) {
            ev x = e->p[i];
            if (x.m && !prevm && w) e->p[w - 1].b = x.b;
            else e->p[w++] = (ev){x.a, x.b, false};
            prevm = x.m;
        }
        break;
    case SB_CONTIGUOUS:
        for (size_t i = 0; i < e->n; i++) {
            ev x = e->p[i];
            if (x.m == prevm && w) e->p[w - 1].b = x.b;
            else e->p[w++] = (ev){x.a, x.b, false};
            prevm = x.m;
        }
        break;
    case SB_MERGED_NEXT: {                         // the mirror of MergedWithPrevious, right to left
        size_t r = e->n;
        for (size_t i = e->n; i-- > 0;) {
            ev x = e->p[i];
            if (x.m && !prevm && r < e->n) e->p[r].a = x.a;
            else e->p[--r] = (ev){x.a, x.b, false};
            prevm = x.m;
        }
        memmove(e->p, e->p + r, (e->n - r) * sizeof *e->p);
        w = e->n - r;
        break;
    }
    }
    for (size_t i = 0; i < w; i++)
        if (!e->p[i].m && e->p[i].b > e->p[i].a) span_put(st, k, base + e->p[i].a, e->p[i].b - e->p[i].a);
}

int tk_pretok_run(const tk_pretok *steps, size_t n, const char *text, size_t len, tk_pretok_state *st,
                  td_error *err)
{
    int bc = 0, sc = 0;                            // current buffer, current span list
    st->buf[0].n = 0;
    tk_buf_put(&st->buf[0], text, len);
    st->nsp[0] = 0;
    if (len) span_put(st, 0, 0, len);
    if (!st->md) {
        st->md = pcre2_match_data_create(4, NULL);
        st->mctx = pcre2_match_context_create(NULL);
        st->jit = pcre2_jit_stack_create(32 * 1024, 8 * 1024 * 1024, NULL);
        pcre2_jit_stack_assign(st->mctx, NULL, st->jit);
    }
    evs e = {0};
    int rc = 0;
    for (size_t s = 0; s < n && !rc; s++) {
        const tk_pretok *p = &steps[s];
        if (p->kind == PT_BYTELEVEL && p->add_prefix_space) {     // " " before every piece lacking one
            tk_buf *src = &st->buf[bc], *dst = &st->buf[1 - bc];
            dst->n = 0;
            st->nsp[1 - sc] = 0;
            for (size_t i = 0; i < st->nsp[sc]; i++) {
                tk_span x = st->sp[sc][i];
                size_t off = dst->n;
                if (src->p[x.off] != ' ') tk_buf_put(dst, " ", 1);
                tk_buf_put(dst, src->p + x.off, x.len);
                span_put(st, 1 - sc, off, dst->n - off);
            }
            bc = 1 - bc;
            sc = 1 - sc;
        }
        if (p->re) {
            st->nsp[1 - sc] = 0;
            for (size_t i = 0; i < st->nsp[sc] && !rc; i++) {
                tk_span x = st->sp[sc][i];
                e.n = 0;
                rc = find_matches(p->re, st->buf[bc].p + x.off, x.len, st, &e, err);
                if (!rc) apply_behavior(&e, p->behavior, p->invert, st, 1 - sc, x.off);
            }
            sc = 1 - sc;
        }
        if (p->kind == PT_BYTELEVEL) {                             // bytes → byte-level characters
            tk_buf *src = &st->buf[bc], *dst = &st->buf[1 - bc];
            dst->n = 0;
            st->nsp[1 - sc] = 0;
            for (size_t i = 0; i < st->nsp[sc]; i++) {
                tk_span x = st->sp[sc][i];
                size_t off = dst->n;
                tk_bytelevel_map(dst, src->p + x.off, x.len);
                span_put(st, 1 - sc, off, dst->n - off);
            }
            bc = 1 - bc;
            sc = 1 - sc;
        }
    }
    free(e.p);
    st->cur = bc;
    if (sc != bc) {                                /* the caller reads spans and buffer under one index */
        tk_span *t = st->sp[0]; st->sp[0] = st->sp[1]; st->sp[1] = t;
        size_t tn = st->nsp[0]; st->nsp[0] = st->nsp[1]; st->nsp[1] = tn;
        size_t tc = st->capsp[0]; st->capsp[0] = st->capsp[1]; st->capsp[1] = tc;
    }
    return rc;
}
