/* tidal-init — write a seeded random-init Hugging Face checkpoint of a given architecture/shape.
 *
 *   tidal-init --arch qwen2 --preset qwen2.5-0.5b --dtype bf16 --seed 1 -o /tmp/q05
 *   tidal-init --arch llama --hidden 64 --layers 2 --heads 4 --kv-heads 2 --intermediate 176 \
 *              --vocab 512 --dtype f32 --seed 7 -o /tmp/tiny
 * Explicit shape flags override the preset. The command line is recorded in the safetensors
 * metadata ("tidal_command").
 *
 *   tidal-init --lora-for /tmp/q05 --rank 8 --alpha 16 --targets q_proj,v_proj --lora-std 0.01 \
 *              --seed 1 -o /tmp/q05-lora
 * writes a PEFT LoRA adapter for that model instead, with random A and B (see usage). */
#include "tidal/checkpoint.h"
#include "tidal/lora.h"

#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void usage(FILE *f)
{
    fprintf(f,
            "usage: tidal-init [--arch llama|mistral|qwen2|qwen3] [--preset tiny|qwen2.5-0.5b|qwen3-0.6b|llama-3.2-1b]\n"
            "                  [--hidden C] [--layers L] [--heads NH] [--kv-heads NKV] [--head-dim HD]\n"
            "                  [--intermediate F] [--vocab V] [--rope-theta X] [--rms-eps X] [--tie|--no-tie]\n"
            "                  [--dtype f32|bf16|f16] [--init-std S] [--embed-std S] [--seed S] -o DIR\n"
            "  --init-std: std of GEMM weights and biases (0.02); --embed-std: of the embedding\n"
            "  (default: --init-std); a larger one (e.g. 0.5) gives peaked distributions\n"
            "       tidal-init --lora-for MODEL_DIR [--rank R] [--alpha A] [--targets q_proj,k_proj,...]\n"
            "                  [--lora-std S] [--seed S] -o ADAPTER_DIR\n"
            "  --lora-for writes a PEFT LoRA adapter (adapter_config.json, adapter_model.safetensors in F32)\n"
            "  for MODEL_DIR's shapes: rank R (default 8), lora_alpha A (default 16), target projections\n"
            "  among q_proj k_proj v_proj o_proj gate_proj up_proj down_proj (default all seven).\n"
            "  Both lora_A and lora_B are random N(0, S^2) (default S 0.01): PEFT starts B at zero, an\n"
            "  update of nothing, so tidal's adapters are random on purpose, for tests and for measuring\n"
            "  what merging an update into low-precision weights keeps. They are not trained adapters.\n");
}

static int parse_int(const char *opt, const char *s, int *out)
{
    char *end;
    long v = strtol(s, &end, 10);
    if (*s == 0 || *end || v < 1 || v > (1L << 24)) {
        fprintf(stderr, "tidal-init: %s expects a positive integer, got '%s'\n", opt, s);
        return -1;
    }
    *out = (int)v;
    return 0;
}

