/* Seeded random checkpoints and named shapes (the library side of tools/tidal-init). */
#include "tidal/checkpoint.h"
#include "config_json.h"
#include "tidal/progress.h"
#include "tidal/rng.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

static bool is_moe_arch(td_arch a)
{
    return a == TD_ARCH_QWEN2_MOE || a == TD_ARCH_QWEN3_MOE || a == TD_ARCH_MIXTRAL || a == TD_ARCH_OLMOE;
}

/* Mixtral and OLMoE: every layer sparse, experts intermediate_size wide (no separate key) */
static bool experts_full_width(td_arch a) { return a == TD_ARCH_MIXTRAL || a == TD_ARCH_OLMOE; }

/* The mixture-of-experts fields as td_config_parse fills them for a config.json that writes them
 * all: every layer sparse (decoder_sparse_step 1, no mlp_only_layers); Mixtral's experts are
 * intermediate_size wide and always renormalised. */
static void set_moe(td_config *c, int E, int K, int FE, int FS, bool norm_topk, double aux_coef)
{
    c->num_experts = E;
    c->num_experts_per_tok = K;
    c->moe_intermediate_size = FE;
    c->shared_expert_intermediate_size = FS;
    c->norm_topk_prob = norm_topk || c->arch == TD_ARCH_MIXTRAL;
    c->decoder_sparse_step = 1;
    c->n_mlp_only = 0;
    c->router_aux_loss_coef = aux_coef;
    c->output_router_logits = false;
}

