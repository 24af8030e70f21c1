/* tidal — checkpoint I/O for Hugging Face Llama-family checkpoints.
 *
 * A checkpoint is a directory as transformers writes it:
 *   config.json                     architecture and shapes (td_config, config.h)
 *   generation_config.json          optional: sampling defaults (td_gen_config)
 *   model.safetensors               one file, or
 *   model.safetensors.index.json    {"weight_map": {tensor name: shard file}} + the shards
 * Tokenizer files are not read here (tokenizer.h does that) and are never required.
 *
 * safetensors layout: u64 little-endian N, then N bytes of JSON header
 *   {"__metadata__": {str: str}, NAME: {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}}
 * then the data area; offsets are relative to the data area, [b, e) per tensor, row-major.
 * Every shard is memory-mapped read-only; tensors point into the maps (nothing is copied until
 * a caller asks for fp32). Every header field is validated against the file before use.
 *
 * HF tensor names and shapes (dimension letters as in config.h):
 *   model.embed_tokens.weight                         (V, C)
 *   model.layers.{i}.input_layernorm.weight           (C)
 *   model.layers.{i}.self_attn.q_proj.weight          (NH*HD, C)     .bias (NH*HD)   Qwen2
 *   model.layers.{i}.self_attn.k_proj.weight          (NKV*HD, C)    .bias (NKV*HD)  Qwen2
 *   model.layers.{i}.self_attn.v_proj.weight          (NKV*HD, C)    .bias (NKV*HD)  Qwen2
 *   model.layers.{i}.self_attn.o_proj.weight          (C, NH*HD)
 *   model.layers.{i}.self_attn.q_norm.weight          (HD)                           Qwen3
 *   model.layers.{i}.self_attn.k_norm.weight          (HD)                           Qwen3
 *   model.layers.{i}.post_attention_layernorm.weight  (C)
 *   model.layers.{i}.mlp.gate_proj.weight             (F, C)
 *   model.layers.{i}.mlp.up_proj.weight               (F, C)
 *   model.layers.{i}.mlp.down_proj.weight             (C, F)
 *   model.norm.weight                                 (C)
 *   lm_head.weight                                    (V, C)   absent when tie_word_embeddings
 */
#ifndef TIDAL_CHECKPOINT_H
#define TIDAL_CHECKPOINT_H

#include "tidal/common.h"
#include "tidal/config.h"
#include "tidal/formats.h"

#include <stdbool.h>
#include <stdio.h>

TD_BEGIN_DECLS

/* ---- tensor dtypes (safetensors names "F32", "F16", "BF16", "F8_E4M3") ---- */
typedef enum { TD_DT_F32 = 0, TD_DT_F16, TD_DT_BF16, TD_DT_F8_E4M3, TD_DT_COUNT,
               /* written only (td_st_writer, raw little-endian int64): integer tensors beside
                * weights, e.g. the input_ids of a gradient dump; the reader refuses it */
               TD_DT_I64 = 16 } td_dtype;

const char *td_dtype_name(td_dtype dt);         /* "F32", ...                          */
int         td_dtype_from_name(const char *s);  /* safetensors name -> td_dtype, or -1 */
/* Also accepts the tool spellings "f32", "fp32", "bf16", "f16", "fp16", "e4m3", "fp8"; -1 if unknown. */
int         td_dtype_parse(const char *s);
size_t      td_dtype_size(td_dtype dt);         /* bytes per element: 4, 2, 2, 1 (I64: 8) */
td_format   td_dtype_format(td_dtype dt);       /* the td_format that decodes it       */

#define TD_MAX_DIMS 8

typedef struct {
    char *name;
    td_dtype dtype;
    int ndim;
    int64_t shape[TD_MAX_DIMS];
    size_t numel;             /* product of shape (1 for a 0-d tensor)           */
    const uint8_t *data;      /* into the shard's read-only map; numel * size    */
    size_t nbytes;
    int shard;                /* index into the checkpoint's shard list          */
} td_tensor;

typedef struct td_checkpoint td_checkpoint;   /* opaque: mapped shards, tensor table, configs */

