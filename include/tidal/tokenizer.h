/* tidal — tokenizers: Hugging Face tokenizer.json (byte-level BPE as GPT-2, Llama 3 and
 * Qwen2/2.5/3 use it) and the character vocabulary of tidal's own task models.
 *
 * The contract is agreement with the HF `tokenizers` library, token for token:
 *   encode = added/special tokens split off first (leftmost-longest, raw text for
 *            normalized=false tokens, normalized text for the others) → normalizer (none or
 *            NFC) → pre-tokenizers (Split regexes through PCRE2, ByteLevel, Digits, Sequence)
 *            → BPE (merges by rank) → post-processor (TemplateProcessing, Roberta, Bert,
 *            ByteLevel; what HF `encode(text)` does with add_special_tokens=True).
 *   decode = ids → token strings (unknown ids dropped, special ones dropped on request) →
 *            decoder (ByteLevel, Fuse, or none = joined by spaces) → UTF-8; invalid UTF-8
 *            (an id sequence that splits a character) becomes U+FFFD per maximal invalid
 *            subsequence, exactly as Rust's String::from_utf8_lossy does.
 * Input text must be valid UTF-8 (HF works on Rust strings, which are): invalid input is an
 * error that names the byte offset, never silently changed.
 * A td_tokenizer is read-only after loading; encode and decode may run from many threads.
 */
#ifndef TIDAL_TOKENIZER_H
#define TIDAL_TOKENIZER_H

#include "tidal/common.h"

#include <stdbool.h>

TD_BEGIN_DECLS

typedef struct td_tokenizer td_tokenizer;

/* Loads PATH (a tokenizer.json). A tokenizer_config.json in the same folder, when present,
 * supplies bos_token / eos_token (td_tokenizer_bos_id / eos_id) and, only for a tokenizer.json
 * without a post-processor, add_bos_token / add_eos_token. NULL + err on failure; an
 * unsupported model, normalizer, pre-tokenizer, post-processor or decoder is named. */
td_tokenizer *td_tokenizer_load(const char *tokenizer_json_path, td_error *err);
void td_tokenizer_free(td_tokenizer *tok);

/* Encodes len bytes of UTF-8 text. *ids is malloc'd (caller frees), *n its length.
 * allow_special: special added tokens written in the text ("<|endoftext|>") become their ids;
 *                false encodes them as plain text (HF `encode_special_tokens = True`).
 * add_special:   run the post-processor (BOS/EOS templates), HF `add_special_tokens`.
 * 0 on success; -1 + err for invalid UTF-8 or an internal limit. */
int td_tokenizer_encode(const td_tokenizer *tok, const char *text, size_t len, bool allow_special,
                        bool add_special, int32_t **ids, size_t *n, td_error *err);

/* Decodes ids to a NUL-terminated UTF-8 string (caller frees); *len_out (may be NULL) gets its
 * byte length. Ids outside the vocabulary are skipped, as HF does. skip_special drops special
 * added tokens (HF `decode(ids, skip_special_tokens=...)`, whose Python default is true). */
char *td_tokenizer_decode(const td_tokenizer *tok, const int32_t *ids, size_t n, bool skip_special,
                          size_t *len_out);

/* Token string of an id as tokenizer.json spells it (byte-level form, "Ġthe"); NULL if none. */
const char *td_tokenizer_token_str(const td_tokenizer *tok, int32_t id);
/* Id of a token string (added tokens first, then the model vocabulary); -1 if none. */
int32_t td_tokenizer_token_id(const td_tokenizer *tok, const char *token);
/* One past the largest id (model vocabulary and added tokens). */
size_t td_tokenizer_vocab_size(const td_tokenizer *tok);
/* From tokenizer_config.json (or the post-processor's first/last special token); -1 if none. */
int32_t td_tokenizer_bos_id(const td_tokenizer *tok);
int32_t td_tokenizer_eos_id(const td_tokenizer *tok);
bool td_tokenizer_is_special(const td_tokenizer *tok, int32_t id);
/* The chat template text (tokenizer_config.json "chat_template", its "default" entry when it
 * is a list, or chat_template.jinja beside it); NULL if none. *from (may be NULL) gets the file. */
const char *td_tokenizer_chat_template(const td_tokenizer *tok, const char **from);
/* --chat-template FILE (TRL's chat_template_path): the Jinja template in FILE replaces the
 * checkpoint's; checked to parse. 0, or -1 + err naming the file. */
int td_tokenizer_set_chat_template(td_tokenizer *tok, const char *path, td_error *err);

/* ---- character vocabulary for tidal's task models ----
 * Every character of `alphabet` (UTF-8) is one token; special tokens come first (ids 0..).
 * Written as a tokenizer.json that HF `tokenizers` loads (BPE model without merges, no
 * pre-tokenizer, Fuse decoder, TemplateProcessing that prepends bos_token when set) plus a
 * tokenizer_config.json naming bos/eos/pad/unk. td_tokenizer_load reads it back. */
typedef struct {
    const char *alphabet;          // UTF-8; each character one token, duplicates rejected
    const char *const *specials;   // (n_specials) e.g. "<pad>", "<bos>", "<eos>", "<unk>"
    size_t n_specials;
    const char *unk_token;         // one of specials, or NULL: unknown characters are dropped
    const char *bos_token;         // one of specials, or NULL: nothing prepended
    const char *eos_token;         // one of specials, or NULL (config only, never appended)
    const char *pad_token;         // one of specials, or NULL (config only)
} td_charvocab_spec;

/* Digits, ASCII letters, space, newline and the operators/punctuation of tidal's task data. */
const char *td_charvocab_default_alphabet(void);
/* The default spec: <pad> <bos> <eos> <unk> and td_charvocab_default_alphabet(). */
td_charvocab_spec td_charvocab_default_spec(void);
/* Writes DIR/tokenizer.json and DIR/tokenizer_config.json (DIR must exist). */
int td_charvocab_write(const char *dir, const td_charvocab_spec *spec, td_error *err);

TD_END_DECLS

#endif