int td_config_preset(const char *name, td_config *c)
{
    if (strcmp(name, "tiny") == 0) {
        td_arch arch = c->arch;   /* tiny keeps the architecture the caller chose */
        td_config_defaults(c, arch);
        c->hidden_size = 64; c->num_layers = 2; c->num_heads = 4; c->num_kv_heads = 2;
        c->head_dim = 16; c->intermediate_size = 176; c->vocab_size = 512;
        c->bos_token_id = 1; c->eos_token_id = 2;
        if (is_moe_arch(arch)) {   /* a tiny mixture: 8 experts, top-2, every layer sparse */
            set_moe(c, 8, 2, experts_full_width(arch) ? c->intermediate_size : 32,
                    arch == TD_ARCH_QWEN2_MOE ? 64 : 0, arch != TD_ARCH_QWEN2_MOE && arch != TD_ARCH_OLMOE,
                    arch == TD_ARCH_OLMOE ? 0.01 : 0.001);
        }
        return 0;
    }
    if (strcmp(name, "qwen2.5-0.5b") == 0) {   /* Qwen/Qwen2.5-0.5B config.json */
        td_config_defaults(c, TD_ARCH_QWEN2);
        c->hidden_size = 896; c->num_layers = 24; c->num_heads = 14; c->num_kv_heads = 2;
        c->head_dim = 64; c->intermediate_size = 4864; c->vocab_size = 151936;
        c->tie_word_embeddings = true; c->rope_theta = 1e6; c->max_position = 32768;
        c->bos_token_id = 151643; c->eos_token_id = 151643;
        return 0;
    }
    if (strcmp(name, "qwen3-0.6b") == 0) {     /* Qwen/Qwen3-0.6B config.json */
        td_config_defaults(c, TD_ARCH_QWEN3);
        c->hidden_size = 1024; c->num_layers = 28; c->num_heads = 16; c->num_kv_heads = 8;
        c->head_dim = 128; c->intermediate_size = 3072; c->vocab_size = 151936;
        c->tie_word_embeddings = true; c->rope_theta = 1e6; c->max_position = 40960;
        c->bos_token_id = 151643; c->eos_token_id = 151645;
        return 0;
    }
    if (strcmp(name, "llama-3.2-1b") == 0) {   /* meta-llama/Llama-3.2-1B config.json */
        td_config_defaults(c, TD_ARCH_LLAMA);
        c->hidden_size = 2048; c->num_layers = 16; c->num_heads = 32; c->num_kv_heads = 8;
        c->head_dim = 64; c->intermediate_size = 8192; c->vocab_size = 128256;
        c->tie_word_embeddings = true; c->rope_theta = 500000.0; c->max_position = 131072;
        c->rms_norm_eps = 1e-5;
        c->rope_factor = 32.0; c->rope_low_freq_factor = 1.0; c->rope_high_freq_factor = 4.0;
        c->rope_original_max_position = 8192;
        c->bos_token_id = 128000; c->eos_token_id = 128001;
        return 0;
    }
    /* meta-llama/Llama-3.1-8B and -Instruct config.json: the seed user's model; the Instruct
     * config ends on any of three ids (<|end_of_text|>, <|eom_id|>, <|eot_id|>) */
    if (strcmp(name, "llama-3.1-8b") == 0 || strcmp(name, "llama-3.1-8b-instruct") == 0) {
        td_config_defaults(c, TD_ARCH_LLAMA);
        c->hidden_size = 4096; c->num_layers = 32; c->num_heads = 32; c->num_kv_heads = 8;
        c->head_dim = 128; c->intermediate_size = 14336; c->vocab_size = 128256;
        c->tie_word_embeddings = false; c->rope_theta = 500000.0; c->max_position = 131072;
        c->rms_norm_eps = 1e-5;
        c->rope_factor = 8.0; c->rope_low_freq_factor = 1.0; c->rope_high_freq_factor = 4.0;
        c->rope_original_max_position = 8192;
        c->bos_token_id = 128000; c->eos_token_id = 128001;
        if (strcmp(name, "llama-3.1-8b-instruct") == 0) {
            int eos[3] = {128001, 128008, 128009};
            memcpy(c->eos_token_ids, eos, sizeof eos);
            c->n_eos = 3;
        }
        return 0;
    }
    /* Mixtures of experts, config only (tidal-init --config-only; tens of GB of weights). The
     * published config.json files these follow are in tests/fixtures/configs/hf4/, with where each
     * was read (test_config.c test_moe_presets_published checks that each parses to its preset). */
    if (strcmp(name, "qwen3-30b-a3b") == 0) {   /* Qwen/Qwen3-30B-A3B config.json (transformers 4.51.0) */
        td_config_defaults(c, TD_ARCH_QWEN3_MOE);
        c->hidden_size = 2048; c->num_layers = 48; c->num_heads = 32; c->num_kv_heads = 4;
        c->head_dim = 128; c->intermediate_size = 6144; c->vocab_size = 151936;
        c->tie_word_embeddings = false; c->rope_theta = 1e6; c->max_position = 40960; c->rms_norm_eps = 1e-6;
        c->bos_token_id = 151643; c->eos_token_id = 151645;
        set_moe(c, 128, 8, 768, 0, true, 0.001);
        return 0;
    }
    /* Qwen/Qwen1.5-MoE-A2.7B config.json (the base model's: 8192 positions; the -Chat model's has
     * 32768 and eos 151645); its "sliding_window": 4096 is off ("use_sliding_window": false) */
    if (strcmp(name, "qwen1.5-moe-a2.7b") == 0) {
        td_config_defaults(c, TD_ARCH_QWEN2_MOE);
        c->hidden_size = 2048; c->num_layers = 24; c->num_heads = 16; c->num_kv_heads = 16;
        c->head_dim = 128; c->intermediate_size = 5632; c->vocab_size = 151936;
        c->tie_word_embeddings = false; c->rope_theta = 1e6; c->max_position = 8192; c->rms_norm_eps = 1e-6;
        c->bos_token_id = 151643; c->eos_token_id = 151643;
        set_moe(c, 60, 4, 1408, 5632, false, 0.001);
        return 0;
    }
    if (strcmp(name, "mixtral-8x7b") == 0) {    /* mistralai/Mixtral-8x7B-v0.1 config.json */
        td_config_defaults(c, TD_ARCH_MIXTRAL);
        c->hidden_size = 4096; c->num_layers = 32; c->num_heads = 32; c->num_kv_heads = 8;
        c->head_dim = 128; c->intermediate_size = 14336; c->vocab_size = 32000;
        c->tie_word_embeddings = false; c->rope_theta = 1e6; c->max_position = 32768; c->rms_norm_eps = 1e-5;
        c->bos_token_id = 1; c->eos_token_id = 2;
        set_moe(c, 8, 2, 14336, 0, true, 0.02);
        return 0;
    }
    return -1;
}