/* ---- generation_config.json ---- */
enum {
    TD_GEN_TEMPERATURE = 1 << 0, TD_GEN_TOP_P = 1 << 1, TD_GEN_TOP_K = 1 << 2,
    TD_GEN_REPETITION_PENALTY = 1 << 3, TD_GEN_DO_SAMPLE = 1 << 4,
    TD_GEN_BOS = 1 << 5, TD_GEN_EOS = 1 << 6,
};
#define TD_GEN_MAX_EOS TD_CONFIG_MAX_EOS
typedef struct {
    double temperature;        /* HF GenerationConfig defaults: 1.0               */
    double top_p;              /* 1.0                                             */
    int top_k;                 /* 50                                              */
    double repetition_penalty; /* 1.0                                             */
    bool do_sample;            /* false                                           */
    int bos_token_id;          /* -1 when unknown                                 */
    int eos_token_ids[TD_GEN_MAX_EOS];
    int n_eos;
    unsigned present;          /* TD_GEN_* bits: keys present in the file         */
    bool from_file;            /* generation_config.json existed                  */
} td_gen_config;

/* ---- reading ---- */

/* Opens a checkpoint directory (config.json required, generation_config.json optional,
 * model.safetensors or model.safetensors.index.json). Also accepts the path of one
 * .safetensors file: then only tensors are available and td_checkpoint_config is NULL.
 * Validates every header; does not check that the tensors fit the config (see
 * td_checkpoint_validate). NULL + err naming the file and the problem on failure. */
td_checkpoint *td_checkpoint_open(const char *path, td_error *err);
void td_checkpoint_close(td_checkpoint *ck);

const td_config *td_checkpoint_config(const td_checkpoint *ck);        /* NULL for a bare file */
/* generation_config.json, or transformers' defaults; bos/eos the file lacks come from config.json
 * (its whole eos list when it has one). */
const td_gen_config *td_checkpoint_generation(const td_checkpoint *ck);
const char *td_checkpoint_path(const td_checkpoint *ck);

size_t td_checkpoint_num_tensors(const td_checkpoint *ck);
const td_tensor *td_checkpoint_tensor(const td_checkpoint *ck, size_t i);   /* sorted by name */
const td_tensor *td_checkpoint_find(const td_checkpoint *ck, const char *name); /* NULL if missing */
const char *td_checkpoint_shard_path(const td_checkpoint *ck, int shard);
/* Value of a "__metadata__" key in the first shard that has it, or NULL. */
const char *td_checkpoint_metadata(const td_checkpoint *ck, const char *key);

/* Fetches a tensor by name, checks its shape exactly (ndim and every extent), converts it to
 * fp32 into dst (numel elements; conversion is exact for every dtype). Error names the file,
 * the tensor, and expected vs actual shape. Counts NaN/Inf values into *nonfinite (may be NULL;
 * non-finite values are copied, not an error). */
int td_checkpoint_read_f32(const td_checkpoint *ck, const char *name, int ndim,
                           const int64_t *shape, float *dst, size_t *nonfinite, td_error *err);
/* The same for a td_tensor already found, without the shape check. */
void td_tensor_to_f32(const td_tensor *t, float *dst, size_t *nonfinite);

/* If the stored dtype is F32 and the data is 4-byte aligned in the map, returns a pointer into
 * the map (no copy); otherwise NULL + err saying why (caller then uses read_f32). Shape checked
 * as in read_f32. Valid until td_checkpoint_close. */
const float *td_checkpoint_map_f32(const td_checkpoint *ck, const char *name, int ndim,
                                   const int64_t *shape, td_error *err);

/* ---- the parameter table of a config ----
 * One table for every place that lays parameters out: the loader and td_model_alloc carve the
 * model's weights by it, the recipe weight preparation carves its rounded copy by it, the
 * checkpoint writer writes tensors in its order, and a trainer carves gradients and optimiser
 * moments by it (same offsets, one allocation each), as llm.c carves its parameter block. */
