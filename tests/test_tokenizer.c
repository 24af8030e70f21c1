/* Tokenizer unit tests: hand-checked BPE merges, byte-level mapping, U+FFFD replacement on
 * decode (Rust from_utf8_lossy rules, worked out by hand from the UTF-8 tables), added and
 * special tokens, NFC, the char vocabulary round trip, and bad files with their messages.
 * Agreement with HF `tokenizers` on thousands of strings is tests/py/test_tokenizer_hf.py. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "testutil.h"

#include "tidal/tokenizer.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char tmpdir[64];

static const char *write_file(const char *name, const char *text)
{
    static char path[256];
    snprintf(path, sizeof path, "%s/%s", tmpdir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    return path;
}

static td_tokenizer *load_text(const char *json)
{
    unlink(write_file("tokenizer_config.json", ""));
    td_error err = {{0}};
    td_tokenizer *t = td_tokenizer_load(write_file("tokenizer.json", json), &err);
    if (!t) fprintf(stderr, "load failed: %s\n", err.msg);
    assert_non_null(t);
    return t;
}

/* Loads json expecting failure; returns the message. */
static const char *load_fail(const char *json)
{
    static td_error err;
    memset(&err, 0, sizeof err);
    td_tokenizer *t = td_tokenizer_load(write_file("tokenizer.json", json), &err);
    assert_null(t);
    return err.msg;
}

static void expect_ids(const td_tokenizer *t, const char *text, bool allow_special, bool add_special,
                       const int32_t *want, size_t n_want)
{
    int32_t *ids;
    size_t n;
    td_error err;
    assert_int_equal(td_tokenizer_encode(t, text, strlen(text), allow_special, add_special, &ids, &n, &err), 0);
    if (n != n_want) {
        fprintf(stderr, "\"%s\": got", text);
        for (size_t i = 0; i < n; i++) fprintf(stderr, " %d", ids[i]);
        fprintf(stderr, "\n");
    }
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++) assert_int_equal(ids[i], want[i]);
    free(ids);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t)

/* Merges by rank: "b c" (rank 0) before "a b" (rank 1), so "abc" = a + bc → abc via "a bc". */
static void test_bpe_rank_order(void **state)
{
    td_tokenizer *t = load_text(
        "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\":0, \"b\":1, \"c\":2, \"ab\":3, \"bc\":4, \"abc\":5, \"aa\":6},"
        " \"merges\": [\"b c\", \"a b\", [\"a\", \"bc\"], \"a a\"]}}");
    expect_ids(t, "abc", true, true, IDS(5));
    expect_ids(t, "ab", true, true, IDS(3));
    expect_ids(t, "aaa", true, true, IDS(6, 0));       // equal ranks: leftmost pair first
    expect_ids(t, "cab", true, true, IDS(2, 3));
    expect_ids(t, "", true, true, NULL, 0);
    assert_int_equal(td_tokenizer_vocab_size(t), 7);
    assert_string_equal(td_tokenizer_token_str(t, 4), "bc");
    assert_int_equal(td_tokenizer_token_id(t, "abc"), 5);
    td_tokenizer_free(t);
}

/* GPT-2 bytes_to_unicode, written out again here as the reference. */
static int bl_char(int b, char out[3])
{
    int cp = b, extra = 0;
    bool self = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    if (!self) {
        for (int k = 0; k < b; k++)
            if (!((k >= '!' && k <= '~') || (k >= 0xA1 && k <= 0xAC) || (k >= 0xAE && k <= 0xFF))) extra++;
        cp = 256 + extra;
    }
    if (cp < 0x80) { out[0] = (char)cp; out[1] = 0; return 1; }
    out[0] = (char)(0xC0 | (cp >> 6)); out[1] = (char)(0x80 | (cp & 0x3F)); out[2] = 0;
    return 2;
}

/* A byte-level tokenizer: ids 0..255 are the byte characters, then "Ġa" (256), "<|endoftext|>"
 * (257, special), "Ã©" (258, the bytes of é), with NFC when nfc. */