/* "--mlp-only-layers" as a list of layer indices ("0,5"; "" or "none": none). */
static int parse_layer_list(td_config *c, const char *list, td_error *err)
{
    int n = 0;
    const int cap = (int)(sizeof c->mlp_only_layers / sizeof c->mlp_only_layers[0]);
    if (strcmp(list, "none") != 0) {
        for (const char *p = list; *p;) {
            char *end;
            errno = 0;
            long v = strtol(p, &end, 10);
            if (end == p || errno || v < 0 || v > 0x7FFFFFFF || (*end && *end != ','))
                return td_fail(err, "--mlp-only-layers: \"%s\" is not a comma-separated list of layer indices", list);
            if (n == cap) return td_fail(err, "--mlp-only-layers: at most %d layers", cap);
            for (int i = 0; i < n; i++)
                if (c->mlp_only_layers[i] == (int)v) return td_fail(err, "--mlp-only-layers: layer %ld listed twice", v);
            c->mlp_only_layers[n++] = (int)v;
            p = *end ? end + 1 : end;
        }
    }
    c->n_mlp_only = n;
    return 0;
}

int td_config_set_moe(td_config *c, const td_moe_opts *o, td_error *err)
{
    const char *arch = td_arch_name(c->arch);
    bool mixtral = c->arch == TD_ARCH_MIXTRAL, qwen2 = c->arch == TD_ARCH_QWEN2_MOE, olmoe = c->arch == TD_ARCH_OLMOE;
    static const char *flag[] = {"--num-experts", "--num-experts-per-tok", "--moe-intermediate-size",
                                 "--shared-expert-intermediate-size", "--decoder-sparse-step", "--norm-topk-prob"};
    const int given[] = {o->num_experts, o->num_experts_per_tok, o->moe_intermediate_size,
                         o->shared_expert_intermediate_size, o->decoder_sparse_step, o->norm_topk_prob};
    for (int i = 0; i < 6; i++) {
        if (given[i] < 0) continue;
        const char *name = i == 5 && !given[i] ? "--no-norm-topk-prob" : flag[i];
        if (!is_moe_arch(c->arch))
            return td_fail(err, "%s: %s is a dense architecture (mixtures of experts: --arch qwen2_moe, qwen3_moe, "
                           "mixtral or olmoe)", name, arch);
        if (mixtral && (i == 2 || i == 4 || i == 5))   /* config.json of Mixtral has no such key */
            return td_fail(err, "%s: not a Mixtral setting (%s)", name,
                           i == 2 ? "its experts are --intermediate-size wide" : i == 4 ? "every layer is sparse"
                                                                                    : "it always renormalises the top-k");
        if (olmoe && (i == 2 || i == 4))   /* OlmoeConfig has no such key */
            return td_fail(err, "%s: not an OLMoE setting (%s)", name,
                           i == 2 ? "its experts are --intermediate-size wide" : "every layer is sparse");
        if (i == 3 && !qwen2 && given[i] > 0)
            return td_fail(err, "%s: a shared expert is Qwen2-MoE's alone (--arch qwen2_moe), not %s", flag[i], arch);
    }
    if (o->mlp_only_layers && !is_moe_arch(c->arch))
        return td_fail(err, "--mlp-only-layers: %s is a dense architecture (mixtures of experts: --arch qwen2_moe, "
                       "qwen3_moe or mixtral)", arch);
    if (o->mlp_only_layers && (mixtral || olmoe))
        return td_fail(err, "--mlp-only-layers: not a%s setting (every layer is sparse)", mixtral ? " Mixtral" : "n OLMoE");
    if (!is_moe_arch(c->arch)) return 0;

    bool had = c->num_experts > 0;   /* a preset's mixture, which the flags override */
    if (o->num_experts >= 0) c->num_experts = o->num_experts;
    if (o->num_experts_per_tok >= 0) c->num_experts_per_tok = o->num_experts_per_tok;
    if (o->moe_intermediate_size >= 0) c->moe_intermediate_size = o->moe_intermediate_size;
    if (o->shared_expert_intermediate_size >= 0) c->shared_expert_intermediate_size = o->shared_expert_intermediate_size;
    if (o->decoder_sparse_step >= 0) c->decoder_sparse_step = o->decoder_sparse_step;
    if (o->norm_topk_prob >= 0) c->norm_topk_prob = o->norm_topk_prob;
    if (o->mlp_only_layers && parse_layer_list(c, o->mlp_only_layers, err)) return -1;
    if (!had) {   /* transformers' defaults would make a tiny model a 60- or 128-expert one: ask */
        if (c->num_experts < 1 || c->num_experts_per_tok < 1)
            return td_fail(err, "%s: %s without a preset that sets its experts needs --num-experts E%s "
                           "--num-experts-per-tok K%s", c->num_experts < 1 ? flag[0] : flag[1], arch,
                           experts_full_width(c->arch) ? " and" : ",", experts_full_width(c->arch) ? "" : qwen2 ?
                           ", --moe-intermediate-size FE and --shared-expert-intermediate-size FS" : " and --moe-intermediate-size FE");
        if (!experts_full_width(c->arch) && c->moe_intermediate_size < 1)
            return td_fail(err, "%s: %s without a preset that sets its experts needs it (each expert's MLP width)", flag[2], arch);
        if (qwen2 && o->shared_expert_intermediate_size < 0)
            return td_fail(err, "%s: %s without a preset that sets its experts needs it (the shared expert's MLP "
                           "width; 0: none)", flag[3], arch);
        if (c->decoder_sparse_step < 1) c->decoder_sparse_step = 1;
        c->router_aux_loss_coef = olmoe ? 0.01 : 0.001;   /* transformers' default (recorded; not used by a forward) */
    }
    if (olmoe) {   /* OlmoeConfig: the experts are intermediate_size wide, every layer */
        c->moe_intermediate_size = c->intermediate_size;
        c->decoder_sparse_step = 1;
    }
    if (mixtral) {   /* MixtralConfig: the experts are intermediate_size wide, always renormalised */
        c->moe_intermediate_size = c->intermediate_size;
        c->norm_topk_prob = true;
        c->decoder_sparse_step = 1;
    }
    if (c->num_experts_per_tok > c->num_experts)
        return td_fail(err, "%s: %d exceeds the %d experts (--num-experts)", flag[1], c->num_experts_per_tok, c->num_experts);
    for (int i = 0; i < c->n_mlp_only; i++)
        if (c->mlp_only_layers[i] >= c->num_layers)
            return td_fail(err, "--mlp-only-layers: layer %d, the model has %d (0..%d)", c->mlp_only_layers[i],
                           c->num_layers, c->num_layers - 1);
    if (td_config_num_moe_layers(c) == 0)
        return td_fail(err, "%s: no layer of the %d is a mixture of experts (a layer l is one when (l + 1) %% "
                       "decoder_sparse_step == 0 and l is not in --mlp-only-layers)",
                       o->mlp_only_layers ? "--mlp-only-layers" : flag[4], c->num_layers);
    return 0;
}

