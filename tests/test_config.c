/* config.json and generation_config.json: the four architectures as their published configs
 * write them (fields copied from Llama-3.2-1B, Mistral-7B-v0.1, Qwen2.5-0.5B, Qwen3-0.6B),
 * transformers' defaults for absent keys, every rejection with a message naming file and key,
 * write -> parse round trips, and the generation defaults report.
 * Mixtures of experts: the defaults of transformers' Qwen2MoeConfig, Qwen3MoeConfig and
 * MixtralConfig for absent keys, the sparse-layer rule, the routers tidal refuses (by key), write
 * -> parse round trips, and the MoE presets against the published config.json files in
 * tests/fixtures/configs/hf4/ (Qwen/Qwen3-30B-A3B, Qwen/Qwen1.5-MoE-A2.7B,
 * mistralai/Mixtral-8x7B-v0.1). */
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

/* A minimal MoE config.json: the required keys, C=128 NH=32 (every arch's default NKV divides it),
 * F=96, plus the given ones ("" for none). */
static const char *moe_config(const char *arch, int layers, const char *extra)
{
    static char text[2048];
    snprintf(text, sizeof text,
             "{\"architectures\":[\"%s\"],\"vocab_size\":256,\"hidden_size\":128,\"intermediate_size\":96,"
             "\"num_hidden_layers\":%d,\"num_attention_heads\":32%s%s}", arch, layers, extra[0] ? "," : "", extra);
    return text;
}

/* transformers' defaults for the keys a config.json leaves out (Qwen2MoeConfig / Qwen3MoeConfig /
 * MixtralConfig of 4.46-4.51): Qwen2-MoE 60 experts top-4, 1408 wide, a shared expert of 5632,
 * no renormalisation; Qwen3-MoE 128 / 8 / 768, no shared expert; Mixtral 8 / 2 with experts
 * intermediate_size wide and always renormalised. Every layer sparse. */
static void test_moe_defaults(void **state)
{
    (void)state;
    td_config c;
    parse_ok(moe_config("Qwen2MoeForCausalLM", 2, ""), &c);
    assert_int_equal(c.arch, TD_ARCH_QWEN2_MOE);
    assert_int_equal(c.num_experts, 60);
    assert_int_equal(c.num_experts_per_tok, 4);
    assert_int_equal(c.moe_intermediate_size, 1408);
    assert_int_equal(c.shared_expert_intermediate_size, 5632);
    assert_false(c.norm_topk_prob);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_int_equal(c.n_mlp_only, 0);
    assert_true(c.router_aux_loss_coef == 0.001 && !c.output_router_logits);
    assert_true(c.qkv_bias && !c.qk_norm);   /* Qwen2-MoE's attention has q/k/v biases */
    assert_int_equal(c.num_kv_heads, 16);
    assert_true(td_config_layer_moe(&c, 0) && td_config_layer_moe(&c, 1));

    parse_ok(moe_config("Qwen3MoeForCausalLM", 2, "\"num_key_value_heads\":2,\"head_dim\":16"), &c);
    assert_int_equal(c.arch, TD_ARCH_QWEN3_MOE);
    assert_int_equal(c.num_experts, 128);
    assert_int_equal(c.num_experts_per_tok, 8);
    assert_int_equal(c.moe_intermediate_size, 768);
    assert_int_equal(c.shared_expert_intermediate_size, 0);
    assert_false(c.norm_topk_prob);
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_true(c.qk_norm && !c.qkv_bias);

    parse_ok(moe_config("MixtralForCausalLM", 2, "\"num_key_value_heads\":2"), &c);
    assert_int_equal(c.arch, TD_ARCH_MIXTRAL);
    assert_int_equal(c.num_experts, 8);
    assert_int_equal(c.num_experts_per_tok, 2);
    assert_int_equal(c.moe_intermediate_size, 96);    /* = intermediate_size */
    assert_int_equal(c.shared_expert_intermediate_size, 0);
    assert_true(c.norm_topk_prob);                   /* MixtralSparseMoeBlock always renormalises */
    assert_int_equal(c.decoder_sparse_step, 1);
    assert_true(!c.qkv_bias && !c.qk_norm);
    /* and read when present: Mixtral's key is num_local_experts */
    parse_ok(moe_config("MixtralForCausalLM", 2, "\"num_key_value_heads\":2,\"num_local_experts\":4,"
                        "\"num_experts_per_tok\":1,\"router_aux_loss_coef\":0.02,\"output_router_logits\":true"), &c);
    assert_true(c.num_experts == 4 && c.num_experts_per_tok == 1 && c.router_aux_loss_coef == 0.02 && c.output_router_logits);
    parse_ok(moe_config("Qwen2MoeForCausalLM", 2, "\"num_experts\":6,\"num_experts_per_tok\":3,\"moe_intermediate_size\":24,"
                        "\"shared_expert_intermediate_size\":0,\"norm_topk_prob\":true"), &c);
    assert_true(c.num_experts == 6 && c.num_experts_per_tok == 3 && c.moe_intermediate_size == 24);
    assert_true(c.shared_expert_intermediate_size == 0 && c.norm_topk_prob);
}

