/* config.json and generation_config.json: the four architectures as their published configs
 * write them (fields copied from Llama-3.2-1B, Mistral-7B-v0.1, Qwen2.5-0.5B, Qwen3-0.6B),
 * transformers' defaults for absent keys, every rejection with a message naming file and key,
 * write -> parse round trips, and the generation defaults report. */
#include "ckpt_testutil.h"

#include "tidal/checkpoint.h"

static char *g_dir;

static int setup(void **state) { (void)state; g_dir = make_tmpdir(); return 0; }
static int teardown(void **state) { (void)state; rm_tree(g_dir); return 0; }

/* Writes text to DIR/name and returns the path (static buffer). */
static const char *put(const char *name, const char *text)
{
    static char p[512];
    path_join(p, sizeof p, g_dir, name);
    write_text(p, text);
    return p;
}

static void parse_ok(const char *text, td_config *c)
{
    td_error err = {{0}};
    const char *p = put("config.json", text);
    int rc = td_config_parse(p, c, &err);
    if (rc) fprintf(stderr, "%s\n", err.msg);
    assert_int_equal(rc, 0);
}

static void parse_fails(const char *text, const char *what)
{
    td_error err = {{0}};
    td_config c;
    const char *p = put("config.json", text);
    assert_int_not_equal(td_config_parse(p, &c, &err), 0);
    assert_true(contains_all(err.msg, p, what, NULL));
}

static void test_llama3(void **state)
{
    (void)state;
    td_config c;
    parse_ok("{\"architectures\":[\"LlamaForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
             "\"bos_token_id\":128000,\"eos_token_id\":[128001,128008,128009],\"head_dim\":64,\"hidden_act\":\"silu\","
             "\"hidden_size\":2048,\"initializer_range\":0.02,\"intermediate_size\":8192,"
             "\"max_position_embeddings\":131072,\"mlp_bias\":false,\"model_type\":\"llama\","
             "\"num_attention_heads\":32,\"num_hidden_layers\":16,\"num_key_value_heads\":8,"
             "\"pretraining_tp\":1,\"rms_norm_eps\":1e-05,\"rope_scaling\":{\"factor\":32.0,"
             "\"high_freq_factor\":4.0,\"low_freq_factor\":1.0,\"original_max_position_embeddings\":8192,"
             "\"rope_type\":\"llama3\"},\"rope_theta\":500000.0,\"tie_word_embeddings\":true,"
             "\"torch_dtype\":\"bfloat16\",\"transformers_version\":\"4.45.0.dev0\",\"use_cache\":true,"
             "\"vocab_size\":128256}", &c);
    assert_int_equal(c.arch, TD_ARCH_LLAMA);
    assert_int_equal(c.vocab_size, 128256);
    assert_int_equal(c.num_kv_heads, 8);
    assert_int_equal(c.head_dim, 64);
    assert_true(c.rms_norm_eps == 1e-5 && c.rope_theta == 500000.0);
    assert_true(c.rope_factor == 32.0 && c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0);
    assert_int_equal(c.rope_original_max_position, 8192);
    assert_true(c.tie_word_embeddings && !c.qkv_bias && !c.qk_norm);
    assert_int_equal(c.bos_token_id, 128000);
    assert_int_equal(c.eos_token_id, 128001);   /* first of the list */
    assert_string_equal(c.torch_dtype, "bfloat16");
    assert_string_equal(td_arch_name(c.arch), "LlamaForCausalLM");
    /* "type" is the older spelling of "rope_type" */
    parse_ok("{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":16,\"hidden_size\":8,\"intermediate_size\":12,"
             "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"rope_scaling\":{\"type\":\"llama3\",\"factor\":8}}", &c);
    assert_true(c.rope_factor == 8.0 && c.rope_high_freq_factor == 4.0 && c.rope_original_max_position == 8192);
}

