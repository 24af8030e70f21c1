/* Precision recipes: presets, the JSON recipe file format, and printing (see recipe.h). */
#include "tidal/recipe.h"
#include "tidal/io.h"
#include "tidal/opts.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FP8_BLOCK  {.fmt = TD_E4M3, .gran = TD_SCALE_BLOCK, .arith = TD_ARITH_DIV, .sat = TD_SATFINITE, .group = 128}
#define FP8_TENSOR {.fmt = TD_E4M3, .gran = TD_SCALE_TENSOR, .arith = TD_ARITH_DIV, .sat = TD_SATFINITE}
#define FP8_ROW    {.fmt = TD_E4M3, .gran = TD_SCALE_ROW, .arith = TD_ARITH_DIV, .sat = TD_SATFINITE}
#define FP8_GROUP  {.fmt = TD_E4M3, .gran = TD_SCALE_GROUP, .arith = TD_ARITH_DIV, .sat = TD_SATFINITE, .group = 128}

/* Common shape of every preset: fp32 accumulation, 128-product promotion, 13 bits. */
#define BASE(nm, desc, dt) \
    .name = nm, .description = desc, .weights = dt, .weight_scaling = FP8_BLOCK, \
    .activations = dt, .gemm_inputs = dt, .act_scaling = FP8_GROUP, .accumulate = TD_ACC_FP32, \
    .promote_every = 128, .acc_fraction_bits = 13, .split_k = 1, .attn_block = 64, \
    .decode_splits = 1, .kv_cache = dt

