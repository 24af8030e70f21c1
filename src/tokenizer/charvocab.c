/* Character vocabulary of tidal's task models, written as a tokenizer.json that HF
 * `tokenizers` loads and td_tokenizer_load reads back:
 *   model        BPE without merges (every character of the alphabet is a token, specials first),
 *                unk_token for characters outside the alphabet
 *   added_tokens the specials (special: true, normalized: false), so "<bos>" in text is one token
 *   pre_tokenizer none (a BPE word without merges is already split into characters)
 *   post_processor TemplateProcessing "<bos> $A" when bos_token is set
 *   decoder      Fuse (tokens concatenated: decode(encode(s)) == s for text in the alphabet) */
#include "tok_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *td_charvocab_default_alphabet(void)
{
    return "0123456789"
           "abcdefghijklmnopqrstuvwxyz"
           "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
           " \n+-*/=()<>.,:;!?^%&|_'\"[]{}#@$~`\\";
}

td_charvocab_spec td_charvocab_default_spec(void)
{
    static const char *const specials[] = {"<pad>", "<bos>", "<eos>", "<unk>"};
    return (td_charvocab_spec){
        .alphabet = td_charvocab_default_alphabet(), .specials = specials, .n_specials = 4,
        .unk_token = "<unk>", .bos_token = "<bos>", .eos_token = "<eos>", .pad_token = "<pad>",
    };
}

static int special_index(const td_charvocab_spec *s, const char *name, const char *what, td_error *err)
{
    if (!name) return -1;
    for (size_t i = 0; i < s->n_specials; i++) if (strcmp(s->specials[i], name) == 0) return (int)i;
    return td_fail(err, "char vocabulary: %s \"%s\" is not one of the special tokens", what, name) - 1;  // -2
}

static int write_json(json_t *j, const char *dir, const char *name, td_error *err)
{
    size_t dl = strlen(dir);
    char *path = td_xmalloc(dl + strlen(name) + 8), *tmp = td_xmalloc(dl + strlen(name) + 16);
    sprintf(path, "%s/%s", dir, name);
    sprintf(tmp, "%s/.%s.tmp", dir, name);
    int rc = 0;
    if (json_dump_file(j, tmp, JSON_INDENT(2) | JSON_ENSURE_ASCII | JSON_PRESERVE_ORDER) != 0 || rename(tmp, path) != 0) {
        remove(tmp);
        rc = td_fail(err, "%s: cannot write (does the folder exist and is it writable?)", path);
    }
    free(path);
    free(tmp);
    return rc;
}

int td_charvocab_write(const char *dir, const td_charvocab_spec *s, td_error *err)
{
    size_t alen = s->alphabet ? strlen(s->alphabet) : 0;
    if (!alen) return td_fail(err, "char vocabulary: the alphabet is empty");
    if (tk_utf8_check((const uint8_t *)s->alphabet, alen) != alen) return td_fail(err, "char vocabulary: the alphabet is not valid UTF-8");
    int unk = special_index(s, s->unk_token, "unk_token", err), bos = special_index(s, s->bos_token, "bos_token", err);
    int eos = special_index(s, s->eos_token, "eos_token", err), pad = special_index(s, s->pad_token, "pad_token", err);
    if (unk < -1 || bos < -1 || eos < -1 || pad < -1) return -1;

    json_t *vocab = json_object(), *added = json_array();
    int rc = -1;
    json_t *root = NULL, *cfg = NULL;
    int32_t id = 0;
    for (size_t i = 0; i < s->n_specials; i++, id++) {
        const char *sp = s->specials[i];
        if (!sp || !*sp || json_object_get(vocab, sp)) { td_fail(err, "char vocabulary: special token %zu is empty or repeated", i); goto out; }
        json_object_set_new(vocab, sp, json_integer(id));
        json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", id, "content", sp,
                                               "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0, "special", 1));
    }
    for (size_t i = 0; i < alen;) {
        size_t adv;
        tk_utf8_next((const uint8_t *)s->alphabet + i, &adv);
        char ch[5] = {0};
        memcpy(ch, s->alphabet + i, adv);
        if (ch[0] == 0 || json_object_get(vocab, ch)) {
            td_fail(err, "char vocabulary: character \"%s\" appears twice (or is a special token)", ch);
            goto out;
        }
        json_object_set_new(vocab, ch, json_integer(id++));
        i += adv;
    }
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:[]}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 0, "vocab", json_incref(vocab), "merges");
    if (unk >= 0) json_object_set_new(model, "unk_token", json_string(s->unk_token));
    json_t *post = json_null();
    if (bos >= 0) {
        const char *b = s->bos_token;
        post = json_pack("{s:s, s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}], s:[{s:{s:s,s:i}}, {s:{s:s,s:i}}, {s:{s:s,s:i}}], s:{s:{s:s, s:[i], s:[s]}}}",
                         "type", "TemplateProcessing",
                         "single", "SpecialToken", "id", b, "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                         "pair", "SpecialToken", "id", b, "type_id", 0, "Sequence", "id", "A", "type_id", 0,
                         "Sequence", "id", "B", "type_id", 1,
                         "special_tokens", b, "id", b, "ids", bos, "tokens", b);
    }
    root = json_pack("{s:s, s:n, s:n, s:o, s:n, s:n, s:o, s:{s:s}, s:o}", "version", "1.0", "truncation", "padding",
                     "added_tokens", json_incref(added), "normalizer", "pre_tokenizer", "post_processor", post,
                     "decoder", "type", "Fuse", "model", model);
    cfg = json_pack("{s:s, s:b, s:b, s:i}", "tokenizer_class", "PreTrainedTokenizerFast", "add_bos_token", 0,
                    "add_eos_token", 0, "model_max_length", 1 << 20);
    const char *names[4] = {"bos_token", "eos_token", "pad_token", "unk_token"};
    const char *vals[4] = {s->bos_token, s->eos_token, s->pad_token, s->unk_token};
    for (int i = 0; i < 4; i++) json_object_set_new(cfg, names[i], vals[i] ? json_string(vals[i]) : json_null());
    if (!root || !cfg) { td_fail(err, "char vocabulary: building the JSON failed"); goto out; }
    rc = write_json(root, dir, "tokenizer.json", err) || write_json(cfg, dir, "tokenizer_config.json", err) ? -1 : 0;
out:
    json_decref(vocab);
    json_decref(added);
    json_decref(root);
    json_decref(cfg);
    return rc;
}
