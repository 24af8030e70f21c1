/* config.json for Llama-family decoders: parse (with transformers' per-architecture defaults),
 * validate, write.
 *
 * Defaults when a key is absent, from the transformers config classes' signatures:
 *                      Llama      Mistral    Qwen2      Qwen3
 *   num_key_value_heads = heads   8          32         32
 *   head_dim            C/NH      C/NH       C/NH       128
 *   max_position        2048      131072     32768      32768
 *   rms_norm_eps        1e-6      1e-6       1e-6       1e-6
 *   rope_theta          10000     10000      10000      10000
 *   tie_word_embeddings false     false      false      false
 *   bos / eos           1 / 2     1 / 2      none       none
 * Qwen2 always has q/k/v biases (its attention hard-codes bias=True); Qwen3 always has q/k norm.
 * Options tidal's forward does not model are refused rather than silently ignored:
 * attention_bias / mlp_bias = true, hidden_act != silu, rope types other than default and
 * llama3 (config_rope.c reads both the 4.x and the 5.x layout), a nonzero attention_dropout,
 * quantisation. Every key transformers writes is classified in config_keys.c; unknown keys are
 * warned about and recorded. Sliding-window layers are recorded (config_rope.c) and sequences
 * longer than their window refused by td_config_check_len.
 */
#include "config_json.h"

#include <math.h>
#include <string.h>
#include <strings.h>

static const struct {
    const char *hf, *model_type;
    int kv_default;            /* 0 = num_attention_heads */
    int head_dim_default;      /* 0 = hidden / heads      */
    int max_position, bos, eos;
} archs[TD_ARCH_COUNT] = {
    [TD_ARCH_LLAMA] = {"LlamaForCausalLM", "llama", 0, 0, 2048, 1, 2},
    [TD_ARCH_MISTRAL] = {"MistralForCausalLM", "mistral", 8, 0, 131072, 1, 2},
    [TD_ARCH_QWEN2] = {"Qwen2ForCausalLM", "qwen2", 32, 0, 32768, -1, -1},
    [TD_ARCH_QWEN3] = {"Qwen3ForCausalLM", "qwen3", 32, 128, 32768, -1, -1},
    [TD_ARCH_QWEN2_MOE] = {"Qwen2MoeForCausalLM", "qwen2_moe", 16, 0, 8192, -1, -1},
    [TD_ARCH_QWEN3_MOE] = {"Qwen3MoeForCausalLM", "qwen3_moe", 4, 0, 32768, -1, -1},   /* head_dim: getattr(config, "head_dim", C / NH) */
    [TD_ARCH_MIXTRAL] = {"MixtralForCausalLM", "mixtral", 8, 0, 131072, 1, 2},
    /* OlmoeConfig (transformers 4.45+): its eos default 50279 is applied in td_config_parse (absent
     * key, a vocabulary that holds it) */
    [TD_ARCH_OLMOE] = {"OlmoeForCausalLM", "olmoe", 0, 0, 4096, -1, -1},
};

/* whether an architecture is a mixture of experts */
static int arch_moe(int a)
{
    return a == TD_ARCH_QWEN2_MOE || a == TD_ARCH_QWEN3_MOE || a == TD_ARCH_MIXTRAL || a == TD_ARCH_OLMOE;
}

/* Upper bound of any one dimension: keeps products such as V*C far from size_t overflow and
 * rejects typos before anything is allocated from them. */
#define DIM_MAX (1 << 24)

bool td_config_layer_moe(const td_config *c, int l)
{
    if (c->num_experts <= 0) return false;
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only_layers[i] == l) return false;
    int step = c->decoder_sparse_step > 0 ? c->decoder_sparse_step : 1;
    return (l + 1) % step == 0;
}

int td_config_num_moe_layers(const td_config *c)
{
    int n = 0;
    for (int l = 0; l < c->num_layers; l++) n += td_config_layer_moe(c, l);
    return n;
}

int td_config_dense_mlp_width(const td_config *c)
{
    return c->num_experts > 0 && td_config_num_moe_layers(c) == c->num_layers ? 0 : c->intermediate_size;
}