static void test_mistral_qwen_defaults(void **state)
{
    (void)state;
    td_config c;
    parse_ok("{\"architectures\":[\"MistralForCausalLM\"],\"bos_token_id\":1,\"eos_token_id\":2,\"hidden_act\":\"silu\","
             "\"hidden_size\":4096,\"initializer_range\":0.02,\"intermediate_size\":14336,\"max_position_embeddings\":32768,"
             "\"model_type\":\"mistral\",\"num_attention_heads\":32,\"num_hidden_layers\":32,\"num_key_value_heads\":8,"
             "\"rms_norm_eps\":1e-05,\"rope_theta\":10000.0,\"sliding_window\":4096,\"tie_word_embeddings\":false,"
             "\"torch_dtype\":\"bfloat16\",\"use_cache\":true,\"vocab_size\":32000}", &c);
    assert_int_equal(c.arch, TD_ARCH_MISTRAL);
    assert_int_equal(c.head_dim, 128);   /* default hidden / heads */
    assert_true(!c.tie_word_embeddings && c.rope_factor == 0);

    parse_ok("{\"architectures\":[\"Qwen2ForCausalLM\"],\"attention_dropout\":0.0,\"bos_token_id\":151643,"
             "\"eos_token_id\":151643,\"hidden_act\":\"silu\",\"hidden_size\":896,\"initializer_range\":0.02,"
             "\"intermediate_size\":4864,\"max_position_embeddings\":32768,\"max_window_layers\":24,\"model_type\":\"qwen2\","
             "\"num_attention_heads\":14,\"num_hidden_layers\":24,\"num_key_value_heads\":2,\"rms_norm_eps\":1e-06,"
             "\"rope_theta\":1000000.0,\"sliding_window\":32768,\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\","
             "\"transformers_version\":\"4.40.1\",\"use_cache\":true,\"use_sliding_window\":false,\"vocab_size\":151936}", &c);
    assert_int_equal(c.arch, TD_ARCH_QWEN2);
    assert_true(c.qkv_bias && !c.qk_norm && c.tie_word_embeddings);
    assert_int_equal(c.head_dim, 64);
    assert_true(c.rope_theta == 1e6);

    /* Qwen3: NH*HD = 16*128 = 2048 != C = 1024 */
    parse_ok("{\"architectures\":[\"Qwen3ForCausalLM\"],\"attention_bias\":false,\"attention_dropout\":0.0,"
             "\"bos_token_id\":151643,\"eos_token_id\":151645,\"head_dim\":128,\"hidden_act\":\"silu\",\"hidden_size\":1024,"
             "\"initializer_range\":0.02,\"intermediate_size\":3072,\"max_position_embeddings\":40960,\"max_window_layers\":28,"
             "\"model_type\":\"qwen3\",\"num_attention_heads\":16,\"num_hidden_layers\":28,\"num_key_value_heads\":8,"
             "\"rms_norm_eps\":1e-06,\"rope_scaling\":null,\"rope_theta\":1000000,\"sliding_window\":null,"
             "\"tie_word_embeddings\":true,\"torch_dtype\":\"bfloat16\",\"use_cache\":true,\"use_sliding_window\":false,"
             "\"vocab_size\":151936}", &c);
    assert_int_equal(c.arch, TD_ARCH_QWEN3);
    assert_true(c.qk_norm && !c.qkv_bias);
    assert_int_equal(c.head_dim * c.num_heads, 2048);
    td_param_spec specs[64];
    size_t n = td_config_params(&c, specs, 64);
    assert_int_equal(n, 1 + 28 * 11 + 1);   /* tied: no lm_head */
    assert_string_equal(specs[2].name, "model.layers.0.self_attn.q_proj.weight");
    assert_true(specs[2].shape[0] == 2048 && specs[2].shape[1] == 1024);

    /* transformers' defaults for absent keys, per architecture */
    const char *minimal = "{\"architectures\":[\"%s\"],\"vocab_size\":256,\"hidden_size\":64,"
                          "\"intermediate_size\":128,\"num_hidden_layers\":2,\"num_attention_heads\":%d}";
    char text[512];
    snprintf(text, sizeof text, minimal, "LlamaForCausalLM", 4);
    parse_ok(text, &c);
    assert_true(c.num_kv_heads == 4 && c.head_dim == 16 && c.bos_token_id == 1 && c.eos_token_id == 2);
    assert_true(c.rms_norm_eps == 1e-6 && c.rope_theta == 10000.0 && !c.tie_word_embeddings && c.max_position == 2048);
    snprintf(text, sizeof text, minimal, "MistralForCausalLM", 8);
    parse_ok(text, &c);
    assert_true(c.num_kv_heads == 8 && c.max_position == 131072);
    snprintf(text, sizeof text, minimal, "Qwen2ForCausalLM", 32);
    parse_ok(text, &c);
    assert_true(c.num_kv_heads == 32 && c.head_dim == 2 && c.bos_token_id == -1 && c.eos_token_id == -1);
    snprintf(text, sizeof text, minimal, "Qwen3ForCausalLM", 32);
    parse_ok(text, &c);
    assert_true(c.num_kv_heads == 32 && c.head_dim == 128 && c.max_position == 32768);
    /* model_type alone identifies the architecture when "architectures" is absent */
    parse_ok("{\"model_type\":\"qwen2\",\"vocab_size\":16,\"hidden_size\":8,\"intermediate_size\":12,"
             "\"num_hidden_layers\":1,\"num_attention_heads\":2,\"num_key_value_heads\":1}", &c);
    assert_int_equal(c.arch, TD_ARCH_QWEN2);
}