/* Presets override fields of BASE: designated initialisers overriding earlier ones on purpose. */
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Woverride-init"
static const td_recipe PRESETS[] = {
    {BASE("fp32", "reference: fp32 everywhere, materialised attention", TD_F32),
     .attention = TD_ATTN_FULL},
    /* trainer (FSDP + FlashAttention): whole-sequence GEMMs, flash attention with P in bf16,
     * HF-style norm and RoPE roundings */
    {BASE("bf16-train", "trainer in bf16 (FSDP param_dtype=bf16): flash attention (P rounded to bf16), HF-style norm/RoPE roundings", TD_BF16),
     .attention = TD_ATTN_FLASH, .attn_block = 128},
    {BASE("bf16-autocast", "trainer under torch.autocast(bf16) over fp32 params: fp32 residual stream, norms and RoPE; bf16 GEMMs/attention", TD_BF16),
     .attention = TD_ATTN_FLASH, .attn_block = 128, .residual_fp32 = true, .rope = TD_ROPE_FUSED},
    /* a generic engine with FlashInfer-style fused kernels (one rounding per norm and RoPE),
     * paged flash attention with smaller key blocks, split-KV decode with log-sum-exp merge,
     * split-K GEMM reductions (vllm-bf16 and sglang-bf16 follow one engine each) */
    {BASE("bf16-infer", "engine in bf16: fused norm/RoPE (one rounding), flash prefill (64-key blocks), split-KV decode (4), split-K 2", TD_BF16),
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 2,
     .norm = TD_NORM_FUSED, .rope = TD_ROPE_FUSED},
    {BASE("vllm-bf16", "vLLM in bf16: its RMSNorm (two roundings) and RoPE (bf16 cos/sin cache, fp32 rotation); engine kernels as bf16-infer", TD_BF16),
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 2,
     .norm = TD_NORM_UNFUSED, .rope = TD_ROPE_VLLM, .moe_fused = true},
    {BASE("sglang-bf16", "SGLang in bf16: FlashInfer fused add+RMSNorm (norm of the fp32 sum) and RoPE (fp32 cache); engine kernels as bf16-infer", TD_BF16),
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 2,
     .norm = TD_NORM_FUSED_ADD, .rope = TD_ROPE_FUSED, .moe_fused = true},
    {BASE("fp16-train", "trainer in fp16: as bf16-train with fp16", TD_F16),
     .attention = TD_ATTN_FLASH, .attn_block = 128},
    {BASE("fp16-infer", "engine in fp16: as bf16-infer with fp16", TD_F16),
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 2,
     .norm = TD_NORM_FUSED, .rope = TD_ROPE_FUSED},
    {BASE("vllm-fp16", "vLLM in fp16: as vllm-bf16 with fp16", TD_F16),
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 2,
     .norm = TD_NORM_UNFUSED, .rope = TD_ROPE_VLLM, .moe_fused = true},
    {BASE("sglang-fp16", "SGLang in fp16: as sglang-bf16 with fp16", TD_F16),
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 2,
     .norm = TD_NORM_FUSED_ADD, .rope = TD_ROPE_FUSED, .moe_fused = true},
    /* FP8 rollouts against a bf16 trainer: block-FP8 weights (128x128), dynamic 1x128 FP8
     * activations into the GEMMs, Hopper fast accumulation promoted every 128 products; the
     * rest of the engine as bf16-infer */
    {BASE("fp8-rollout", "engine with block-FP8 GEMMs (w 128x128, act 1x128, fast acc promoted /128); pair with bf16-train", TD_BF16),
     .weights = TD_E4M3, .gemm_inputs = TD_E4M3, .accumulate = TD_ACC_FP8_FAST,
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 1,
     .norm = TD_NORM_FUSED, .rope = TD_ROPE_FUSED},
    /* vLLM's online FP8 (quantization="fp8" on a bf16 checkpoint): per-tensor weight scales,
     * dynamic per-tensor activation scales, CUTLASS FP8 fast accumulation (no promotion) */
    {BASE("vllm-fp8", "vLLM online FP8: per-tensor weight scale, dynamic per-tensor act scale, fast accumulation; vllm-bf16 elsewhere", TD_BF16),
     .weights = TD_E4M3, .weight_scaling = FP8_TENSOR, .gemm_inputs = TD_E4M3, .act_scaling = FP8_TENSOR,
     .accumulate = TD_ACC_FP8_FAST, .promote_every = 65536,
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 1,
     .norm = TD_NORM_UNFUSED, .rope = TD_ROPE_VLLM, .moe_fused = true},
    {BASE("vllm-fp8-per-token", "vllm-fp8 with dynamic per-token activation scales", TD_BF16),
     .weights = TD_E4M3, .weight_scaling = FP8_TENSOR, .gemm_inputs = TD_E4M3, .act_scaling = FP8_ROW,
     .accumulate = TD_ACC_FP8_FAST, .promote_every = 65536,
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 1,
     .norm = TD_NORM_UNFUSED, .rope = TD_ROPE_VLLM, .moe_fused = true},
    /* Jet-RL: one FP8 flow for both paths (same quantisation of weights and activations in
     * training and rollout). fp8-unified on both paths has no kernel differences between them
     * (only the structure differs); the fair pair is fp8-unified-train / fp8-unified-infer,
     * whose paths differ in kernels as bf16-train / bf16-infer do */
    {BASE("fp8-unified", "one FP8 flow (Jet-RL), same kernels on both paths: block-FP8 GEMMs, bf16 elsewhere", TD_BF16),
     .weights = TD_E4M3, .gemm_inputs = TD_E4M3, .accumulate = TD_ACC_FP8_FAST,
     .attention = TD_ATTN_FLASH, .attn_block = 64, .split_k = 1},
    {BASE("fp8-unified-train", "the unified FP8 flow with the trainer's kernels (as bf16-train)", TD_BF16),
     .weights = TD_E4M3, .gemm_inputs = TD_E4M3, .accumulate = TD_ACC_FP8_FAST,
     .attention = TD_ATTN_FLASH, .attn_block = 128, .split_k = 1},
    {BASE("fp8-unified-infer", "the unified FP8 flow with the engine's kernels (as bf16-infer)", TD_BF16),
     .weights = TD_E4M3, .gemm_inputs = TD_E4M3, .accumulate = TD_ACC_FP8_FAST,
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 1,
     .norm = TD_NORM_FUSED, .rope = TD_ROPE_FUSED},
    /* the MiniMax-M1 fix, as a ready-made pair member */
    {BASE("bf16-infer-fp32head", "bf16-infer with an fp32 lm_head", TD_BF16),
     .attention = TD_ATTN_FLASH, .attn_block = 64, .decode_splits = 4, .split_k = 2,
     .norm = TD_NORM_FUSED, .rope = TD_ROPE_FUSED, .lm_head_fp32 = true},
    {BASE("bf16-train-fp32head", "bf16-train with an fp32 lm_head", TD_BF16),
     .attention = TD_ATTN_FLASH, .attn_block = 128, .lm_head_fp32 = true},
};

