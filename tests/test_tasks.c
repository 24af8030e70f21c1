/* The task library (src/tasks/, include/tidal/tasks.h):
 *  - generators: the same items from a seed twice, other items from another seed; a smaller
 *    split is a prefix of a larger one; train and test share no prompt and every prompt sits in
 *    the split the hash rule gives it; knobs out of range and exhausted spaces are refused;
 *  - text: every character emitted is in TD_TASK_ALPHABET, which lies inside the character
 *    vocabulary; through the real tokenizer (td_charvocab_write + td_tokenizer_load) a record
 *    is strlen + 1 tokens ending in the vocabulary's EOS id, no <unk>, and decodes back;
 *  - rewards: every reference completion of both length presets scores 1.0; the edge cases
 *    (wrong, partial with its exact value, garbage, empty, overlong, EOS cut, scratch-pad only,
 *    countdown number reuse, inexact division, division by zero, foreign numbers, overflow,
 *    unary minus, spaces, leading zeros, deep parentheses, another correct expression);
 *  - JSONL: a write/read round trip, and each kind of bad line named by file and line.
 * The Python cross-check of the shipped splits and of these rewards is tests/py/test_tasks_python.py. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <cmocka.h>

#include "testutil.h"

#include "tidal/tasks.h"
#include "tidal/tokenizer.h"

static const char *const LENGTHS[] = {"short", "long"};

static td_task_item *gen(const char *task, const char *length, uint64_t seed, td_split split, size_t n)
{
    td_error err;
    const td_task *t = td_task_find(task, &err);
    assert_non_null(t);
    td_task_params p;
    assert_int_equal(td_task_preset(t, length, &p, &err), 0);
    td_task_item *it;
    if (td_task_generate(t, &p, seed, split, n, &it, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    return it;
}

static double reward_of(const char *task, const char *prompt, const char *answer, const char *completion,
                        td_reward_info *info)
{
    td_error err;
    const td_task *t = td_task_find(task, &err);
    double r = -1;
    if (td_task_reward(t, prompt, answer, completion, strlen(completion), &r, info, &err)) {
        print_error("%s\n", err.msg);
        fail();
    }
    return r;
}

static void test_determinism(void **state)
{
    (void)state;
    for (size_t k = 0; k < td_task_count(); k++)
        for (int L = 0; L < 2; L++) {
            const char *name = td_task_at(k)->name;
            td_task_item *a = gen(name, LENGTHS[L], 42, TD_SPLIT_TRAIN, 60);
            td_task_item *b = gen(name, LENGTHS[L], 42, TD_SPLIT_TRAIN, 60);
            td_task_item *c = gen(name, LENGTHS[L], 43, TD_SPLIT_TRAIN, 60);
            td_task_item *prefix = gen(name, LENGTHS[L], 42, TD_SPLIT_TRAIN, 25);
            int differ = 0;
            for (int i = 0; i < 60; i++) {
                assert_string_equal(a[i].prompt, b[i].prompt);
                assert_string_equal(a[i].completion, b[i].completion);
                assert_string_equal(a[i].answer, b[i].answer);
                assert_string_equal(a[i].id, b[i].id);
                differ += strcmp(a[i].prompt, c[i].prompt) != 0;
                if (i < 25) assert_string_equal(a[i].prompt, prefix[i].prompt);
            }
            assert_true(differ > 50);   /* another seed, other items (a few may coincide by chance) */
            td_task_items_free(a, 60);
            td_task_items_free(b, 60);
            td_task_items_free(c, 60);
            td_task_items_free(prefix, 25);
        }
}

