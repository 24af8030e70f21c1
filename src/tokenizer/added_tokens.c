/* Added tokens are split off the text before normalization and pre-tokenization, as HF's
 * AddedVocabulary does: matches are found leftmost-longest over all added tokens of a pass
 * (an Aho-Corasick automaton in HF; here buckets by first byte, longest first), then each
 * match is kept or skipped (a special token when special tokens are not allowed; a
 * single_word token touching a word character) and widened over whitespace (lstrip, rstrip).
 * A skipped match is not searched again for shorter tokens, exactly like HF's loop. */
#include "tok_internal.h"

#include <stdlib.h>
#include <string.h>

static int by_first_then_longest(const void *a, const void *b)
{
    const tk_added *x = *(const tk_added *const *)a, *y = *(const tk_added *const *)b;
    uint8_t fx = (uint8_t)x->content[0], fy = (uint8_t)y->content[0];
    if (fx != fy) return fx < fy ? -1 : 1;
    if (x->len != y->len) return x->len > y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void tk_matcher_build(tk_matcher *m, const tk_added *all, size_t n_all, bool normalized)
{
    memset(m, 0, sizeof *m);
    m->sorted = td_xcalloc(n_all ? n_all : 1, sizeof *m->sorted);
    for (size_t i = 0; i < n_all; i++)
        if (all[i].normalized == normalized && all[i].len) m->sorted[m->n++] = &all[i];
    qsort(m->sorted, m->n, sizeof *m->sorted, by_first_then_longest);
    size_t k = 0;
    for (int b = 0; b <= 256; b++) {
        m->first[b] = (uint32_t)k;
        while (b < 256 && k < m->n && (uint8_t)m->sorted[k]->content[0] == b) k++;
    }
}

void tk_matcher_free(tk_matcher *m)
{
    free(m->sorted);
    memset(m, 0, sizeof *m);
}

static bool is_white_space(uint32_t c)                 // Rust char::is_whitespace (White_Space)
{
    return (c >= 9 && c <= 13) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
           c == 0x3000;
}

/* Rust regex \w (Unicode): Alphabetic, marks, decimal digits, connector punctuation, joiners. */
static bool is_word_char(uint32_t c)
{
    static pcre2_code *re;                                  // compiled once; benign race at worst
    pcre2_code *r = __atomic_load_n(&re, __ATOMIC_ACQUIRE);
    if (!r) {
        int ec; PCRE2_SIZE eo;
        r = pcre2_compile((PCRE2_SPTR) "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}]",
                          PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &ec, &eo, NULL);
        pcre2_code *expected = NULL;
        if (!__atomic_compare_exchange_n(&re, &expected, r, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE)) {
            pcre2_code_free(r);
            r = expected;
        }
    }
    char u[4];
    int n = tk_utf8_put(u, c);
    pcre2_match_data *md = pcre2_match_data_create(1, NULL);
    int rc = pcre2_match(r, (PCRE2_SPTR)u, (size_t)n, 0, PCRE2_ANCHORED, md, NULL);
    pcre2_match_data_free(md);
    return rc >= 0;
}

static uint32_t last_char(const char *s, size_t n)       // n > 0, s valid UTF-8
{
    size_t i = n - 1, adv;
    while (i && ((uint8_t)s[i] & 0xC0) == 0x80) i--;
    return tk_utf8_next((const uint8_t *)s + i, &adv);
}

static void piece_put(tk_piece **p, size_t *n, size_t *cap, size_t off, size_t len, int32_t id)
{
    if (*n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        *p = tk_xrealloc(*p, *cap * sizeof **p);
    }
    (*p)[(*n)++] = (tk_piece){off, len, id};
}

void tk_added_split(const tk_matcher *m, const char *text, size_t len, bool allow_special,
                    tk_piece **pieces, size_t *n, size_t *cap)
{
    size_t pos = 0, start_offset = 0;
    while (m->n && pos < len) {
        const tk_added *hit = NULL;
        size_t at = pos;
        for (; at < len && !hit; at++) {                  // leftmost position with a match
            uint8_t b = (uint8_t)text[at];
            for (uint32_t k = m->first[b]; k < m->first[b + 1]; k++) {
                const tk_added *t = m->sorted[k];
                if (t->len <= len - at && memcmp(text + at, t->content, t->len) == 0) { hit = t; break; }
            }
        }
        if (!hit) break;
        size_t start = at - 1, stop = start + hit->len;
        pos = stop;
        if (hit->special && !allow_special) continue;
        if (hit->single_word) {
            size_t adv;
            bool start_space = start == 0 || !is_word_char(last_char(text, start));
            bool stop_space = stop == len || !is_word_char(tk_utf8_next((const uint8_t *)text + stop, &adv));
            if (!start_space || !stop_space) continue;
        }
        if (hit->lstrip) {
            size_t s = start;                                  // leftmost of the whitespace run before
            while (s > 0) {
                size_t i = s - 1;
                while (i && ((uint8_t)text[i] & 0xC0) == 0x80) i--;
                size_t adv;
                if (!is_white_space(tk_utf8_next((const uint8_t *)text + i, &adv))) break;
                s = i;
            }
            start = s > start_offset ? s : start_offset;
        }
        if (hit->rstrip) {
            while (stop < len) {
                size_t adv;
                if (!is_white_space(tk_utf8_next((const uint8_t *)text + stop, &adv))) break;
                stop += adv;
            }
        }
        if (start > start_offset) piece_put(pieces, n, cap, start_offset, start - start_offset, -1);
        piece_put(pieces, n, cap, start, stop - start, hit->id);
        start_offset = stop;
    }
    if (start_offset < len) piece_put(pieces, n, cap, start_offset, len - start_offset, -1);
}