typedef enum { TD_PARAM_EMBED, TD_PARAM_MATRIX, TD_PARAM_NORM, TD_PARAM_BIAS } td_param_kind;
/* Which tensor of the model an entry is (the field of td_model_weights / td_layer_weights). */
typedef enum {
    TD_ROLE_EMBED, TD_ROLE_ATTN_NORM, TD_ROLE_WQ, TD_ROLE_WK, TD_ROLE_WV, TD_ROLE_BQ, TD_ROLE_BK,
    TD_ROLE_BV, TD_ROLE_WO, TD_ROLE_Q_NORM, TD_ROLE_K_NORM, TD_ROLE_MLP_NORM, TD_ROLE_W_GATE,
    TD_ROLE_W_UP, TD_ROLE_W_DOWN, TD_ROLE_FINAL_NORM, TD_ROLE_LM_HEAD,
    /* mixture-of-experts layers (config.h): the router (E, C); expert `expert`'s gate (FE, C), up
     * (FE, C) and down (C, FE); Qwen2-MoE's shared expert (FS, C), (FS, C), (C, FS) and its gate
     * (1, C) */
    TD_ROLE_ROUTER, TD_ROLE_E_GATE, TD_ROLE_E_UP, TD_ROLE_E_DOWN, TD_ROLE_SH_GATE, TD_ROLE_SH_UP,
    TD_ROLE_SH_DOWN, TD_ROLE_SH_ROUTE, TD_ROLE_COUNT
} td_param_role;
typedef struct {
    char name[96];            /* HF tensor name */
    td_param_kind kind;
    int layer;                /* -1 for embed_tokens, model.norm, lm_head */
    int expert;               /* the expert of TD_ROLE_E_*, else -1 */
    int ndim;                 /* 1 or 2 */
    int64_t shape[2];
    td_param_role role;
    size_t numel;             /* shape[0] * shape[1] (ndim 2) or shape[0] */
    size_t offset;            /* elements before it with every tensor of the table end to end */
    td_format dtype;          /* element format of a carved buffer: fp32 (master weights, and
                                 gradients / moments later) */
} td_param_spec;

/* Fills out[0..cap) with the tensors a checkpoint of this config holds, in HF order
 * (embed, layers 0..L-1, norm, lm_head unless tied); returns the total count (may be > cap).
 * The elements of all of them: td_config_param_elems. */
size_t td_config_params(const td_config *cfg, td_param_spec *out, size_t cap);
size_t td_config_param_elems(const td_config *cfg);
/* Every tensor of td_config_params present with its exact shape and a supported dtype;
 * tensors not in the list (rotary inv_freq, ...) are ignored. Error names the first problem.
 * Experts are per-expert tensors in the table (the hub's layout, transformers 4); a checkpoint in
 * transformers 5's fused layout (mlp.experts.gate_up_proj [E, 2 FE, C], each expert's gate rows
 * first, and mlp.experts.down_proj [E, C, FE]) is read through per-expert views of those tensors
 * that td_checkpoint_open adds (no copy), so both layouts load alike. */
int td_checkpoint_validate(const td_checkpoint *ck, td_error *err);
/* Counts NaN/Inf over every tensor; returns the total and sets *n_tensors_bad. */
size_t td_checkpoint_count_nonfinite(const td_checkpoint *ck, size_t *n_tensors_bad);

/* ---- config.json / generation_config.json ---- */

/* Parses config.json for LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM,
 * Qwen3ForCausalLM; missing optional keys take transformers' defaults for that architecture.
 * Rejects unknown architectures, missing/mistyped keys, NH % NKV != 0, unsupported options
 * (rope_scaling other than llama3, attention/mlp biases Llama does not model, hidden_act
 * other than silu). eos lists: the first id goes to cfg->eos_token_id. */
int td_config_parse(const char *config_json_path, td_config *cfg, td_error *err);
/* The same checks on an already filled struct (what = name used in messages). */
int td_config_validate(const td_config *cfg, const char *what, td_error *err);
/* HF defaults for an architecture (shapes zero): the starting point of a writer. */
void td_config_defaults(td_config *cfg, td_arch arch);
/* Parses "llama", "mistral", "qwen2", "qwen3" or the HF class name; -1 if unknown. */
int td_arch_from_name(const char *s);
/* Writes a config.json transformers accepts for that architecture. */
int td_config_write(const char *path, const td_config *cfg, td_error *err);

void td_gen_config_defaults(td_gen_config *g);
/* Parses generation_config.json; keys absent keep defaults; cfg (may be NULL) supplies
 * bos/eos when the file lacks them, as transformers does. */
int td_gen_config_parse(const char *path, const td_config *cfg, td_gen_config *g, td_error *err);
/* The ids that end a generated sequence for the checkpoint in `dir`, as transformers decides:
 * generation_config.json's eos list when the file has one, else config.json's (cfg), else
 * tok_eos (the tokenizer's eos; -1 for none). Returns the count (0..TD_GEN_MAX_EOS) or -1 + err
 * when generation_config.json is unreadable. */