static void test_splits_disjoint(void **state)
{
    (void)state;
    enum { NTR = 1500, NTE = 300 };
    for (size_t k = 0; k < td_task_count(); k++)
        for (int L = 0; L < 2; L++) {
            const char *name = td_task_at(k)->name;
            td_task_item *tr = gen(name, LENGTHS[L], 7, TD_SPLIT_TRAIN, NTR);
            td_task_item *te = gen(name, LENGTHS[L], 7, TD_SPLIT_TEST, NTE);
            td_error err;
            if (td_task_check_disjoint(tr, NTR, te, NTE, &err)) { print_error("%s\n", err.msg); fail(); }
            for (int i = 0; i < NTR; i++) assert_int_equal(td_task_split_of(tr[i].prompt), TD_SPLIT_TRAIN);
            for (int i = 0; i < NTE; i++) assert_int_equal(td_task_split_of(te[i].prompt), TD_SPLIT_TEST);
            /* distinct within a split (the checker, run on a split against itself minus one) */
            assert_int_equal(td_task_check_disjoint(tr, NTR / 2, tr + NTR / 2, NTR - NTR / 2, &err), 0);
            /* and the checker does see an overlap */
            assert_int_equal(td_task_check_disjoint(tr, NTR, tr + 5, 1, &err), -1);
            assert_msg_has(err.msg, "in both splits");
            td_task_items_free(tr, NTR);
            td_task_items_free(te, NTE);
        }
}

static void test_knobs_refused(void **state)
{
    (void)state;
    td_error err;
    td_task_item *it;
    const td_task *add = td_task_find("add", &err), *sort = td_task_find("sort", &err), *cd = td_task_find("countdown", &err);
    assert_null(td_task_find("multiply", &err));
    assert_msg_has(err.msg, "unknown task \"multiply\"");
    td_task_params p = {.digits = 0};
    assert_int_equal(td_task_generate(add, &p, 1, TD_SPLIT_TRAIN, 5, &it, &err), -1);
    assert_msg_has(err.msg, "digits 0 out of range");
    p = (td_task_params){.count = 1, .digits = 2};
    assert_int_equal(td_task_generate(sort, &p, 1, TD_SPLIT_TRAIN, 5, &it, &err), -1);
    assert_msg_has(err.msg, "count 1 out of range");
    p = (td_task_params){.count = TD_TASK_MAX_NUMBERS + 1, .max_value = 10, .max_target = 100};
    assert_int_equal(td_task_generate(cd, &p, 1, TD_SPLIT_TRAIN, 5, &it, &err), -1);
    assert_msg_has(err.msg, "count 13 out of range");
    /* 1-digit additions: 81 prompts, about 10 of them test prompts */
    p = (td_task_params){.digits = 1};
    assert_int_equal(td_task_generate(add, &p, 1, TD_SPLIT_TEST, 30, &it, &err), -1);
    assert_msg_has(err.msg, "space is too small");
    assert_int_equal(td_task_preset(add, "medium", &p, &err), -1);
    assert_msg_has(err.msg, "expected short or long");
}

static void check_alphabet(const char *s, const char *what)
{
    for (const char *c = s; *c; c++)
        if (!strchr(TD_TASK_ALPHABET, *c)) {
            print_error("%s \"%s\": character 0x%02x outside TD_TASK_ALPHABET\n", what, s, (unsigned char)*c);
            fail();
        }
}

static void test_alphabet_and_tokenizer(void **state)
{
    (void)state;
    const char *vocab = td_charvocab_default_alphabet();
    for (const char *c = TD_TASK_ALPHABET; *c; c++) assert_non_null(strchr(vocab, *c));
    td_charvocab_spec spec = td_charvocab_default_spec();
    assert_string_equal(spec.eos_token, TD_TASK_EOS);
    td_error err;
    if (td_charvocab_write(test_dir, &spec, &err)) { print_error("%s\n", err.msg); fail(); }
    char path[128];
    test_path(path, sizeof path, "tokenizer.json");
    td_tokenizer *tok = td_tokenizer_load(path, &err);
    if (!tok) { print_error("%s\n", err.msg); fail(); }
    int32_t eos = td_tokenizer_eos_id(tok), unk = td_tokenizer_token_id(tok, "<unk>");
    assert_true(eos >= 0 && unk >= 0);
    for (size_t k = 0; k < td_task_count(); k++)
        for (int L = 0; L < 2; L++)
            for (int s = 0; s < 2; s++) {
                enum { N = 200 };
                td_task_item *it = gen(td_task_at(k)->name, LENGTHS[L], 3, (td_split)s, N);
                for (int i = 0; i < N; i++) {
                    check_alphabet(it[i].prompt, "prompt");
                    check_alphabet(it[i].completion, "completion");
                    check_alphabet(it[i].answer, "answer");
                    /* the response as SFT trains it and RL generates it: completion + EOS */
                    size_t lc = strlen(it[i].completion);
                    char *text = malloc(lc + sizeof TD_TASK_EOS);
                    memcpy(text, it[i].completion, lc);
                    memcpy(text + lc, TD_TASK_EOS, sizeof TD_TASK_EOS);
                    int32_t *ids;
                    size_t n;
                    assert_int_equal(td_tokenizer_encode(tok, text, strlen(text), true, false, &ids, &n, &err), 0);
                    assert_int_equal(n, lc + 1);
                    assert_int_equal(ids[n - 1], eos);
                    for (size_t j = 0; j < n; j++) assert_int_not_equal(ids[j], unk);
                    char *back = td_tokenizer_decode(tok, ids, n, false, NULL);
                    assert_string_equal(back, text);
                    /* the decoded text (EOS kept) is what a reward may be given */
                    assert_true(reward_of(td_task_at(k)->name, it[i].prompt, it[i].answer, back, NULL) == 1.0);
                    free(back);
                    free(ids);
                    free(text);
                }
                td_task_items_free(it, N);
            }
    td_tokenizer_free(tok);
}

