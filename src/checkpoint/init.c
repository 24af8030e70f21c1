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

int td_config_preset(const char *name, td_config *c)
{
    if (strcmp(name, "tiny") == 0) {
        td_arch arch = c->arch;   /* tiny keeps the architecture the caller chose */
        td_config_defaults(c, arch);
        c->hidden_size = 64; c->num_layers = 2; c->num_heads = 4; c->num_kv_heads = 2;
        c->head_dim = 16; c->intermediate_size = 176; c->vocab_size = 512;
        c->bos_token_id = 1; c->eos_token_id = 2;
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
    return -1;
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
static void fill_chunk(float *x, size_t n, const td_param_spec *s, uint64_t seed, size_t i, size_t k,
                       const td_init_opts *o)
{
    td_rng r;
    td_rng_stream(&r, seed, ((uint64_t)i << 32) | k);
    double mean = 0.0, std = o->std;
    if (s->kind == TD_PARAM_EMBED) std = o->embed_std;
    if (s->kind == TD_PARAM_NORM) { mean = 1.0; std = 0.1; }
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

/* The factor on the planted channels of tensor s (td_init_opts); 0 when it has none. Site norm:
 * S on the norm weights, 1/S on the input columns of the projections that read them, so the
 * model computes the same function in exact arithmetic. Site embed: S on the embedding columns. */
static double planted_factor(const td_param_spec *s, const td_init_opts *o)
{
    if (o->outlier_channels <= 0) return 0;
    if (o->outlier_site == TD_OUTLIER_NORM) {
        if (s->role == TD_ROLE_ATTN_NORM || s->role == TD_ROLE_MLP_NORM) return o->outlier_scale;
        if (s->role == TD_ROLE_WQ || s->role == TD_ROLE_WK || s->role == TD_ROLE_WV || s->role == TD_ROLE_W_GATE ||
            s->role == TD_ROLE_W_UP) return 1.0 / o->outlier_scale;
        return 0;
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
    td_init_opts o = {0.02, 0.02, 0, 1.0, TD_OUTLIER_NORM};
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
                       "columns of the q/k/v and gate/up projections that read them (the same function in exact arithmetic)"
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
        size_t nchunks = (numel + CHUNK - 1) / CHUNK;
        for (size_t k0 = 0; k0 < nchunks; k0 += BATCH) {
            size_t kn = nchunks - k0 < BATCH ? nchunks - k0 : BATCH;
            #pragma omp parallel for schedule(dynamic, 1) if (kn > 1)
            for (size_t k = 0; k < kn; k++) {
                size_t off = (k0 + k) * CHUNK, m = numel - off < CHUNK ? numel - off : CHUNK;
                fill_chunk(buf + k * CHUNK, m, s, seed, i, k0 + k, opts);
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