static void test_config_errors(void **state)
{
    (void)state;
    const char *base = "\"vocab_size\":16,\"hidden_size\":8,\"intermediate_size\":12,\"num_hidden_layers\":1";
    char t[1024];
#define FAILS(what, ...) do { snprintf(t, sizeof t, __VA_ARGS__); parse_fails(t, what); } while (0)
    FAILS("missing required key \"num_attention_heads\"", "{\"architectures\":[\"LlamaForCausalLM\"],%s}", base);
    FAILS("\"num_attention_heads\" must be an integer, got a string",
          "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":\"2\"}", base);
    FAILS("\"num_attention_heads\" must be an integer, got a real number",
          "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2.5}", base);
    FAILS("\"rms_norm_eps\" must be a number, got a string",
          "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"rms_norm_eps\":\"1e-6\"}", base);
    FAILS("\"tie_word_embeddings\" must be true or false",
          "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"tie_word_embeddings\":1}", base);
    FAILS("unknown architecture \"GPT2LMHeadModel\"", "{\"architectures\":[\"GPT2LMHeadModel\"],%s,\"num_attention_heads\":2}", base);
    FAILS("missing \"architectures\"", "{%s,\"num_attention_heads\":2}", base);
    FAILS("\"architectures\" must be a list", "{\"architectures\":\"LlamaForCausalLM\",%s,\"num_attention_heads\":2}", base);
    FAILS("num_attention_heads 6 is not divisible by num_key_value_heads 4",
          "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":6,\"num_key_value_heads\":4,\"head_dim\":2}", base);
    FAILS("\"hidden_size\" = 0 is out of range", "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":16,\"hidden_size\":0,"
          "\"intermediate_size\":12,\"num_hidden_layers\":1,\"num_attention_heads\":2}");
    FAILS("\"vocab_size\" = 99999999999 is out of range", "{\"architectures\":[\"LlamaForCausalLM\"],\"vocab_size\":99999999999,"
          "\"hidden_size\":8,\"intermediate_size\":12,\"num_hidden_layers\":1,\"num_attention_heads\":2}");
    FAILS("\"rope_scaling.rope_type\" is \"yarn\", which tidal does not model",
          "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}}", base);
    FAILS("rope_scaling.factor", "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"rope_scaling\":{\"rope_type\":\"llama3\"}}", base);
    FAILS("\"attention_bias\": true", "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"attention_bias\":true}", base);
    FAILS("\"mlp_bias\": true", "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"mlp_bias\":true}", base);
    FAILS("\"hidden_act\" must be \"silu\"", "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"hidden_act\":\"gelu\"}", base);
    FAILS("head_dim 3 must be even", "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"head_dim\":3}", base);
    FAILS("outside the vocabulary", "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"eos_token_id\":16}", base);
    FAILS("not a JSON object", "[1,2]");
    FAILS("invalid JSON", "{\"architectures\": [");
    FAILS("duplicate", "{\"architectures\":[\"LlamaForCausalLM\"],%s,\"num_attention_heads\":2,\"num_attention_heads\":4}", base);
#undef FAILS
    td_error err = {{0}};
    td_config c;
    char p[512];
    path_join(p, sizeof p, g_dir, "absent.json");
    assert_int_not_equal(td_config_parse(p, &c, &err), 0);
    assert_true(contains_all(err.msg, p, "cannot open", NULL));
    /* a checkpoint whose config is bad fails to open with the config's message */
    put("config.json", "{\"architectures\":[\"Phi3ForCausalLM\"]}");
    assert_null(td_checkpoint_open(g_dir, &err));
    assert_true(contains_all(err.msg, "config.json", "unknown architecture \"Phi3ForCausalLM\"", NULL));
}