static void test_reference_scores_one(void **state)
{
    (void)state;
    for (size_t k = 0; k < td_task_count(); k++)
        for (int L = 0; L < 2; L++)
            for (int s = 0; s < 2; s++) {
                enum { N = 1000 };
                const char *name = td_task_at(k)->name;
                td_task_item *it = gen(name, LENGTHS[L], 11, (td_split)s, N);
                for (int i = 0; i < N; i++) {
                    td_reward_info info;
                    double r = reward_of(name, it[i].prompt, it[i].answer, it[i].completion, &info);
                    if (r != 1.0 || !info.exact || !info.parsed) {
                        print_error("%s: reference completion scores %g:\n%s%s\n", it[i].id, r, it[i].prompt, it[i].completion);
                        fail();
                    }
                }
                td_task_items_free(it, N);
            }
}

/* A long string of c, n bytes. */
static char *repeat(char c, size_t n)
{
    char *s = malloc(n + 1);
    memset(s, c, n);
    s[n] = 0;
    return s;
}

static void expect(const char *task, const char *prompt, const char *answer, const char *completion, double want,
                   bool parsed)
{
    td_reward_info info;
    double r = reward_of(task, prompt, answer, completion, &info);
    if (r != want || info.parsed != parsed || info.exact != (want == 1.0)) {
        print_error("%s reward of \"%s\": %g (parsed %d exact %d), expected %g (parsed %d)\n", task, completion, r,
                    info.parsed, info.exact, want, parsed);
        fail();
    }
}

static void test_reward_add(void **state)
{
    (void)state;
    const char *P = "4821+3970\n", *A = "8791";
    const char *ref = "1+0+0=01\n2+7+0=09\n8+9+0=17\n4+3+1=08\n8791";
    expect("add", P, A, ref, 1.0, true);
    expect("add", P, A, "8791", 1.0, true);                   /* no scratch-pad: not graded */
    expect("add", P, A, "8791\n\n  ", 1.0, true);             /* trailing whitespace */
    expect("add", P, A, "8791<eos>1234", 1.0, true);          /* cut at EOS */
    expect("add", P, A, "8792", 0.75, true);                  /* 3 of 4 digits */
    expect("add", P, A, "08791", 0.8, true);                  /* 4 of 5 positions */
    expect("add", P, A, "87910", 0.0, true);                  /* overlong by a digit: all shifted */
    expect("add", P, A, "1234", 0.0, true);                   /* wrong, parsed */
    expect("add", P, A, "", 0.0, false);                      /* empty */
    expect("add", P, A, "<eos>", 0.0, false);
    expect("add", P, A, "87 91", 0.0, false);                 /* garbage */
    expect("add", P, A, "8791x", 0.0, false);
    expect("add", P, A, "1+0+0=01\n2+7+0=09", 0.0, false);    /* scratch-pad only */
    char *longline = repeat('9', TD_TASK_MAX_DIGITS + 1);
    expect("add", P, A, longline, 0.0, false);
    free(longline);
    char *huge = repeat('\n', TD_TASK_MAX_COMPLETION + 10);   /* overlong text, answer at the end */
    memcpy(huge + TD_TASK_MAX_COMPLETION + 6, "8791", 4);
    expect("add", P, A, huge, 0.0, false);
    free(huge);
    td_error err;
    double r;
    const td_task *t = td_task_find("add", &err);
    assert_int_equal(td_task_reward(t, P, "8790", "8790", 4, &r, NULL, &err), -1);   /* a bad record */
    assert_msg_has(err.msg, "not the sum");
    /* a NUL inside the text (len counts it) */
    assert_int_equal(td_task_reward(t, P, A, "87\0" "91", 5, &r, NULL, &err), 0);
    assert_true(r == 0.0);
}