/* What each preset follows, by name (printed by td_recipe_print_presets). */
static const struct { const char *name, *doc; } DOCS[] = {
    {"bf16-train", "HF model in bf16 (transformers LlamaRMSNorm, apply_rotary_pos_emb) under FSDP "
                   "MixedPrecision(param_dtype=bf16) as verl's fsdp_workers; flash-attn 128-key blocks"},
    {"bf16-autocast", "torch.autocast(dtype=bfloat16) over fp32 parameters: linear/SDPA cast to bf16, "
                      "RMSNorm and the residual adds in fp32, cos/sin kept fp32 (rotary_emb(x) with fp32 x)"},
    {"bf16-infer", "generic engine: FlashInfer-style RMSNormKernel / rope (one rounding), split-KV decode"},
    {"vllm-bf16", "vLLM csrc/layernorm_kernels.cu rms_norm_kernel and fused_add_rms_norm_kernel "
                  "((scalar_t)(x * s_variance)) * weight; csrc/pos_encoding_kernels.cu "
                  "apply_token_rotary_embedding (cache in dtype, fp32 rotation); MoE layers as fused_moe (fp32 "
                  "routing weights in the down GEMM's epilogue, moe_sum in top-k order)"},
    {"sglang-bf16", "SGLang on CUDA: FlashInfer include/flashinfer/norm.cuh RMSNormKernel and "
                    "FusedAddRMSNormKernel; apply_rope_with_cos_sin_cache with the fp32 cos_sin_cache "
                    "of python/sglang/srt/layers/rotary_embedding.py; MoE layers as its Triton fused_moe (vLLM's)"},
    {"fp16-train", "as bf16-train, the HF model in fp16"},
    {"fp16-infer", "as bf16-infer in fp16"},
    {"vllm-fp16", "as vllm-bf16"},
    {"sglang-fp16", "as sglang-bf16"},
    {"fp8-rollout", "DeepSeek-V3 / DeepGEMM block FP8 (w 128x128, act 1x128), promotion every 128 products"},
    {"vllm-fp8", "vLLM Fp8LinearMethod online quantisation: scaled_fp8_quant per-tensor weight scales, "
                 "dynamic per-tensor activation scales (amax over the whole batch: not batch-invariant), "
                 "cutlass_scaled_mm sm90 FP8FastAccum (accumulated without promotion)"},
    {"vllm-fp8-per-token", "vLLM Fp8LinearOp with use_per_token_if_dynamic (dynamic per-token scales)"},
    {"fp8-unified", "Jet-RL unified FP8 flow; same kernels on both paths (the structure-only comparison)"},
    {"fp8-unified-train", "Jet-RL unified FP8 flow, trainer side (kernels as bf16-train)"},
    {"fp8-unified-infer", "Jet-RL unified FP8 flow, engine side (kernels as bf16-infer): the fair pair"},
    {"bf16-infer-fp32head", "MiniMax-M1: lm_head in fp32"},
    {"bf16-train-fp32head", "MiniMax-M1: lm_head in fp32"},
};