int td_checkpoint_stop_ids(const char *dir, const td_config *cfg, int tok_eos, int *ids, td_error *err);
int td_gen_config_write(const char *path, const td_gen_config *g, td_error *err);
/* One line: "generation: temperature=0.7 top_p=0.8 top_k=20 repetition_penalty=1.05 (...)"
 * plus a warning when repetition_penalty != 1 comes from the file (a sampler that ignores it,
 * or a rollout engine that silently inherits it, scores a different distribution). */
void td_gen_config_print(FILE *f, const td_gen_config *g);

/* ---- random initialisation (tidal-init) ---- */

/* Named shapes: "tiny" (C=64 L=2 NH=4 NKV=2 HD=16 F=176 V=512, arch kept; for a mixture-of-experts
 * arch also E=8 K=2 on every layer, FE=32 (Mixtral: F), Qwen2-MoE's shared expert FS=64,
 * norm_topk_prob true but for Qwen2-MoE), "qwen2.5-0.5b", "qwen3-0.6b", "llama-3.2-1b",
 * "llama-3.1-8b", "llama-3.1-8b-instruct", and the mixtures "qwen3-30b-a3b", "qwen1.5-moe-a2.7b",
 * "mixtral-8x7b" (these set the architecture too, rope_scaling, eos lists and expert shapes as the
 * hub's config.json; the mixtures are meant for config-only use, tidal-init --config-only).
 * -1 if unknown. */
int td_config_preset(const char *name, td_config *cfg);
#define TD_CONFIG_PRESETS "tiny, qwen2.5-0.5b, qwen3-0.6b, llama-3.2-1b, llama-3.1-8b, llama-3.1-8b-instruct, " \
                          "qwen3-30b-a3b, qwen1.5-moe-a2.7b, mixtral-8x7b"
/* The mixture-of-experts shape of a tidal-init command line, -1 (NULL) for a flag not given. */
typedef struct {
    int num_experts, num_experts_per_tok, moe_intermediate_size, shared_expert_intermediate_size;
    int decoder_sparse_step;
    int norm_topk_prob;           /* 0 / 1 */
    const char *mlp_only_layers;  /* "1,3"; "" or "none": none */
} td_moe_opts;
/* Applies o to cfg, whose arch and other shapes are final (a Mixtral's experts take its
 * intermediate_size). Refused, with the message starting with the flag's name: any of them for a
 * dense arch; moe_intermediate_size, decoder_sparse_step, norm_topk_prob, mlp_only_layers for
 * Mixtral (its config.json has none); a shared expert but for Qwen2-MoE; an MoE arch whose cfg has
 * no experts yet (no preset) without E, K, FE (Qwen) and FS (Qwen2-MoE; 0: none); K > E; a layer
 * index outside the model; no MoE layer left. */
int td_config_set_moe(td_config *cfg, const td_moe_opts *o, td_error *err);
/* "rope_scaling" as config.json spells it (a JSON object, e.g. {"rope_type": "llama3",
 * "factor": 8.0, ...}; "null" or "none" removes it), through config.json's own parser. */
int td_config_set_rope_scaling(td_config *cfg, const char *json_text, td_error *err);
/* eos_token_id as a comma-separated list ("128001,128008,128009"), kept in order. */
int td_config_set_eos(td_config *cfg, const char *list, td_error *err);
/* Writes DIR/model.safetensors, config.json and generation_config.json of a seeded random
 * model (normals from td_rng, polar method): matrices and embeddings N(0, 0.02^2), norm weights 1 + 0.1 N(0,1) (not exactly 1, so
 * a forward that forgets a norm weight is caught), biases N(0, 0.02^2); in a mixture of experts
 * every tensor of td_config_params (routers, each expert's gate/up/down, Qwen2-MoE's shared
 * expert and its gate) the same, but the routers N(0, (2/sqrt(C))^2) (td_init_opts.router_std). Tensors are generated
 * in fixed 2^20-element chunks, chunk k of tensor i from td_rng_stream(seed, i << 32 | k), so
 * the values do not depend on the thread count; written as generated (memory ~ a few chunks).
 * `command` goes into the safetensors metadata as "tidal_command"; progress (may be NULL)
 * gets a line per layer. */
int td_checkpoint_init_random(const char *dir, const td_config *cfg, td_dtype dt, uint64_t seed,
                              const char *command, FILE *progress, td_error *err);
/* The same with the initialisation's standard deviations: std for GEMM matrices and biases
 * (0.02 by default, as HF's initializer_range), embed_std for the embedding (tied: also the
 * lm_head). A larger embed_std gives peaked next-token distributions, like a trained model's,
 * instead of the near-uniform ones of std 0.02. Norm weights are 1 + N(0, 0.1). */
