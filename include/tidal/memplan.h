/* tidal — the device memory plan of a run (src/backend/memplan.c): what a diff or a scoring
 * run will hold on the GPU, computed before anything is allocated, from the configuration, the
 * checkpoint's storage dtype, both recipes and the shapes the paths are created with:
 *
 *   weights     the GEMM matrices as the CUDA backend keeps them (tdc_const: the prepared
 *               td_wmat's storage, once per host copy; matmul.cu's fp32 widened copies where a
 *               recipe multiplies in fp32), both recipes, copies they share counted once; norms,
 *               biases, inv_freq; an unmerged LoRA's rounded A and B
 *   kv_cache    the inference path's cache, as td_session_create allocates it (fp32 today);
 *               kv_cache_recipe: what the recipe's kv format would take
 *   acts        td_acts of each path (acts_alloc, forward only; a mixture of experts' device
 *               buffers: one layer's router logits, routing, expert rows, vLLM's fused moe_v) and
 *               its logits rows
 *   workspace   the backend's grow-only scratch slots (their 1.25x growth included), cuBLASLt's
 *               32 MiB workspace, split-KV attention partials, the device sampler's processed
 *               rows and masks (slots x V), and the largest per-op staging (host rows copied in:
 *               the embedding gather, decode logits)
 *
 * The plan is an upper bound of the peak the backend allocates (tests/py/test_memplan.py checks
 * it against the simulator's measured peak). Dimension letters as in config.h. */
#ifndef TIDAL_MEMPLAN_H
#define TIDAL_MEMPLAN_H

#include <stddef.h>
#include <stdio.h>

#include "tidal/common.h"
#include "tidal/config.h"
#include "tidal/lora.h"
#include "tidal/recipe.h"

TD_BEGIN_DECLS

typedef struct {
    const td_config *cfg;
    td_format storage;         /* the checkpoint's GEMM matrices: TD_F32, TD_BF16 or TD_F16      */
    const td_recipe *a;        /* training path (td_forward), NULL: none                         */
    const td_recipe *b;        /* inference path (td_session), NULL: none                        */
    const td_lora *lora;       /* adapter of both paths (NULL: none), and how each path runs it  */
    int lora_mode_a, lora_mode_b;   /* TD_LORA_UNMERGED / MERGED / PUNICA (lora.h)                */
    int fwd_tokens, fwd_seq_len, fwd_logits_rows;   /* td_forward_create's arguments             */
    int slots, max_len, chunk;                      /* td_session_create's arguments            */
    int nthreads;              /* the backend's ops context (omp_get_max_threads())              */
    int keep_rows;             /* B's log-softmax rows kept on the device per slot for the per-
                                  token metrics (tidal-diff: td_rows_dev), 0 = none              */
} td_memplan_in;

typedef struct {
    size_t weights;            /* A and B together, shared copies once                           */
    size_t weights_a, weights_b;    /* each path's own share (copies only it holds)              */
    size_t kv_cache;           /* as allocated                                                   */
    size_t kv_cache_recipe;    /* in recipe B's kv format (what an engine holds)                 */
    size_t acts_a, acts_b;     /* activations + logits rows of each path                         */
    size_t workspace;
    size_t rows_b;             /* B's kept rows: slots x keep_rows x V floats                    */
    size_t total;
    size_t free, device_total; /* cudaMemGetInfo when the device is open, else 0                 */
} td_memplan;

/* Bytes of K and V of one token in one layer, as the inference path's cache holds them:
 * 2 * NKV * HD * bytes of an element. as_allocated != 0: what td_session_create allocates
 * today (fp32 elements whatever the recipe); 0: the recipe's kv format (bf16/fp16 2 bytes,
 * fp8 1 byte). ONE place for the KV cache's size: when the device cache moves to the recipe's
 * format (kv_write_cuda, the session's allocation), change the as_allocated branch here and the
 * plan follows. */
size_t td_memplan_kv_bytes(const td_config *c, const td_recipe *b, int as_allocated);

/* Computes the plan (free/device_total left 0: set them from td_device_mem_info). */
void td_memplan_compute(const td_memplan_in *in, td_memplan *p);

/* The bytes kept back from the free memory (fragmentation, the driver's own): free / 64. */
size_t td_memplan_reserve(size_t free_bytes);

/* Whether the plan fits the free memory less the reserve. */
int td_memplan_fits(const td_memplan *p);

/* Lowers in->fwd_tokens (not below fwd_seq_len: a sequence is scored whole) and in->slots (not
 * below 1), in that order, until the plan fits p->free; in->chunk follows fwd_tokens when it
 * was larger. Returns 0 when it fits (possibly lowered), -1 when even one sequence does not:
 * then *p is the plan of one slot and one sequence. p->free must be set. */
int td_memplan_fit(td_memplan_in *in, td_memplan *p);

/* The plan as one compact table on f, lines prefixed by `tool`. */
void td_memplan_print(FILE *f, const char *tool, const td_memplan *p, const td_memplan_in *in);

/* The plan as a JSON object (caller frees): recorded in run files (attribute memory_plan). */
char *td_memplan_json(const td_memplan *p, const td_memplan_in *in);