int td_config_set_rope_scaling(td_config *c, const char *text, td_error *err)
{
    if (strcmp(text, "null") == 0 || strcmp(text, "none") == 0) {
        c->rope_factor = 0;
        return 0;
    }
    json_error_t je;
    json_t *rs = td_json_loadb(text, strlen(text), JSON_REJECT_DUPLICATES, &je);
    if (!rs) return td_fail(err, "--rope-scaling: invalid JSON at column %d: %s", je.column, je.text);
    if (!json_is_object(rs)) {
        json_decref(rs);
        return td_fail(err, "--rope-scaling: expected a JSON object as config.json's \"rope_scaling\", e.g. "
                       "'{\"rope_type\": \"llama3\", \"factor\": 8.0, \"low_freq_factor\": 1.0, "
                       "\"high_freq_factor\": 4.0, \"original_max_position_embeddings\": 8192}'");
    }
    json_t *j = json_pack("{s:f, s:o}", "rope_theta", c->rope_theta, "rope_scaling", rs);
    int rc = j ? cfgj_rope("--rope-scaling", j, c, err) : td_fail(err, "--rope-scaling: out of memory");
    json_decref(j);
    return rc;
}

int td_config_set_eos(td_config *c, const char *list, td_error *err)
{
    int n = 0;
    const char *p = list;
    while (*p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > 0x7FFFFFFF || (*end && *end != ','))
            return td_fail(err, "--eos-token-id: \"%s\" is not a comma-separated list of token ids", list);
        if (n == TD_CONFIG_MAX_EOS) return td_fail(err, "--eos-token-id: at most %d ids", TD_CONFIG_MAX_EOS);
        c->eos_token_ids[n++] = (int)v;
        p = *end ? end + 1 : end;
    }
    if (n == 0) return td_fail(err, "--eos-token-id: empty list");
    c->eos_token_id = c->eos_token_ids[0];
    c->n_eos = n > 1 ? n : 0;
    return 0;
}