static td_tokenizer *byte_level(bool nfc, bool add_prefix_space)
{
    static char json[16384];
    size_t k = (size_t)snprintf(json, sizeof json, "{\"added_tokens\": [{\"id\": 257, \"content\": \"<|endoftext|>\", "
                                "\"special\": true, \"normalized\": false}], \"normalizer\": %s, "
                                "\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": %s}, "
                                "\"decoder\": {\"type\": \"ByteLevel\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {",
                                nfc ? "{\"type\": \"NFC\"}" : "null", add_prefix_space ? "true" : "false");
    for (int b = 0; b < 256; b++) {
        char c[3];
        bl_char(b, c);
        k += (size_t)snprintf(json + k, sizeof json - k, "\"%s%s\": %d, ", c[0] == '"' || c[0] == '\\' ? "\\" : "", c, b);
    }
    snprintf(json + k, sizeof json - k, "\"\\u0120a\": 256, \"<|endoftext|>\": 257, \"\\u00c3\\u00a9\": 258}, "
             "\"merges\": [\"\\u0120 a\", \"\\u00c3 \\u00a9\"]}}");
    return load_text(json);
}

static void test_byte_level_encode(void **state)
{
    td_tokenizer *t = byte_level(false, false);
    expect_ids(t, "a a", true, true, IDS('a', 256));                         // " a" = "Ġa"
    expect_ids(t, "\n", true, true, IDS('\n'));                              // byte 10 → 'Ċ' → id 10
    expect_ids(t, "x<|endoftext|>a", true, true, IDS('x', 257, 'a'));
    expect_ids(t, "<|endoftext|>", false, true, IDS('<', '|', 'e', 'n', 'd', 'o', 'f', 't', 'e', 'x', 't', '|', '>'));
    expect_ids(t, "\xc3\xa9", true, true, IDS(258));
    expect_ids(t, "e\xcc\x81", true, true, IDS('e', 0xCC, 0x81));            // no normalizer: stays decomposed
    assert_true(td_tokenizer_is_special(t, 257));
    assert_false(td_tokenizer_is_special(t, 256));
    int32_t *ids;
    size_t n;
    td_error err;
    assert_int_equal(td_tokenizer_encode(t, "ok\xff!", 4, true, true, &ids, &n, &err), -1);
    assert_non_null(strstr(err.msg, "not valid UTF-8 (byte 2"));
    td_tokenizer_free(t);
    t = byte_level(false, true);
    expect_ids(t, "a", true, true, IDS(256));                                // prefix space added
    expect_ids(t, " a", true, true, IDS(256));                               // not doubled
    td_tokenizer_free(t);
    t = byte_level(true, false);
    expect_ids(t, "e\xcc\x81", true, true, IDS(258));                        // NFC: e + U+0301 → é
    expect_ids(t, "\xe1\x84\x80\xe1\x85\xa1", true, true, IDS(0xEA, 0xB0, 0x80));  // Hangul L+V → U+AC00
    td_tokenizer_free(t);
}

static void expect_decode(const td_tokenizer *t, const int32_t *ids, size_t n, bool skip, const char *want)
{
    size_t len;
    char *s = td_tokenizer_decode(t, ids, n, skip, &len);
    assert_int_equal(len, strlen(want));
    assert_string_equal(s, want);
    free(s);
}

/* U+FFFD per maximal invalid subsequence (Unicode 15 §3.9 "U+FFFD substitution of maximal
 * subparts", what Rust's from_utf8_lossy implements): worked out by hand. */