int td_config_moe_index(const td_config *c, int l)
{
    if (!td_config_layer_moe(c, l)) return -1;
    int n = 0;
    for (int i = 0; i < l; i++) n += td_config_layer_moe(c, i);
    return n;
}

/* The mixture-of-experts keys (transformers' Qwen2MoeConfig, Qwen3MoeConfig, MixtralConfig, 4.46
 * and 5.x), with their defaults; keys of routers tidal does not model (DeepSeek-V3 / Kimi's sigmoid
 * scoring with a correction bias, group-limited top-k, a routed scaling factor) are refused by key
 * and value, so such a model is never run as a softmax top-k one. */
static int parse_moe(const char *path, json_t *j, td_config *c, td_error *err)
{
    static const char *refused[] = {"n_group", "topk_group", "e_score_correction_bias", "n_routed_experts",
                                    "n_shared_experts", "first_k_dense_replace", "moe_layer_freq", NULL};
    for (int i = 0; refused[i]; i++) {
        json_t *v = json_object_get(j, refused[i]);
        if (v && !json_is_null(v))
            return td_fail(err, "%s: \"%s\" is set: a router tidal does not model (DeepSeek-V3 style group-limited "
                           "or biased routing); only softmax top-k routing (Qwen2-MoE, Qwen3-MoE, Mixtral) is read",
                           path, refused[i]);
    }
    json_t *sf = json_object_get(j, "scoring_func");
    if (sf && !json_is_null(sf) && (!json_is_string(sf) || strcmp(json_string_value(sf), "softmax") != 0))
        return td_fail(err, "%s: \"scoring_func\" is %s: tidal models softmax routing only", path,
                       json_is_string(sf) ? json_string_value(sf) : "not a string");
    json_t *tm = json_object_get(j, "topk_method");
    if (tm && !json_is_null(tm) && (!json_is_string(tm) || strcmp(json_string_value(tm), "greedy") != 0))
        return td_fail(err, "%s: \"topk_method\" is %s: tidal models greedy top-k only", path,
                       json_is_string(tm) ? json_string_value(tm) : "not a string");
    double scaling;
    if (cfgj_num(path, j, "routed_scaling_factor", 1.0, &scaling, err)) return -1;
    if (scaling != 1.0)
        return td_fail(err, "%s: \"routed_scaling_factor\" is %g: tidal models unscaled routing weights (1.0)", path,
                       scaling);
    if (!arch_moe(c->arch)) {
        static const char *moe_keys[] = {"num_experts", "num_local_experts", "num_experts_per_tok",
                                         "moe_intermediate_size", "shared_expert_intermediate_size", NULL};
        for (int i = 0; moe_keys[i]; i++) {
            json_t *v = json_object_get(j, moe_keys[i]);
            if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 0))
                return td_fail(err, "%s: \"%s\" is set for %s, a dense architecture: tidal would run it without "
                               "its experts", path, moe_keys[i], td_arch_name(c->arch));
        }
        return 0;
    }
    int mixtral = c->arch == TD_ARCH_MIXTRAL, qwen2 = c->arch == TD_ARCH_QWEN2_MOE, olmoe = c->arch == TD_ARCH_OLMOE;
    /* Mixtral names it num_local_experts; transformers 5's Qwen3-MoE config writes that name too
     * (its attribute map sends num_experts there): either is read, and two different values refused */
    const char *ekey = mixtral || !json_object_get(j, "num_experts") ? "num_local_experts" : "num_experts";
    json_t *e1 = json_object_get(j, "num_experts"), *e2 = json_object_get(j, "num_local_experts");
    if (!mixtral && json_is_integer(e1) && json_is_integer(e2) && json_integer_value(e1) != json_integer_value(e2))
        return td_fail(err, "%s: \"num_experts\" %lld and \"num_local_experts\" %lld differ", path,
                       (long long)json_integer_value(e1), (long long)json_integer_value(e2));
    if (!mixtral && !e1 && !e2) ekey = "num_experts";
    if (cfgj_int(path, j, ekey, false, mixtral ? 8 : qwen2 ? 60 : olmoe ? 64 : 128, 1, 65536, &c->num_experts, err) ||
        cfgj_int(path, j, "num_experts_per_tok", false, mixtral ? 2 : qwen2 ? 4 : 8, 1, 65536,
                 &c->num_experts_per_tok, err) ||
        cfgj_num(path, j, "router_aux_loss_coef", olmoe ? 0.01 : 0.001, &c->router_aux_loss_coef, err) ||
        cfgj_bool(path, j, "output_router_logits", false, &c->output_router_logits, err))
        return -1;
    if (mixtral) {
        c->moe_intermediate_size = c->intermediate_size;
        c->norm_topk_prob = true;       /* MixtralSparseMoeBlock always renormalises */
        c->decoder_sparse_step = 1;
        double jitter;
        if (cfgj_num(path, j, "router_jitter_noise", 0.0, &jitter, err)) return -1;
        (void)jitter;                   /* applied in training mode only: the forward is without it */
    } else if (olmoe) {   /* OlmoeSparseMoeBlock: experts of width intermediate_size in every layer */
        c->moe_intermediate_size = c->intermediate_size;
        c->decoder_sparse_step = 1;
        if (cfgj_bool(path, j, "norm_topk_prob", false, &c->norm_topk_prob, err)) return -1;
        json_t *clip = json_object_get(j, "clip_qkv");
        if (clip && !json_is_null(clip))
            return td_fail(err, "%s: \"clip_qkv\" is set: OLMoE's clamp of q, k and v is not modelled (null reads)", path);
    } else {
        if (cfgj_int(path, j, "moe_intermediate_size", false, qwen2 ? 1408 : 768, 1, DIM_MAX,
                     &c->moe_intermediate_size, err) ||
            cfgj_bool(path, j, "norm_topk_prob", false, &c->norm_topk_prob, err) ||
            cfgj_int(path, j, "decoder_sparse_step", false, 1, 1, 4096, &c->decoder_sparse_step, err))
            return -1;
        if (qwen2 && cfgj_int(path, j, "shared_expert_intermediate_size", false, 5632, 0, DIM_MAX,
                              &c->shared_expert_intermediate_size, err))
            return -1;
        if (qwen2 && cfgj_bool(path, j, "qkv_bias", true, &c->qkv_bias, err))   /* transformers 5 writes it */
            return -1;
        json_t *mo = json_object_get(j, "mlp_only_layers");
        if (mo && !json_is_null(mo)) {
            if (!json_is_array(mo)) return td_fail(err, "%s: \"mlp_only_layers\" must be a list of layer indices", path);
            if (json_array_size(mo) > sizeof c->mlp_only_layers / sizeof c->mlp_only_layers[0])
                return td_fail(err, "%s: \"mlp_only_layers\" lists %zu layers; tidal reads at most %zu", path,
                               json_array_size(mo), sizeof c->mlp_only_layers / sizeof c->mlp_only_layers[0]);
            size_t i;
            json_t *e;
            json_array_foreach(mo, i, e) {
                if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) >= c->num_layers)
                    return td_fail(err, "%s: \"mlp_only_layers\"[%zu] must be a layer index in [0, %d)", path, i,
                                   c->num_layers);
                c->mlp_only_layers[c->n_mlp_only++] = (int)json_integer_value(e);
            }
        }
    }
    if (c->num_experts_per_tok > c->num_experts)
        return td_fail(err, "%s: \"num_experts_per_tok\" %d exceeds the %d experts (\"%s\")", path,
                       c->num_experts_per_tok, c->num_experts, mixtral ? "num_local_experts" : "num_experts");
    return 0;
}