/* ---- the trainers (tidal-sft, tidal-rl --device cuda) ------------------------------------- *
 * What td_trainer_create (src/train/trainer.c) and the paths beside it hold on the device:
 *   weights      the trainer's model is fp32 (td_model_alloc); each path's prepared GEMM matrices
 *                as for tidal-diff (storage fp32), plus the backward's fp32 view of every matrix
 *                a recipe rounds (weights_recipe.c: a trainer's recipe keeps an fp32 copy,
 *                uploaded by matmul_backward_cuda's tdc_const)
 *   state        fp32 masters, gradients, AdamW m and v of the trained parameters (all of them, or
 *                the LoRA adapter's A and B only): 4 x nparams x 4 bytes
 *   acts         acts_alloc of the training forward (every layer's saved tensors; with gradient
 *                checkpointing each layer's input stream + one layer's set, recomputed)
 *   grad_acts    grad_acts_alloc (one layer's activation gradients, a mixture of experts' among
 *                them, the attention backward's scratch, the LoRA branch's)
 *   logits       the forward's logits rows and the trainer's dlogits rows (rows x V fp32 each)
 *   rollout      tidal-rl: the pi_old forward (and the reference's, beta > 0) of one micro-batch,
 *                the session's KV cache for num-generations x prompts slots at prompt +
 *                max-completion-length and its activations; tidal-sft: the evaluation's session
 *   workspace    tdc_scratch slots of the forward and backward GEMMs (1.25x growth), cuBLASLt's
 *                32 MiB, the attention backward's, the device sampler's, staging */
typedef struct {
    const td_config *cfg;
    const td_recipe *train;        /* the training recipe                                           */
    const td_recipe *infer;        /* the session's recipe (rollouts / evaluation), NULL: no session */
    int lora_rank;                 /* 0: full fine-tuning                                            */
    unsigned lora_modules;         /* td_lora_module bit mask (0: q_proj, v_proj)                    */
    int lora_merged;               /* the session merges the adapter into its own weights            */
    int engine_copy;               /* the session runs a separate fp32 copy of the model (merge-unmerge) */
    int lora_sync_device;          /* tidal-rl's LoRA sync on the device (rl/sync.c): merged keeps the
                                      frozen base in fp32 there (td_trainer_base_to_device), merge-
                                      unmerge the base, the engine's fp32 copy and W_0 of the adapted
                                      matrices                                                      */
    int gradient_checkpointing;
    int max_tokens, max_seq_len;   /* one micro-batch: rows, longest sequence                         */
    int scoring_forwards;          /* forward-only td_forward of max_tokens rows: pi_old's separate
                                      forward (rl.h step 4: when it runs), the reference's           */
    int rollouts;                  /* the session is tidal-rl's rollouts (else tidal-sft's evaluation) */
    int reference_model;           /* the reference forward reads the loaded checkpoint (not the
                                      trainer's model): its matrices uploaded too (<= 4 bytes each)  */
    int slots, max_len;            /* the session: sequences decoded together, prompt + new tokens   */
    int sampler;                   /* the session samples on the device (sampling.cu's scratch)      */
    const td_recipe *eval;         /* tidal-rl --eval-steps: a second session on the trainer's model
                                      beside the rollouts' (NULL: none), eval_slots x eval_len        */
    int eval_slots, eval_len;
    int nthreads;
} td_memplan_train_in;

typedef struct {
    size_t nparams;                /* trained parameters                                             */
    size_t weights, state, acts, grad_acts, logits, rollout_kv, rollout_acts, workspace;
    size_t total;
    size_t free, device_total;     /* cudaMemGetInfo when the device is open, else 0                 */
} td_memplan_train;

void td_memplan_train_compute(const td_memplan_train_in *in, td_memplan_train *p);
int td_memplan_train_fits(const td_memplan_train *p);
void td_memplan_train_print(FILE *f, const char *tool, const td_memplan_train *p, const td_memplan_train_in *in);
/* The refusal: needed, free, the biggest items and what to change (flags named for `tool`). */
int td_memplan_train_refuse(const char *tool, const char *device, const td_memplan_train *p,
                            const td_memplan_train_in *in, td_error *err);
char *td_memplan_train_json(const td_memplan_train *p, const td_memplan_train_in *in);

/* Free and total bytes of the device named ("cuda", "cuda:N"; opens it as td_model_set_device
 * does). 0, or -1 + err (no CUDA build, no GPU). src/backend/device.c. */
int td_device_mem_info(const char *device, size_t *free_bytes, size_t *total_bytes, td_error *err);

/* The most device memory tidal's CUDA backend has held at once in this process (every cudaMalloc
 * and cudaMallocAsync it made, less what it freed): what the plan bounds. 0 without CUDA. */
size_t td_device_mem_peak(void);

/* Bytes tidal's CUDA backend has copied from the device to the host in this process (downloads,
 * the ops' host outputs, reductions): what tidal-diff reports per decode step. 0 without CUDA. */
size_t td_device_d2h_bytes(void);

TD_END_DECLS

#endif