/*
 * Planted outlier channels (outlier_channels > 0): real LLMs carry a few hidden channels whose
 * activations are orders of magnitude above the rest, in every token (LLM.int8()'s outlier
 * features; Bondarenko et al., Wei et al. "Outlier Suppression": the RMSNorm/LayerNorm weight γ
 * is itself large on those channels and scales them up in the GEMM inputs; Sun et al.'s "massive
 * activations" in the residual stream). A random-init model has none, so FP8 scaling granularity
 * makes no difference on it. `outlier_channels` hidden channels, drawn from the seed (stream
 * TD_INIT_OUTLIER_STREAM), are multiplied by `outlier_scale`:
 *   TD_OUTLIER_NORM   in every input_layernorm and post_attention_layernorm weight (γ): the
 *                     inputs of every q/k/v and gate/up projection (and of an MoE layer's router,
 *                     experts' gate/up, shared expert and its gate) carry the outliers, as the
 *                     channel outliers of real models do (what per-tensor FP8 scaling suffers);
 *                     the input columns of those projections are divided by the same factor
 *                     (SmoothQuant's migration run backwards), so the model computes the same
 *                     function in exact arithmetic and only the roundings see the outliers;
 *   TD_OUTLIER_EMBED  in the embedding's columns (a tied lm_head is that tensor): the residual stream
 *                     carries them from the first layer on (massive activations; what FP16's
 *                     65504 limit meets); the norms scale them back down in the GEMM inputs.
 * The checkpoint records them in its safetensors metadata (tidal_synthetic, tidal_outlier_*):
 * these are planted, not learned. */
typedef enum { TD_OUTLIER_NORM = 0, TD_OUTLIER_EMBED = 1 } td_outlier_site;
#define TD_INIT_OUTLIER_STREAM 0x6f75746c6965ull   /* "outlie": the channel draw */
typedef struct {
    double std, embed_std;
    int outlier_channels;       /* 0: none                                   */
    double outlier_scale;       /* factor on those channels                 */
    td_outlier_site outlier_site;
    double router_std;          /* MoE routers; 0: 2 / sqrt(C), router logits of std ~2 on a
                                   normed input (init.c says why)            */
} td_init_opts;
/* The planted channels of a config and seed: n distinct channels in [0, C), ascending. */
void td_init_outlier_channels(uint64_t seed, int C, int n, int *out);
int td_checkpoint_init_random_opts(const char *dir, const td_config *cfg, td_dtype dt, uint64_t seed,
                                   const td_init_opts *opts, const char *command, FILE *progress,
                                   td_error *err);

/* ---- writing model.safetensors (streaming) ----
 * Declare every tensor first (name, dtype, shape); td_st_writer_begin lays the data out and
 * writes the header ("__metadata__": {"format": "pt", ...}). The layout is the one the Rust
 * safetensors library writes: header padded with spaces to a multiple of 8 bytes, tensors
 * contiguous (no gaps, which its loader rejects), ordered by element size, widest first, then
 * by declaration, so every tensor starts aligned to its element size (F32 data can be mapped
 * as float*). Then feed each tensor's data by name, in any tensor order, each tensor's pieces
 * in order, as fp32 (converted to the dtype: round to nearest even, e4m3 saturating to ±448)
 * or raw bytes in the dtype's little-endian encoding. td_st_writer_finish checks every tensor
 * was fully written, then renames PATH.tmp to PATH: nothing half-written is left under the
 * final name. td_st_writer_free on an unfinished writer removes the temporary file. */
typedef struct td_st_writer td_st_writer;
td_st_writer *td_st_writer_new(const char *path);
int td_st_writer_meta(td_st_writer *w, const char *key, const char *value, td_error *err);
int td_st_writer_declare(td_st_writer *w, const char *name, td_dtype dt, int ndim,
                         const int64_t *shape, td_error *err);
int td_st_writer_begin(td_st_writer *w, td_error *err);
int td_st_writer_write_f32(td_st_writer *w, const char *name, const float *x, size_t n,
                           td_error *err);
int td_st_writer_write_raw(td_st_writer *w, const char *name, const void *bytes, size_t nbytes,
                           td_error *err);
int td_st_writer_finish(td_st_writer *w, td_error *err);
void td_st_writer_free(td_st_writer *w);

TD_END_DECLS

#endif