const char *td_arch_name(td_arch a) { return (unsigned)a < TD_ARCH_COUNT ? archs[a].hf : "?"; }

int td_arch_from_name(const char *s)
{
    for (int i = 0; i < TD_ARCH_COUNT; i++)
        if (strcmp(s, archs[i].hf) == 0 || strcasecmp(s, archs[i].model_type) == 0) return i;
    return -1;
}

void td_config_defaults(td_config *c, td_arch arch)
{
    memset(c, 0, sizeof *c);
    c->arch = arch;
    c->max_position = archs[arch].max_position;
    c->rms_norm_eps = 1e-6;
    c->rope_theta = 10000.0;
    c->qkv_bias = arch == TD_ARCH_QWEN2 || arch == TD_ARCH_QWEN2_MOE;
    c->qk_norm = arch == TD_ARCH_QWEN3 || arch == TD_ARCH_QWEN3_MOE || arch == TD_ARCH_OLMOE;
    c->qk_norm_full = arch == TD_ARCH_OLMOE;
    if (arch == TD_ARCH_OLMOE) c->rms_norm_eps = 1e-5;
    c->bos_token_id = archs[arch].bos;
    c->eos_token_id = archs[arch].eos;
    c->first_sliding_layer = -1;
    snprintf(c->torch_dtype, sizeof c->torch_dtype, "float32");
}

