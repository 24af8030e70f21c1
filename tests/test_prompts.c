/* Prompt and rollout JSONL files (src/io/prompts.c):
 *  - text prompts through a tokenizer callback (a fake one: one id per byte), token prompts,
 *    rollouts with the canonical keys and with vLLM's aliases; empty lines and CRLF endings;
 *  - every kind of bad line stops the load with an error that names path:line and the problem;
 *  - with skip_bad the bad lines are skipped and counted, and the good ones kept with their
 *    line numbers. Files are written to mkstemp temporaries. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "testutil.h"

#include "tidal/io.h"
#include "tidal/prompts.h"

enum { VOCAB = 256, MAX_LEN = 16 };

/* Fake tokenizer: one id per byte; a '!' is a tokenizer error (e.g. an unknown piece). */
static int fake_tokenize(void *user, const char *text, size_t len, bool model_input, int32_t **ids, size_t *n, td_error *err)
{
    int *calls = user;
    (*calls)++;
    if (memchr(text, '!', len)) return td_fail(err, "fake tokenizer: '!' is not in the vocabulary");
    *ids = malloc((len ? len : 1) * sizeof **ids);
    for (size_t i = 0; i < len; i++) (*ids)[i] = (unsigned char)text[i];
    *n = len;
    return 0;
}

static void assert_ids(const int32_t *got, int n, const int32_t *want, int n_want)
{
    assert_int_equal(n, n_want);
    for (int i = 0; i < n; i++) assert_int_equal(got[i], want[i]);
}

