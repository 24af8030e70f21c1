/* Fuzz target: tokenizer.json (td_tokenizer_load), then encode and decode a fixed battery of
 * texts with whatever the file set up (added tokens, regex pre-tokenizers, merges, templates),
 * so a loader that accepts a file the encoder cannot use shows up here. */
#include "fuzz_util.h"
#include "tidal/tokenizer.h"

static const char *const TEXTS[] = {
    "Hello world! 12345 <|endoftext|> <s>",
    "  leading spaces\n\ttabs and\r\nnewlines   ",
    "caf\xc3\xa9 na\xc3\xafve \xe4\xb8\xad\xe6\x96\x87 \xf0\x9f\x98\x80 e\xcc\x81",
    "(3+4)*5=35; x_1 != y-2?",
    "",
};

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char path[600];
    fz_write(path, sizeof path, "tokenizer.json", data, size);
    td_error err;
    td_tokenizer *tok = td_tokenizer_load(path, &err);
    if (!tok) return 0;
    for (size_t i = 0; i < sizeof TEXTS / sizeof TEXTS[0]; i++) {
        for (int mode = 0; mode < 2; mode++) {
            int32_t *ids = NULL;
            size_t n = 0;
            if (td_tokenizer_encode(tok, TEXTS[i], strlen(TEXTS[i]), mode, mode, &ids, &n, &err) == 0) {
                char *s = td_tokenizer_decode(tok, ids, n, mode, NULL);
                free(s);
            }
            free(ids);
        }
    }
    size_t V = td_tokenizer_vocab_size(tok);
    int32_t probe[4] = {0, (int32_t)(V ? V - 1 : 0), (int32_t)V, -1};
    char *s = td_tokenizer_decode(tok, probe, 4, false, NULL);
    free(s);
    for (int i = 0; i < 4; i++) td_tokenizer_token_str(tok, probe[i]);
    td_tokenizer_bos_id(tok);
    td_tokenizer_eos_id(tok);
    td_tokenizer_free(tok);
    return 0;
}