/* ---- typed getters: absent (or null) -> default or "missing", wrong type -> error ---- */

const char *cfgj_type_name(const json_t *v)
{
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: case JSON_FALSE: return "a boolean";
    default: return "null";
    }
}

int cfgj_int(const char *path, json_t *o, const char *key, bool required, int def, int lo,
                   int hi, int *out, td_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) {
        if (required) return td_fail(err, "%s: missing required key \"%s\"", path, key);
        *out = def;
        return 0;
    }
    if (!json_is_integer(v))
        return td_fail(err, "%s: \"%s\" must be an integer, got %s", path, key, cfgj_type_name(v));
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return td_fail(err, "%s: \"%s\" = %lld is out of range [%d, %d]", path, key, (long long)x, lo, hi);
    *out = (int)x;
    return 0;
}

int cfgj_num(const char *path, json_t *o, const char *key, double def, double *out, td_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_number(v))
        return td_fail(err, "%s: \"%s\" must be a number, got %s", path, key, cfgj_type_name(v));
    *out = json_number_value(v);
    if (!isfinite(*out)) return td_fail(err, "%s: \"%s\" is not finite", path, key);
    return 0;
}

int cfgj_bool(const char *path, json_t *o, const char *key, bool def, bool *out, td_error *err)
{
    json_t *v = json_object_get(o, key);
    if (!v || json_is_null(v)) { *out = def; return 0; }
    if (!json_is_boolean(v))
        return td_fail(err, "%s: \"%s\" must be true or false, got %s", path, key, cfgj_type_name(v));
    *out = json_is_true(v);
    return 0;
}

/* Token id: an integer, or a list of integers (all kept in ids[0..*n), the first also in *out:
 * Llama 3 Instruct stops on [128001, 128008, 128009]), or null / absent (def). */
static int get_tokens(const char *path, json_t *o, const char *key, int def, int *out, int *ids, int *n,
                      td_error *err)
{
    json_t *v = json_object_get(o, key);
    *n = 0;
    if (json_is_array(v)) {
        if (json_array_size(v) > TD_CONFIG_MAX_EOS)
            return td_fail(err, "%s: \"%s\" lists %zu ids, tidal keeps at most %d", path, key, json_array_size(v),
                           TD_CONFIG_MAX_EOS);
        for (size_t i = 0; i < json_array_size(v); i++) {
            json_t *e = json_array_get(v, i);
            if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
                return td_fail(err, "%s: \"%s\" list must hold non-negative integers", path, key);
            ids[(*n)++] = (int)json_integer_value(e);
        }
        *out = *n ? ids[0] : def;
        return 0;
    }
    if (cfgj_int(path, o, key, false, def, 0, INT32_MAX, out, err)) return -1;
    if (*out >= 0) ids[(*n)++] = *out;
    return 0;
}


/* eos_token_id when config.json leaves it out: the architecture's class default, but OlmoeConfig's
 * 50279 only where the key is absent (null is None in transformers) and the vocabulary holds that
 * id (a small tidal-init vocabulary does not: no eos then, as before) */