static void test_decode_lossy(void **state)
{
    td_tokenizer *t = byte_level(false, false);
    expect_decode(t, IDS('a', 256, 257, 258), false, "a a<|endoftext|>\xc3\xa9");
    expect_decode(t, IDS('a', 256, 257, 258), true, "a a\xc3\xa9");
    expect_decode(t, IDS(0xF0, 0x9F, 0x98, 0x80), false, "\xf0\x9f\x98\x80");          // 😀 whole
    expect_decode(t, IDS(0xF0, 0x9F, 0x98, 'x'), false, "\xef\xbf\xbdx");              // cut: one U+FFFD
    expect_decode(t, IDS(0xED, 0xA0, 0x80), false, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");  // surrogate: 3
    expect_decode(t, IDS(0xC0, 0x80), false, "\xef\xbf\xbd\xef\xbf\xbd");              // overlong: 2
    expect_decode(t, IDS(0xE2, 0x82, 'A'), false, "\xef\xbf\xbd" "A");                 // E2 82 is one subpart
    expect_decode(t, IDS(0x98, 0x80, 0xFF), false, "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    expect_decode(t, IDS(0xF4, 0x90, 0x80, 0x80), false,                                // > U+10FFFF: 4
                  "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    expect_decode(t, IDS(-5, 99999, 'z'), false, "z");                                  // unknown ids dropped
    td_tokenizer_free(t);
}

static void test_template_and_config(void **state)
{
    const char *base =
        "{\"added_tokens\": [{\"id\": 3, \"content\": \"<s>\", \"special\": true, \"normalized\": false},"
        " {\"id\": 4, \"content\": \"</s>\", \"special\": true, \"normalized\": false}],"
        " \"post_processor\": %s, \"model\": {\"type\": \"BPE\", \"vocab\": {\"a\":0, \"b\":1, \"ab\":2}, \"merges\": [\"a b\"]}}";
    char json[2048];
    snprintf(json, sizeof json, base,
             "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}},"
             " {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}],"
             " \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [3], \"tokens\": [\"<s>\"]},"
             " \"</s>\": {\"id\": \"</s>\", \"ids\": [4], \"tokens\": [\"</s>\"]}}}");
    td_tokenizer *t = load_text(json);
    expect_ids(t, "abab", true, true, IDS(3, 2, 2, 4));
    expect_ids(t, "abab", true, false, IDS(2, 2));
    assert_int_equal(td_tokenizer_bos_id(t), 3);
    assert_int_equal(td_tokenizer_eos_id(t), 4);
    expect_decode(t, IDS(3, 2, 4), false, "<s> ab </s>");                 // no decoder: joined by spaces
    td_tokenizer_free(t);
    /* no post-processor: tokenizer_config.json's add_bos_token decides */
    snprintf(json, sizeof json, base, "null");
    write_file("tokenizer.json", json);
    write_file("tokenizer_config.json", "{\"bos_token\": {\"content\": \"<s>\"}, \"eos_token\": \"</s>\", \"add_bos_token\": true}");
    td_error err = {{0}};
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
    t = td_tokenizer_load(path, &err);
    assert_non_null(t);
    expect_ids(t, "ab", true, true, IDS(3, 2));
    assert_int_equal(td_tokenizer_eos_id(t), 4);
    td_tokenizer_free(t);
    write_file("tokenizer_config.json", "{\"bos_token\": \"<nope>\"}");
    assert_null(td_tokenizer_load(path, &err));
    assert_non_null(strstr(err.msg, "tokenizer_config.json: bos_token \"<nope>\" is not a token"));
    write_file("tokenizer_config.json", "{\"bos_token\": ");
    assert_null(td_tokenizer_load(path, &err));
    assert_non_null(strstr(err.msg, "tokenizer_config.json:1:"));
    unlink(write_file("tokenizer_config.json", ""));
}

static void test_charvocab(void **state)
{
    td_charvocab_spec spec = td_charvocab_default_spec();
    td_error err = {{0}};
    assert_int_equal(td_charvocab_write(tmpdir, &spec, &err), 0);
    char path[256];
    snprintf(path, sizeof path, "%s/tokenizer.json", tmpdir);
    td_tokenizer *t = td_tokenizer_load(path, &err);
    assert_non_null(t);
    /* ids: <pad>0 <bos>1 <eos>2 <unk>3, then '0'..'9' = 4..13, 'a' = 14 */
    expect_ids(t, "12+a", true, true, IDS(1, 5, 6, td_tokenizer_token_id(t, "+"), 14));
    expect_ids(t, "1\xc3\xa9<eos>", true, false, IDS(5, 3, 2));            // é is unknown
    assert_int_equal(td_tokenizer_bos_id(t), 1);
    assert_int_equal(td_tokenizer_eos_id(t), 2);
    expect_decode(t, IDS(1, 5, 6, 2), true, "12");
    expect_decode(t, IDS(1, 5, 6, 2), false, "<bos>12<eos>");
    assert_int_equal(td_tokenizer_vocab_size(t), 4 + strlen(td_charvocab_default_alphabet()));
    td_tokenizer_free(t);
    spec.alphabet = "abca";
    assert_int_equal(td_charvocab_write(tmpdir, &spec, &err), -1);
    assert_non_null(strstr(err.msg, "\"a\" appears twice"));
    spec = td_charvocab_default_spec();
    spec.bos_token = "<start>";
    assert_int_equal(td_charvocab_write(tmpdir, &spec, &err), -1);
    assert_non_null(strstr(err.msg, "bos_token \"<start>\" is not one of the special tokens"));
    unlink(path);
    snprintf(path, sizeof path, "%s/tokenizer_config.json", tmpdir);
    unlink(path);
}

static void test_bad_files(void **state)
{
    const char *m;
    m = load_fail("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}");
    assert_non_null(strstr(m, "model type \"Unigram\" is not supported"));
    /* a Unigram tokenizer.json as HF writes it (vocab is a list of [piece, score]), whose added
     * tokens lie past the list: refused by its type, not by the added token ids (issue 16) */
    m = load_fail("{\"added_tokens\": [{\"id\": 32000, \"content\": \"<pad>\", \"special\": true}],"
                  " \"pre_tokenizer\": {\"type\": \"Metaspace\", \"replacement\": \"\u2581\"},"
                  " \"model\": {\"type\": \"Unigram\", \"unk_id\": 0, \"vocab\": [[\"<unk>\", 0.0], [\"a\", -1.5]]}}");
    assert_msg_has(m, "model type \"Unigram\" is not supported (a SentencePiece Unigram model");
    assert_null(strstr(m, "outside"));
    /* Llama 2 / Mistral: BPE behind a Prepend("\u2581") + Replace normalizer; newer ones: Metaspace */
    m = load_fail("{\"added_tokens\": [{\"id\": 32000, \"content\": \"<x>\"}], \"normalizer\": {\"type\": \"Sequence\","
                  " \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": \"\u2581\"}, {\"type\": \"Replace\"}]},"
                  " \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_msg_has(m, "normalizer type \"Prepend\" is not supported: a SentencePiece-style tokenizer");
    m = load_fail("{\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Metaspace\"}]},"
                  " \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_msg_has(m, "pre_tokenizer type \"Metaspace\" is not supported: a SentencePiece-style");
    m = load_fail("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}");
    assert_non_null(strstr(m, "\"WordPiece\""));
    m = load_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}");
    assert_non_null(strstr(m, "right token \"b\" is not in model.vocab"));
    m = load_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": [\"a b\"]}}");
    assert_non_null(strstr(m, "merged token \"ab\" is not in model.vocab"));
    m = load_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 4000000000}, \"merges\": []}}");
    assert_non_null(strstr(m, "model.vocab[\"a\"]: id must be an integer in [0, 1)"));
    m = load_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 0}, \"merges\": []}}");
    assert_non_null(strstr(m, "id 0 is given to both"));
    m = load_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a\"]}}");
    assert_non_null(strstr(m, "model.merges[0] = \"a\": expected \"left right\""));
    m = load_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [], \"dropout\": 0.1}}");
    assert_non_null(strstr(m, "model.dropout"));
    m = load_fail("{\"pre_tokenizer\": {\"type\": \"Metaspace\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_non_null(strstr(m, "pre_tokenizer type \"Metaspace\" is not supported"));
    m = load_fail("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"},"
                  " \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_non_null(strstr(m, "regex \"(a\" does not compile"));
    m = load_fail("{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"a\"}, \"behavior\": \"Sideways\"},"
                  " \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_non_null(strstr(m, "\"behavior\" must be one of"));
    m = load_fail("{\"normalizer\": {\"type\": \"NFKC\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_non_null(strstr(m, "normalizer type \"NFKC\" is not supported"));
    m = load_fail("{\"decoder\": {\"type\": \"WordPiece\"}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_non_null(strstr(m, "decoder type \"WordPiece\" is not supported"));
    m = load_fail("{\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\"}},"
                  " {\"SpecialToken\": {\"id\": \"</s>\"}}], \"special_tokens\": {}}, \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_non_null(strstr(m, "no entry \"</s>\""));
    m = load_fail("{\"added_tokens\": [{\"id\": 7, \"content\": \"<x>\"}], \"model\": {\"type\": \"BPE\", \"vocab\": {}, \"merges\": []}}");
    assert_non_null(strstr(m, "added_tokens[0] \"<x>\": id 7 outside [0, 1)"));
    m = load_fail("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"a\": 1}, \"merges\": []}}");
    assert_non_null(strstr(m, "tokenizer.json:1:"));                        // duplicate key, with position
    m = load_fail("{\"model\": [1, 2");
    assert_non_null(strstr(m, "tokenizer.json:1:"));
    m = load_fail("[]");
    assert_non_null(strstr(m, "expected a JSON object"));
    m = load_fail("{\"version\": \"1.0\"}");
    assert_non_null(strstr(m, "no \"model\""));
    td_error err;
    assert_null(td_tokenizer_load("/nonexistent/tokenizer.json", &err));
    assert_non_null(strstr(err.msg, "/nonexistent/tokenizer.json: cannot open"));
}

