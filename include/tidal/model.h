/* tidal — the Llama-family decoder (Llama 2/3, Mistral, Qwen2 with qkv bias, Qwen3 with q/k
 * norm) in fp32 on the CPU, and the two structures that run it:
 *
 *   teacher-forced  td_forward_*  whole sequences packed into micro-batches, no KV cache; gives
 *                   log p(token[t+1] | token[0..t]) for every position (the training path).
 *   incremental     td_session_*  per-slot KV cache; prefill a prompt (chunked), then decode one
 *                   token per slot per step, batched over slots (the inference path).
 *
 * Both run the same decoder body (src/model/decoder.c) over one op list (src/model/ops.h),
 * carried out by a backend (src/backend/: the CPU today) under a precision recipe (recipe.h).
 * Dimension letters as in config.h.
 * All scratch memory and the KV cache are allocated at creation: nothing is allocated per token.
 */
#ifndef TIDAL_MODEL_H
#define TIDAL_MODEL_H

#include <stdio.h>

#include "tidal/common.h"
#include "tidal/config.h"
#include "tidal/metrics.h"
#include "tidal/recipe.h"

TD_BEGIN_DECLS

/* One decoder layer's parameters in fp32. Pointers either map the checkpoint (F32 tensors) or
 * point into the model's one owned allocation. Matrices are row-major (out, in), as HF stores
 * them. A model loaded from a bf16/fp16 checkpoint keeps its matrices, embedding and lm_head in
 * that dtype (mapped, see td_model_load): their pointers here are NULL; td_model_param_f32
 * widens any tensor. */
typedef struct {
    const float *attn_norm;  // (C)            input_layernorm.weight
    const float *wq;         // (NH*HD, C)     self_attn.q_proj.weight
    const float *wk;         // (NKV*HD, C)
    const float *wv;         // (NKV*HD, C)
    const float *bq;         // (NH*HD)        Qwen2 only, else NULL
    const float *bk;         // (NKV*HD)
    const float *bv;         // (NKV*HD)
    const float *q_norm;     // (HD)           Qwen3 only, else NULL
    const float *k_norm;     // (HD)
    const float *wo;         // (C, NH*HD)     self_attn.o_proj.weight
    const float *mlp_norm;   // (C)            post_attention_layernorm.weight
    const float *w_gate;     // (F, C)
    const float *w_up;       // (F, C)
    const float *w_down;     // (C, F)         (NULL in an MoE layer: td_config_layer_moe)
    /* mixture-of-experts layers (config.h); NULL in dense layers */
    const float *w_router;   // (E, C)         mlp.gate.weight (Mixtral: block_sparse_moe.gate)
    const float **w_experts; // (E * 3)        expert e's gate (FE, C), up (FE, C), down (C, FE) at
                             //                3e, 3e+1, 3e+2 (an array td_model_weights owns)
    const float *ws_gate;    // (FS, C)        Qwen2-MoE: mlp.shared_expert.gate_proj.weight
    const float *ws_up;      // (FS, C)
    const float *ws_down;    // (C, FS)
    const float *ws_route;   // (1, C)         mlp.shared_expert_gate.weight
} td_layer_weights;

typedef struct {
    const float *embed;      // (V, C)         model.embed_tokens.weight
    td_layer_weights *layers;// (L)
    const float **experts;   // (L * E * 3)    the layers' w_experts arrays, one allocation (NULL:
                             //                a dense model); td_model_weights_layers makes both
    const float *final_norm; // (C)            model.norm.weight
    const float *lm_head;    // (V, C)         == embed when tie_word_embeddings
} td_model_weights;

struct td_checkpoint;

typedef struct {
    td_config cfg;
    td_model_weights w;
    float *inv_freq;         // (HD/2)  RoPE inverse frequencies, llama3 scaling applied
    float *owned;            // the one allocation holding every non-mapped parameter
    size_t owned_floats;
    struct td_checkpoint *ck;// kept open while mapped tensors are in use (NULL if none)
    struct td_wstore *store; // tensors in their storage dtype (loaded models; NULL: all in w)
    FILE *progress;          // long work on this model reports here (NULL: silent)
    const struct td_backend *backend;  // what runs its forward (td_model_set_device; NULL: CPU)
    const float *owned_dev;  // a trainer's masters in the backend's memory, the current values of
                             // owned (which may be stale): recipes are prepared from them on the
                             // device (src/train/trainer.c); NULL: owned is current
    int owned_host_current;  // with owned_dev: owned is current too (a LoRA trainer's frozen base,
                             // kept on the device for merged adapters): host forms read it there
} td_model;