static int eos_default(int arch, json_t *j, const td_config *c)
{
    if (arch != TD_ARCH_OLMOE) return c->eos_token_id;
    return !json_object_get(j, "eos_token_id") && c->vocab_size > 50279 ? 50279 : -1;
}

int td_config_parse(const char *path, td_config *c, td_error *err)
{
    json_t *j = td_json_load_file(path, err);
    if (!j) return -1;
    int rc = -1;
    if (!json_is_object(j)) { td_fail(err, "%s: not a JSON object", path); goto done; }

    json_t *ar = json_object_get(j, "architectures"), *mt = json_object_get(j, "model_type");
    const char *archname = NULL;
    int arch = -1;
    if (ar && !json_is_null(ar)) {
        if (!json_is_array(ar) || json_array_size(ar) < 1 || !json_is_string(json_array_get(ar, 0))) {
            td_fail(err, "%s: \"architectures\" must be a list of class names", path);
            goto done;
        }
        archname = json_string_value(json_array_get(ar, 0));
        for (int i = 0; i < TD_ARCH_COUNT; i++)
            if (strcmp(archname, archs[i].hf) == 0) arch = i;
    } else if (json_is_string(mt)) {
        archname = json_string_value(mt);
        for (int i = 0; i < TD_ARCH_COUNT; i++)
            if (strcmp(archname, archs[i].model_type) == 0) arch = i;
    } else {
        td_fail(err, "%s: missing \"architectures\" (and no \"model_type\")", path);
        goto done;
    }
    if (arch < 0) {
        td_fail(err, "%s: unknown architecture \"%s\" (tidal reads LlamaForCausalLM, MistralForCausalLM, "
                "Qwen2ForCausalLM, Qwen3ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, MixtralForCausalLM, "
                "OlmoeForCausalLM)",
                path, archname);
        goto done;
    }
    td_config_defaults(c, (td_arch)arch);
    int bos_ids[TD_CONFIG_MAX_EOS], n_bos;
    if (cfgj_int(path, j, "vocab_size", true, 0, 1, DIM_MAX, &c->vocab_size, err) ||
        cfgj_int(path, j, "hidden_size", true, 0, 1, DIM_MAX, &c->hidden_size, err) ||
        cfgj_int(path, j, "intermediate_size", true, 0, 1, DIM_MAX, &c->intermediate_size, err) ||
        cfgj_int(path, j, "num_hidden_layers", true, 0, 1, 4096, &c->num_layers, err) ||
        cfgj_int(path, j, "num_attention_heads", true, 0, 1, 65536, &c->num_heads, err))
        goto done;
    int kv_def = archs[arch].kv_default ? archs[arch].kv_default : c->num_heads;
    int hd_def = archs[arch].head_dim_default ? archs[arch].head_dim_default : c->hidden_size / c->num_heads;
    if (cfgj_int(path, j, "num_key_value_heads", false, kv_def, 1, 65536, &c->num_kv_heads, err) ||
        cfgj_int(path, j, "head_dim", false, hd_def, 1, 65536, &c->head_dim, err) ||
        cfgj_int(path, j, "max_position_embeddings", false, c->max_position, 1, INT32_MAX, &c->max_position, err) ||
        cfgj_num(path, j, "rms_norm_eps", c->rms_norm_eps, &c->rms_norm_eps, err) ||
        cfgj_bool(path, j, "tie_word_embeddings", false, &c->tie_word_embeddings, err) ||
        get_tokens(path, j, "bos_token_id", c->bos_token_id, &c->bos_token_id, bos_ids, &n_bos, err) ||
        get_tokens(path, j, "eos_token_id", eos_default(arch, j, c), &c->eos_token_id, c->eos_token_ids, &c->n_eos, err) ||
        cfgj_rope(path, j, c, err) || cfgj_attention_layers(path, j, c, err) || cfgj_classify_keys(path, j, c, err) ||
        parse_moe(path, j, c, err))
        goto done;

    bool attention_bias, mlp_bias;
    if (cfgj_bool(path, j, "attention_bias", false, &attention_bias, err) ||
        cfgj_bool(path, j, "mlp_bias", false, &mlp_bias, err))
        goto done;
    if (attention_bias && arch != TD_ARCH_QWEN2 && arch != TD_ARCH_QWEN2_MOE) {
        td_fail(err, "%s: \"attention_bias\": true (biases on q/k/v/o) is not supported for %s", path, archname);
        goto done;
    }
    if (mlp_bias) { td_fail(err, "%s: \"mlp_bias\": true is not supported", path); goto done; }
    json_t *act = json_object_get(j, "hidden_act");
    if (act && !json_is_null(act) && (!json_is_string(act) || strcmp(json_string_value(act), "silu") != 0)) {
        td_fail(err, "%s: \"hidden_act\" must be \"silu\" (SwiGLU MLP)", path);
        goto done;
    }
    /* 5.x writes "dtype", 4.x "torch_dtype"; transformers 5 prefers "dtype" where both are present */
    const char *dt_key = "dtype";
    json_t *dt = json_object_get(j, dt_key);
    if (!dt || json_is_null(dt)) dt = json_object_get(j, dt_key = "torch_dtype");
    if (dt && !json_is_null(dt)) {
        if (!json_is_string(dt)) { td_fail(err, "%s: \"%s\" must be a string", path, dt_key); goto done; }
        snprintf(c->torch_dtype, sizeof c->torch_dtype, "%s", json_string_value(dt));
    } else {
        c->torch_dtype[0] = 0;
    }
    rc = td_config_validate(c, path, err);
done:
    json_decref(j);
    return rc;
}