static void test_reward_sort(void **state)
{
    (void)state;
    const char *P = "sort 42 7 19 3\n", *A = "3 7 19 42";
    expect("sort", P, A, "3 7 19 42", 1.0, true);
    expect("sort", P, A, "3 7 19 42\n", 1.0, true);
    expect("sort", P, A, "3 7 42 19", 0.5, true);             /* 2 of 4 positions */
    expect("sort", P, A, "3 7 19", 0.75, true);               /* short: 3 of 4 */
    expect("sort", P, A, "3 7 19 42 42", 0.8, true);          /* overlong: 4 of 5 */
    expect("sort", P, A, "42 19 7 3", 0.0, true);
    expect("sort", P, A, "03 7 19 42", 1.0, true);            /* values compared as numbers */
    expect("sort", P, A, "", 0.0, false);
    expect("sort", P, A, "3  7 19 42", 0.0, false);           /* double space */
    expect("sort", P, A, " 3 7 19 42", 0.0, false);
    expect("sort", P, A, "3,7,19,42", 0.0, false);
    expect("sort", P, A, "3 7 19 1234567890", 0.0, false);    /* a 10-digit number */
    expect("sort", P, A, "sort 3 7 19 42", 0.0, false);
}

static void test_reward_countdown(void **state)
{
    (void)state;
    const char *P = "reach 34 with 3 7 8 1\n", *A = "34";
    expect("countdown", P, A, "8-3=5\n5*7=35\n35-1=34\n(8-3)*7-1", 1.0, true);
    expect("countdown", P, A, "(8-3)*7-1", 1.0, true);
    expect("countdown", P, A, "7*(8-3)-1", 1.0, true);        /* another solution */
    expect("countdown", P, A, "((8-3))*7-1", 1.0, true);
    expect("countdown", P, A, "(8-3)*7+1", 0.1, true);        /* misses the target */
    expect("countdown", P, A, "(8-3)*7", 0.1, true);          /* 35 */
    expect("countdown", P, A, "7*7-8-7", 0.1, true);          /* 7 used twice (= 34) */
    expect("countdown", P, A, "3*8+7+3", 0.1, true);          /* 3 used twice (= 34) */
    expect("countdown", P, A, "34", 0.1, true);               /* a number not given */
    expect("countdown", P, A, "(8*7+1)/3*3-23", 0.1, true);   /* 57/3 exact but 23 foreign */
    expect("countdown", P, A, "7/3*8", 0.1, true);            /* inexact division */
    expect("countdown", P, A, "8/(7-7)", 0.1, true);          /* division by zero (and 7 twice) */
    expect("countdown", P, A, "3/(8-8)+34", 0.1, true);
    expect("countdown", P, A, "", 0.0, false);
    expect("countdown", P, A, "-3+37", 0.0, false);           /* unary minus */
    expect("countdown", P, A, "(8 - 3)*7-1", 0.0, false);     /* spaces */
    expect("countdown", P, A, "(8-3)*07-1", 0.0, false);      /* leading zero */
    expect("countdown", P, A, "(8-3)*7-1=34", 0.0, false);
    expect("countdown", P, A, "(8-3*7-1", 0.0, false);
    expect("countdown", P, A, "8-3)*7-1", 0.0, false);
    expect("countdown", P, A, "(8-3)7-1", 0.0, false);
    expect("countdown", P, A, "()", 0.0, false);
    expect("countdown", P, A, "8-3=5\n5*7=35\n35-1=34", 0.0, false);   /* steps only */
    expect("countdown", P, A, "(8-3)*7-1<eos>)", 1.0, true);
    /* 70 nested parentheses: over the depth limit of 64 */
    char deep[200];
    size_t k = 0;
    for (int i = 0; i < 70; i++) deep[k++] = '(';
    deep[k++] = '8';
    for (int i = 0; i < 70; i++) deep[k++] = ')';
    deep[k] = 0;
    expect("countdown", P, A, deep, 0.0, false);
    /* int64 overflow: the numbers are on offer, the product is not representable */
    const char *P2 = "reach 999999999 with 999999999 999999999 999999999 5\n";
    expect("countdown", P2, "999999999", "999999999*999999999*999999999+5", 0.1, true);
    expect("countdown", P2, "999999999", "999999999*999999999/999999999", 1.0, true);   /* ~1e18 on the way */
}

