/* config.json as the two generations of transformers write it.
 *
 * References: tests/fixtures/configs/hf4/ holds the published config.json of Qwen2.5-0.5B/7B-
 * Instruct, Qwen3-8B, Llama-3.1-8B-Instruct, Llama-3.2-1B-Instruct, Mistral-7B-v0.1 and
 * Mistral-7B-Instruct-v0.3 (plus three tiny test shapes); hf5/ holds the same configs as
 * transformers 5.23 re-saves them (resave_tf5.py beside them: rope_parameters, dtype,
 * layer_types, no top-level rope_theta). Asserted:
 *  1. each pair parses to the identical td_config, with no key outside tidal's key table;
 *  2. the values that matter are right (RoPE theta and llama3 factors, eos lists, windows);
 *  3. every refusal of the issue names the file and the key;
 *  4. eos lists: generation_config.json's list wins over config.json's, config.json's whole
 *     list is inherited otherwise;
 *  5. sequences longer than a sliding window are refused, shorter ones accepted. */
#include "ckpt_testutil.h"

#include "tidal/checkpoint.h"

#include <sys/stat.h>

static char *g_dir;

static int setup(void **state) { (void)state; g_dir = make_tmpdir(); return 0; }
static int teardown(void **state) { (void)state; rm_tree(g_dir); return 0; }

#define FIX "tests/fixtures/configs/"

static void parse_file(const char *path, td_config *c)
{
    td_error err = {{0}};
    int rc = td_config_parse(path, c, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
}

static const struct {
    const char *name;
    td_arch arch;
    double theta, factor;
    int n_eos, eos0, window, n_sliding, layers;
} published[] = {
    {"qwen2.5-0.5b-instruct", TD_ARCH_QWEN2, 1e6, 0, 1, 151645, 0, 0, 24},
    {"qwen2.5-7b-instruct", TD_ARCH_QWEN2, 1e6, 0, 1, 151645, 0, 0, 28},
    {"qwen3-8b", TD_ARCH_QWEN3, 1e6, 0, 1, 151645, 0, 0, 36},
    {"llama-3.1-8b-instruct", TD_ARCH_LLAMA, 500000, 8, 3, 128001, 0, 0, 32},
    {"llama-3.2-1b-instruct", TD_ARCH_LLAMA, 500000, 32, 3, 128001, 0, 0, 16},
    {"mistral-7b-v0.1", TD_ARCH_MISTRAL, 10000, 0, 1, 2, 4096, 32, 32},
    {"mistral-7b-instruct-v0.3", TD_ARCH_MISTRAL, 1e6, 0, 1, 2, 0, 0, 32},
    {"tiny-qwen2-rope1e6", TD_ARCH_QWEN2, 1e6, 0, 1, 2, 0, 0, 2},
    {"tiny-qwen2-sliding", TD_ARCH_QWEN2, 1e6, 0, 1, 2, 16, 1, 2},
    {"tiny-llama-llama3", TD_ARCH_LLAMA, 500000, 8, 3, 2, 0, 0, 2},
};

static void test_both_generations(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof published / sizeof published[0]; i++) {
        char p4[256], p5[256];
        snprintf(p4, sizeof p4, FIX "hf4/%s.json", published[i].name);
        snprintf(p5, sizeof p5, FIX "hf5/%s.json", published[i].name);
        td_config a, b;
        parse_file(p4, &a);
        parse_file(p5, &b);
        if (memcmp(&a, &b, sizeof a) != 0) fprintf(stderr, "%s: 4.x and 5.x layouts parse differently\n", published[i].name);
        assert_memory_equal(&a, &b, sizeof a);
        assert_string_equal(a.unknown_keys, "");
        assert_int_equal(a.arch, published[i].arch);
        assert_int_equal(a.num_layers, published[i].layers);
        assert_true(a.rope_theta == published[i].theta);
        assert_true(a.rope_factor == published[i].factor);
        assert_int_equal(a.n_eos, published[i].n_eos);
        assert_int_equal(a.eos_token_ids[0], published[i].eos0);
        assert_int_equal(a.sliding_window, published[i].window);
        assert_int_equal(a.n_sliding_layers, published[i].n_sliding);
    }
    td_config c;
    parse_file(FIX "hf5/llama-3.1-8b-instruct.json", &c);
    assert_true(c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0 && c.rope_original_max_position == 8192);
    assert_int_equal(c.eos_token_ids[1], 128008);
    assert_int_equal(c.eos_token_ids[2], 128009);
    assert_string_equal(c.torch_dtype, "bfloat16");   /* 5.x "dtype" */
    parse_file(FIX "hf5/tiny-qwen2-sliding.json", &c);
    assert_int_equal(c.first_sliding_layer, 1);
}