int td_config_eos_list(const td_config *c, int *ids)
{
    if (c->n_eos > 0) {
        memcpy(ids, c->eos_token_ids, (size_t)c->n_eos * sizeof *ids);
        return c->n_eos;
    }
    if (c->eos_token_id < 0) return 0;
    ids[0] = c->eos_token_id;
    return 1;
}

int td_config_validate(const td_config *c, const char *what, td_error *err)
{
    if ((unsigned)c->arch >= TD_ARCH_COUNT) return td_fail(err, "%s: unknown architecture %d", what, (int)c->arch);
    if (c->vocab_size < 1 || c->hidden_size < 1 || c->intermediate_size < 1 || c->num_layers < 1 ||
        c->num_heads < 1 || c->num_kv_heads < 1 || c->head_dim < 1)
        return td_fail(err, "%s: every dimension must be positive (V=%d C=%d F=%d L=%d NH=%d NKV=%d HD=%d)", what,
                       c->vocab_size, c->hidden_size, c->intermediate_size, c->num_layers, c->num_heads,
                       c->num_kv_heads, c->head_dim);
    if (c->vocab_size > DIM_MAX || c->hidden_size > DIM_MAX || c->intermediate_size > DIM_MAX ||
        (int64_t)c->num_heads * c->head_dim > DIM_MAX)
        return td_fail(err, "%s: a dimension exceeds %d", what, DIM_MAX);
    if (c->num_heads % c->num_kv_heads != 0)
        return td_fail(err, "%s: num_attention_heads %d is not divisible by num_key_value_heads %d", what,
                       c->num_heads, c->num_kv_heads);
    if (c->head_dim % 2 != 0) return td_fail(err, "%s: head_dim %d must be even (RoPE rotates pairs)", what, c->head_dim);
    if (c->num_experts < 0 || (c->num_experts > 0 && (c->num_experts_per_tok < 1 || c->moe_intermediate_size < 1 ||
                                                       c->shared_expert_intermediate_size < 0)))
        return td_fail(err, "%s: mixture of experts with E=%d K=%d FE=%d FS=%d: every size must be positive", what,
                       c->num_experts, c->num_experts_per_tok, c->moe_intermediate_size,
                       c->shared_expert_intermediate_size);
    if (c->num_experts > 0 && c->num_experts_per_tok > c->num_experts)
        return td_fail(err, "%s: num_experts_per_tok %d exceeds the %d experts", what, c->num_experts_per_tok,
                       c->num_experts);
    int moe_arch = arch_moe(c->arch);
    if (moe_arch && c->num_experts < 1)
        return td_fail(err, "%s: %s is a mixture of experts: num_experts must be at least 1", what, td_arch_name(c->arch));
    if (c->arch == TD_ARCH_MIXTRAL &&
        (c->moe_intermediate_size != c->intermediate_size || c->decoder_sparse_step > 1 || c->n_mlp_only > 0 ||
         !c->norm_topk_prob))
        return td_fail(err, "%s: Mixtral's experts are every layer's, of width intermediate_size %d, renormalised "
                       "(got width %d, sparse step %d, %d dense layers, norm_topk_prob %d)", what, c->intermediate_size,
                       c->moe_intermediate_size, c->decoder_sparse_step, c->n_mlp_only, (int)c->norm_topk_prob);
    if (c->arch == TD_ARCH_OLMOE &&
        (c->moe_intermediate_size != c->intermediate_size || c->decoder_sparse_step > 1 || c->n_mlp_only > 0 ||
         c->head_dim * c->num_heads != c->hidden_size))
        return td_fail(err, "%s: OLMoE's experts are every layer's, of width intermediate_size %d, and its heads "
                       "split hidden_size (got width %d, sparse step %d, %d dense layers, head_dim %d x %d heads "
                       "for hidden_size %d)", what, c->intermediate_size, c->moe_intermediate_size,
                       c->decoder_sparse_step, c->n_mlp_only, c->head_dim, c->num_heads, c->hidden_size);
    if (c->num_experts > 0 && !moe_arch)
        return td_fail(err, "%s: %d experts for %s, a dense architecture", what, c->num_experts, td_arch_name(c->arch));
    if (c->shared_expert_intermediate_size > 0 && c->arch != TD_ARCH_QWEN2_MOE)
        return td_fail(err, "%s: a shared expert is Qwen2-MoE's alone", what);
    if (!(c->rms_norm_eps > 0)) return td_fail(err, "%s: rms_norm_eps must be > 0", what);
    if (!(c->rope_theta > 0)) return td_fail(err, "%s: rope_theta must be > 0", what);
    if (c->bos_token_id >= c->vocab_size || c->eos_token_id >= c->vocab_size)
        return td_fail(err, "%s: bos/eos token id (%d/%d) outside the vocabulary of %d", what, c->bos_token_id,
                       c->eos_token_id, c->vocab_size);
    int eos[TD_CONFIG_MAX_EOS], n_eos = td_config_eos_list(c, eos);
    for (int i = 0; i < n_eos; i++)
        if (eos[i] < 0 || eos[i] >= c->vocab_size)
            return td_fail(err, "%s: eos_token_id %d outside the vocabulary of %d", what, eos[i], c->vocab_size);
    return 0;
}