/* w->layers (L, zeroed) and, for a mixture of experts, w->experts with each MoE layer's w_experts
 * pointing into it; from src (may be NULL) the pointers are copied. Freed by
 * td_model_weights_free_layers. */
void td_model_weights_layers(td_model_weights *w, const td_config *c, const td_model_weights *src);
void td_model_weights_free_layers(td_model_weights *w);

/* Checks a configuration for what the forward needs (positive sizes, NH % NKV == 0,
 * even HD, ...). 0 or -1 + err naming `what`. */
int td_model_check_config(const td_config *cfg, const char *what, td_error *err);

/* A model whose every parameter lives in one zeroed owned allocation (norm weights too), for
 * callers that fill weights themselves (tests, synthetic models). NULL + err on bad config. */
td_model *td_model_alloc(const td_config *cfg, td_error *err);

/* Loads a HF checkpoint directory (config.json + safetensors). Nothing is widened: F32 tensors
 * are mapped without copying (the pointers of w); BF16 and F16 matrices, embedding and lm_head
 * are mapped in their dtype (an 8B bf16 checkpoint takes its 16 GB of page cache, no more),
 * copied only when misaligned in the file; norms, biases and F8 tensors are converted to fp32
 * into the owned allocation. Each 16-bit tensor is scanned once for NaN. Shapes are checked
 * against config. td_model_load_progress also reports the scan on `progress` (with an ETA) and
 * keeps `progress` as m->progress for the paths' long work (prefill, decode steps, teacher-
 * forced micro-batches, recipe weight preparation). */
td_model *td_model_load(const char *dir, td_error *err);
td_model *td_model_load_progress(const char *dir, FILE *progress, td_error *err);

/* Entry i of the model's parameter table (td_config_params) widened to fp32 into dst (its
 * numel floats), exactly: the fp32 path for trainers of a bf16 checkpoint (they copy). */
void td_model_param_f32(const td_model *m, size_t i, float *dst);

void td_model_free(td_model *m);

/* The storage dtype of the model's GEMM matrices as loaded: TD_BF16 / TD_F16 for a 16-bit
 * checkpoint (mapped as it is), else TD_F32 (the device memory plan, memplan.h). */
td_format td_model_weight_storage(const td_model *m);

/* Where the model's forward runs (both paths, every tool): "cpu" (the default) or "cuda" /
 * "cuda:N" (src/backend/cuda: weights uploaded in their storage dtype on first use, GEMMs on
 * cuBLASLt, the recipes' rounding points in tidal's kernels). 0, or -1 + err: an unknown name,
 * a tidal built without nvcc, no driver or GPU, a bad index (the message says which).
 * A trainer made from a model with a device runs its forward and backward there (train.h). */
int td_model_set_device(td_model *m, const char *device, td_error *err);
/* The device the forward runs on, as set: "cpu" or "cuda:0 (NVIDIA H100 ..., sm_90, 79 GiB)". */
const char *td_model_device(const td_model *m);
/* Whether `device` names a device this build knows ("cpu", "cuda", "cuda:N"): the CLI's usage
 * check (exit 2) before any model is loaded. */
int td_device_name_ok(const char *device);
/* The --device option of every tool that runs the forward (tidal/opts.h TD_OPT_FN form): stores
 * the name in *(const char **)dest after td_device_name_ok; a bad name is a usage error. */
int td_opt_device(void *dest, const char *value, char *why, size_t whylen);
#define TD_OPT_DEVICE(dest) \
    TD_OPT_FUN("device", 0, dest, "DEV", td_opt_device, "cpu, cuda or cuda:N", \
               "where the forward runs: cpu (default), cuda or cuda:N (an NVIDIA\n" \
               "GPU: GEMMs on cuBLASLt, the recipe's roundings in tidal's kernels)")

/* Called with the full log-softmax row (V) of the next-token distribution after position
 * `pos` of sequence/slot `seq`; the row is only valid during the call. */
typedef void (*td_row_fn)(void *user, int seq, int pos, const float *logp_row);

/* Called after each decoder layer l with the residual stream of the N rows just computed:
 * x (N, C); row i belongs to sequence (teacher-forced: index in the call) or slot (session)
 * seq[i], at position pos[i]. Valid during the call only. */
typedef void (*td_layer_fn)(void *user, int layer, int N, const int *seq, const int *pos,
                            const float *x);