#pragma GCC diagnostic pop

#define N_PRESETS (sizeof PRESETS / sizeof PRESETS[0])

size_t td_recipe_num_presets(void) { return N_PRESETS; }
const td_recipe *td_recipe_preset(size_t i) { return i < N_PRESETS ? &PRESETS[i] : NULL; }

const char *td_recipe_preset_doc(size_t i)
{
    if (i >= N_PRESETS) return NULL;
    for (size_t d = 0; d < sizeof DOCS / sizeof DOCS[0]; d++)
        if (!strcmp(DOCS[d].name, PRESETS[i].name)) return DOCS[d].doc;
    return "";
}

void td_recipe_print_presets(FILE *f)
{
    for (size_t i = 0; i < N_PRESETS; i++) {
        char *j = td_recipe_to_json(&PRESETS[i]);
        const char *doc = td_recipe_preset_doc(i);
        fprintf(f, "%-20s %s\n", PRESETS[i].name, PRESETS[i].description);
        if (*doc) fprintf(f, "  follows: %s\n", doc);
        fprintf(f, "  %s\n", j);
        free(j);
    }
}

const td_recipe *td_recipe_find_preset(const char *name)
{
    for (size_t i = 0; i < N_PRESETS; i++)
        if (!strcmp(PRESETS[i].name, name)) return &PRESETS[i];
    return NULL;
}

/* ---------------------------------------------------------------- checking */

int td_recipe_check(const td_recipe *r, const char *what, td_error *err)
{
    if (r->weights != TD_F32 && r->weights != TD_BF16 && r->weights != TD_F16 && r->weights != TD_E4M3)
        return td_fail(err, "%s: field \"weights\": expected fp32, bf16, fp16 or e4m3", what);
    if (r->activations != TD_F32 && r->activations != TD_BF16 && r->activations != TD_F16)
        return td_fail(err, "%s: field \"activations\": expected fp32, bf16 or fp16", what);
    if (r->gemm_inputs != r->activations && r->gemm_inputs != TD_E4M3 && r->gemm_inputs != TD_E5M2)
        return td_fail(err, "%s: field \"gemm_inputs\": expected the activations dtype (%s), e4m3 or e5m2",
                       what, td_format_info(r->activations)->name);
    if (r->kv_cache != r->activations && r->kv_cache != TD_E4M3 && r->kv_cache != TD_F32)
        return td_fail(err, "%s: field \"kv_cache\": expected the activations dtype (%s), fp32 or e4m3",
                       what, td_format_info(r->activations)->name);
    if (r->split_k < 1 || r->split_k > 64)
        return td_fail(err, "%s: field \"split_k\": expected 1..64, got %d", what, r->split_k);
    if (r->attn_block < 1 || r->attn_block > 65536)
        return td_fail(err, "%s: field \"attn_block\": expected 1..65536, got %d", what, r->attn_block);
    if (r->decode_splits < 1 || r->decode_splits > 256)
        return td_fail(err, "%s: field \"decode_splits\": expected 1..256, got %d", what, r->decode_splits);
    if (r->promote_every < 1 || r->promote_every > 65536)
        return td_fail(err, "%s: field \"promote_every\": expected 1..65536, got %d", what, r->promote_every);
    if (r->acc_fraction_bits < 1 || r->acc_fraction_bits > 23)
        return td_fail(err, "%s: field \"acc_fraction_bits\": expected 1..23, got %d", what, r->acc_fraction_bits);
    if ((unsigned)r->norm > TD_NORM_FUSED_ADD || (unsigned)r->rope > TD_ROPE_VLLM)
        return td_fail(err, "%s: field \"norm\" or \"rope\": unknown form", what);
    if (!(r->kv_scale >= 0.0f) || r->kv_scale > 1e30f)
        return td_fail(err, "%s: field \"kv_scale\": expected a finite value >= 0", what);
    const td_fp8_scheme *sc[2] = {&r->weight_scaling, &r->act_scaling};
    const char *scn[2] = {"weight_scaling", "act_scaling"};
    for (int i = 0; i < 2; i++) {
        if (sc[i]->fmt != TD_E4M3 && sc[i]->fmt != TD_E5M2)
            return td_fail(err, "%s: field \"%s.format\": expected e4m3 or e5m2", what, scn[i]);
        if ((unsigned)sc[i]->gran >= TD_SCALE_COUNT)
            return td_fail(err, "%s: field \"%s.granularity\": unknown", what, scn[i]);
        if (sc[i]->group < 0 || sc[i]->group > 65536)
            return td_fail(err, "%s: field \"%s.group\": expected 0..65536", what, scn[i]);
    }
    return 0;
}

