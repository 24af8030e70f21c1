/* tidal-init — write a seeded random-init Hugging Face checkpoint of a given architecture/shape.
 *
 *   tidal-init --arch qwen2 --preset qwen2.5-0.5b --dtype bf16 --seed 1 -o /tmp/q05
 *   tidal-init --arch llama --hidden-size 64 --num-layers 2 --num-heads 4 --num-kv-heads 2 \
 *              --intermediate-size 176 --vocab-size 512 --dtype f32 --seed 7 -o /tmp/tiny
 *   tidal-init --arch qwen3_moe --preset tiny --num-experts 16 --num-experts-per-tok 4 -o /tmp/moe
 *   tidal-init --preset qwen3-30b-a3b --dtype bf16 --config-only -o /tmp/q30   (a memory plan's)
 * Explicit shape flags override the preset. The command line is recorded in the safetensors
 * metadata ("tidal_command").
 *
 *   tidal-init --lora-for /tmp/q05 --rank 8 --alpha 16 --targets q_proj,v_proj --lora-std 0.01 \
 *              --seed 1 -o /tmp/q05-lora
 * writes a PEFT LoRA adapter for that model instead, with random A and B (see usage). */
#include "tidal/checkpoint.h"
#include "tidal/lora.h"
#include "tidal/opts.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --lora-for: a random PEFT adapter for the model in model_dir. */
static int write_adapter(const char *model_dir, const char *targets, int rank, double alpha, double std,
                         unsigned long long seed, const char *out, int argc, char **argv)
{
    char path[4096], list[512];
    snprintf(path, sizeof path, "%s/config.json", model_dir);
    td_config cfg;
    td_error err;
    if (td_config_parse(path, &cfg, &err)) { fprintf(stderr, "tidal-init: %s\n", err.msg); return 1; }
    unsigned modules = 0;
    snprintf(list, sizeof list, "%s", targets);
    for (char *save = NULL, *t = strtok_r(list, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int m = td_lora_module_from_name(t);
        if (m < 0) {
            fprintf(stderr, "tidal-init: --targets: expected projections among q_proj k_proj v_proj o_proj gate_proj "
                            "up_proj down_proj, got '%s'\n", t);
            return 2;
        }
        modules |= 1u << m;
    }
    if (!modules) { fprintf(stderr, "tidal-init: --targets: expected at least one projection, got '%s'\n", targets); return 2; }
    char *cmd = td_command_line(argc, argv);
    int rc = td_lora_init_random(out, &cfg, rank, alpha, modules, std, seed, model_dir, cmd, &err);
    free(cmd);
    if (rc) { fprintf(stderr, "tidal-init: %s\n", err.msg); return 1; }
    fprintf(stderr, "tidal-init: wrote LoRA adapter %s (r=%d, alpha=%g, std=%g, targets %s, %d layers)\n", out, rank,
            alpha, std, targets, cfg.num_layers);
    return 0;
}

/* Ctrl-C / SIGTERM while writing: remove DIR/model.safetensors.tmp (the real name only ever
 * appears, by rename, once the file is complete), then die of the signal as before. */
static char tmp_path[4200];

static void on_stop_signal(int sig)
{
    unlink(tmp_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

int main(int argc, char **argv)
{
    const char *arch = NULL, *preset = NULL, *out = NULL, *dtype = "f32", *rope_scaling = NULL, *eos = NULL;
    const char *mlp_only = NULL;
    int bos = -2;
    int hidden = 0, layers = 0, heads = 0, kv = 0, hd = 0, inter = 0, vocab = 0, tie = -1;
    double theta = 0, eps = 0;
    const char *lora_for = NULL, *targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    int rank = 8;
    double alpha = 16, lora_std = 0.01;
    unsigned long long seed = 0;
    td_init_opts init = {0.02, -1, 0, 1.0, TD_OUTLIER_NORM, 0};
    td_moe_opts moe = {-1, -1, -1, -1, -1, -1, NULL};
    int outlier_site = 0, config_only = 0;
    const int MAXDIM = 1 << 24;
    /* shape flags take the config.json names too (--num-hidden-layers, --num_attention_heads ...) */
    td_opt opts[] = {
        TD_OPT_S("arch", 0, &arch, "A", "llama|mistral|qwen2|qwen3|qwen2_moe|qwen3_moe|mixtral|olmoe\n"
                 "(default llama, or the preset's)"),
        TD_OPT_S("preset", 0, &preset, "NAME", "tiny|qwen2.5-0.5b|qwen3-0.6b|llama-3.2-1b|llama-3.1-8b|\n"
                 "llama-3.1-8b-instruct|qwen3-30b-a3b|qwen1.5-moe-a2.7b|\nmixtral-8x7b; shape flags override it"),
        TD_OPT_I("hidden-size", 0, &hidden, "C", 1, MAXDIM, "hidden size"),
        TD_OPT_I("num-layers", 0, &layers, "L", 1, MAXDIM, "decoder layers"),
        TD_OPT_I("num-heads", 0, &heads, "NH", 1, MAXDIM, "attention heads"),
        TD_OPT_I("num-kv-heads", 0, &kv, "NKV", 1, MAXDIM, "key/value heads (default: --num-heads)"),
        TD_OPT_I("head-dim", 0, &hd, "HD", 1, MAXDIM, "head dimension (default C / NH)"),
        TD_OPT_I("intermediate-size", 0, &inter, "F", 1, MAXDIM, "MLP width"),
        TD_OPT_I("vocab-size", 0, &vocab, "V", 1, MAXDIM, "vocabulary size"),
        TD_OPT_D("rope-theta", 0, &theta, "X", 0, 1e12, "RoPE base"),
        TD_OPT_D("rms-norm-eps", 0, &eps, "X", 0, 1, "RMSNorm epsilon"),
        TD_OPT_S("rope-scaling", 0, &rope_scaling, "JSON", "config.json's rope_scaling, e.g. '{\"rope_type\": \"llama3\",\n"
                 "\"factor\": 8.0, \"low_freq_factor\": 1.0, \"high_freq_factor\": 4.0,\n"
                 "\"original_max_position_embeddings\": 8192}' (Llama 3.1); null\n"
                 "removes the preset's"),
        TD_OPT_S("eos-token-id", 0, &eos, "IDS", "end-of-sequence id or comma-separated list (Llama 3.1\n"
                 "Instruct: 128001,128008,128009)"),
        TD_OPT_I("bos-token-id", 0, &bos, "ID", -1, 0x7FFFFFFF, "beginning-of-sequence id (-1: none)"),
        TD_OPT_I("num-experts", 0, &moe.num_experts, "E", 1, 65536, "mixture of experts: experts per MoE layer\n"
                 "(--arch qwen2_moe|qwen3_moe|mixtral|olmoe; tiny: 8)"),
        TD_OPT_I("num-experts-per-tok", 0, &moe.num_experts_per_tok, "K", 1, 65536, "experts each token is routed to (top-k)"),
        TD_OPT_I("moe-intermediate-size", 0, &moe.moe_intermediate_size, "FE", 1, MAXDIM, "each expert's MLP width (Qwen; Mixtral's is\n"
                 "--intermediate-size)"),
        TD_OPT_I("shared-expert-intermediate-size", 0, &moe.shared_expert_intermediate_size, "FS", 0, MAXDIM,
                 "Qwen2-MoE's shared expert's MLP width (0: none)"),
        TD_OPT_I("decoder-sparse-step", 0, &moe.decoder_sparse_step, "S", 1, 4096, "Qwen: layer l is sparse when (l + 1) % S == 0\n"
                 "(default 1: every layer)"),
        TD_OPT_S("mlp-only-layers", 0, &mlp_only, "LIST", "Qwen: layers with a dense MLP instead, e.g. 0,3\n"
                 "(none: none)"),
        TD_OPT_F("norm-topk-prob", 0, &moe.norm_topk_prob, 1, "Qwen: renormalise the top-k routing weights"),
        TD_OPT_F("no-norm-topk-prob", 0, &moe.norm_topk_prob, 0, "Qwen: do not (transformers' default; Mixtral always\n"
                 "does)"),
        TD_OPT_F("tie", 0, &tie, 1, "tie the embedding and the LM head (tie_word_embeddings)"),
        TD_OPT_F("no-tie", 0, &tie, 0, "untied LM head"),
        TD_OPT_F("config-only", 0, &config_only, 1, "write DIR/config.json only (no weights): enough for\n"
                 "tidal-diff --plan-only's memory plan of a large model"),
        TD_OPT_S("dtype", 0, &dtype, "f32|bf16|f16", "stored dtype (default f32)"),
        TD_OPT_D("init-std", 0, &init.std, "S", 0, 1e3, "std of GEMM weights and biases (default 0.02)"),
        TD_OPT_D("router-std", 0, &init.router_std, "S", 0, 1e3, "std of MoE routers (default 2/sqrt(C): router logits of\n"
                 "std ~2, so the routing is neither uniform nor one-hot)"),
        TD_OPT_D("embed-std", 0, &init.embed_std, "S", 0, 1e3, "std of the embedding (default --init-std); a larger one\n"
                 "(e.g. 0.5) gives peaked distributions"),
        TD_OPT_I("outlier-channels", 0, &init.outlier_channels, "N", 0, MAXDIM, "plant N outlier channels (synthetic; recorded in the\n"
                 "checkpoint's metadata): N hidden channels drawn from\nthe seed, multiplied by --outlier-scale at --outlier-site"),
        TD_OPT_D("outlier-scale", 0, &init.outlier_scale, "S", 0, 1e30, "factor on the planted channels (default 1; real models'\n"
                 "outlier channels are 10-1000x the rest; 1e5 overflows FP16)"),
        TD_OPT_C("outlier-site", 0, &outlier_site, "norm|embed", "norm (default): the input_layernorm and\n"
                 "post_attention_layernorm weights (channel outliers in\nevery GEMM input, as LLM.int8() found), divided back\n"
                 "out of the projections' input columns (same function in\nexact arithmetic); embed: the embedding's columns\n"
                 "(massive residual-stream values; changes the function)"),
        TD_OPT_U("seed", 0, &seed, "S", "seed (default 0)"),
        TD_OPT_S("output", 'o', &out, "DIR", "output directory (created, parents too)"),
        TD_OPT_S("lora-for", 0, &lora_for, "MODEL_DIR", "write a PEFT LoRA adapter for MODEL_DIR's shapes instead"),
        TD_OPT_I("rank", 0, &rank, "R", 1, MAXDIM, "LoRA rank (default 8)"),
        TD_OPT_D("alpha", 0, &alpha, "A", 0, 1e6, "lora_alpha (default 16)"),
        TD_OPT_S("targets", 0, &targets, "LIST", "projections among q_proj k_proj v_proj o_proj gate_proj\n"
                 "up_proj down_proj, comma-separated (default all seven)"),
        TD_OPT_D("lora-std", 0, &lora_std, "S", 0, 1e3, "std of lora_A and lora_B (default 0.01)"),
        /* the old spelling, unlisted: tidal-diff's --layers is a switch; checkpoints record it */
        TD_OPT_I("layers", 0, &layers, "L", 1, MAXDIM, NULL),
        {0}};
    td_opt_get(opts, "hidden-size")->aliases = "hidden";
    td_opt_get(opts, "num-layers")->aliases = "num-hidden-layers";
    td_opt_get(opts, "num-heads")->aliases = "num-attention-heads heads";
    td_opt_get(opts, "num-kv-heads")->aliases = "num-key-value-heads kv-heads";
    td_opt_get(opts, "intermediate-size")->aliases = "intermediate";
    td_opt_get(opts, "vocab-size")->aliases = "vocab";
    td_opt_get(opts, "rms-norm-eps")->aliases = "rms-eps";
    td_opt_get(opts, "num-experts")->aliases = "num-local-experts";
    const char *positive[] = {"rope-theta", "rms-norm-eps", "init-std", "embed-std", "router-std", "alpha", "lora-std",
                              "outlier-scale"};
    for (size_t i = 0; i < sizeof positive / sizeof *positive; i++) td_opt_get(opts, positive[i])->lo_open = 1;
    td_opt_get(opts, "output")->required = 1;
    td_cli cli = {"tidal-init", "[--arch A] [--preset P] [shape flags] [--dtype D] [--seed S] -o DIR\n"
                  "--lora-for MODEL_DIR [--rank R] [--alpha A] [--targets LIST] [--lora-std S] [--seed S] -o ADAPTER_DIR",
                  "Writes a seeded random-init Hugging Face checkpoint (config.json, model.safetensors) of a\n"
                  "Llama-family shape; without --preset give --hidden-size --num-layers --num-heads\n"
                  "--intermediate-size --vocab-size, and for a mixture of experts --num-experts\n"
                  "--num-experts-per-tok (Qwen: --moe-intermediate-size; Qwen2-MoE:\n"
                  "--shared-expert-intermediate-size). The command line is recorded in the safetensors metadata.",
                  "--lora-for: both lora_A and lora_B are random N(0, S^2): PEFT starts B at zero, an update of\n"
                  "nothing, so tidal's adapters are random on purpose, for tests and for measuring what merging\n"
                  "an update into low-precision weights keeps. They are not trained adapters.\n"
                  "--outlier-channels: a random model has no outlier channels, so FP8 scaling granularity\n"
                  "and FP16's range make no difference on it; real LLMs have a few huge channels. Planted\n"
                  "ones are synthetic and say so in the safetensors metadata (tidal_synthetic).",
                  opts, 0, 0};
    int nargs, rc = td_cli_parse(&cli, argc, argv, NULL, &nargs);
    if (rc >= 0) return rc;
    td_error err;
    if (td_make_parent_dirs(out, &err)) { fprintf(stderr, "tidal-init: %s\n", err.msg); return 1; }
    if (lora_for) return write_adapter(lora_for, targets, rank, alpha, lora_std, seed, out, argc, argv);

    td_config cfg;
    int a = arch ? td_arch_from_name(arch) : TD_ARCH_LLAMA;
    if (a < 0) return td_cli_bad(&cli, "--arch", arch, "one of llama, mistral, qwen2, qwen3, qwen2_moe, qwen3_moe, mixtral, olmoe");
    td_config_defaults(&cfg, (td_arch)a);
    if (preset) {
        if (td_config_preset(preset, &cfg) != 0) {
            return td_cli_bad(&cli, "--preset", preset, "one of " TD_CONFIG_PRESETS);
        }
        if (arch && (int)cfg.arch != a) {
            return td_cli_bad(&cli, "--arch", arch, "the preset's architecture (--preset %s is a %s)", preset, td_arch_name(cfg.arch));
        }
    } else if (!hidden || !layers || !heads || !inter || !vocab) {
        return td_cli_bad(&cli, "--preset", NULL, "without a preset give --hidden-size --num-layers --num-heads "
                          "--intermediate-size --vocab-size");
    }
    if (hidden) cfg.hidden_size = hidden;
    if (layers) cfg.num_layers = layers;
    if (heads) cfg.num_heads = heads;
    cfg.num_kv_heads = kv ? kv : (heads ? heads : cfg.num_kv_heads);
    if (hd) cfg.head_dim = hd;
    else if (hidden || heads || !preset) cfg.head_dim = cfg.hidden_size / cfg.num_heads;
    if (inter) cfg.intermediate_size = inter;
    if (vocab) cfg.vocab_size = vocab;
    if (theta > 0) cfg.rope_theta = theta;
    if (eps > 0) cfg.rms_norm_eps = eps;
    if (tie >= 0) cfg.tie_word_embeddings = tie;
    /* the library's messages start with the flag's name, as td_cli_bad's do */
    if (rope_scaling && td_config_set_rope_scaling(&cfg, rope_scaling, &err))
        return td_cli_bad(&cli, "--rope-scaling", NULL, "%s", err.msg + strlen("--rope-scaling: "));
    if (eos && td_config_set_eos(&cfg, eos, &err))
        return td_cli_bad(&cli, "--eos-token-id", NULL, "%s", err.msg + strlen("--eos-token-id: "));
    if (bos != -2) cfg.bos_token_id = bos;
    moe.mlp_only_layers = mlp_only;
    if (td_config_set_moe(&cfg, &moe, &err)) {   /* "--flag: why" */
        char *colon = strstr(err.msg, ": ");
        if (!colon) { fprintf(stderr, "tidal-init: %s\n", err.msg); return 2; }
        *colon = 0;
        return td_cli_bad(&cli, err.msg, NULL, "%s", colon + 2);
    }
    for (int i = 0; eos && i < (cfg.n_eos ? cfg.n_eos : 1); i++)
        if (cfg.eos_token_ids[i] >= cfg.vocab_size)
            return td_cli_bad(&cli, "--eos-token-id", NULL, "id %d outside the vocabulary of %d", cfg.eos_token_ids[i], cfg.vocab_size);
    if (bos >= cfg.vocab_size) return td_cli_bad(&cli, "--bos-token-id", NULL, "id %d outside the vocabulary of %d", bos, cfg.vocab_size);
    if (cfg.bos_token_id >= cfg.vocab_size) cfg.bos_token_id = -1;
    if (cfg.eos_token_id >= cfg.vocab_size) cfg.eos_token_id = -1;
    for (int i = 0; i < cfg.n_eos; i++)   /* a preset's list, with a smaller --vocab-size */
        if (cfg.eos_token_ids[i] >= cfg.vocab_size) { cfg.n_eos = 0; cfg.eos_token_id = -1; }
    int dt = td_dtype_parse(dtype);
    if (dt < 0 || dt == TD_DT_F8_E4M3) {
        return td_cli_bad(&cli, "--dtype", dtype, "f32, bf16 or f16");
    }

    if (config_only) {   /* the shape alone: what a memory plan reads */
        snprintf(cfg.torch_dtype, sizeof cfg.torch_dtype, "%s", dt == TD_DT_BF16 ? "bfloat16" : dt == TD_DT_F16 ? "float16" : "float32");
        char cpath[4096];
        snprintf(cpath, sizeof cpath, "%s/config.json", out);
        if (td_make_parent_dirs(cpath, &err) || td_config_write(cpath, &cfg, &err)) { fprintf(stderr, "tidal-init: %s\n", err.msg); return 1; }
        fprintf(stderr, "tidal-init: wrote %s (config only: no weights)\n", cpath);
        return 0;
    }
    /* the command line, recorded in the checkpoint */
    if (init.embed_std < 0) init.embed_std = init.std;
    init.outlier_site = outlier_site ? TD_OUTLIER_EMBED : TD_OUTLIER_NORM;
    if (init.outlier_channels > cfg.hidden_size)
        return td_cli_bad(&cli, "--outlier-channels", NULL, "at most the hidden size (%d), got %d", cfg.hidden_size, init.outlier_channels);
    char *cmd = td_command_line(argc, argv);
    if (!cmd) return 2;
    snprintf(tmp_path, sizeof tmp_path, "%s/model.safetensors.tmp", out);
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    rc = td_checkpoint_init_random_opts(out, &cfg, (td_dtype)dt, seed, &init, cmd, stderr, &err);
    free(cmd);
    if (rc != 0) { fprintf(stderr, "tidal-init: %s\n", err.msg); return 1; }
    char experts[160] = "", shared[32] = "";
    if (cfg.shared_expert_intermediate_size > 0) snprintf(shared, sizeof shared, " FS=%d", cfg.shared_expert_intermediate_size);
    if (cfg.num_experts > 0)
        snprintf(experts, sizeof experts, ", E=%d K=%d FE=%d%s on %d of %d layers", cfg.num_experts,
                 cfg.num_experts_per_tok, cfg.moe_intermediate_size, shared, td_config_num_moe_layers(&cfg), cfg.num_layers);
    fprintf(stderr, "tidal-init: wrote %s (%s, C=%d L=%d NH=%d NKV=%d HD=%d F=%d V=%d%s%s)\n", out, td_arch_name(cfg.arch),
            cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
            cfg.vocab_size, experts, cfg.tie_word_embeddings ? ", tied" : "");
    return 0;
}