/* OlmoeConfig's eos_token_id default (50279) where config.json leaves the key out and the
 * vocabulary holds it; none where it is null or the vocabulary is smaller; the file's value wins */
static void test_olmoe_eos_default(void **state)
{
    (void)state;
    static const char *fmt = "{\"architectures\":[\"OlmoeForCausalLM\"],\"vocab_size\":%d,\"hidden_size\":128,"
                             "\"intermediate_size\":96,\"num_hidden_layers\":2,\"num_attention_heads\":4%s}";
    char text[1024];
    td_config c;
    snprintf(text, sizeof text, fmt, 50304, "");
    parse_ok(text, &c);
    assert_int_equal(c.eos_token_id, 50279);
    snprintf(text, sizeof text, fmt, 50304, ",\"eos_token_id\":null");
    parse_ok(text, &c);
    assert_int_equal(c.eos_token_id, -1);
    snprintf(text, sizeof text, fmt, 256, "");
    parse_ok(text, &c);
    assert_int_equal(c.eos_token_id, -1);
    snprintf(text, sizeof text, fmt, 50304, ",\"eos_token_id\":7");
    parse_ok(text, &c);
    assert_int_equal(c.eos_token_id, 7);
}

/* Layer l is sparse when (l + 1) % decoder_sparse_step == 0 and l is not in mlp_only_layers
 * (transformers' Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer); the parameter table follows: a
 * dense layer has mlp.gate_proj (F, C), a sparse one mlp.gate (E, C) and E experts of (FE, C). */
static void test_moe_layer_rule(void **state)
{
    (void)state;
    td_config c;
    parse_ok(moe_config("Qwen3MoeForCausalLM", 6, "\"num_key_value_heads\":2,\"head_dim\":16,\"num_experts\":4,"
                        "\"num_experts_per_tok\":2,\"moe_intermediate_size\":24,\"decoder_sparse_step\":2,"
                        "\"mlp_only_layers\":[3]"), &c);
    assert_int_equal(c.decoder_sparse_step, 2);
    assert_int_equal(c.n_mlp_only, 1);
    assert_int_equal(c.mlp_only_layers[0], 3);
    const bool sparse[6] = {false, true, false, false, false, true};   /* 3: (3+1) % 2 == 0 but listed */
    for (int l = 0; l < 6; l++) assert_int_equal(td_config_layer_moe(&c, l), sparse[l]);
    assert_int_equal(td_config_num_moe_layers(&c), 2);
    assert_int_equal(td_config_moe_index(&c, 1), 0);
    assert_int_equal(td_config_moe_index(&c, 5), 1);
    assert_int_equal(td_config_moe_index(&c, 3), -1);
    size_t n = td_config_params(&c, NULL, 0);
    td_param_spec *sp = malloc(n * sizeof *sp);
    td_config_params(&c, sp, n);
    int routers = 0, experts = 0, dense = 0;
    for (size_t i = 0; i < n; i++) {
        if (sp[i].role == TD_ROLE_ROUTER) {
            routers++;
            assert_true(sparse[sp[i].layer] && sp[i].shape[0] == 4 && sp[i].shape[1] == 128);
        }
        if (sp[i].role == TD_ROLE_E_GATE) {
            experts++;
            assert_true(sparse[sp[i].layer] && sp[i].shape[0] == 24 && sp[i].shape[1] == 128);
            assert_true(sp[i].expert >= 0 && sp[i].expert < 4);
        }
        if (sp[i].role == TD_ROLE_W_GATE) {
            dense++;
            assert_true(!sparse[sp[i].layer] && sp[i].shape[0] == 96);
        }
    }
    assert_int_equal(routers, 2);
    assert_int_equal(experts, 2 * 4);
    assert_int_equal(dense, 4);
    free(sp);

    /* decoder_sparse_step 3 over 7 layers: 2 and 5; Mixtral: every layer, whatever else is said */
    parse_ok(moe_config("Qwen2MoeForCausalLM", 7, "\"decoder_sparse_step\":3"), &c);
    for (int l = 0; l < 7; l++) assert_int_equal(td_config_layer_moe(&c, l), l == 2 || l == 5);
    parse_ok(moe_config("MixtralForCausalLM", 3, "\"num_key_value_heads\":2"), &c);
    assert_int_equal(td_config_num_moe_layers(&c), 3);
    /* an empty list is no layer; a layer index outside the model is refused */
    parse_ok(moe_config("Qwen3MoeForCausalLM", 2, "\"head_dim\":16,\"mlp_only_layers\":[]"), &c);
    assert_int_equal(td_config_num_moe_layers(&c), 2);
    parse_fails(moe_config("Qwen3MoeForCausalLM", 2, "\"head_dim\":16,\"mlp_only_layers\":[2]"), "\"mlp_only_layers\"");
}