/* write -> parse gives back the same struct, for every architecture, with and without
 * llama3 rope scaling */
static void test_config_write_roundtrip(void **state)
{
    (void)state;
    const char *presets[] = {"qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b"};
    for (int k = 0; k < 3 + TD_ARCH_COUNT; k++) {
        td_config c, back;
        td_config_defaults(&c, k < 3 ? TD_ARCH_LLAMA : (td_arch)(k - 3));
        assert_int_equal(td_config_preset(k < 3 ? presets[k] : "tiny", &c), 0);
        snprintf(c.torch_dtype, sizeof c.torch_dtype, "bfloat16");
        c.rms_norm_eps = 1e-5;
        c.n_eos = td_config_eos_list(&c, c.eos_token_ids);   /* parsed configs hold the list form */
        char p[512];
        path_join(p, sizeof p, g_dir, "written.json");
        td_error err = {{0}};
        assert_int_equal(td_config_write(p, &c, &err), 0);
        assert_int_equal(td_config_parse(p, &back, &err), 0);
        assert_memory_equal(&c, &back, sizeof c);
    }
    td_config bad;
    td_config_defaults(&bad, TD_ARCH_LLAMA);
    td_error err = {{0}};
    char p[512];
    path_join(p, sizeof p, g_dir, "never.json");
    assert_int_not_equal(td_config_write(p, &bad, &err), 0);   /* zero dims: refused */
    assert_int_not_equal(access(p, F_OK), 0);
}