enum { CHUNK = 1 << 20, BATCH = 8 };

/* Fills chunk k of parameter i: values depend only on (seed, i, k).
 * Normals by Marsaglia's polar method on td_rng bits: (u, v) uniform in the unit disc (32-bit
 * coordinates, float arithmetic: plenty for an initialisation),
 * s = u^2 + v^2, then u*sqrt(-2 ln s / s) and v*sqrt(-2 ln s / s) are two independent N(0,1).
 * One log and one sqrt per pair and no trig: about 4x cheaper than td_rng_normal's one-output
 * Box-Muller, which matters at 0.5B parameters. */
static void fill_chunk(float *x, size_t n, double mean, double std, uint64_t seed, size_t i, size_t k)
{
    td_rng r;
    td_rng_stream(&r, seed, ((uint64_t)i << 32) | k);
    for (size_t j = 0; j < n;) {
        /* one 64-bit draw gives both 32-bit coordinates */
        uint64_t b = td_rng_next(&r);
        float u = (float)(int32_t)(uint32_t)b * 0x1p-31f, v = (float)(int32_t)(uint32_t)(b >> 32) * 0x1p-31f;
        float q = u * u + v * v;
        if (q >= 1.0f || q == 0.0f) continue;
        float f = (float)std * sqrtf(-2.0f * logf(q) / q);
        x[j++] = (float)mean + u * f;
        if (j < n) x[j++] = (float)mean + v * f;
    }
}

void td_init_outlier_channels(uint64_t seed, int C, int n, int *out)
{
    /* a partial Fisher-Yates shuffle of 0..C-1, then sorted */
    int *perm = td_xmalloc((size_t)C * sizeof(int));
    for (int c = 0; c < C; c++) perm[c] = c;
    td_rng r;
    td_rng_stream(&r, seed, TD_INIT_OUTLIER_STREAM);
    for (int i = 0; i < n && i < C; i++) {
        int j = i + (int)td_rng_below(&r, (uint64_t)(C - i));
        int t = perm[i]; perm[i] = perm[j]; perm[j] = t;
    }
    for (int i = 0; i < n; i++) {   /* insertion sort of the n drawn */
        int v = perm[i], k = i;
        while (k > 0 && out[k - 1] > v) { out[k] = out[k - 1]; k--; }
        out[k] = v;
    }
    free(perm);
}

/* The mean and std of tensor s's values (td_init_opts). A router (E, C) reads an RMS-normalised
 * input (each element ~1 in size), so its logits have std ~ router_std * sqrt(C): the default
 * router_std = 2 / sqrt(C) gives logits of std ~2 at any width, where the top expert takes a
 * median ~50% of the probability and the k-th ~11% and the choice still varies token to token
 * (tests/py/make_moe_checkpoints.py measured this at C = 64, std 0.25). With 0.02 the logits
 * would have std 0.02 sqrt(C) (0.16 at C = 64): a near-uniform softmax whose top-k flips on any
 * rounding, unlike a trained router's. */
static void tensor_stats(const td_param_spec *s, const td_init_opts *o, int C, double *mean, double *std)
{
    *mean = 0.0;
    *std = o->std;
    if (s->kind == TD_PARAM_EMBED) *std = o->embed_std;
    if (s->kind == TD_PARAM_NORM) { *mean = 1.0; *std = 0.1; }
    if (s->role == TD_ROLE_ROUTER) *std = o->router_std > 0 ? o->router_std : 2.0 / sqrt((double)C);
}

/* The factor on the planted channels of tensor s (td_init_opts); 0 when it has none. Site norm:
 * S on the norm weights, 1/S on the input columns of the projections that read them, so the
 * model computes the same function in exact arithmetic. Site embed: S on the embedding columns. */