/* ---------------------------------------------------------------- JSON */

static const char *const NORM_NAMES[] = {"unfused", "fused", "fused-add"};
static const char *const ROPE_NAMES[] = {"unfused", "fused", "vllm"};

/* A field naming one of n values (names[i] -> i), with aliases for value 0 ("hf", "vllm" for
 * the norm: both write HF's two roundings). */
static int get_enum(json_t *v, const char *what, const char *field, const char *const *names, int n,
                    const char *const *alias0, int *out, td_error *err)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    for (int i = 0; s && i < n; i++)
        if (!strcmp(s, names[i])) { *out = i; return 0; }
    for (int i = 0; s && alias0 && alias0[i]; i++)
        if (!strcmp(s, alias0[i])) { *out = 0; return 0; }
    char list[128] = "";
    for (int i = 0; i < n; i++) {
        strncat(list, i ? ", \"" : "\"", sizeof list - strlen(list) - 1);
        strncat(list, names[i], sizeof list - strlen(list) - 1);
        strncat(list, "\"", sizeof list - strlen(list) - 1);
    }
    return td_fail(err, "%s: field \"%s\": expected one of %s", what, field, list);
}

static const char *arith_name(td_scale_arith a) { return a == TD_ARITH_MUL ? "mul" : "div"; }

static json_t *scheme_json(const td_fp8_scheme *s)
{
    return json_pack("{s:s, s:s, s:s, s:b, s:s, s:i}", "format", td_format_info(s->fmt)->name,
                     "granularity", td_scale_granularity_name(s->gran), "arith", arith_name(s->arith),
                     "pow2", s->pow2, "saturate", s->sat == TD_SATFINITE ? "satfinite" : "nosat",
                     "group", s->group);
}