static void test_jsonl(void **state)
{
    (void)state;
    enum { N = 40 };
    td_task_item *it = gen("countdown", "short", 5, TD_SPLIT_TEST, N);
    char path[128];
    test_path(path, sizeof path, "test.jsonl");
    td_error err;
    assert_int_equal(td_task_write_jsonl(path, it, N, TD_SPLIT_TEST, &err), 0);
    td_task_item *back;
    size_t n;
    if (td_task_read_jsonl(path, &back, &n, &err)) { print_error("%s\n", err.msg); fail(); }
    assert_int_equal(n, N);
    for (int i = 0; i < N; i++) {
        assert_string_equal(back[i].id, it[i].id);
        assert_string_equal(back[i].prompt, it[i].prompt);
        assert_string_equal(back[i].completion, it[i].completion);
        assert_string_equal(back[i].answer, it[i].answer);
        assert_ptr_equal(back[i].task, it[i].task);
        assert_memory_equal(&back[i].params, &it[i].params, sizeof it[i].params);
        assert_int_equal(back[i].line, i + 1);
    }
    td_task_items_free(back, n);
    td_task_items_free(it, N);

    static const struct { const char *text, *msg; } bad[] = {
        {"{\"task\": \"add\", \"prompt\": \"1+2\\n\", \"answer\": \"3\"}\n{\"task\": \"add\", \"prompt\": \"1+2\\n\"\n", ":2: invalid JSON"},
        {"\n\n{\"task\": \"add\", \"prompt\": \"1+2\\n\"}\n", ":3: no \"answer\" field"},
        {"{\"task\": \"mul\", \"prompt\": \"1+2\\n\", \"answer\": \"3\"}\n", ":1: unknown task \"mul\""},
        {"{\"task\": \"add\", \"prompt\": \"1+2\\n\", \"answer\": \"4\"}\n", ":1: task add: answer \"4\" is not the sum"},
        {"{\"task\": \"add\", \"prompt\": 12, \"answer\": \"4\"}\n", ":1: \"prompt\" is not a string"},
        {"{\"task\": \"sort\", \"prompt\": \"sort 3 1\\n\", \"answer\": \"1 3\", \"count\": -2}\n", ":1: \"count\" is not a non-negative"},
        {"{\"task\": \"countdown\", \"prompt\": \"reach 5 from 2 3\\n\", \"answer\": \"5\"}\n", ":1: task countdown: prompt is not"},
        {"[1, 2]\n", ":1: record 1 of the array is not a JSON object"},
        {"{\"task\": \"add\", \"prompt\": \"1+2\\u0000\\n\", \"answer\": \"3\"}\n", ":1: \"prompt\" holds a NUL"},
        {"\n  \n", "no records"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char p[64];
        test_write_temp(p, bad[i].text, ".jsonl");
        assert_int_equal(td_task_read_jsonl(p, &back, &n, &err), -1);
        assert_msg_has(err.msg, p);
        assert_msg_has(err.msg, bad[i].msg);
        unlink(p);
    }
    assert_int_equal(td_task_read_jsonl("/nonexistent/x.jsonl", &back, &n, &err), -1);
    assert_msg_has(err.msg, "/nonexistent/x.jsonl: cannot open");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_determinism),
        cmocka_unit_test(test_splits_disjoint),
        cmocka_unit_test(test_knobs_refused),
        cmocka_unit_test(test_alphabet_and_tokenizer),
        cmocka_unit_test(test_reference_scores_one),
        cmocka_unit_test(test_reward_add),
        cmocka_unit_test(test_reward_sort),
        cmocka_unit_test(test_reward_countdown),
        cmocka_unit_test(test_jsonl),
    };
    return cmocka_run_group_tests(tests, test_dir_setup, test_dir_teardown);
}