/* Routers tidal does not model, and MoE keys where there are no experts: refused, naming the key. */
static void test_moe_refusals(void **state)
{
    (void)state;
    const char *q3 = "Qwen3MoeForCausalLM", *hd = "\"head_dim\":16,";
    char t[512];
#define MOE_FAILS(what, arch, ...) do { snprintf(t, sizeof t, __VA_ARGS__); parse_fails(moe_config(arch, 2, t), what); } while (0)
    MOE_FAILS("\"num_experts_per_tok\" 9 exceeds the 8 experts", q3, "%s\"num_experts\":8,\"num_experts_per_tok\":9", hd);
    MOE_FAILS("\"num_experts_per_tok\" 3 exceeds the 2 experts (\"num_local_experts\")", "MixtralForCausalLM",
              "\"num_key_value_heads\":2,\"num_local_experts\":2,\"num_experts_per_tok\":3");
    MOE_FAILS("\"n_group\"", q3, "%s\"n_group\":8", hd);
    MOE_FAILS("\"topk_group\"", q3, "%s\"topk_group\":4", hd);
    MOE_FAILS("\"e_score_correction_bias\"", q3, "%s\"e_score_correction_bias\":true", hd);
    MOE_FAILS("\"n_routed_experts\"", q3, "%s\"n_routed_experts\":64", hd);
    MOE_FAILS("\"scoring_func\" is sigmoid", q3, "%s\"scoring_func\":\"sigmoid\"", hd);
    MOE_FAILS("\"routed_scaling_factor\" is 2.5", q3, "%s\"routed_scaling_factor\":2.5", hd);
    MOE_FAILS("\"topk_method\" is noaux_tc", q3, "%s\"topk_method\":\"noaux_tc\"", hd);
    MOE_FAILS("\"num_experts\" must be an integer", q3, "%s\"num_experts\":\"8\"", hd);
    MOE_FAILS("\"num_experts\" = 0 is out of range", q3, "%s\"num_experts\":0", hd);
    MOE_FAILS("\"mlp_only_layers\" must be a list", q3, "%s\"mlp_only_layers\":1", hd);
    /* MoE keys on a dense architecture: tidal would run the model without its experts */
    MOE_FAILS("\"num_experts\" is set for Qwen3ForCausalLM", "Qwen3ForCausalLM", "%s\"num_experts\":8", hd);
    MOE_FAILS("\"num_local_experts\" is set for MistralForCausalLM", "MistralForCausalLM", "\"num_local_experts\":8");
    MOE_FAILS("\"moe_intermediate_size\" is set for Qwen2ForCausalLM", "Qwen2ForCausalLM", "\"moe_intermediate_size\":32");
    MOE_FAILS("\"shared_expert_intermediate_size\" is set for LlamaForCausalLM", "LlamaForCausalLM",
              "\"shared_expert_intermediate_size\":32");
#undef MOE_FAILS
    /* their neutral values are accepted: a softmax router of unscaled weights, no experts */
    td_config c;
    parse_ok(moe_config(q3, 2, "\"head_dim\":16,\"scoring_func\":\"softmax\",\"routed_scaling_factor\":1.0,"
                        "\"n_group\":null,\"topk_method\":\"greedy\""), &c);
    parse_ok(moe_config("Qwen3ForCausalLM", 2, "\"head_dim\":16,\"num_experts\":0"), &c);
    assert_int_equal(c.num_experts, 0);
    /* a hand-built struct: the same checks in td_config_validate */
    td_config_defaults(&c, TD_ARCH_LLAMA);
    assert_int_equal(td_config_preset("tiny", &c), 0);
    c.num_experts = 4; c.num_experts_per_tok = 2; c.moe_intermediate_size = 8;
    td_error err = {{0}};
    assert_int_not_equal(td_config_validate(&c, "hand-built", &err), 0);
    assert_true(contains_all(err.msg, "hand-built", "4 experts for LlamaForCausalLM", NULL));
    td_config_defaults(&c, TD_ARCH_QWEN3_MOE);
    assert_int_equal(td_config_preset("tiny", &c), 0);
    c.shared_expert_intermediate_size = 16;
    assert_int_not_equal(td_config_validate(&c, "hand-built", &err), 0);
    assert_true(contains_all(err.msg, "a shared expert is Qwen2-MoE's alone", NULL));
}