char *td_recipe_to_json(const td_recipe *r)
{
    json_t *o = json_object();
    json_object_set_new(o, "name", json_string(r->name));
    json_object_set_new(o, "description", json_string(r->description));
    json_object_set_new(o, "weights", json_string(td_format_info(r->weights)->name));
    json_object_set_new(o, "weight_scaling", scheme_json(&r->weight_scaling));
    json_object_set_new(o, "activations", json_string(td_format_info(r->activations)->name));
    json_object_set_new(o, "gemm_inputs", json_string(td_format_info(r->gemm_inputs)->name));
    json_object_set_new(o, "act_scaling", scheme_json(&r->act_scaling));
    json_object_set_new(o, "accumulate", json_string(r->accumulate == TD_ACC_FP8_FAST ? "fp8-fast" : "fp32"));
    json_object_set_new(o, "promote_every", json_integer(r->promote_every));
    json_object_set_new(o, "acc_fraction_bits", json_integer(r->acc_fraction_bits));
    json_object_set_new(o, "split_k", json_integer(r->split_k));
    json_object_set_new(o, "attention", json_string(r->attention == TD_ATTN_FLASH ? "flash" : "full"));
    json_object_set_new(o, "attn_block", json_integer(r->attn_block));
    json_object_set_new(o, "decode_splits", json_integer(r->decode_splits));
    json_object_set_new(o, "kv_cache", json_string(td_format_info(r->kv_cache)->name));
    json_object_set_new(o, "kv_scale", json_real(r->kv_scale));
    json_object_set_new(o, "lm_head", json_string(r->lm_head_fp32 ? "fp32" : "native"));
    json_object_set_new(o, "norm", json_string(NORM_NAMES[r->norm]));
    json_object_set_new(o, "rope", json_string(ROPE_NAMES[r->rope]));
    json_object_set_new(o, "batch_invariant", json_boolean(r->batch_invariant));
    json_object_set_new(o, "residual", json_string(r->residual_fp32 ? "fp32" : "activations"));
    json_object_set_new(o, "logits_temperature", json_string(r->temp_in_act ? "activations" : "fp32"));
    json_object_set_new(o, "logsoftmax", json_string(r->logsoftmax_act ? "activations" : "fp32"));
    if (r->moe_fused) json_object_set_new(o, "moe", json_string("fused"));   /* hf, the default, unprinted */
    if (r->router_fp32) json_object_set_new(o, "router", json_string("fp32"));   /* activations: unprinted */
    char *s = json_dumps(o, JSON_PRESERVE_ORDER | JSON_COMPACT);
    json_decref(o);
    return s;
}

/* Field readers: each names the file and the field in its error. */
static int get_format(json_t *v, const char *what, const char *field, td_format *out, td_error *err)
{
    int f = json_is_string(v) ? td_format_from_name(json_string_value(v)) : -1;
    if (f < 0 || f == TD_E8M0)
        return td_fail(err, "%s: field \"%s\": expected a format name (fp32, bf16, fp16, e4m3, e5m2)", what, field);
    *out = (td_format)f;
    return 0;
}

static int get_int(json_t *v, const char *what, const char *field, int *out, td_error *err)
{
    if (!json_is_integer(v) || json_integer_value(v) < -1000000000 || json_integer_value(v) > 1000000000)
        return td_fail(err, "%s: field \"%s\": expected an integer", what, field);
    *out = (int)json_integer_value(v);
    return 0;
}

static int get_bool(json_t *v, const char *what, const char *field, bool *out, td_error *err)
{
    if (!json_is_boolean(v)) return td_fail(err, "%s: field \"%s\": expected true or false", what, field);
    *out = json_is_true(v);
    return 0;
}

/* A string field with two allowed values mapping to false / true. */
static int get_choice(json_t *v, const char *what, const char *field, const char *no, const char *yes,
                      bool *out, td_error *err)
{
    const char *s = json_is_string(v) ? json_string_value(v) : NULL;
    if (s && !strcmp(s, no)) { *out = false; return 0; }
    if (s && !strcmp(s, yes)) { *out = true; return 0; }
    return td_fail(err, "%s: field \"%s\": expected \"%s\" or \"%s\"", what, field, no, yes);
}

static int get_scheme(json_t *v, const char *what, const char *field, td_fp8_scheme *s, td_error *err)
{
    if (!json_is_object(v)) return td_fail(err, "%s: field \"%s\": expected an object", what, field);
    const char *key;
    json_t *val;
    char sub[96];
    json_object_foreach(v, key, val) {
        snprintf(sub, sizeof sub, "%s.%s", field, key);
        if (!strcmp(key, "format")) { if (get_format(val, what, sub, &s->fmt, err)) return -1; }
        else if (!strcmp(key, "granularity")) {
            int g = json_is_string(val) ? td_scale_granularity_from_name(json_string_value(val)) : -1;
            if (g < 0) return td_fail(err, "%s: field \"%s\": expected tensor, row, group, block or mx", what, sub);
            s->gran = (td_scale_granularity)g;
        } else if (!strcmp(key, "arith")) {
            bool mul;
            if (get_choice(val, what, sub, "div", "mul", &mul, err)) return -1;
            s->arith = mul ? TD_ARITH_MUL : TD_ARITH_DIV;
        } else if (!strcmp(key, "pow2")) { if (get_bool(val, what, sub, &s->pow2, err)) return -1; }
        else if (!strcmp(key, "saturate")) {
            bool nosat;
            if (get_choice(val, what, sub, "satfinite", "nosat", &nosat, err)) return -1;
            s->sat = nosat ? TD_NOSAT : TD_SATFINITE;
        } else if (!strcmp(key, "group")) { if (get_int(val, what, sub, &s->group, err)) return -1; }
        else return td_fail(err, "%s: unknown field \"%s\"", what, sub);
    }
    return 0;
}