static void test_prompts(void **state)
{
    (void)state;
    char path[64];
    /* line 1 text, 2 empty, 3 tokens with extra keys, 4 spaces only, 5 text with CRLF,
     * 6 text with a JSON escape (é = 2 UTF-8 bytes) */
    test_write_temp(path, "{\"text\": \"hi\"}\n"
                     "\n"
                     "{\"id\": 7, \"tokens\": [5, 0, 255], \"meta\": {\"a\": 1}}\n"
                     "   \n"
                     "{\"text\": \"abc\"}\r\n"
                     "{\"text\": \"\\u00e9\"}", "");           /* no final newline */
    int calls = 0;
    td_prompt_set ps;
    td_error err = {{0}};
    if (td_prompts_load(path, fake_tokenize, &calls, VOCAB, MAX_LEN, false, &ps, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    assert_int_equal(ps.n, 4);
    assert_int_equal(ps.n_skipped, 0);
    assert_false(ps.has_rollouts);
    assert_int_equal(calls, 3);
    assert_ids(ps.items[0].prompt, ps.items[0].n_prompt, (const int32_t[]){'h', 'i'}, 2);
    assert_ids(ps.items[1].prompt, ps.items[1].n_prompt, (const int32_t[]){5, 0, 255}, 3);
    assert_ids(ps.items[2].prompt, ps.items[2].n_prompt, (const int32_t[]){'a', 'b', 'c'}, 3);
    assert_ids(ps.items[3].prompt, ps.items[3].n_prompt, (const int32_t[]){0xc3, 0xa9}, 2);
    const long lines[4] = {1, 3, 5, 6};
    for (int i = 0; i < 4; i++) {
        assert_int_equal(ps.items[i].line, lines[i]);
        assert_null(ps.items[i].response);
        assert_null(ps.items[i].rollout_logp);
        assert_int_equal(ps.items[i].n_response, 0);
    }
    td_prompts_free(&ps);
    assert_int_equal(ps.n, 0);
    assert_null(ps.items);
    unlink(path);

    /* token prompts need no tokenizer; exactly max_len tokens is fine */
    test_write_temp(path, "{\"tokens\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16]}\n", "");
    assert_int_equal(td_prompts_load(path, NULL, NULL, VOCAB, MAX_LEN, false, &ps, &err), 0);
    assert_int_equal(ps.items[0].n_prompt, MAX_LEN);
    td_prompts_free(&ps);
    unlink(path);
}

static void test_rollouts(void **state)
{
    (void)state;
    char path[64];
    test_write_temp(path, "{\"prompt_ids\": [1, 2], \"response_ids\": [3, 4, 5], \"rollout_logprobs\": [-0.5, 0, -1e-3]}\n"
                     "{\"prompt_token_ids\": [9], \"output_token_ids\": [8], \"logprobs\": [-2.25], \"text_out\": \"x\"}\n"
                     "{\"prompt_ids\": [7], \"output_token_ids\": [6, 5], \"logprobs\": [-1, -3]}\n", "");
    td_prompt_set ps;
    td_error err = {{0}};
    if (td_prompts_load(path, NULL, NULL, VOCAB, MAX_LEN, false, &ps, &err)) { print_error("%s\n", err.msg); fail(); }
    assert_int_equal(ps.n, 3);
    assert_true(ps.has_rollouts);
    assert_ids(ps.items[0].prompt, ps.items[0].n_prompt, (const int32_t[]){1, 2}, 2);
    assert_ids(ps.items[0].response, ps.items[0].n_response, (const int32_t[]){3, 4, 5}, 3);
    assert_true(ps.items[0].rollout_logp[0] == -0.5f && ps.items[0].rollout_logp[1] == 0.0f &&
                ps.items[0].rollout_logp[2] == -1e-3f);
    assert_ids(ps.items[1].prompt, ps.items[1].n_prompt, (const int32_t[]){9}, 1);
    assert_ids(ps.items[1].response, ps.items[1].n_response, (const int32_t[]){8}, 1);
    assert_true(ps.items[1].rollout_logp[0] == -2.25f);
    assert_ids(ps.items[2].response, ps.items[2].n_response, (const int32_t[]){6, 5}, 2);
    assert_true(ps.items[2].rollout_logp[1] == -3.0f);
    td_prompts_free(&ps);
    unlink(path);
}

/* One bad line at line 4 (after two good prompts and an empty line; rollout cases put a good
 * rollout first): the load fails with path:4 and `what` in the message and returns nothing. */
static void expect_bad_line(const char *bad, const char *what, bool rollout, bool with_tokenizer)
{
    char text[1024], path[64], where[96];
    const char *good = rollout ? "{\"prompt_ids\": [1], \"response_ids\": [2], \"rollout_logprobs\": [-1]}"
                               : "{\"tokens\": [1, 2]}";
    snprintf(text, sizeof text, "%s\n%s\n\n%s\n%s\n", good, good, bad, good);
    test_write_temp(path, text, "");
    int calls = 0;
    td_prompt_set ps;
    td_error err = {{0}};
    int rc = td_prompts_load(path, with_tokenizer ? fake_tokenize : NULL, &calls, VOCAB, MAX_LEN, false, &ps, &err);
    if (rc == 0) { print_error("bad line accepted: %s\n", bad); td_prompts_free(&ps); unlink(path); fail(); }
    snprintf(where, sizeof where, "%s:4:", path);
    assert_msg_has(err.msg, where);
    assert_msg_has(err.msg, what);
    assert_int_equal(ps.n, 0);
    assert_null(ps.items);

    /* skip_bad: the same file loads the three good lines (1, 2, 5) and counts one skipped */
    rc = td_prompts_load(path, with_tokenizer ? fake_tokenize : NULL, &calls, VOCAB, MAX_LEN, true, &ps, &err);
    if (rc) { print_error("skip_bad: %s\n", err.msg); unlink(path); fail(); }
    assert_int_equal(ps.n, 3);
    assert_int_equal(ps.n_skipped, 1);
    assert_int_equal(ps.items[0].line, 1);
    assert_int_equal(ps.items[1].line, 2);
    assert_int_equal(ps.items[2].line, 5);
    td_prompts_free(&ps);
    unlink(path);
}

static void test_bad_lines(void **state)
{
    (void)state;
    expect_bad_line("{\"tokens\": [1, 2]", "invalid JSON", false, true);
    expect_bad_line("{\"tokens\": [1, 2]} x", "invalid JSON", false, true);
    expect_bad_line("[1, 2, 3]", "object", false, true);
    expect_bad_line("\"text\"", "object", false, true);
    expect_bad_line("{\"text\": \"ab\", \"tokens\": [1]}", "exactly one", false, true);
    expect_bad_line("{\"id\": 3}", "the record has the keys \"id\"", false, true);
    expect_bad_line("{\"tokens\": [1, 256]}", "outside the vocabulary", false, true);
    expect_bad_line("{\"tokens\": [-1]}", "outside the vocabulary", false, true);
    expect_bad_line("{\"tokens\": [1, 2.5]}", "not an integer", false, true);
    expect_bad_line("{\"tokens\": [\"1\"]}", "not an integer", false, true);
    expect_bad_line("{\"tokens\": 5}", "array", false, true);
    expect_bad_line("{\"tokens\": [1, 2], \"tokens\": [3]}", "invalid JSON", false, true);   /* duplicate key */
    expect_bad_line("{\"tokens\": []}", "empty prompt", false, true);
    expect_bad_line("{\"text\": \"\"}", "empty prompt", false, true);
    expect_bad_line("{\"tokens\": [1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17]}", "longer than the context", false, true);
    expect_bad_line("{\"text\": \"seventeen letters\"}", "longer than the context", false, true);
    expect_bad_line("{\"text\": 5}", "string", false, true);
    expect_bad_line("{\"text\": \"hi!\"}", "fake tokenizer", false, true);   /* the tokenizer's own error */
    expect_bad_line("{\"text\": \"hi\"}", "tokenizer", false, false);        /* no tokenizer at all */
    /* rollouts */
    expect_bad_line("{\"prompt_ids\": [1], \"response_ids\": [2, 3], \"rollout_logprobs\": [-1]}", "rollout_logprobs", true, true);
    expect_bad_line("{\"prompt_ids\": [1], \"response_ids\": [2], \"rollout_logprobs\": [0.5]}", "rollout_logprobs", true, true);
    expect_bad_line("{\"prompt_ids\": [1], \"response_ids\": [2], \"rollout_logprobs\": [\"nan\"]}", "rollout_logprobs", true, true);
    expect_bad_line("{\"prompt_ids\": [1], \"response_ids\": [2], \"rollout_logprobs\": [NaN]}", "invalid JSON", true, true);
    expect_bad_line("{\"prompt_ids\": [1], \"response_ids\": [2], \"rollout_logprobs\": [-1e999]}", "invalid JSON", true, true);
    expect_bad_line("{\"prompt_ids\": [1], \"response_ids\": [2]}", "rollout_logprobs", true, true);
    expect_bad_line("{\"prompt_ids\": [1], \"rollout_logprobs\": [-1]}", "response_ids", true, true);
    expect_bad_line("{\"prompt_ids\": [1], \"response_ids\": [], \"rollout_logprobs\": []}", "response_ids", true, true);
    expect_bad_line("{\"prompt_ids\": [1], \"response_ids\": [300], \"rollout_logprobs\": [-1]}", "outside the vocabulary", true, true);
    expect_bad_line("{\"prompt_ids\": [], \"response_ids\": [3], \"rollout_logprobs\": [-1]}", "empty prompt", true, true);
    expect_bad_line("{\"prompt_ids\": [1,2,3,4,5,6,7,8,9,10], \"response_ids\": [1,2,3,4,5,6,7], \"rollout_logprobs\": [-1,-1,-1,-1,-1,-1,-1]}",
                    "prompt + response", true, true);
}

static void test_mixed_kinds(void **state)
{
    (void)state;
    /* a prompt file with a rollout on line 3 (and the other way round): an error at that line,
     * also with skip_bad (one kind per file is a property of the file, not a damaged line) */
    const char *files[2] = {
        "{\"tokens\": [1]}\n{\"tokens\": [2]}\n{\"prompt_ids\": [1], \"response_ids\": [2], \"rollout_logprobs\": [-1]}\n{\"tokens\": [3]}\n",
        "{\"prompt_ids\": [1], \"response_ids\": [2], \"rollout_logprobs\": [-1]}\n\n{\"tokens\": [2]}\n",
    };
    for (int k = 0; k < 2; k++) {
        for (int skip = 0; skip < 2; skip++) {
            char path[64], where[96];
            test_write_temp(path, files[k], "");
            td_prompt_set ps;
            td_error err = {{0}};
            assert_int_equal(td_prompts_load(path, NULL, NULL, VOCAB, MAX_LEN, skip, &ps, &err), -1);
            snprintf(where, sizeof where, "%s:3:", path);
            assert_msg_has(err.msg, where);
            assert_msg_has(err.msg, "mixes prompts and rollouts");
            assert_int_equal(ps.n, 0);
            unlink(path);
        }
    }
}

static void test_empty_and_missing(void **state)
{
    (void)state;
    const char *texts[3] = {"", "\n\n  \n\r\n", "{\"tokens\": []}\n"};
    for (int k = 0; k < 3; k++) {
        char path[64];
        test_write_temp(path, texts[k], "");
        td_prompt_set ps;
        td_error err = {{0}};
        /* the last file's only line is bad: skipped, then nothing is left */
        assert_int_equal(td_prompts_load(path, NULL, NULL, VOCAB, MAX_LEN, k == 2, &ps, &err), -1);
        assert_msg_has(err.msg, path);
        assert_msg_has(err.msg, "no prompts");
        assert_int_equal(ps.n, 0);
        unlink(path);
    }
    td_prompt_set ps;
    td_error err = {{0}};
    assert_int_equal(td_prompts_load("/nonexistent/p.jsonl", NULL, NULL, VOCAB, MAX_LEN, false, &ps, &err), -1);
    assert_msg_has(err.msg, "/nonexistent/p.jsonl");
}

static void test_skip_bad_many(void **state)
{
    (void)state;
    /* good, bad, good, bad, bad, good over 200 repetitions: realloc growth past the first 64
     * items, and every good line kept in order */
    size_t cap = 200 * 120, len = 0;
    char *text = malloc(cap);
    for (int r = 0; r < 200; r++)
        len += (size_t)snprintf(text + len, cap - len, "{\"tokens\": [%d]}\n{\"tokens\": [-%d]}\n{\"tokens\": [%d, 1]}\n[]\n{\n{\"tokens\": [%d, 2, 3]}\n",
                                r, r + 1, r, r);
    char path[64];
    test_write_temp(path, text, "");
    free(text);
    td_prompt_set ps;
    td_error err = {{0}};
    int saved = dup(2);                       /* the 600 warnings go to /dev/null */
    assert_non_null(freopen("/dev/null", "w", stderr));
    int rc = td_prompts_load(path, NULL, NULL, VOCAB, MAX_LEN, true, &ps, &err);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    assert_int_equal(rc, 0);
    assert_int_equal(ps.n, 600);
    assert_int_equal(ps.n_skipped, 600);
    for (int r = 0; r < 200; r++) {
        for (int j = 0; j < 3; j++) {
            const td_prompt *p = &ps.items[3 * r + j];
            assert_int_equal(p->n_prompt, j + 1);
            assert_int_equal(p->prompt[0], r);
            const long line_of[3] = {1, 3, 6};
            assert_int_equal(p->line, 6 * r + line_of[j]);
        }
    }
    td_prompts_free(&ps);
    unlink(path);
}


/* Records what the loader asks the tokenizer: the text and whether it is a whole model input. */
typedef struct { char text[4096]; bool model_input; int calls; } tok_log;

static int logging_tokenize(void *user, const char *text, size_t len, bool model_input, int32_t **ids, size_t *n, td_error *err)
{
    tok_log *lg = user;
    lg->calls++;
    lg->model_input = model_input;
    snprintf(lg->text, sizeof lg->text, "%.*s", (int)len, text);
    return fake_tokenize(&lg->calls, text, len, model_input, ids, n, err);
}

static char *read_qwen25(void)
{
    td_error err;
    char *t = td_read_file("tests/data/chat_templates/Qwen-Qwen2.5-7B-Instruct.jinja", 1 << 20, NULL, &err);
    if (!t) { print_error("%s\n", err.msg); fail(); }
    return t;
}

/* TRL's prompt kinds: "prompt" text is a model input as it is; "prompt": [messages] and
 * "messages" go through the checkpoint's chat template (Qwen2.5-Instruct's, published text)
 * with add_generation_prompt after a user turn and continue_final_message after an assistant
 * turn, as TRL's maybe_apply_chat_template does. */
static void test_chat_prompts(void **state)
{
    (void)state;
    char *tmpl = read_qwen25();
    tok_log lg = {0};
    td_prompt_reader r = {.tokenize = logging_tokenize, .tok_user = &lg, .chat_template = tmpl,
                          .chat_template_from = "tokenizer_config.json", .vocab_size = VOCAB, .max_len = 4096};
    const char *sys = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n";
    struct { const char *line, *want; bool model_input; } cases[] = {
        {"{\"prompt\": \"<|im_start|>user\\nhi<|im_end|>\\n\", \"solution\": \"42\"}", "<|im_start|>user\nhi<|im_end|>\n", true},
        {"{\"text\": \"plain\"}", "plain", false},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"answer\": \"4\"}",
         "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", true},
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi\"},"
         " {\"role\": \"assistant\", \"content\": \"Hello, I am\"}]}",
         "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\nHello, I am", true},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[64];
        test_write_temp(path, cases[i].line, ".jsonl");
        td_prompt_set ps;
        td_error err;
        if (td_prompts_read(path, &r, &ps, &err)) { print_error("%s\n", err.msg); fail(); }
        char want[1024];
        snprintf(want, sizeof want, "%s%s", i == 2 ? sys : "", cases[i].want);
        assert_string_equal(lg.text, want);
        assert_int_equal(lg.model_input, cases[i].model_input);
        assert_int_equal(ps.n, 1);
        assert_int_equal(ps.items[0].n_prompt, (int)strlen(want));
        td_prompts_free(&ps);
        unlink(path);
    }
    /* errors: a conversation ending with a system turn; no chat template; a template that fails */
    struct { const char *line, *needle; const char *tmpl; } bad[] = {
        {"{\"messages\": [{\"role\": \"system\", \"content\": \"x\"}]}", "the last message of \"messages\" is from \"system\"", tmpl},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"x\"}]}", "has no chat template", NULL},
        {"{\"prompt\": [{\"role\": \"user\", \"content\": \"x\"}]}", "{% macro", "{% macro m() %}{% endmacro %}"},
        {"{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}]}", "raised an error: roles", "{{ raise_exception('roles') }}"},
        {"{\"question\": \"x\", \"answer\": 4}", "the record has the keys \"question\", \"answer\"", tmpl},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char path[64];
        test_write_temp(path, bad[i].line, ".jsonl");
        r.chat_template = bad[i].tmpl;
        td_prompt_set ps;
        td_error err;
        assert_int_equal(td_prompts_read(path, &r, &ps, &err), -1);
        assert_msg_has(err.msg, path);
        if (i == 2) assert_msg_has(err.msg, "the tag \"macro\" is not supported");
        else assert_msg_has(err.msg, bad[i].needle);
        if (i >= 1 && i <= 3) assert_msg_has(err.msg, "{\"prompt\": \"...\"}");
        unlink(path);
    }
    free(tmpl);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prompts),
        cmocka_unit_test(test_rollouts),
        cmocka_unit_test(test_bad_lines),
        cmocka_unit_test(test_mixed_kinds),
        cmocka_unit_test(test_empty_and_missing),
        cmocka_unit_test(test_skip_bad_many),
        cmocka_unit_test(test_chat_prompts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
