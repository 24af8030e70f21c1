/* Dataset files (src/io/dataset.c): JSON Lines, a JSON array, either gzip-compressed, a UTF-8
 * BOM; every record named by the line it starts on, and errors by file and line. The expected
 * lines are counted by hand in the texts below. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>
#include <zlib.h>

#include "testutil.h"

#include "tidal/dataset.h"

static void read_ok(const char *path, size_t n_want, const long *lines, td_record **out)
{
    td_record *r;
    size_t n;
    td_error err = {{0}};
    if (td_records_read(path, &r, &n, &err)) { print_error("%s\n", err.msg); fail(); }
    assert_int_equal(n, n_want);
    for (size_t i = 0; i < n; i++)
        if (r[i].line != lines[i]) fail_msg("record %zu: line %ld, expected %ld", i, r[i].line, lines[i]);
    *out = r;
}

static void read_fails(const char *text, const char *suffix, const char *needle)
{
    char path[64];
    test_write_temp(path, text, suffix);
    td_record *r;
    size_t n;
    td_error err = {{0}};
    assert_int_equal(td_records_read(path, &r, &n, &err), -1);
    assert_msg_has(err.msg, path);
    assert_msg_has(err.msg, needle);
    unlink(path);
}

/* a pretty-printed array behind a BOM and a blank line; strings hold brackets, commas, escaped
 * quotes and "\n" escapes, which must not move the element lines */
static void test_array_lines(void **state)
{
    (void)state;
    const char *text = "\xEF\xBB\xBF\n"
                       "[\n"                                                  /* 2 */
                       "  {\"prompt\": \"a [b], {c}\", \"x\": [1, 2]},\n"      /* 3 */
                       "  {\n"                                                /* 4 */
                       "    \"prompt\": \"say \\\"hi\\\",\\n then ]\",\n"
                       "    \"messages\": [{\"role\": \"user\", \"content\": \"}\"}]\n"
                       "  },\n"
                       "\n"
                       "  {\"prompt\": \"last\"}\n"                           /* 9 */
                       "]\n";
    char path[64];
    test_write_temp(path, text, ".json");
    td_record *r;
    const long lines[] = {3, 4, 9};
    read_ok(path, 3, lines, &r);
    assert_string_equal(json_string_value(json_object_get(r[1].obj, "prompt")), "say \"hi\",\n then ]");
    assert_string_equal(json_string_value(json_object_get(r[2].obj, "prompt")), "last");
    td_records_free(r, 3);
    unlink(path);
}

/* JSON Lines with blank lines, CRLF endings and indentation; the same records gzip-compressed
 * under a .json.gz name read the same */
static void test_jsonl_and_gzip(void **state)
{
    (void)state;
    const char *text = "{\"prompt\": \"one\", \"id\": 1}\r\n\r\n   {\"prompt\": \"two\"}\n\n{\"prompt\": [{\"role\": \"user\"}]}";
    char path[64];
    test_write_temp(path, text, ".jsonl");
    td_record *r;
    const long lines[] = {1, 3, 5};
    read_ok(path, 3, lines, &r);
    assert_int_equal(json_integer_value(json_object_get(r[0].obj, "id")), 1);
    assert_true(json_is_array(json_object_get(r[2].obj, "prompt")));
    td_records_free(r, 3);
    unlink(path);
    char gz[64];
    test_write_temp(gz, "", ".json.gz");
    gzFile f = gzopen(gz, "wb");
    assert_non_null(f);
    assert_int_equal(gzwrite(f, text, (unsigned)strlen(text)), (int)strlen(text));
    assert_int_equal(gzclose(f), Z_OK);
    read_ok(gz, 3, lines, &r);
    assert_string_equal(json_string_value(json_object_get(r[1].obj, "prompt")), "two");
    td_records_free(r, 3);
    unlink(gz);
}

static void test_errors(void **state)
{
    (void)state;
    read_fails("{\"prompt\": \"a\"}\n{\"prompt\": \"b\"}\n{\"prompt\": \"c\n", ".jsonl", ":3: invalid JSON");
    read_fails("{\"prompt\": \"a\"}\n[1, 2]\n", ".jsonl", ":2: not a JSON object");
    read_fails("[\n  {\"prompt\": \"a\"},\n  \"b\"\n]\n", ".json", ":3: record 2 of the array is not a JSON object");
    read_fails("[\n  {\"prompt\": \"a\"},\n  {\"prompt\": }\n]\n", ".json", ":3: invalid JSON");
    read_fails("{\n  \"prompt\": \"a\"\n}\n", ".json", "holds one JSON object over several lines");
    read_fails("\n\n", ".jsonl", "no records");
    read_fails("\x1f\x8b\x08\x00garbage", ".json.gz", "a damaged or truncated .gz file?");
    /* a .gz cut short (its CRC and length trailer missing) is an error, not fewer records */
    char gz[64];
    test_write_temp(gz, "", ".json.gz");
    gzFile f = gzopen(gz, "wb");
    for (int i = 0; i < 50; i++) gzputs(f, "{\"prompt\": \"a\"}\n");
    gzclose(f);
    FILE *fp = fopen(gz, "r+");
    fseek(fp, 0, SEEK_END);
    assert_int_equal(ftruncate(fileno(fp), ftell(fp) - 6), 0);
    fclose(fp);
    td_record *r;
    size_t n;
    td_error err;
    assert_int_equal(td_records_read(gz, &r, &n, &err), -1);
    assert_msg_has(err.msg, "unexpected end of file");
    unlink(gz);
    assert_int_equal(td_records_read("/tmp", &r, &n, &err), -1);
    assert_msg_has(err.msg, "/tmp: is a directory");
    assert_int_equal(td_records_read("/nonexistent/x.jsonl", &r, &n, &err), -1);
    assert_msg_has(err.msg, "cannot open");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_array_lines),
        cmocka_unit_test(test_jsonl_and_gzip),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