int td_recipe_from_json(const char *text, size_t len, const char *what, td_recipe *out, td_error *err)
{
    json_t *o = td_json_load_text(text, len, what, err);
    if (!o) return -1;
    int rc = -1;
    if (!json_is_object(o)) { td_fail(err, "%s: a recipe file holds one JSON object", what); goto done; }
    td_recipe r = PRESETS[0];
    json_t *base = json_object_get(o, "base");
    if (base) {
        const td_recipe *p = json_is_string(base) ? td_recipe_find_preset(json_string_value(base)) : NULL;
        if (!p) { td_fail(err, "%s: field \"base\": expected a preset name (see --list-recipes)", what); goto done; }
        r = *p;
    }
    snprintf(r.name, sizeof r.name, "%s", what);
    r.description[0] = 0;
    const char *key;
    json_t *v;
    json_object_foreach(o, key, v) {
        int e = 0;
        bool b = false;   /* read below even when get_choice fails */
        if (!strcmp(key, "base")) continue;
        else if (!strcmp(key, "name")) {
            if (!json_is_string(v)) { td_fail(err, "%s: field \"name\": expected a string", what); goto done; }
            snprintf(r.name, sizeof r.name, "%s", json_string_value(v));
        } else if (!strcmp(key, "description")) {
            if (!json_is_string(v)) { td_fail(err, "%s: field \"description\": expected a string", what); goto done; }
            snprintf(r.description, sizeof r.description, "%s", json_string_value(v));
        }
        else if (!strcmp(key, "weights")) e = get_format(v, what, key, &r.weights, err);
        else if (!strcmp(key, "activations")) e = get_format(v, what, key, &r.activations, err);
        else if (!strcmp(key, "gemm_inputs")) e = get_format(v, what, key, &r.gemm_inputs, err);
        else if (!strcmp(key, "kv_cache")) e = get_format(v, what, key, &r.kv_cache, err);
        else if (!strcmp(key, "weight_scaling")) e = get_scheme(v, what, key, &r.weight_scaling, err);
        else if (!strcmp(key, "act_scaling")) e = get_scheme(v, what, key, &r.act_scaling, err);
        else if (!strcmp(key, "accumulate")) {
            e = get_choice(v, what, key, "fp32", "fp8-fast", &b, err);
            r.accumulate = b ? TD_ACC_FP8_FAST : TD_ACC_FP32;
        }
        else if (!strcmp(key, "promote_every")) e = get_int(v, what, key, &r.promote_every, err);
        else if (!strcmp(key, "acc_fraction_bits")) e = get_int(v, what, key, &r.acc_fraction_bits, err);
        else if (!strcmp(key, "split_k")) e = get_int(v, what, key, &r.split_k, err);
        else if (!strcmp(key, "attention")) {
            e = get_choice(v, what, key, "full", "flash", &b, err);
            r.attention = b ? TD_ATTN_FLASH : TD_ATTN_FULL;
        }
        else if (!strcmp(key, "attn_block")) e = get_int(v, what, key, &r.attn_block, err);
        else if (!strcmp(key, "decode_splits")) e = get_int(v, what, key, &r.decode_splits, err);
        else if (!strcmp(key, "kv_scale")) {
            if (!json_is_number(v)) e = td_fail(err, "%s: field \"kv_scale\": expected a number", what);
            else r.kv_scale = (float)json_number_value(v);
        }
        else if (!strcmp(key, "lm_head")) e = get_choice(v, what, key, "native", "fp32", &r.lm_head_fp32, err);
        else if (!strcmp(key, "norm")) {
            static const char *const alias[] = {"hf", "vllm", NULL};
            int f = 0;
            e = get_enum(v, what, key, NORM_NAMES, 3, alias, &f, err);
            r.norm = (td_norm_form)f;
        } else if (!strcmp(key, "rope")) {
            static const char *const alias[] = {"hf", NULL};
            int f = 0;
            e = get_enum(v, what, key, ROPE_NAMES, 3, alias, &f, err);
            r.rope = (td_rope_form)f;
        }
        else if (!strcmp(key, "batch_invariant")) e = get_bool(v, what, key, &r.batch_invariant, err);
        else if (!strcmp(key, "residual")) e = get_choice(v, what, key, "activations", "fp32", &r.residual_fp32, err);
        else if (!strcmp(key, "logits_temperature"))
            e = get_choice(v, what, key, "fp32", "activations", &r.temp_in_act, err);
        else if (!strcmp(key, "logsoftmax")) e = get_choice(v, what, key, "fp32", "activations", &r.logsoftmax_act, err);
        else if (!strcmp(key, "moe")) e = get_choice(v, what, key, "hf", "fused", &r.moe_fused, err);
        else if (!strcmp(key, "router")) e = get_choice(v, what, key, "activations", "fp32", &r.router_fp32, err);
        else { td_fail(err, "%s: unknown field \"%s\"", what, key); goto done; }
        if (e) goto done;
    }
    /* a recipe that changes activations but not gemm_inputs / kv_cache means them to follow */
    if (json_object_get(o, "activations")) {
        if (!json_object_get(o, "gemm_inputs") && !td_recipe_fp8_gemm(&r)) r.gemm_inputs = r.activations;
        if (!json_object_get(o, "kv_cache") && r.kv_cache != TD_E4M3) r.kv_cache = r.activations;
    }
    if (td_recipe_check(&r, what, err)) goto done;
    *out = r;
    rc = 0;
done:
    json_decref(o);
    return rc;
}