/* td_config_write -> td_config_parse gives the same struct for every MoE arch: the tiny presets,
 * the published shapes, and Qwen layouts with a sparse step, dense layers and no shared expert. */
static void test_moe_write_roundtrip(void **state)
{
    (void)state;
    struct { td_arch arch; const char *preset; int step; const char *mlp_only; int fs, norm, moe_layers; } cases[] = {
        {TD_ARCH_QWEN2_MOE, "tiny", -1, NULL, -1, -1, 2},
        {TD_ARCH_QWEN3_MOE, "tiny", -1, NULL, -1, -1, 2},
        {TD_ARCH_MIXTRAL, "tiny", -1, NULL, -1, -1, 2},
        {TD_ARCH_QWEN3_MOE, "qwen3-30b-a3b", -1, NULL, -1, -1, 48},
        {TD_ARCH_QWEN2_MOE, "qwen1.5-moe-a2.7b", -1, NULL, -1, -1, 24},
        {TD_ARCH_MIXTRAL, "mixtral-8x7b", -1, NULL, -1, -1, 32},
        {TD_ARCH_QWEN2_MOE, "tiny", 2, "0", 0, 1, 1},                 /* layer 1; no shared expert */
        {TD_ARCH_QWEN3_MOE, "qwen3-30b-a3b", 3, "0,47,20", -1, 0, 14}, /* 2, 5, .., 47 less 20 and 47 */
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        td_config c, back;
        td_config_defaults(&c, cases[k].arch);
        assert_int_equal(td_config_preset(cases[k].preset, &c), 0);
        assert_int_equal(c.arch, cases[k].arch);
        td_moe_opts o = {-1, -1, -1, cases[k].fs, cases[k].step, cases[k].norm, cases[k].mlp_only};
        td_error err = {{0}};
        if (td_config_set_moe(&c, &o, &err)) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(err.msg[0], 0);
        snprintf(c.torch_dtype, sizeof c.torch_dtype, "bfloat16");
        c.n_eos = td_config_eos_list(&c, c.eos_token_ids);   /* parsed configs hold the list form */
        char p[512];
        path_join(p, sizeof p, g_dir, "written.json");
        assert_int_equal(td_config_write(p, &c, &err), 0);
        if (td_config_parse(p, &back, &err)) fprintf(stderr, "%s\n", err.msg);
        if (memcmp(&c, &back, sizeof c) != 0)
            fprintf(stderr, "%s %s: E %d/%d K %d/%d FE %d/%d FS %d/%d step %d/%d mlp_only %d/%d norm %d/%d\n",
                    td_arch_name(c.arch), cases[k].preset, c.num_experts, back.num_experts, c.num_experts_per_tok,
                    back.num_experts_per_tok, c.moe_intermediate_size, back.moe_intermediate_size,
                    c.shared_expert_intermediate_size, back.shared_expert_intermediate_size, c.decoder_sparse_step,
                    back.decoder_sparse_step, c.n_mlp_only, back.n_mlp_only, c.norm_topk_prob, back.norm_topk_prob);
        assert_memory_equal(&c, &back, sizeof c);
        assert_int_equal(td_config_num_moe_layers(&back), cases[k].moe_layers);
    }
}