/* Qwen2.5-0.5B in the 5.x layout, with one key replaced (or added): "KEY":VALUE. */
static const char *qwen5(const char *key_value)
{
    static char text[4096];
    snprintf(text, sizeof text,
             "{\"architectures\":[\"Qwen2ForCausalLM\"],\"bos_token_id\":151643,"
             "\"dtype\":\"bfloat16\",\"eos_token_id\":151645,\"hidden_act\":\"silu\",\"hidden_size\":896,"
             "\"intermediate_size\":4864,\"max_position_embeddings\":32768,\"max_window_layers\":21,"
             "\"model_type\":\"qwen2\",\"num_attention_heads\":14,\"num_hidden_layers\":4,"
             "\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,\"sliding_window\":null,\"tie_word_embeddings\":true,"
             "\"use_sliding_window\":false,\"vocab_size\":151936,%s}", key_value);
    return text;
}

static const char *put(const char *name, const char *text)
{
    static char p[512];
    path_join(p, sizeof p, g_dir, name);
    write_text(p, text);
    return p;
}

static void refused(const char *key_value, const char *needle1, const char *needle2)
{
    td_config c;
    td_error err = {{0}};
    const char *p = put("config.json", qwen5(key_value));
    assert_int_not_equal(td_config_parse(p, &c, &err), 0);
    if (!contains_all(err.msg, p, needle1, needle2, NULL))
        fprintf(stderr, "message \"%s\" lacks \"%s\" / \"%s\"\n", err.msg, needle1, needle2);
    assert_true(contains_all(err.msg, p, needle1, needle2, NULL));
}

static void accepted(const char *key_value, td_config *c)
{
    parse_file(put("config.json", qwen5(key_value)), c);
}

