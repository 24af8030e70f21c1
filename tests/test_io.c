/* JSON loading (src/util/io.c): integers beyond 64 bits, as transformers writes them
 * (tokenizer_config.json "model_max_length": int(1e30)), load as reals of the same value;
 * everything jansson checks otherwise is still checked. References: Python's
 * int(1e30) == 1000000000000000019884624838656, the double 1e30 exactly; jansson 2.14 refuses
 * such literals with json_error_numeric_overflow ("too big integer"). */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <math.h>
#include <stdint.h>
#include <cmocka.h>

#include "testutil.h"

#include "tidal/io.h"

static json_t *load(const char *text, td_error *err)
{
    return td_json_load_text(text, strlen(text), "t.json", err);
}

static void test_big_integer_becomes_real(void **state)
{
    (void)state;
    td_error err = {{0}};
    /* as transformers' save_pretrained writes it (json.dumps of int(1e30)) */
    json_t *j = load("{\"model_max_length\": 1000000000000000019884624838656, \"n\": 7,\n"
                     " \"neg\": -99999999999999999999, \"edge\": 9223372036854775807,\n"
                     " \"s\": \"99999999999999999999 \\\" 123456789012345678901\", \"r\": 1.5e3,"
                     " \"a\": [18446744073709551616, -9223372036854775808]}", &err);
    if (!j) { print_error("%s\n", err.msg); fail(); }
    json_t *m = json_object_get(j, "model_max_length");
    assert_true(json_is_real(m));
    assert_true(json_real_value(m) == 1e30);               /* exact: int(1e30) is a double */
    assert_true(json_is_integer(json_object_get(j, "n")));
    assert_int_equal(json_integer_value(json_object_get(j, "n")), 7);
    assert_true(json_is_real(json_object_get(j, "neg")));
    assert_true(json_real_value(json_object_get(j, "neg")) == -1e20);
    /* the largest int64 stays an integer, and so does the smallest */
    assert_true(json_is_integer(json_object_get(j, "edge")));
    assert_true(json_integer_value(json_object_get(j, "edge")) == INT64_MAX);
    json_t *a = json_object_get(j, "a");
    assert_true(json_is_real(json_array_get(a, 0)));
    assert_true(json_real_value(json_array_get(a, 0)) == 18446744073709551616.0);   /* 2^64 */
    assert_true(json_is_integer(json_array_get(a, 1)));
    assert_true(json_integer_value(json_array_get(a, 1)) == INT64_MIN);
    /* digits inside a string (after an escaped quote too) are text, untouched */
    assert_string_equal(json_string_value(json_object_get(j, "s")), "99999999999999999999 \" 123456789012345678901");
    assert_true(json_real_value(json_object_get(j, "r")) == 1500.0);
    json_decref(j);
}

static void test_other_errors_still_reported(void **state)
{
    (void)state;
    td_error err = {{0}};
    /* a big integer and, later on the next line, a syntax error: the syntax error is reported
     * with its line */
    assert_null(load("{\"a\": 100000000000000000000,\n \"b\": [1, 2,]}", &err));
    assert_msg_has(err.msg, "t.json:2:");
    assert_msg_has(err.msg, "invalid JSON");
    /* duplicate keys are still refused after the retry */
    assert_null(load("{\"a\": 100000000000000000000, \"a\": 1}", &err));
    assert_msg_has(err.msg, "duplicate");
    /* a real beyond double range is not an integer and stays an error */
    assert_null(load("{\"a\": 1e400}", &err));
    assert_msg_has(err.msg, "t.json:1:");
    /* an integer beyond double range too */
    char big[420] = "[1";
    for (int i = 0; i < 400; i++) strcat(big, "0");
    strcat(big, "]");
    assert_null(load(big, &err));
    assert_msg_has(err.msg, "overflow");
}

static void test_json_file(void **state)
{
    (void)state;
    char path[64];
    test_write_temp(path, "{\"model_max_length\": 1000000000000000019884624838656}", ".json");
    td_error err = {{0}};
    json_t *j = td_json_load_file(path, &err);
    unlink(path);
    if (!j) { print_error("%s\n", err.msg); fail(); }
    assert_true(json_real_value(json_object_get(j, "model_max_length")) == 1e30);
    json_decref(j);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_big_integer_becomes_real),
        cmocka_unit_test(test_other_errors_still_reported),
        cmocka_unit_test(test_json_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