static void test_generation_config(void **state)
{
    (void)state;
    td_config c;
    td_config_defaults(&c, TD_ARCH_QWEN2);
    c.vocab_size = 151936; c.bos_token_id = 151643; c.eos_token_id = 151643;
    td_gen_config g;
    td_error err = {{0}};
    /* Qwen2.5-Instruct's file: sampling on, and a repetition penalty a rollout may inherit */
    const char *p = put("generation_config.json",
                        "{\"bos_token_id\":151643,\"pad_token_id\":151643,\"do_sample\":true,"
                        "\"eos_token_id\":[151645,151643],\"repetition_penalty\":1.05,\"temperature\":0.7,"
                        "\"top_p\":0.8,\"top_k\":20,\"transformers_version\":\"4.37.0\"}");
    assert_int_equal(td_gen_config_parse(p, &c, &g, &err), 0);
    assert_true(g.from_file && g.do_sample && g.temperature == 0.7 && g.top_p == 0.8 && g.top_k == 20);
    assert_true(g.repetition_penalty == 1.05);
    assert_int_equal(g.n_eos, 2);
    assert_true(g.eos_token_ids[0] == 151645 && g.eos_token_ids[1] == 151643);
    assert_int_equal(g.present, TD_GEN_TEMPERATURE | TD_GEN_TOP_P | TD_GEN_TOP_K | TD_GEN_REPETITION_PENALTY |
                                TD_GEN_DO_SAMPLE | TD_GEN_BOS | TD_GEN_EOS);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    td_gen_config_print(f, &g);
    fclose(f);
    assert_true(contains_all(buf, "temperature=0.7", "top_k=20", "repetition_penalty=1.05", "eos_token_id=151645,151643",
                             "warning", NULL));
    free(buf);
    /* round trip through the writer */
    char q[512];
    path_join(q, sizeof q, g_dir, "gen_written.json");
    assert_int_equal(td_gen_config_write(q, &g, &err), 0);
    td_gen_config g2;
    assert_int_equal(td_gen_config_parse(q, NULL, &g2, &err), 0);
    assert_memory_equal(&g, &g2, sizeof g);
    /* only what the file says: a key it does not hold is not printed with a library default */
    p = put("generation_config.json", "{\"temperature\":0.6}");
    assert_int_equal(td_gen_config_parse(p, &c, &g, &err), 0);
    f = open_memstream(&buf, &len);
    td_gen_config_print(f, &g);
    fclose(f);
    assert_true(contains_all(buf, "generation_config.json sets temperature=0.6", NULL));
    assert_null(strstr(buf, "top_k"));
    assert_null(strstr(buf, "top_p"));
    free(buf);

    /* no file: transformers' defaults, ids from config.json, and no warning */
    assert_int_equal(td_gen_config_parse(NULL, &c, &g, &err), 0);
    assert_true(!g.from_file && g.present == 0 && g.temperature == 1.0 && g.top_k == 50 && g.repetition_penalty == 1.0);
    assert_true(g.bos_token_id == 151643 && g.n_eos == 1 && g.eos_token_ids[0] == 151643);
    f = open_memstream(&buf, &len);
    td_gen_config_print(f, &g);
    fclose(f);
    assert_null(strstr(buf, "warning"));
    assert_null(strstr(buf, "top_k"));   /* transformers' default 50 is not the checkpoint's */
    free(buf);

    /* mistyped keys */
    p = put("generation_config.json", "{\"temperature\":\"hot\"}");
    assert_int_not_equal(td_gen_config_parse(p, &c, &g, &err), 0);
    assert_true(contains_all(err.msg, p, "\"temperature\" must be a finite number", NULL));
    p = put("generation_config.json", "{\"top_k\":2.5}");
    assert_int_not_equal(td_gen_config_parse(p, &c, &g, &err), 0);
    assert_true(contains_all(err.msg, p, "top_k", NULL));
    p = put("generation_config.json", "{\"eos_token_id\":[1,\"2\"]}");
    assert_int_not_equal(td_gen_config_parse(p, &c, &g, &err), 0);
    assert_true(contains_all(err.msg, p, "eos_token_id", NULL));
    p = put("generation_config.json", "{\"do_sample\":\"yes\"}");
    assert_int_not_equal(td_gen_config_parse(p, &c, &g, &err), 0);
    assert_true(contains_all(err.msg, p, "do_sample", NULL));
}

static void test_names(void **state)
{
    (void)state;
    assert_int_equal(td_arch_from_name("qwen3"), TD_ARCH_QWEN3);
    assert_int_equal(td_arch_from_name("MistralForCausalLM"), TD_ARCH_MISTRAL);
    assert_int_equal(td_arch_from_name("gpt2"), -1);
    assert_int_equal(td_dtype_from_name("F8_E4M3"), TD_DT_F8_E4M3);
    assert_int_equal(td_dtype_from_name("bf16"), -1);   /* safetensors names are exact */
    assert_int_equal(td_dtype_parse("bf16"), TD_DT_BF16);
    assert_int_equal(td_dtype_parse("fp16"), TD_DT_F16);
    assert_int_equal(td_dtype_parse("int8"), -1);
    for (int d = 0; d < TD_DT_COUNT; d++)
        assert_int_equal(td_dtype_from_name(td_dtype_name((td_dtype)d)), d);
    td_config c;
    td_config_defaults(&c, TD_ARCH_LLAMA);
    assert_int_equal(td_config_preset("gpt-5", &c), -1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama3),
        cmocka_unit_test(test_mistral_qwen_defaults),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_config_write_roundtrip),
        cmocka_unit_test(test_generation_config),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