/* The MoE presets are the published config.json files (tests/fixtures/configs/hf4/; hf5/ the same
 * re-saved by transformers 5.24 with resave_tf5.py's steps): each file parses to the preset's
 * struct, but for what a preset leaves out (the file's torch_dtype, and Qwen1.5-MoE's legacy
 * "expert_interval", which transformers ignores and tidal classifies as inert). Where the hf4 files were read:
 *   qwen3-30b-a3b.json      huggingface.co/Qwen/Qwen3-30B-A3B config.json (transformers_version
 *                           4.51.0), as quoted whole in github.com/citsjtu2020/LLM-Prof
 *                           sglang/Model_Config.md; several other copies agree key for key
 *   qwen1.5-moe-a2.7b.json  huggingface.co/Qwen/Qwen1.5-MoE-A2.7B, config.json at revision
 *                           9f55e3d9d56a29aeac19d3d38329e58e63d38f61 (914 bytes, as this file);
 *                           the -Chat model's differs (32768 positions, eos 151645)
 *   mixtral-8x7b-v0.1.json  huggingface.co/mistralai/Mixtral-8x7B-v0.1 config.json, as quoted in
 *                           github.com/NVIDIA/TensorRT-LLM tests/unittest/_torch/modeling/
 *                           test_modeling_mixtral.py (MIXTRAL_8X7B_CONFIG); the -Instruct-v0.1
 *                           file (revision eba92302, 720 bytes, as this file) holds the same. */
static void test_moe_presets_published(void **state)
{
    (void)state;
    struct { const char *preset, *file, *unknown; } cases[] = {
        {"qwen3-30b-a3b", "tests/fixtures/configs/hf4/qwen3-30b-a3b.json", ""},
        {"qwen1.5-moe-a2.7b", "tests/fixtures/configs/hf4/qwen1.5-moe-a2.7b.json", ""},
        {"mixtral-8x7b", "tests/fixtures/configs/hf4/mixtral-8x7b-v0.1.json", ""},
        /* the same as transformers 5.24 re-saves them (resave_tf5.py): rope_parameters, dtype,
         * Qwen3-MoE's num_local_experts, Qwen2-MoE's qkv_bias, layer_types and sliding_window 0 */
        {"qwen3-30b-a3b", "tests/fixtures/configs/hf5/qwen3-30b-a3b.json", ""},
        {"qwen1.5-moe-a2.7b", "tests/fixtures/configs/hf5/qwen1.5-moe-a2.7b.json", ""},
        {"mixtral-8x7b", "tests/fixtures/configs/hf5/mixtral-8x7b-v0.1.json", ""},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        td_config pub, pre;
        td_error err = {{0}};
        if (td_config_parse(cases[k].file, &pub, &err)) fprintf(stderr, "%s\n", err.msg);
        assert_int_equal(err.msg[0], 0);
        assert_string_equal(pub.unknown_keys, cases[k].unknown);
        assert_string_equal(pub.torch_dtype, "bfloat16");
        td_config_defaults(&pre, TD_ARCH_LLAMA);
        assert_int_equal(td_config_preset(cases[k].preset, &pre), 0);
        memcpy(pre.torch_dtype, pub.torch_dtype, sizeof pre.torch_dtype);
        memcpy(pre.unknown_keys, pub.unknown_keys, sizeof pre.unknown_keys);
        pre.n_eos = td_config_eos_list(&pre, pre.eos_token_ids);
        if (memcmp(&pub, &pre, sizeof pub) != 0) fprintf(stderr, "preset %s differs from %s\n", cases[k].preset, cases[k].file);
        assert_memory_equal(&pub, &pre, sizeof pub);
    }
    /* the published values that matter, spelled out */
    td_config c;
    td_config_defaults(&c, TD_ARCH_LLAMA);
    assert_int_equal(td_config_preset("qwen3-30b-a3b", &c), 0);
    assert_true(c.arch == TD_ARCH_QWEN3_MOE && c.hidden_size == 2048 && c.num_layers == 48 && c.num_heads == 32);
    assert_true(c.num_kv_heads == 4 && c.head_dim == 128 && c.intermediate_size == 6144 && c.vocab_size == 151936);
    assert_true(c.num_experts == 128 && c.num_experts_per_tok == 8 && c.moe_intermediate_size == 768 && c.norm_topk_prob);
    assert_true(c.rope_theta == 1e6 && c.rms_norm_eps == 1e-6 && c.max_position == 40960 && !c.tie_word_embeddings);
    assert_int_equal(td_config_preset("qwen1.5-moe-a2.7b", &c), 0);
    assert_true(c.arch == TD_ARCH_QWEN2_MOE && c.hidden_size == 2048 && c.num_layers == 24 && c.num_heads == 16);
    assert_true(c.num_kv_heads == 16 && c.intermediate_size == 5632 && c.vocab_size == 151936 && c.qkv_bias);
    assert_true(c.num_experts == 60 && c.num_experts_per_tok == 4 && c.moe_intermediate_size == 1408);
    assert_true(c.shared_expert_intermediate_size == 5632 && !c.norm_topk_prob);
    assert_true(c.rope_theta == 1e6 && c.max_position == 8192 && !c.tie_word_embeddings && c.sliding_window == 0);
    assert_int_equal(td_config_preset("mixtral-8x7b", &c), 0);
    assert_true(c.arch == TD_ARCH_MIXTRAL && c.hidden_size == 4096 && c.num_layers == 32 && c.num_heads == 32);
    assert_true(c.num_kv_heads == 8 && c.intermediate_size == 14336 && c.vocab_size == 32000);
    assert_true(c.num_experts == 8 && c.num_experts_per_tok == 2 && c.moe_intermediate_size == 14336 && c.norm_topk_prob);
    assert_true(c.rope_theta == 1e6 && c.rms_norm_eps == 1e-5 && c.max_position == 32768 && !c.tie_word_embeddings);
}

