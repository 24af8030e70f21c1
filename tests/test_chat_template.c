/* Chat templates (src/io/chat_template*.c) against Python jinja2 as transformers configures it.
 *
 * Reference: tests/data/chat_templates/cases.json, written by tests/py/chat_template_cases.py
 * with jinja2 (the published Qwen2.5-7B-Instruct, Qwen3-0.6B, Llama-3.1-8B-Instruct and
 * Llama-3.2-3B-Instruct templates over random conversations, tools and tool calls, plus one
 * inline template per Jinja feature). Every rendering must equal jinja2's byte for byte
 * (tolerance: none, it is text); error cases must fail with the named message. With
 * TIDAL_CHAT_CASES=FILE the cases come from FILE instead (test_chat_template.py regenerates
 * them live with the installed jinja2). Also: errors name the template line. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include "testutil.h"

#include "tidal/chat_template.h"
#include "tidal/io.h"

static char *read_template(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "tests/data/chat_templates/%s", name);
    td_error err;
    char *t = td_read_file(path, 1 << 20, NULL, &err);
    if (!t) { print_error("%s\n", err.msg); fail(); }
    return t;
}

static void show_diff(const char *want, const char *got)
{
    size_t i = 0;
    while (want[i] && want[i] == got[i]) i++;
    size_t from = i > 60 ? i - 60 : 0;
    print_error("  first difference at byte %zu:\n  want ...%.120s\n  got  ...%.120s\n", i, want + from, got + from);
}

static void test_cases(void **state)
{
    (void)state;
    const char *file = getenv("TIDAL_CHAT_CASES");
    if (!file || !*file) file = "tests/data/chat_templates/cases.json";
    td_error err;
    json_t *root = td_json_load_file(file, &err);
    if (!root) { print_error("%s\n", err.msg); fail(); }
    char epoch[32];
    snprintf(epoch, sizeof epoch, "%lld", (long long)json_integer_value(json_object_get(root, "source_date_epoch")));
    setenv("SOURCE_DATE_EPOCH", epoch, 1);
    json_t *cases = json_object_get(root, "cases");
    assert_true(json_array_size(cases) >= 60);
    size_t bad = 0, n_ok = 0, n_err = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        json_t *c = json_array_get(cases, i);
        json_t *tname = json_object_get(c, "template");
        char *text = tname ? read_template(json_string_value(tname)) : strdup(json_string_value(json_object_get(c, "template_text")));
        const char *label = tname ? json_string_value(tname) : text;
        const char *want_err = json_string_value(json_object_get(c, "error"));
        td_chat_template *t = td_chat_template_parse(text, strlen(text), &err);
        char *out = NULL;
        int rc = t ? td_chat_template_render(t, json_object_get(c, "messages"), json_is_true(json_object_get(c, "add_generation_prompt")),
                                             json_object_get(c, "vars"), &out, NULL, &err) : -1;
        if (want_err) {
            if (rc == 0) { print_error("case %zu (%s): rendered, but jinja2 fails (%s)\n", i, label, want_err); bad++; }
            else if (!strstr(err.msg, want_err) || !strstr(err.msg, "chat template line ")) {
                print_error("case %zu (%s): message \"%s\" lacks \"%s\" or the line\n", i, label, err.msg, want_err);
                bad++;
            } else n_err++;
        } else {
            const char *want = json_string_value(json_object_get(c, "expected"));
            if (rc) { print_error("case %zu (%s): %s\n", i, label, err.msg); bad++; }
            else if (strcmp(out, want) != 0) { print_error("case %zu (%s): differs from jinja2\n", i, label); show_diff(want, out); bad++; }
            else n_ok++;
        }
        free(out);
        td_chat_template_free(t);
        free(text);
    }
    print_message("chat templates: %zu renderings equal to jinja2's, %zu errors as expected, %zu bad (%s)\n", n_ok, n_err, bad, file);
    json_decref(root);
    assert_int_equal(bad, 0);
}

/* Errors name the line of the template where the problem is. */
static void test_error_lines(void **state)
{
    (void)state;
    td_error err;
    const char *src = "{%- for m in messages %}\n  {{- m.content }}\n{%- endfor %}\n{{ messages[0].nope.deeper }}";
    td_chat_template *t = td_chat_template_parse(src, strlen(src), &err);
    assert_non_null(t);
    json_t *msgs = json_pack("[{ssss}]", "role", "user", "content", "hi");
    char *out;
    assert_int_equal(td_chat_template_render(t, msgs, true, NULL, &out, NULL, &err), -1);
    assert_msg_has(err.msg, "chat template line 4:");
    assert_msg_has(err.msg, "attribute \"nope\" is undefined");
    td_chat_template_free(t);
    const char *bad = "ok\n\n{% include 'other.jinja' %}";
    assert_null(td_chat_template_parse(bad, strlen(bad), &err));
    assert_msg_has(err.msg, "chat template line 3: the tag \"include\" is not supported");
    json_decref(msgs);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases),
        cmocka_unit_test(test_error_lines),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