/* What one mixture-of-experts layer routed for the N rows just computed (src/model/moe.c): the K
 * experts of each row in top-k order (largest probability first; equal probabilities: the lower
 * expert first) and the router's softmax over all E experts in fp32. Row i belongs to sequence
 * (teacher-forced: index in the call) or slot (session) seq[i], at position pos[i]. replayed: the
 * experts were supplied by a td_moe_replay_fn (routing replay), the probabilities are still this
 * path's own. Valid during the call only. */
typedef struct {
    int layer, moe_layer;    /* decoder layer; its index among the MoE layers */
    int N, K, E;
    const int *seq, *pos;    /* (N) */
    const int *experts;      /* (N, K) */
    const float *probs;      /* (N, E) */
    int replayed;
} td_moe_route;
typedef void (*td_moe_fn)(void *user, const td_moe_route *r);
/* The K largest of p (E probabilities) into sel, largest first, equal values the lower expert first:
 * the paths' routing rule (src/model/moe.c), for observers that compare a path's own choice. */
void td_moe_top_k(const float *p, int E, int K, int *sel);
/* Routing replay (R3, R2): fill experts (N, K) for the rows of MoE layer moe_layer and return 1, or
 * return 0 to let the path route them itself. The path then weights the given experts by its own
 * router probabilities, renormalised over them as the model does (norm_topk_prob), so that the
 * router keeps its gradient through the gating weights (the R3 paper's definition). */
typedef int (*td_moe_replay_fn)(void *user, int moe_layer, int N, const int *seq, const int *pos, int K,
                                int *experts);

/* ---- teacher-forced structure (training path) ---------------------------------------------- */

typedef struct td_forward td_forward;

/* Scratch for micro-batches of at most max_tokens tokens (sum of sequence lengths), each
 * sequence at most max_seq_len long. logits_rows bounds how many rows of (rows, V) logits exist
 * at once (0 picks a default of 256): the lm_head + log-softmax runs in chunks of that many. */
td_forward *td_forward_create(const td_model *m, int max_tokens, int max_seq_len,
                              int logits_rows, td_error *err);
void td_forward_free(td_forward *f);
/* Runs this structure under a precision recipe (recipe.h); the default is "fp32". The recipe
 * is copied. 0, or -1 + err if the model cannot run it. */
int td_forward_set_recipe(td_forward *f, const td_recipe *r, td_error *err);
/* Observe every layer's residual stream (NULL to stop). */
void td_forward_set_layer_fn(td_forward *f, td_layer_fn fn, void *user);
/* Observe every MoE layer's routing, and replay another path's (NULL to stop). */
void td_forward_set_moe_fn(td_forward *f, td_moe_fn fn, void *user);
void td_forward_set_moe_replay(td_forward *f, td_moe_replay_fn fn, void *user);

/* The training path's rows become log-softmax(logits / T), T divided in the dtype the recipe's
 * logits_temperature says (recipe.h), as a trainer scores sampled tokens at the sampling
 * temperature (TRL, verl). T <= 0 or 1: the raw log-softmax (the default). */
void td_forward_set_temperature(td_forward *f, float T);

/* Runs nseq sequences (tokens[s], lens[s] >= 1), splitting them into micro-batches of whole
 * sequences that fit max_tokens. For every s and t < lens[s]-1 writes
 *   logp[s][t] = log p(tokens[s][t+1] | tokens[s][0..t]);
 * logp may be NULL. If row_fn is set it also receives every position's full log-softmax row,
 * t = 0 .. lens[s]-1 (the last one predicts past the end). 0, or -1 + err. */
int td_forward_logprobs(td_forward *f, int nseq, const int *const *tokens, const int *lens,
                        float *const *logp, td_row_fn row_fn, void *user, td_error *err);
/* on: td_forward_logprobs may call row_fn for several rows at once, from OpenMP threads, in no
 * fixed order (each row once); for a row_fn whose work and writes are the row's own (tidal-diff's
 * per-token metrics: a vocabulary-long pass per row, on one core otherwise). Off by default. */
void td_forward_set_rows_parallel(td_forward *f, int on);

/* ---- per-token metrics on the model's device ----------------------------------------------- */