int td_recipe_resolve(const char *name_or_path, td_recipe *out, td_error *err)
{
    const td_recipe *p = td_recipe_find_preset(name_or_path);
    if (p) { *out = *p; return 0; }
    if (!strchr(name_or_path, '/') && !strchr(name_or_path, '.')) {
        char names[512] = "";
        for (size_t i = 0; i < N_PRESETS; i++) {
            strncat(names, i ? ", " : "", sizeof names - strlen(names) - 1);
            strncat(names, PRESETS[i].name, sizeof names - strlen(names) - 1);
        }
        /* a close preset name (vllm_bf16, bf16-trian) is named first, as options' typos are */
        const char *close = NULL;
        int best = strlen(name_or_path) <= 6 ? 2 : 3;   /* one more than the largest distance named */
        for (size_t i = 0; i < N_PRESETS; i++) {
            int d = td_name_distance(name_or_path, PRESETS[i].name);
            if (d < best) { best = d; close = PRESETS[i].name; }
        }
        if (close)
            return td_fail(err, "unknown recipe '%s'; did you mean '%s'? (presets: %s; or give a recipe file path)",
                           name_or_path, close, names);
        return td_fail(err, "unknown recipe '%s' (presets: %s; or give a recipe file path)", name_or_path, names);
    }
    size_t n;
    char *text = td_read_file(name_or_path, 1 << 20, &n, err);
    if (!text) return -1;
    int rc = td_recipe_from_json(text, n, name_or_path, out, err);
    free(text);
    return rc;
}
