/* The resume helpers of include/tidal/opts.h: td_settings_diff names only the settings that
 * differ, each with both values as typed on a command line; td_command_line_edit builds the
 * command a stopped tool prints (an option with its value dropped, --resume added). References:
 * the strings below, written by hand from the documented format. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "tidal/opts.h"

static const td_setting_flag FLAGS[] = {
    {"is_drop_masked", "--is-masked-normaliser", "keep|drop"},
    {"sampling.top_p", "--top-p", NULL},
    {"recipe_a", "--recipe-a", NULL},
    {0}};

static void test_only_what_differs(void **state)
{
    (void)state;
    char buf[2048];
    const char *run = "{\"learning_rate\": 0.01, \"seed\": 42, \"max_steps\": 100, \"is_drop_masked\": 0, "
                      "\"beta\": 0.0, \"model_path\": \"m\", \"lora_r\": 0}";
    const char *now = "{\"learning_rate\": 0.003, \"seed\": 42, \"max_steps\": 300, \"is_drop_masked\": 1, "
                      "\"beta\": 0, \"model_path\": \"m\", \"eval_steps\": 5}";
    static const char *const ignore[] = {"max_steps", NULL};
    int n = td_settings_diff(run, now, FLAGS, ignore, buf, sizeof buf);
    /* beta 0.0 vs 0: equal as numbers; max_steps ignored; the rest in the run's order, then the
     * keys only the command has */
    assert_int_equal(n, 4);
    assert_string_equal(buf, "  --learning-rate: run has 0.01, command gives 0.003\n"
                             "  --is-masked-normaliser: run has keep, command gives drop\n"
                             "  --lora-r: run has 0, command gives (not set)\n"
                             "  --eval-steps: run has (not set), command gives 5");
    assert_int_equal(td_settings_diff(run, run, FLAGS, NULL, buf, sizeof buf), 0);
    assert_string_equal(buf, "");
    assert_int_equal(td_settings_diff("[1]", run, FLAGS, NULL, buf, sizeof buf), -1);
}

static void test_nested(void **state)
{
    (void)state;
    char buf[2048];
    /* a nested object member by member (a table entry for the path, else "--top (sub)"); named
     * objects of different names by their names */
    const char *run = "{\"sampling\": {\"top_p\": 0.95, \"top_k\": 0}, \"recipe_a\": {\"name\": \"bf16-train\", \"x\": 1},"
                      " \"recipe_b\": {\"name\": \"r\", \"gemm\": {\"accum\": \"fp32\"}}}";
    const char *now = "{\"sampling\": {\"top_p\": 0.9, \"top_k\": 5}, \"recipe_a\": {\"name\": \"fp16-train\", \"x\": 2},"
                      " \"recipe_b\": {\"name\": \"r\", \"gemm\": {\"accum\": \"bf16\"}}}";
    int n = td_settings_diff(run, now, FLAGS, NULL, buf, sizeof buf);
    assert_int_equal(n, 4);
    assert_string_equal(buf, "  --top-p: run has 0.95, command gives 0.9\n"
                             "  --sampling (top_k): run has 0, command gives 5\n"
                             "  --recipe-a: run has bf16-train, command gives fp16-train\n"
                             "  --recipe-b (gemm.accum): run has fp32, command gives bf16");
}

static void test_continue_command(void **state)
{
    (void)state;
    char *argv[] = {"tidal-rl", "--max-steps", "6", "--resume-from-checkpoint", "out/checkpoint-2", "-o", "out dir",
                    "--overwrite-output-dir", "--resume_from_checkpoint=x"};
    static const char *const drop[] = {"--overwrite-output-dir", "--resume-from-checkpoint=", "--resume_from_checkpoint=", NULL};
    char *s = td_command_line_edit(9, argv, drop, "--resume");
    assert_string_equal(s, "tidal-rl --max-steps 6 -o 'out dir' --resume");
    free(s);
    char *again[] = {"tidal-rl", "--resume", "-o", "x"};
    s = td_command_line_edit(4, again, drop, "--resume");   /* not added twice */
    assert_string_equal(s, "tidal-rl --resume -o x");
    free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_only_what_differs),
        cmocka_unit_test(test_nested),
        cmocka_unit_test(test_continue_command),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
