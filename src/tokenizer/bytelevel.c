/* Byte-level alphabet (GPT-2 bytes_to_unicode) and UTF-8 helpers.
 *
 * GPT-2 gives each of the 256 byte values a printable character so that BPE can work on
 * text: bytes '!'..'~', 0xA1..0xAC and 0xAE..0xFF stand for themselves (as code points), the
 * other 68 bytes (controls, space, 0x7F..0xA0, 0xAD) get U+0100, U+0101, ... in byte order.
 * So a space is 'Ġ' (U+0120) and a newline 'Ċ' (U+010A).
 */
#include "tok_internal.h"

static pthread_once_t bl_once = PTHREAD_ONCE_INIT;
static uint16_t bl_cp[256];         // byte → code point
static int16_t  bl_byte[324];       // code point (< 324) → byte or -1

static void bl_fill(void)
{
    for (int c = 0; c < 324; c++) bl_byte[c] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        bl_cp[b] = (uint16_t)(self ? b : 256 + extra++);
        bl_byte[bl_cp[b]] = (int16_t)b;
    }
}

static void bl_init(void) { pthread_once(&bl_once, bl_fill); }

static inline int byte_utf8(uint8_t b, char out[2])      // after bl_init
{
    uint32_t cp = bl_cp[b];
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6));
    out[1] = (char)(0x80 | (cp & 0x3F));
    return 2;
}

int tk_byte_to_utf8(uint8_t b, char out[2])
{
    bl_init();
    return byte_utf8(b, out);
}

int tk_char_to_byte(uint32_t cp)
{
    bl_init();
    return cp < 324 ? bl_byte[cp] : -1;
}

void tk_bytelevel_map(tk_buf *out, const char *s, size_t n)
{
    char tmp[512];
    size_t k = 0;
    bl_init();
    for (size_t i = 0; i < n; i++) {
        k += (size_t)byte_utf8((uint8_t)s[i], tmp + k);
        if (k > sizeof tmp - 2) { tk_buf_put(out, tmp, k); k = 0; }
    }
    tk_buf_put(out, tmp, k);
}

bool tk_bytelevel_unmap(tk_buf *out, const char *t, size_t n)
{
    size_t start = out->n;
    bl_init();
    for (size_t i = 0; i < n;) {
        size_t adv;
        uint32_t cp = tk_utf8_next((const uint8_t *)t + i, &adv);
        int b = cp < 324 ? bl_byte[cp] : -1;
        if (b < 0) { out->n = start; return false; }
        uint8_t c = (uint8_t)b;
        tk_buf_put(out, &c, 1);
        i += adv;
    }
    return true;
}

uint32_t tk_utf8_next(const uint8_t *s, size_t *adv)
{
    uint8_t c = s[0];
    if (c < 0x80) { *adv = 1; return c; }
    if (c < 0xE0) { *adv = 2; return ((uint32_t)(c & 0x1F) << 6) | (s[1] & 0x3F); }
    if (c < 0xF0) { *adv = 3; return ((uint32_t)(c & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F); }
    *adv = 4;
    return ((uint32_t)(c & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) | (s[3] & 0x3F);
}

int tk_utf8_put(char out[4], uint32_t cp)
{
    if (cp < 0x80) { out[0] = (char)cp; return 1; }
    if (cp < 0x800) { out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | (cp >> 12)); out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F)); return 3;
    }
    out[0] = (char)(0xF0 | (cp >> 18)); out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Length of the valid UTF-8 sequence at s (n bytes left), or 0 when it is invalid; in that
 * case *bad gets the length of the maximal invalid subsequence (the prefix of a valid
 * sequence that the bytes begin, at least 1) — Unicode's "maximal subpart" practice, which
 * is what Rust's from_utf8_lossy replaces with one U+FFFD each. */
static size_t utf8_seq(const uint8_t *s, size_t n, size_t *bad)
{
    uint8_t c = s[0];
    if (c < 0x80) return 1;
    size_t need;
    uint8_t lo = 0x80, hi = 0xBF;            // allowed range of the second byte
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) { need = 3; if (c == 0xE0) lo = 0xA0; if (c == 0xED) hi = 0x9F; }
    else if (c >= 0xF0 && c <= 0xF4) { need = 4; if (c == 0xF0) lo = 0x90; if (c == 0xF4) hi = 0x8F; }
    else { *bad = 1; return 0; }
    size_t i = 1;
    for (; i < need; i++) {
        if (i >= n) break;
        uint8_t l = i == 1 ? lo : 0x80, h = i == 1 ? hi : 0xBF;
        if (s[i] < l || s[i] > h) break;
    }
    if (i == need) return need;
    *bad = i;
    return 0;
}

size_t tk_utf8_check(const uint8_t *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        size_t bad, k = utf8_seq(s + i, n - i, &bad);
        if (!k) return i;
        i += k;
    }
    return n;
}

void tk_utf8_lossy(tk_buf *out, const uint8_t *s, size_t n)
{
    size_t i = 0, run = 0;                   // [run, i) is valid and not yet copied
    while (i < n) {
        if (s[i] < 0x80) { i++; continue; }
        size_t bad, k = utf8_seq(s + i, n - i, &bad);
        if (k) { i += k; continue; }
        tk_buf_put(out, s + run, i - run);
        tk_buf_put(out, "\xEF\xBF\xBD", 3);
        i += bad;
        run = i;
    }
    tk_buf_put(out, s + run, i - run);
}