/* tidal-init's MoE flags (td_config_set_moe): what each arch takes, what it refuses, naming the
 * flag first (tidal-init prints it as a usage error). */
static void test_moe_set_flags(void **state)
{
    (void)state;
    struct { td_arch arch; const char *preset; td_moe_opts o; const char *flag, *why; } bad[] = {
        {TD_ARCH_LLAMA, "tiny", {4, -1, -1, -1, -1, -1, NULL}, "--num-experts:", "dense architecture"},
        {TD_ARCH_QWEN2, "tiny", {-1, -1, -1, -1, -1, -1, "1"}, "--mlp-only-layers:", "dense architecture"},
        {TD_ARCH_QWEN3, "tiny", {-1, -1, -1, -1, -1, 0, NULL}, "--no-norm-topk-prob:", "dense architecture"},
        {TD_ARCH_MIXTRAL, "tiny", {-1, -1, 64, -1, -1, -1, NULL}, "--moe-intermediate-size:", "--intermediate-size wide"},
        {TD_ARCH_MIXTRAL, "tiny", {-1, -1, -1, -1, 2, -1, NULL}, "--decoder-sparse-step:", "every layer is sparse"},
        {TD_ARCH_MIXTRAL, "tiny", {-1, -1, -1, -1, -1, 1, NULL}, "--norm-topk-prob:", "always renormalises"},
        {TD_ARCH_MIXTRAL, "tiny", {-1, -1, -1, -1, -1, -1, "0"}, "--mlp-only-layers:", "every layer is sparse"},
        {TD_ARCH_QWEN3_MOE, "tiny", {-1, -1, -1, 32, -1, -1, NULL}, "--shared-expert-intermediate-size:", "Qwen2-MoE's alone"},
        {TD_ARCH_QWEN3_MOE, "tiny", {4, 5, -1, -1, -1, -1, NULL}, "--num-experts-per-tok:", "5 exceeds the 4 experts"},
        {TD_ARCH_QWEN3_MOE, "tiny", {-1, -1, -1, -1, -1, -1, "2"}, "--mlp-only-layers:", "layer 2, the model has 2"},
        {TD_ARCH_QWEN3_MOE, "tiny", {-1, -1, -1, -1, -1, -1, "0,1"}, "--mlp-only-layers:", "no layer of the 2"},
        {TD_ARCH_QWEN3_MOE, "tiny", {-1, -1, -1, -1, 3, -1, NULL}, "--decoder-sparse-step:", "no layer of the 2"},
        {TD_ARCH_QWEN3_MOE, "tiny", {-1, -1, -1, -1, -1, -1, "0,0"}, "--mlp-only-layers:", "listed twice"},
        {TD_ARCH_QWEN3_MOE, "tiny", {-1, -1, -1, -1, -1, -1, "1;"}, "--mlp-only-layers:", "not a comma-separated list"},
        /* no preset: an MoE arch needs its expert shape */
        {TD_ARCH_QWEN3_MOE, NULL, {-1, -1, -1, -1, -1, -1, NULL}, "--num-experts:", "--moe-intermediate-size FE"},
        {TD_ARCH_QWEN3_MOE, NULL, {8, 2, -1, -1, -1, -1, NULL}, "--moe-intermediate-size:", "each expert's MLP width"},
        {TD_ARCH_QWEN2_MOE, NULL, {8, 2, 16, -1, -1, -1, NULL}, "--shared-expert-intermediate-size:", "0: none"},
        {TD_ARCH_MIXTRAL, NULL, {8, -1, -1, -1, -1, -1, NULL}, "--num-experts-per-tok:", "--num-experts E and"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        td_config c;
        td_config_defaults(&c, bad[k].arch);
        if (bad[k].preset) assert_int_equal(td_config_preset(bad[k].preset, &c), 0);
        else { c.hidden_size = 64; c.num_layers = 2; c.num_heads = 4; c.num_kv_heads = 4; c.head_dim = 16;
               c.intermediate_size = 96; c.vocab_size = 128; }
        td_error err = {{0}};
        assert_int_not_equal(td_config_set_moe(&c, &bad[k].o, &err), 0);
        if (strncmp(err.msg, bad[k].flag, strlen(bad[k].flag)) != 0) fprintf(stderr, "\"%s\" does not start with %s\n", err.msg, bad[k].flag);
        assert_int_equal(strncmp(err.msg, bad[k].flag, strlen(bad[k].flag)), 0);
        assert_true(contains_all(err.msg, bad[k].why, NULL));
    }
    /* accepted: flags over a preset, a Mixtral's experts following its intermediate_size, a
     * shape from flags alone, none for a dense arch */
    td_config c;
    td_error err = {{0}};
    td_config_defaults(&c, TD_ARCH_MIXTRAL);
    assert_int_equal(td_config_preset("mixtral-8x7b", &c), 0);
    c.intermediate_size = 512;
    td_moe_opts o = {4, 1, -1, -1, -1, -1, NULL};
    assert_int_equal(td_config_set_moe(&c, &o, &err), 0);
    assert_true(c.num_experts == 4 && c.num_experts_per_tok == 1 && c.moe_intermediate_size == 512 && c.norm_topk_prob);
    td_config_defaults(&c, TD_ARCH_QWEN2_MOE);
    c.hidden_size = 64; c.num_layers = 4; c.num_heads = 4; c.num_kv_heads = 4; c.head_dim = 16;
    c.intermediate_size = 96; c.vocab_size = 128;
    td_moe_opts q = {6, 2, 16, 0, 2, 1, "3"};
    assert_int_equal(td_config_set_moe(&c, &q, &err), 0);
    assert_true(c.num_experts == 6 && c.num_experts_per_tok == 2 && c.moe_intermediate_size == 16);
    assert_true(c.shared_expert_intermediate_size == 0 && c.decoder_sparse_step == 2 && c.norm_topk_prob);
    assert_true(c.n_mlp_only == 1 && c.mlp_only_layers[0] == 3 && c.router_aux_loss_coef == 0.001);
    assert_int_equal(td_config_num_moe_layers(&c), 1);   /* 1; 3 is dense */
    assert_int_equal(td_config_validate(&c, "flags", &err), 0);
    td_moe_opts none = {-1, -1, -1, -1, -1, -1, "none"};
    assert_int_equal(td_config_set_moe(&c, &none, &err), 0);
    assert_int_equal(c.n_mlp_only, 0);
    td_moe_opts nothing = {-1, -1, -1, -1, -1, -1, NULL};
    td_config_defaults(&c, TD_ARCH_QWEN3);
    assert_int_equal(td_config_preset("tiny", &c), 0);
    assert_int_equal(td_config_set_moe(&c, &nothing, &err), 0);
    assert_int_equal(c.num_experts, 0);
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
        cmocka_unit_test(test_moe_defaults),
        cmocka_unit_test(test_olmoe_eos_default),
        cmocka_unit_test(test_moe_layer_rule),
        cmocka_unit_test(test_moe_refusals),
        cmocka_unit_test(test_moe_write_roundtrip),
        cmocka_unit_test(test_moe_presets_published),
        cmocka_unit_test(test_moe_set_flags),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