static double planted_factor(const td_param_spec *s, const td_init_opts *o)
{
    if (o->outlier_channels <= 0) return 0;
    if (o->outlier_site == TD_OUTLIER_NORM) {
        if (s->role == TD_ROLE_ATTN_NORM || s->role == TD_ROLE_MLP_NORM) return o->outlier_scale;
        switch (s->role) {   /* every GEMM that reads a normed input: its input columns */
        case TD_ROLE_WQ: case TD_ROLE_WK: case TD_ROLE_WV: case TD_ROLE_W_GATE: case TD_ROLE_W_UP:
        case TD_ROLE_ROUTER: case TD_ROLE_E_GATE: case TD_ROLE_E_UP: case TD_ROLE_SH_GATE: case TD_ROLE_SH_UP:
        case TD_ROLE_SH_ROUTE:
            return 1.0 / o->outlier_scale;
        default:
            return 0;
        }
    }
    return s->role == TD_ROLE_EMBED ? o->outlier_scale : 0;   /* tied: the lm_head is this tensor */
}

/* Scales the planted channels among elements [off, off + n) of a tensor whose rows are C long. */
static void plant(float *x, size_t n, size_t off, int C, const int *ch, int nch, float scale)
{
    for (size_t j = 0; j < n; j++) {
        int c = (int)((off + j) % (size_t)C);
        for (int k = 0; k < nch; k++)
            if (ch[k] == c) { x[j] *= scale; break; }
    }
}

static const char *torch_dtype_of(td_dtype dt)
{
    switch (dt) {
    case TD_DT_BF16: return "bfloat16";
    case TD_DT_F16: return "float16";
    default: return "float32";
    }
}

int td_checkpoint_init_random(const char *dir, const td_config *cfg_in, td_dtype dt, uint64_t seed,
                              const char *command, FILE *progress, td_error *err)
{
    td_init_opts o = {0.02, 0.02, 0, 1.0, TD_OUTLIER_NORM, 0};
    return td_checkpoint_init_random_opts(dir, cfg_in, dt, seed, &o, command, progress, err);
}