static int parse_double(const char *opt, const char *s, double *out)
{
    char *end;
    *out = strtod(s, &end);
    if (*s == 0 || *end || !(*out > 0)) {
        fprintf(stderr, "tidal-init: %s expects a positive number, got '%s'\n", opt, s);
        return -1;
    }
    return 0;
}

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
            fprintf(stderr, "tidal-init: --targets: unknown projection '%s' (q_proj k_proj v_proj o_proj gate_proj up_proj down_proj)\n", t);
            return 2;
        }
        modules |= 1u << m;
    }
    if (!modules) { fprintf(stderr, "tidal-init: --targets names no projection\n"); return 2; }
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
    enum { O_ARCH = 256, O_PRESET, O_HIDDEN, O_LAYERS, O_HEADS, O_KV, O_HD, O_F, O_V, O_THETA, O_EPS, O_TIE,
           O_NOTIE, O_DTYPE, O_SEED, O_LORA_FOR, O_RANK, O_ALPHA, O_TARGETS, O_LORA_STD, O_STD, O_ESTD };
    static const struct option opts[] = {
        {"arch", 1, 0, O_ARCH}, {"preset", 1, 0, O_PRESET}, {"hidden", 1, 0, O_HIDDEN},
        {"layers", 1, 0, O_LAYERS}, {"heads", 1, 0, O_HEADS}, {"kv-heads", 1, 0, O_KV},
        {"head-dim", 1, 0, O_HD}, {"intermediate", 1, 0, O_F}, {"vocab", 1, 0, O_V},
        {"rope-theta", 1, 0, O_THETA}, {"rms-eps", 1, 0, O_EPS}, {"tie", 0, 0, O_TIE},
        {"no-tie", 0, 0, O_NOTIE}, {"dtype", 1, 0, O_DTYPE}, {"seed", 1, 0, O_SEED},
        {"lora-for", 1, 0, O_LORA_FOR}, {"rank", 1, 0, O_RANK}, {"alpha", 1, 0, O_ALPHA},
        {"targets", 1, 0, O_TARGETS}, {"lora-std", 1, 0, O_LORA_STD},
        {"init-std", 1, 0, O_STD}, {"embed-std", 1, 0, O_ESTD},
        {"output", 1, 0, 'o'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    const char *arch = NULL, *preset = NULL, *out = NULL, *dtype = "f32";
    int hidden = 0, layers = 0, heads = 0, kv = 0, hd = 0, inter = 0, vocab = 0, tie = -1;
    double theta = 0, eps = 0;
    const char *lora_for = NULL, *targets = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj";
    int rank = 8;
    double alpha = 16, lora_std = 0.01;
    unsigned long long seed = 0;
    td_init_opts init = {0.02, -1};
    int c;
    while ((c = getopt_long(argc, argv, "o:h", opts, NULL)) != -1) {
        int bad = 0;
        switch (c) {
        case O_ARCH: arch = optarg; break;
        case O_PRESET: preset = optarg; break;
        case O_HIDDEN: bad = parse_int("--hidden", optarg, &hidden); break;
        case O_LAYERS: bad = parse_int("--layers", optarg, &layers); break;
        case O_HEADS: bad = parse_int("--heads", optarg, &heads); break;
        case O_KV: bad = parse_int("--kv-heads", optarg, &kv); break;
        case O_HD: bad = parse_int("--head-dim", optarg, &hd); break;
        case O_F: bad = parse_int("--intermediate", optarg, &inter); break;
        case O_V: bad = parse_int("--vocab", optarg, &vocab); break;
        case O_THETA: bad = parse_double("--rope-theta", optarg, &theta); break;
        case O_EPS: bad = parse_double("--rms-eps", optarg, &eps); break;
        case O_TIE: tie = 1; break;
        case O_NOTIE: tie = 0; break;
        case O_DTYPE: dtype = optarg; break;
        case O_SEED: {
            char *end;
            seed = strtoull(optarg, &end, 10);
            if (!*optarg || *end) { fprintf(stderr, "tidal-init: --seed expects an integer\n"); return 2; }
        } break;
        case O_LORA_FOR: lora_for = optarg; break;
        case O_RANK: bad = parse_int("--rank", optarg, &rank); break;
        case O_ALPHA: bad = parse_double("--alpha", optarg, &alpha); break;
        case O_TARGETS: targets = optarg; break;
        case O_LORA_STD: bad = parse_double("--lora-std", optarg, &lora_std); break;
        case O_STD: bad = parse_double("--init-std", optarg, &init.std); break;
        case O_ESTD: bad = parse_double("--embed-std", optarg, &init.embed_std); break;
        case 'o': out = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (bad) return 2;
    }
    if (!out || optind != argc) { usage(stderr); return 2; }
    if (lora_for) return write_adapter(lora_for, targets, rank, alpha, lora_std, seed, out, argc, argv);

    td_config cfg;
    int a = arch ? td_arch_from_name(arch) : TD_ARCH_LLAMA;
    if (a < 0) { fprintf(stderr, "tidal-init: unknown --arch '%s' (llama, mistral, qwen2, qwen3)\n", arch); return 2; }
    td_config_defaults(&cfg, (td_arch)a);
    if (preset) {
        if (td_config_preset(preset, &cfg) != 0) {
            fprintf(stderr, "tidal-init: unknown --preset '%s' (tiny, qwen2.5-0.5b, qwen3-0.6b, llama-3.2-1b)\n", preset);
            return 2;
        }
        if (arch && (int)cfg.arch != a) {
            fprintf(stderr, "tidal-init: --preset %s is a %s, not --arch %s\n", preset, td_arch_name(cfg.arch), arch);
            return 2;
        }
    } else if (!hidden || !layers || !heads || !inter || !vocab) {
        fprintf(stderr, "tidal-init: without --preset give --hidden --layers --heads --intermediate --vocab\n");
        return 2;
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
    if (cfg.bos_token_id >= cfg.vocab_size) cfg.bos_token_id = -1;
    if (cfg.eos_token_id >= cfg.vocab_size) cfg.eos_token_id = -1;
    int dt = td_dtype_parse(dtype);
    if (dt < 0 || dt == TD_DT_F8_E4M3) {
        fprintf(stderr, "tidal-init: --dtype must be f32, bf16 or f16, got '%s'\n", dtype);
        return 2;
    }

    /* the command line, recorded in the checkpoint */
    char *cmd = td_command_line(argc, argv);
    if (!cmd) return 2;

    td_error err;
    if (init.embed_std < 0) init.embed_std = init.std;
    snprintf(tmp_path, sizeof tmp_path, "%s/model.safetensors.tmp", out);
    signal(SIGINT, on_stop_signal);
    signal(SIGTERM, on_stop_signal);
    int rc = td_checkpoint_init_random_opts(out, &cfg, (td_dtype)dt, seed, &init, cmd, stderr, &err);
    free(cmd);
    if (rc != 0) { fprintf(stderr, "tidal-init: %s\n", err.msg); return 1; }
    fprintf(stderr, "tidal-init: wrote %s (%s, C=%d L=%d NH=%d NKV=%d HD=%d F=%d V=%d%s)\n", out, td_arch_name(cfg.arch),
            cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.intermediate_size,
            cfg.vocab_size, cfg.tie_word_embeddings ? ", tied" : "");
    return 0;
}
