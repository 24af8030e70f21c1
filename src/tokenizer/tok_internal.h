/* Internal structures shared by the tokenizer sources (not a public header).
 *
 * Layout of a loaded tokenizer:
 *   vocab       model vocabulary, string → id and id → string (BPE "vocab")
 *   merges      (left id, right id) → (rank, merged id)
 *   added       added tokens in tokenizer.json order, split off before the model runs
 *   pretok      flattened pre-tokenizer steps (a Sequence becomes its members in order)
 *   post        ids placed before / after the sequence by the post-processor
 */
#ifndef TIDAL_TOK_INTERNAL_H
#define TIDAL_TOK_INTERNAL_H

#include "tidal/tokenizer.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

/* realloc that reports file and line and exits on failure, as td_xmalloc does: for buffers
 * that grow with text already in memory, never for sizes read from a file. */
void *tk_xrealloc_at(void *p, size_t size, const char *file, int line);
#define tk_xrealloc(p, sz) tk_xrealloc_at((p), (sz), __FILE__, __LINE__)

/* ---- growable byte and id buffers ---- */
typedef struct { char *p; size_t n, cap; } tk_buf;
typedef struct { int32_t *p; size_t n, cap; } tk_ids;
void tk_buf_put(tk_buf *b, const void *s, size_t n);
void tk_ids_put(tk_ids *v, int32_t id);

/* ---- string → int32 hash map; keys are copied into the map ---- */
typedef struct { const char *key; uint32_t len; int32_t val; } tk_entry;
typedef struct {
    tk_entry *e;      // (cap) open addressing, key == NULL marks an empty slot
    size_t cap, n;    // cap is a power of two, kept at most half full
} tk_strmap;
uint64_t tk_hash(const void *s, size_t n);
/* Inserts (copy of key) → val; returns false if the key was already there (value unchanged). */
bool tk_strmap_put(tk_strmap *m, const char *key, size_t len, int32_t val);
/* Value for key, or -1. */
int32_t tk_strmap_get(const tk_strmap *m, const char *key, size_t len);
void tk_strmap_free(tk_strmap *m);

/* ---- byte-level alphabet (GPT-2 bytes_to_unicode) ---- */
/* UTF-8 of the character that stands for byte b: 1 or 2 bytes, written to out; returns length. */
int tk_byte_to_utf8(uint8_t b, char out[2]);
/* Byte that the code point cp stands for, or -1 when cp is not in the byte-level alphabet. */
int tk_char_to_byte(uint32_t cp);
/* Appends s with every byte replaced by its byte-level character. */
void tk_bytelevel_map(tk_buf *out, const char *s, size_t n);
/* Appends the bytes of token text t (byte-level characters back to bytes); false when some
 * character is outside the alphabet (the caller then uses the text itself, as HF does). */
bool tk_bytelevel_unmap(tk_buf *out, const char *t, size_t n);
/* Appends s as valid UTF-8: each maximal invalid subsequence becomes U+FFFD, exactly as Rust's
 * String::from_utf8_lossy (and so HF's ByteLevel decoder) does. */
void tk_utf8_lossy(tk_buf *out, const uint8_t *s, size_t n);
/* Byte offset of the first invalid UTF-8 sequence in s, or n when s is valid. */
size_t tk_utf8_check(const uint8_t *s, size_t n);
/* Decodes one code point of valid UTF-8 at s; *adv gets its length. */
uint32_t tk_utf8_next(const uint8_t *s, size_t *adv);
int tk_utf8_put(char out[4], uint32_t cp);

/* ---- NFC normalizer ---- */
/* Appends the NFC form of valid UTF-8 s. */
void tk_nfc(tk_buf *out, const char *s, size_t n);

/* ---- BPE model ---- */
typedef struct {
    tk_strmap vocab;          // token string → id
    char **id_str;            // (n_ids) token string per id, NULL for holes
    uint32_t *id_len;         // (n_ids)
    size_t n_ids;             // one past the largest model id
    struct tk_merge *merges;  // open-addressed (left,right) → rank,new_id
    size_t merges_cap, n_merges;
    int32_t unk_id;           // -1 if no unk_token
    bool fuse_unk, byte_fallback, ignore_merges;
    char *cont_prefix, *eow_suffix;   // continuing_subword_prefix, end_of_word_suffix or NULL
    int32_t byte_fallback_ids[256];   // <0xXX> ids when byte_fallback, else -1
} tk_bpe;
struct tk_merge { uint64_t pair; int32_t rank, new_id; };   // pair = left<<32 | right, 0 empty
int  tk_bpe_load(tk_bpe *bpe, json_t *model, const char *path, size_t max_ids, td_error *err);
void tk_bpe_free(tk_bpe *bpe);
/* Appends the ids of one pre-tokenized word. */
void tk_bpe_word(const tk_bpe *bpe, const char *w, size_t n, tk_ids *out);