int td_checkpoint_init_random_opts(const char *dir, const td_config *cfg_in, td_dtype dt, uint64_t seed,
                                   const td_init_opts *opts, const char *command, FILE *progress, td_error *err)
{
    td_config cfg = *cfg_in;
    snprintf(cfg.torch_dtype, sizeof cfg.torch_dtype, "%s", torch_dtype_of(dt));
    if (td_config_validate(&cfg, dir, err) != 0) return -1;
    if (mkdir(dir, 0755) != 0 && errno != EEXIST) return td_fail(err, "%s: cannot create directory: %s", dir, strerror(errno));

    char path[4096];
    snprintf(path, sizeof path, "%s/model.safetensors", dir);
    size_t n = td_config_params(&cfg, NULL, 0);
    td_param_spec *specs = td_xmalloc(n * sizeof *specs);
    td_config_params(&cfg, specs, n);
    td_st_writer *w = td_st_writer_new(path);
    float *buf = td_xmalloc((size_t)BATCH * CHUNK * sizeof(float));   /* values of a batch of chunks */
    uint8_t *codes = td_xmalloc((size_t)BATCH * CHUNK * td_dtype_size(dt));   /* ... encoded */
    int rc = -1, *ch = NULL;
    char seedstr[32];
    snprintf(seedstr, sizeof seedstr, "%llu", (unsigned long long)seed);
    if (td_st_writer_meta(w, "tidal_command", command ? command : "", err) ||
        td_st_writer_meta(w, "tidal_seed", seedstr, err) || td_st_writer_meta(w, "tidal_version", TD_VERSION, err))
        goto done;
    int nch = opts->outlier_channels;
    if (nch > cfg.hidden_size) { td_fail(err, "--outlier-channels %d: the model has %d hidden channels", nch, cfg.hidden_size); goto done; }
    ch = td_xmalloc((size_t)(nch > 0 ? nch : 1) * sizeof(int));
    if (nch > 0) {
        td_init_outlier_channels(seed, cfg.hidden_size, nch, ch);
        char list[4096] = "", note[4600], scale[64];
        for (int k = 0; k < nch && strlen(list) + 16 < sizeof list; k++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%d", k ? "," : "", ch[k]);
        snprintf(scale, sizeof scale, "%.17g", opts->outlier_scale);
        const char *site = opts->outlier_site == TD_OUTLIER_NORM ? "norm" : "embed";
        snprintf(note, sizeof note, "planted outlier channels, not learned ones: hidden channels %s multiplied by %g in %s", list,
                 opts->outlier_scale, opts->outlier_site == TD_OUTLIER_NORM
                     ? "every input_layernorm and post_attention_layernorm weight, and divided by it in the input "
                       "columns of the projections that read them: q/k/v, gate/up, and in a mixture of experts the "
                       "router, the experts' gate/up and the shared expert's gate/up and gate (the same function in "
                       "exact arithmetic)"
                     : "the embedding's columns (and a tied lm_head's)");
        if (td_st_writer_meta(w, "tidal_synthetic", note, err) || td_st_writer_meta(w, "tidal_outlier_channels", list, err) ||
            td_st_writer_meta(w, "tidal_outlier_scale", scale, err) || td_st_writer_meta(w, "tidal_outlier_site", site, err))
            goto done;
    }
    for (size_t i = 0; i < n; i++)
        if (td_st_writer_declare(w, specs[i].name, dt, specs[i].ndim, specs[i].shape, err) != 0) goto done;
    size_t total = specs[n - 1].offset + specs[n - 1].numel;   /* the table's elements */
    if (td_st_writer_begin(w, err) != 0) goto done;
    const size_t es = td_dtype_size(dt);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    td_progress pr;
    td_progress_start(&pr, progress, "tidal-init");
    size_t params_done = 0;
    for (size_t i = 0; i < n; i++) {
        const td_param_spec *s = &specs[i];
        td_progress_update(&pr, (double)params_done, (double)total, "parameters");
        params_done += s->numel;
        size_t numel = s->numel;
        double mean, std;
        tensor_stats(s, opts, cfg.hidden_size, &mean, &std);
        size_t nchunks = (numel + CHUNK - 1) / CHUNK;
        for (size_t k0 = 0; k0 < nchunks; k0 += BATCH) {
            size_t kn = nchunks - k0 < BATCH ? nchunks - k0 : BATCH;
            #pragma omp parallel for schedule(dynamic, 1) if (kn > 1)
            for (size_t k = 0; k < kn; k++) {
                size_t off = (k0 + k) * CHUNK, m = numel - off < CHUNK ? numel - off : CHUNK;
                fill_chunk(buf + k * CHUNK, m, mean, std, seed, i, k0 + k);
                double pf = planted_factor(s, opts);
                if (pf != 0) plant(buf + k * CHUNK, m, off, cfg.hidden_size, ch, nch, (float)pf);
                td_encode_row(td_dtype_format(dt), buf + k * CHUNK, codes + k * CHUNK * es, m, TD_SATFINITE);
            }
            size_t done_elems = k0 * CHUNK, m = numel - done_elems < kn * CHUNK ? numel - done_elems : kn * CHUNK;
            for (size_t k = 0; k < kn; k++) {
                size_t mk = m - k * CHUNK < CHUNK ? m - k * CHUNK : CHUNK;
                if (td_st_writer_write_raw(w, s->name, codes + k * CHUNK * es, mk * es, err) != 0) goto done;
            }
        }
    }
    if (td_st_writer_finish(w, err) != 0) goto done;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    td_progress_end(&pr);
    if (progress)
        fprintf(progress, "tidal-init: %zu tensors, %zu parameters, %s, %.1f s\n", n, total, td_dtype_name(dt),
                (double)(t1.tv_sec - t0.tv_sec) + 1e-9 * (double)(t1.tv_nsec - t0.tv_nsec));

    snprintf(path, sizeof path, "%s/config.json", dir);
    if (td_config_write(path, &cfg, err) != 0) goto done;
    td_gen_config g;
    td_gen_config_defaults(&g);
    g.bos_token_id = cfg.bos_token_id;
    g.n_eos = td_config_eos_list(&cfg, g.eos_token_ids);
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (td_gen_config_write(path, &g, err) != 0) goto done;
    rc = 0;
done:
    td_st_writer_free(w);
    free(buf);
    free(codes);
    free(specs);
    free(ch);
    return rc;
}