/* Log-softmax rows kept in the model's backend memory (tidal-diff --device cuda: the inference
 * path's rows of a batch, by position), so that the per-token metrics (metrics.h) are computed
 * where both paths' rows are and only one td_token_metrics per token comes to the host: the
 * rollout fills them (td_rollout_batch.keep, rollout.h), td_forward_metrics scores A's rows
 * against them. NULL (err untouched) when the model's backend has no such ops (the CPU: its rows
 * are host memory already); nrows * V floats of device memory (tidal-diff's memory plan counts
 * them; a failed allocation exits as every device allocation does). */
typedef struct td_rows_dev td_rows_dev;
td_rows_dev *td_rows_dev_create(const td_model *m, size_t nrows);
void td_rows_dev_free(td_rows_dev *r);
/* Their memory, nrows x V floats in the backend's memory: where td_session_prefill's last row and
 * td_session_decode's rows can go without coming to the host (tidal-bench-model --device cuda's
 * decode cases, as tidal-diff's rollouts keep theirs). */
float *td_rows_dev_data(td_rows_dev *r);

/* Which kept row holds the log-softmax row that predicted position pos of sequence s:
 * base[s] + pos - from[s], for from[s] <= pos (positions before from[s] are not kept). */
typedef struct {
    const td_rows_dev *rows;
    const int *from;         /* (nseq) first kept position of each sequence (>= 1) */
    const size_t *base;      /* (nseq) its row                                      */
} td_rows_dev_map;

/* td_forward_logprobs, scoring instead of handing rows out: for every s and position pos with
 * from[s] <= pos < lens[s], m[s][pos] = td_token_metrics_compute(A's row at pos - 1, B's kept row
 * of pos, V, tokens[s][pos]), computed on the device (A's rows never leave it). The layer
 * observer runs as in td_forward_logprobs. 0, or -1 + err. */
int td_forward_metrics(td_forward *f, int nseq, const int *const *tokens, const int *lens,
                       const td_rows_dev_map *b_rows, td_token_metrics *const *m, td_error *err);

/* The same for replayed rollouts, B known only by the log-prob of each token: for every s and
 * from[s] <= pos < lens[s] (from[s] >= 1), m[s][pos] = td_token_metrics_replay(A's row at pos - 1,
 * V, tokens[s][pos], logp_b[s][pos - from[s]]) computed on the device: logp_a, top1_a, rank_a
 * and k3 exactly, entropy_a summed in another order (metrics.h). 0, or -1 + err (a backend that
 * computes no metrics: the CPU, see td_forward_device_metrics). */
int td_forward_metrics_replay(td_forward *f, int nseq, const int *const *tokens, const int *lens, const int *from,
                              const float *const *logp_b, td_token_metrics *const *m, td_error *err);
/* Whether this path's backend computes the per-token metrics itself (CUDA): td_forward_metrics
 * and td_forward_metrics_replay run there. */
int td_forward_device_metrics(const td_forward *f);

/* ---- incremental structure (inference path) ------------------------------------------------ */

typedef struct td_session td_session;

/* nslots KV-cache slots of max_len positions each; prefill runs in chunks of at most
 * prefill_chunk tokens (0 picks 128), decode handles up to nslots slots per step. */
td_session *td_session_create(const td_model *m, int nslots, int max_len, int prefill_chunk,
                              td_error *err);
void td_session_free(td_session *s);

/* Rows given by prefill and decode are the raw logits (raw != 0) instead of log-softmax rows:
 * for samplers that process logits (repetition penalty, temperature) as engines do. */
void td_session_set_raw_logits(td_session *s, int raw);
/* As td_forward_set_recipe, for the inference path. */
int td_session_set_recipe(td_session *s, const td_recipe *r, td_error *err);
void td_session_set_layer_fn(td_session *s, td_layer_fn fn, void *user);
void td_session_set_moe_fn(td_session *s, td_moe_fn fn, void *user);
void td_session_set_moe_replay(td_session *s, td_moe_replay_fn fn, void *user);

void td_session_reset(td_session *s, int slot);     /* forget the slot's tokens */
int  td_session_len(const td_session *s, int slot); /* tokens held in the slot */

/* Appends n >= 1 tokens to a slot. last_row (V), if not NULL, receives the log-softmax after
 * the last token; row_fn, if set, receives every appended position's row. */
int td_session_prefill(td_session *s, int slot, const int *tokens, int n, float *last_row,
                       td_row_fn row_fn, void *user, td_error *err);

/* Appends one token to each of n distinct slots in one batched step and writes each slot's
 * next-token log-softmax row: rows (n, V). */
int td_session_decode(td_session *s, int n, const int *slots, const int *tokens, float *rows,
                      td_error *err);

TD_END_DECLS

#endif