/* Split behaviours on "a-b--c" with pattern "-" (HF SplitDelimiterBehavior), seen through a
 * model whose vocabulary holds every piece. */
static void test_split_behaviors(void **state)
{
    static const struct { const char *beh; int32_t want[6]; size_t n; } cases[] = {
        {"Removed", {0, 1, 2}, 3},                     // a b c
        {"Isolated", {0, 3, 1, 3, 3, 2}, 6},           // a - b - - c
        {"MergedWithPrevious", {4, 5, 3, 2}, 4},       // a- b- - c
        {"MergedWithNext", {0, 6, 3, 7}, 4},           // a -b - -c
        {"Contiguous", {0, 3, 1, 8, 2}, 5},            // a - b -- c
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char json[1024];
        snprintf(json, sizeof json, "{\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"%s\"},"
                 " \"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {\"a\":0, \"b\":1, \"c\":2, \"-\":3,"
                 " \"a-\":4, \"b-\":5, \"-b\":6, \"-c\":7, \"--\":8}, \"merges\": []}}", cases[i].beh);
        td_tokenizer *t = load_text(json);
        expect_ids(t, "a-b--c", true, true, cases[i].want, cases[i].n);
        td_tokenizer_free(t);
    }
}

/* Encoding from several threads at once (the workspace pool) gives the serial ids. */
static void test_threads(void **state)
{
    td_tokenizer *t = byte_level(true, false);
    enum { NS = 64 };
    char text[NS][96];
    int32_t *want[NS];
    size_t nwant[NS];
    td_error err;
    for (int i = 0; i < NS; i++) {
        snprintf(text[i], sizeof text[i], "a a%*s<|endoftext|>e\xcc\x81 %d\xc3\xa9 a", i % 7, "", i * 7919);
        assert_int_equal(td_tokenizer_encode(t, text[i], strlen(text[i]), true, true, &want[i], &nwant[i], &err), 0);
    }
    int bad = 0;
#pragma omp parallel for reduction(+ : bad) num_threads(4)
    for (int k = 0; k < 4000; k++) {
        int i = k % NS;
        int32_t *ids;
        size_t n;
        td_error e;
        if (td_tokenizer_encode(t, text[i], strlen(text[i]), true, true, &ids, &n, &e) != 0 || n != nwant[i] ||
            memcmp(ids, want[i], n * sizeof *ids) != 0)
            bad++;
        free(ids);
    }
    assert_int_equal(bad, 0);
    for (int i = 0; i < NS; i++) free(want[i]);
    td_tokenizer_free(t);
}

int main(void)
{
    snprintf(tmpdir, sizeof tmpdir, "%s/tidal-tok-XXXXXX", test_tmp_base());
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 1; }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bpe_rank_order),   cmocka_unit_test(test_byte_level_encode),
        cmocka_unit_test(test_decode_lossy),     cmocka_unit_test(test_template_and_config),
        cmocka_unit_test(test_charvocab),        cmocka_unit_test(test_bad_files),
        cmocka_unit_test(test_split_behaviors),  cmocka_unit_test(test_threads),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", tmpdir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", tmpdir);
    return rc;
}