int td_config_write(const char *path, const td_config *c, td_error *err)
{
    if (td_config_validate(c, path, err) != 0) return -1;
    const char *mt = archs[c->arch].model_type;
    json_t *j = json_object();
    json_object_set_new(j, "architectures", json_pack("[s]", archs[c->arch].hf));
    json_object_set_new(j, "model_type", json_string(mt));
    json_object_set_new(j, "vocab_size", json_integer(c->vocab_size));
    json_object_set_new(j, "hidden_size", json_integer(c->hidden_size));
    json_object_set_new(j, "intermediate_size", json_integer(c->intermediate_size));
    json_object_set_new(j, "num_hidden_layers", json_integer(c->num_layers));
    json_object_set_new(j, "num_attention_heads", json_integer(c->num_heads));
    json_object_set_new(j, "num_key_value_heads", json_integer(c->num_kv_heads));
    json_object_set_new(j, "head_dim", json_integer(c->head_dim));
    json_object_set_new(j, "hidden_act", json_string("silu"));
    json_object_set_new(j, "max_position_embeddings", json_integer(c->max_position));
    json_object_set_new(j, "initializer_range", json_real(0.02));
    json_object_set_new(j, "rms_norm_eps", json_real(c->rms_norm_eps));
    json_object_set_new(j, "rope_theta", json_real(c->rope_theta));
    if (c->rope_factor > 0)
        json_object_set_new(j, "rope_scaling",
                            json_pack("{s:s, s:f, s:f, s:f, s:i}", "rope_type", "llama3", "factor", c->rope_factor,
                                      "low_freq_factor", c->rope_low_freq_factor, "high_freq_factor",
                                      c->rope_high_freq_factor, "original_max_position_embeddings",
                                      c->rope_original_max_position));
    else
        json_object_set_new(j, "rope_scaling", json_null());
    json_object_set_new(j, "tie_word_embeddings", json_boolean(c->tie_word_embeddings));
    json_object_set_new(j, "attention_dropout", json_real(0.0));
    if (c->arch == TD_ARCH_LLAMA || c->arch == TD_ARCH_QWEN3 || c->arch == TD_ARCH_QWEN3_MOE || c->arch == TD_ARCH_OLMOE)
        json_object_set_new(j, "attention_bias", json_false());
    if (c->arch == TD_ARCH_OLMOE) json_object_set_new(j, "clip_qkv", json_null());
    if (c->arch == TD_ARCH_LLAMA) json_object_set_new(j, "mlp_bias", json_false());
    if (c->arch == TD_ARCH_MISTRAL || c->arch == TD_ARCH_MIXTRAL) json_object_set_new(j, "sliding_window", json_null());
    if (c->arch == TD_ARCH_QWEN2 || c->arch == TD_ARCH_QWEN3 || c->arch == TD_ARCH_QWEN2_MOE ||
        c->arch == TD_ARCH_QWEN3_MOE) {
        json_object_set_new(j, "use_sliding_window", json_false());
        json_object_set_new(j, "sliding_window", json_null());
        json_object_set_new(j, "max_window_layers", json_integer(c->num_layers));
    }
    json_object_set_new(j, "bos_token_id", c->bos_token_id >= 0 ? json_integer(c->bos_token_id) : json_null());
    int eos[TD_CONFIG_MAX_EOS], n_eos = td_config_eos_list(c, eos);
    if (n_eos > 1) {
        json_t *a = json_array();
        for (int i = 0; i < n_eos; i++) json_array_append_new(a, json_integer(eos[i]));
        json_object_set_new(j, "eos_token_id", a);
    } else {
        json_object_set_new(j, "eos_token_id", c->eos_token_id >= 0 ? json_integer(c->eos_token_id) : json_null());
    }
    if (c->num_experts > 0) {
        json_object_set_new(j, c->arch == TD_ARCH_MIXTRAL ? "num_local_experts" : "num_experts",
                            json_integer(c->num_experts));
        json_object_set_new(j, "num_experts_per_tok", json_integer(c->num_experts_per_tok));
        json_object_set_new(j, "router_aux_loss_coef", json_real(c->router_aux_loss_coef));
        json_object_set_new(j, "output_router_logits", json_boolean(c->output_router_logits));
        if (c->arch == TD_ARCH_OLMOE) json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob));
        if (c->arch != TD_ARCH_MIXTRAL && c->arch != TD_ARCH_OLMOE) {
            json_object_set_new(j, "moe_intermediate_size", json_integer(c->moe_intermediate_size));
            json_object_set_new(j, "norm_topk_prob", json_boolean(c->norm_topk_prob));
            json_object_set_new(j, "decoder_sparse_step", json_integer(c->decoder_sparse_step));
            json_t *mo = json_array();
            for (int i = 0; i < c->n_mlp_only; i++) json_array_append_new(mo, json_integer(c->mlp_only_layers[i]));
            json_object_set_new(j, "mlp_only_layers", mo);
        }
        if (c->arch == TD_ARCH_QWEN2_MOE)
            json_object_set_new(j, "shared_expert_intermediate_size", json_integer(c->shared_expert_intermediate_size));
    }
    json_object_set_new(j, "torch_dtype", json_string(c->torch_dtype[0] ? c->torch_dtype : "float32"));
    json_object_set_new(j, "use_cache", json_true());
    int rc = 0;
    if (json_dump_file(j, path, JSON_INDENT(2) | JSON_PRESERVE_ORDER) != 0)
        rc = td_fail(err, "%s: cannot write config.json", path);
    json_decref(j);
    return rc;
}