static void test_refusals(void **state)
{
    (void)state;
    td_config c;
    refused("\"rope_parameters\":[1000000.0]", "\"rope_parameters\" must be an object", "an array");
    refused("\"rope_parameters\":{\"rope_type\":\"default\"}", "\"rope_parameters\" has no \"rope_theta\"", "");
    refused("\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":\"yarn\",\"factor\":4.0}",
            "\"rope_parameters.rope_type\" is \"yarn\"", "does not model");
    refused("\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":\"dynamic\",\"factor\":2.0}", "\"dynamic\"", "does not model");
    refused("\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":\"default\",\"mrope_section\":[16,24,24]}",
            "\"rope_parameters\" has a key \"mrope_section\"", "");
    refused("\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":\"default\",\"partial_rotary_factor\":0.5}",
            "\"rope_parameters.partial_rotary_factor\" is 0.5", "");
    refused("\"partial_rotary_factor\":0.25,\"rope_theta\":1e6", "\"partial_rotary_factor\" is 0.25", "");
    /* both generations present and disagreeing: both keys named */
    refused("\"rope_theta\":10000.0,\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":\"default\"}",
            "\"rope_theta\" (10000)", "\"rope_parameters\" rope_theta (1e+06)");
    refused("\"rope_theta\":500000.0,\"rope_scaling\":{\"rope_type\":\"llama3\",\"factor\":8.0},"
            "\"rope_parameters\":{\"rope_theta\":500000.0,\"rope_type\":\"default\"}",
            "\"rope_scaling\" (rope_type \"llama3\")", "\"rope_parameters\" (rope_type \"default\")");
    refused("\"rope_parameters\":{\"full_attention\":{\"rope_theta\":1e6,\"rope_type\":\"default\"},"
            "\"sliding_attention\":{\"rope_theta\":1e4,\"rope_type\":\"default\"}}", "different rotary embeddings", "");
    refused("\"rope_parameters\":{\"full_attention\":{\"rope_type\":\"default\"}}",
            "\"rope_parameters.full_attention\" has no \"rope_theta\"", "");
    refused("\"layer_types\":[\"full_attention\",\"full_attention\"]", "\"layer_types\" lists 2 layers",
            "\"num_hidden_layers\" is 4");
    refused("\"layer_types\":\"full_attention\"", "\"layer_types\" must be a list", "");
    refused("\"layer_types\":[\"full_attention\",\"full_attention\",\"chunked_attention\",\"full_attention\"]",
            "\"layer_types\"[2]", "");
    refused("\"rope_theta\":1e6,\"attention_dropout\":0.1", "\"attention_dropout\" is 0.1", "");
    refused("\"rope_theta\":1e6,\"quantization_config\":{\"quant_method\":\"fp8\"}", "\"quantization_config\"", "quantised");
    /* agreeing layouts, a nested per-layer-type object and an unknown key are accepted */
    accepted("\"rope_theta\":1e6,\"rope_parameters\":{\"rope_theta\":1e6,\"rope_type\":\"default\"}", &c);
    assert_true(c.rope_theta == 1e6);
    accepted("\"rope_parameters\":{\"full_attention\":{\"rope_theta\":5e5,\"rope_type\":\"default\"},"
             "\"sliding_attention\":{\"rope_theta\":5e5,\"rope_type\":\"default\"}}", &c);
    assert_true(c.rope_theta == 5e5);
    accepted("\"rope_theta\":1e6,\"my_new_field\":3,\"another\":true", &c);
    assert_string_equal(c.unknown_keys, "my_new_field,another");
    /* absent everywhere: transformers' default 10000 */
    accepted("\"initializer_range\":0.02", &c);
    assert_true(c.rope_theta == 10000.0);
}

static void test_eos_lists(void **state)
{
    (void)state;
    char dir[512], p[600];
    td_config c;
    parse_file(FIX "hf5/llama-3.1-8b-instruct.json", &c);
    td_gen_config g;
    td_error err = {{0}};
    assert_int_equal(td_gen_config_parse(NULL, &c, &g, &err), 0);   /* no generation_config.json */
    assert_int_equal(g.n_eos, 3);
    assert_int_equal(g.eos_token_ids[2], 128009);
    path_join(dir, sizeof dir, g_dir, "gen");
    mkdir(dir, 0755);
    path_join(p, sizeof p, dir, "generation_config.json");
    write_text(p, "{\"bos_token_id\":128000,\"eos_token_id\":[128009,128001],\"do_sample\":true}");
    assert_int_equal(td_gen_config_parse(p, &c, &g, &err), 0);      /* the file's list wins */
    assert_int_equal(g.n_eos, 2);
    assert_int_equal(g.eos_token_ids[0], 128009);
    assert_int_equal(g.eos_token_ids[1], 128001);
}

static void test_sliding_window_len(void **state)
{
    (void)state;
    td_config c;
    td_error err = {{0}};
    parse_file(FIX "hf5/mistral-7b-v0.1.json", &c);
    assert_int_equal(td_config_check_len(&c, 4096, &err), 0);
    assert_int_not_equal(td_config_check_len(&c, 4097, &err), 0);
    assert_true(contains_all(err.msg, "4097 positions", "sliding window of 4096", "32 layer(s)", "first: layer 0", NULL));
    parse_file(FIX "hf4/tiny-qwen2-sliding.json", &c);   /* use_sliding_window, max_window_layers 1 */
    assert_int_equal(td_config_check_len(&c, 16, &err), 0);
    assert_int_not_equal(td_config_check_len(&c, 17, &err), 0);
    assert_true(contains_all(err.msg, "1 layer(s)", "first: layer 1", NULL));
    parse_file(FIX "hf4/qwen2.5-0.5b-instruct.json", &c);    /* sliding_window set, not used */
    assert_int_equal(td_config_check_len(&c, 1 << 20, &err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_both_generations),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_eos_lists),
        cmocka_unit_test(test_sliding_window_len),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