/* ---- pre-tokenizers ---- */
enum { PT_SPLIT, PT_BYTELEVEL, PT_DIGITS };
enum { SB_REMOVED, SB_ISOLATED, SB_MERGED_PREV, SB_MERGED_NEXT, SB_CONTIGUOUS };
typedef struct {
    int kind;
    pcre2_code *re;           // Split pattern, ByteLevel's GPT-2 regex, Digits' \p{N}; or NULL
    int behavior;             // SB_*
    bool invert;              // Split: matches and gaps swap roles
    bool add_prefix_space;    // ByteLevel
} tk_pretok;
/* Parses a pre_tokenizer JSON value (object or null) into steps (appended to *steps). */
int tk_pretok_load(json_t *j, const char *path, tk_pretok **steps, size_t *n, td_error *err);
void tk_pretok_free(tk_pretok *steps, size_t n);
/* One piece of text during pre-tokenization: bytes [off, off+len) of a buffer. */
typedef struct { size_t off, len; } tk_span;
typedef struct {
    tk_buf buf[2];            // current pieces live in buf[cur]
    int cur;
    tk_span *sp[2]; size_t nsp[2], capsp[2];
    pcre2_match_data *md;
    pcre2_jit_stack *jit;
    pcre2_match_context *mctx;
} tk_pretok_state;
void tk_pretok_state_init(tk_pretok_state *st);
void tk_pretok_state_free(tk_pretok_state *st);
/* Runs all steps over text; the pieces are then st->sp[st->cur][0..nsp) in st->buf[st->cur]. */
int tk_pretok_run(const tk_pretok *steps, size_t n, const char *text, size_t len, tk_pretok_state *st,
                  td_error *err);
/* Compiles a regex with HF (Oniguruma) semantics; exposed for tests of the \s rewrite. */
pcre2_code *tk_regex_compile(const char *pattern, size_t len, bool literal, const char *path, td_error *err);

/* ---- added tokens ---- */
typedef struct {
    char *content; uint32_t len;
    int32_t id;
    bool special, normalized, lstrip, rstrip, single_word;
} tk_added;
typedef struct {
    const tk_added *tok;      // (n) the tokens of this pass, longest first within a first byte
    size_t n;
    uint32_t first[257];      // tokens with first byte b are tok[first[b] .. first[b+1])
    const tk_added **sorted;  // (n)
} tk_matcher;
/* Builds the matcher over the tokens whose `normalized` flag equals `normalized`. */
void tk_matcher_build(tk_matcher *m, const tk_added *all, size_t n_all, bool normalized);
void tk_matcher_free(tk_matcher *m);
/* Splits text into pieces: (id >= 0: that added token) or (id == -1: plain text [off, off+len)).
 * Follows HF AddedVocabulary::find_matches (leftmost-longest, single_word, lstrip, rstrip);
 * special tokens are skipped when !allow_special. */
typedef struct { size_t off, len; int32_t id; } tk_piece;
void tk_added_split(const tk_matcher *m, const char *text, size_t len, bool allow_special,
                    tk_piece **pieces, size_t *n, size_t *cap);

/* ---- encode workspace: scratch buffers and a word → ids cache, reused across calls ----
 * Workspaces sit in a pool inside the tokenizer (taken and returned under a mutex), so a
 * const tokenizer can encode from many threads while each call reuses warm buffers and its
 * compiled-regex match data. The cache only skips recomputing tk_bpe_word: same ids. */
typedef struct { uint64_t h; uint32_t key_off, key_len, ids_off, n_ids; } tk_cache_slot;
typedef struct tk_work {
    tk_pretok_state st;
    tk_piece *p1, *p2; size_t c1, c2;
    tk_buf norm;
    tk_cache_slot *slots;     // (TK_CACHE_SLOTS) open addressing, key_len 0 = empty
    size_t n_cached;
    tk_buf keys;              // cached words, back to back
    tk_ids ids;               // their ids, back to back
    struct tk_work *next;     // pool link
} tk_work;
#define TK_CACHE_SLOTS 32768u
#define TK_CACHE_MAX_WORD 64u

/* ---- the tokenizer ---- */
enum { DEC_NONE, DEC_BYTELEVEL, DEC_FUSE };
struct td_tokenizer {
    char *path;
    tk_bpe bpe;
    tk_added *added; size_t n_added;          // tokenizer.json "added_tokens"
    tk_strmap added_by_str;                  // content → index in added
    int32_t *added_by_id;                    // (n_ids) index in added, or -1
    tk_matcher raw_match, norm_match;        // normalized=false / normalized=true tokens
    bool nfc;                                // normalizer NFC
    tk_pretok *pretok; size_t n_pretok;
    tk_ids post_before, post_after;          // post-processor ids around the sequence
    int decoders[8]; size_t n_decoders;      // DEC_* in order; none = join with " "
    size_t n_ids;                            // one past the largest id
    int32_t bos_id, eos_id;
    char *chat_template;          /* tokenizer_config.json "chat_template" / chat_template.jinja, or NULL */
    char *chat_template_from;     /* the file it came from */
    tk_work *pool;                           // idle encode workspaces
    pthread_mutex_t pool_lock;
};

#endif
