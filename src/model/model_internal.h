/* tidal — pieces shared by the two forward structures (internal header). */
#ifndef TIDAL_MODEL_INTERNAL_H
#define TIDAL_MODEL_INTERNAL_H

#include "tidal/checkpoint.h"
#include "tidal/lora.h"
#include "tidal/model.h"
#include "ops.h"

/* Whether a backend's buffers are host memory (the CPU backend: nothing to synchronise); on a device
 * backend the MoE router's logits and their gradients get host mirrors, and the routing decision
 * goes up into backend copies (td_acts, td_grad_acts). */
static inline int backend_host_memory(const td_backend *be) { return be->sync == NULL; }

/* A model with config, inv_freq and an empty layer table, nothing else. */
td_model *model_new(const td_config *cfg, const char *what, td_error *err);

/* Weights as the forward reads them (td_wmat, ops.h): the GEMM matrices of every layer in
 * lora.h's module order (q k v o gate up down), the embedding and the lm_head. Norms and
 * biases are read from a td_model_weights (fp32: they are small). */
typedef struct td_wset {
    td_wmat embed, lm_head;
    td_wmat *mat;              // (L * TD_LORA_NMOD)
    td_wmat *moe;              // (L * moe_per) a mixture of experts' matrices (NULL: dense), per
                               // layer at the slots below: router, the shared expert's gate, up,
                               // down and its sigmoid gate, then expert e's gate, up, down
    int moe_per;               // 5 + 3 E
} td_wset;

enum { TD_MOE_ROUTER = 0, TD_MOE_SH_GATE, TD_MOE_SH_UP, TD_MOE_SH_DOWN, TD_MOE_SH_ROUTE, TD_MOE_EXPERTS };

static inline td_wmat *wset_mat(const td_wset *ws, int layer, int module)
{
    return &ws->mat[(size_t)layer * TD_LORA_NMOD + module];
}

static inline td_wmat *wset_moe(const td_wset *ws, int layer, int slot)
{
    return &ws->moe[(size_t)layer * ws->moe_per + slot];
}
/* The wset_moe slot of a parameter-table entry, -1 for a tensor outside the MoE blocks. */
int param_moe_slot(const td_param_spec *p);
/* The LoRA slot (lora.h td_lora_slots) of a parameter-table entry, -1 for one no LoRA adapts. */
int param_lora_slot(const td_param_spec *p);

/* A loaded model's tensors in their storage dtype (load.c): entry i of the parameter table is
 * t[i] (mapped from the checkpoint, or owned); nan[i] says whether it holds a NaN (scanned at
 * load for 16-bit tensors: rounding a NaN canonicalises it, so such a tensor is never shared
 * as "already rounded"). */
struct td_wstore {
    size_t n;
    td_wmat *t;
    unsigned char *nan;
    void *owned;               /* 16-bit tensors that could not be mapped (misaligned) */
};

/* Entry i (spec p) of the model's parameter table in its storage: the store's, or the fp32
 * tensor of m->w (td_model_alloc, fp32 checkpoints). *has_nan: 1 if it may hold a NaN that a
 * rounding would change (unknown counts as 1 for non-fp32 storage). */
td_wmat model_param_wmat(const td_model *m, size_t i, const td_param_spec *p, int *has_nan);
/* Rows [r0, r0 + nr) of entry i as fp32 into dst (nr * cols floats). */
void model_param_rows_f32(const td_model *m, size_t i, const td_param_spec *p, size_t r0, size_t nr,
                          float *dst);

/* ---- the parameter table (params.c; the table itself is td_config_params) ---- */
/* The config's table (caller frees), n entries. */
td_param_spec *param_table(const td_config *c, size_t *n);
/* The pointer of w that entry p fills; NULL if p has no place in a model of num_layers. */
const float **param_slot(td_model_weights *w, int num_layers, const td_param_spec *p);
/* The LoRA module (TD_LORA_Q ...) a GEMM weight is, -1 for other tensors. */
int param_lora_module(td_param_role role);

/* Activations for up to cap token rows (attention over up to max_keys keys).
 *
 * Forward only (save 0): one layer's buffers, reused by every layer; the residual stream is
 * updated in place, SwiGLU writes over gate and q/k-norm over q/k, no rstd or log-sum-exp kept.
 * Kept for a backward (save 1): every per-layer buffer holds L slices of cap rows (layer l at
 * l * cap * width) and nothing is overwritten: a backward finds for layer l the residual
 * stream entering it, the normalised inputs and rstd of both RMSNorms, q/k before q/k-norm and
 * their rstd, q/k/v as attention read them, the attention output and its log-sum-exp, the
 * stream after attention, gate, up and silu(gate) * up; plus the final norm's rstd. The
 * buffers a mode does not need are not allocated: the forward-only paths pay nothing.
 * Gradient checkpointing (save 2, TD_ACTS_CHECKPOINT): the residual stream entering every layer
 * (L+1 slices) and the final norm's rstd are kept, the other per-layer buffers have one slice
 * that decoder_backward refills layer by layer (decoder_recompute_layer).
 * acts_layer gives the views of one layer in either mode. */
typedef struct {
    int cap, max_keys, L, save;
    const td_backend *be;        /* the buffers are the backend's                                  */
    float *x;        // (save ? L+1 : 1, cap, C)  residual stream; slice l enters layer l
    float *x_mid;    // (L, cap, C)    stream after attention           [save, else the stream]
    float *xn;       // (cap, C)       final norm output (and both sub-block norms when not saving)
    float *xn1;      // (L, cap, C)    attention RMSNorm output         [save]
    float *xn2;      // (L, cap, C)    MLP RMSNorm output               [save]
    float *rstd1;    // (L, cap)       their rstd                       [save]
    float *rstd2;    // (L, cap)                                        [save]
    float *rstd_f;   // (cap)          final norm rstd                  [save]
    float *q_raw;    // (L, cap, NH*HD)  q projection before q-norm     [save, Qwen3]
    float *k_raw;    // (L, cap, NKV*HD)                                [save, Qwen3]
    float *q_rstd;   // (L, cap * NH)  q-norm rstd per head             [save, Qwen3]
    float *k_rstd;   // (L, cap * NKV)                                  [save, Qwen3]
    float *q;        // (save ? L : 1, cap, NH*HD)  after q-norm and RoPE
    float *k;        // (save ? L : 1, cap, NKV*HD) after k-norm and RoPE
    float *v;        // (save ? L : 1, cap, NKV*HD)
    float *att;      // (save ? L : 1, cap, NH*HD)  attention output before o_proj
    float *lse;      // (L, cap, NH)   attention log-sum-exp            [save]
    float *gate;     // (save ? L : 1, cap, F)      gate_proj output
    float *up;       // (save ? L : 1, cap, F)
    float *act;      // (L, cap, F)    silu(gate) * up                  [save, else over gate]
    float *proj;     // (cap, C)       o_proj / down_proj output (scratch)
    float *scores;   // (nthreads, ATT_BLOCK, max_keys)
    size_t *kv_off;  // (cap)
    float *x_host;   /* a device backend's stream rows for the layer observer (lazy) */
    /* mixture-of-experts scratch (moe.c), one layer's. The routing decision is the host's: the
     * routing buffers are host memory on every backend; the rows are the backend's, and the
     * decision goes up into backend copies (_b; on the CPU backend the host buffers themselves) */
    float *moe_logits;  // (cap, E)    router logits (and the shared expert's gate)     [backend]
    float *moe_logits_h;// (cap, E)    their host mirror (moe_logits itself on the CPU)
    float *moe_probs;   // (cap, E)    router softmax                                   [host]
    int *moe_experts;   // (cap, K)    chosen experts, top-k order                      [host]
    float *moe_weights; // (cap, K)    their routing weights                            [host]
    int *moe_rows;      // (cap * K)   the pairs i * K + j, expert after expert, in row order [host]
    int *moe_start;     // (2 E + 1)   expert e's pairs: moe_rows[moe_start[e] .. moe_start[e + 1]),
                        //             then E ints of the counting sort's cursors    [host]
    int *moe_rows_b;    // (cap * K)   moe_rows on the backend
    float *moe_weights_b;//(cap, K)    the layer's routing weights on the backend (device backends)
    float *moe_in;      // (cap, C)    an expert's input rows (an expert is chosen once per row) [backend]
    float *moe_gate;    // (cap, max(FE, FS))                                           [backend]
    float *moe_up;      // (cap, max(FE, FS))                                           [backend]
    float *moe_y;       // (cap, C)    an expert's output rows                          [backend]
    float *moe_v;       // (cap * K, C) the fused combine's weighted rows (allocated by the first
                        //             fused layer, moe.c)                              [backend]
    float *moe_probs_s; // (L, cap, E) router softmax of every MoE layer             [save, host]
    int *moe_experts_s; // (L, cap, K) chosen experts                                [save, host]
    float *moe_weights_s;//(L, cap, K) routing weights (before the stream's rounding) [save, host]
    void *host_owned[16]; /* host buffers of a device backend's acts_alloc */
    int nhost;
    void *owned[48]; /* what acts_alloc allocated (and moe.c's moe_v) */
    int nowned;
} td_acts;

/* One layer's views of td_acts (aliases of the shared buffers when not saving). */
typedef struct {
    float *x_in, *x_mid, *x_out, *xn1, *rstd1, *q_raw, *k_raw, *q_rstd, *k_rstd, *q, *k, *v, *att,
          *lse, *xn2, *rstd2, *gate, *up, *act;
} td_layer_acts;

/* save: TD_ACTS_NONE (forward only: one layer's scratch), TD_ACTS_ALL (every layer's activations
 * for a backward), TD_ACTS_CHECKPOINT (gradient checkpointing, HF's activation recomputation: the
 * stream entering every layer, the final norm's, and one layer's set, which decoder_backward
 * refills per layer with decoder_recompute_layer). */
enum { TD_ACTS_NONE = 0, TD_ACTS_ALL = 1, TD_ACTS_CHECKPOINT = 2 };
void acts_alloc(td_acts *a, const td_config *c, const td_ops *ops, int cap, int max_keys, int save);
void acts_free(td_acts *a);
td_layer_acts acts_layer(const td_acts *a, const td_config *c, int l);

/* A mixture-of-experts layer's MLP on N rows of x (its post-attention norm output) into out (N, C)
 * (moe.c); and its routing alone: logits (N, E) -> probs, experts (N, K), weights (N, K). */
void moe_forward(const td_ops *ops, const td_model *m, td_acts *a, int l, const float *x, const int *pos, int N,
                 float *out);
void moe_route(const td_ops *ops, const td_config *c, int l, int N, const int *pos, const float *logits,
               float *probs, int *experts, float *weights);
/* Under TD_ACTS_CHECKPOINT's recomputation (tail 0): the router and the routing alone, into the
 * saved slices (the experts run again in moe_backward). */
/* vLLM's moe_sum: out (N, C) row i = the K values v[(i * K + j) * C ..] summed in slot order j in a
 * D accumulator, each add rounded to D (src/backend/cpu_moe.c, the CPU's moe_sum; tests call it) */
void moe_sum_topk(td_format D, int N, int K, int C, const float *v, float *out);
void moe_route_only(const td_ops *ops, const td_model *m, td_acts *a, int l, const float *x, const int *pos, int N);

/* Where the keys and values of the rows live: layer l of K is kv_k + l*layer_stride (same for
 * V); row i's sequence starts at offset kv_off[i] in it and the row itself is written at
 * kv_off[i] + pos[i]*NKV*HD. With layer_stride 0 and kv_k == acts->k the rows' own projections
 * serve as the store (teacher forcing); a KV cache uses one region per layer and slot. */
typedef struct {
    float *k, *v;
    size_t layer_stride;   /* elements */
    size_t esize;          /* bytes an element: 4 (floats), or 2 / 1 for a cache of codes
                              (ops.h td_kv_esize of ctx->kv_fmt) */
} td_kv_store;

/* Embedding, all L decoder layers and the final norm for N token rows (tokens, pos, and
 * a->kv_off filled by the caller). Leaves the final-normed hidden states in a->xn (N, C). */
void decoder_forward(const td_ops *ops, const td_model *m, td_acts *a, const int *tokens,
                     const int *pos, int N, const td_kv_store *kv);
/* Under TD_ACTS_CHECKPOINT: layer l's activations again, from the stream that entered it, into the
 * one layer set (teacher-forced rows: a->kv_off as the forward left it), the same ops in the same
 * order as decoder_forward, so a recipe's values come out bit for bit (a fused-add norm, which
 * reads the unrounded sum, is the exception: trainers refuse it with checkpointing). */
void decoder_recompute_layer(const td_ops *ops, const td_model *m, td_acts *a, int l, const int *pos, int N);

/* Teacher-forced structure (src/paths/forward.c): keep every layer's activations of the last
 * micro-batch for a backward (keep TD_ACTS_ALL), the streams for recomputing them (TD_ACTS_CHECKPOINT)
 * or only one layer's scratch (keep 0, the default), and
 * read them. */
void forward_keep_activations(td_forward *f, int keep);
/* The unmerged adapter's rounded A and B made again from the adapter set with the recipe (a
 * trainer's, updated by an optimiser step); the base's prepared weights are left as they are. */
void forward_refresh_lora(td_forward *f);
/* The same for a session's unmerged or vLLM-form adapter (lora: the one set with the recipe). */
void session_refresh_lora(td_session *s, const td_lora *lora);
const td_acts *forward_acts(const td_forward *f);
/* Runs the ops through another backend table: an observer wrapping the CPU's op entries
 * (src/analysis/headroom.c), whose memory calls are the CPU's. */
void forward_set_backend(td_forward *f, const td_backend *be);
/* The rows of the micro-batch a trainer runs: how many, the ops context they ran under, and
 * each row's token, position and sequence index (valid until the next call). */
typedef struct {
    int N;
    const td_ops *ops;
    const int *tok, *pos, *row_seq;
} td_forward_rows;
/* Packs sequences 0..nseq-1 (validated by the caller, total length <= max_tokens, each at most
 * max_seq_len) into one micro-batch and runs the decoder (no lm_head): a->xn then holds the
 * final-normed hidden states, and with forward_keep_activations every layer's activations.
 * Returns the number of rows. */
int forward_decoder(td_forward *f, int nseq, const int *const *tokens, const int *lens,
                    td_forward_rows *rows);

/* logits (N, V) = lm_head(h (N, C)), then log-softmax in place unless raw. */
void head_forward(const td_ops *ops, const td_model *m, float *logits, const float *h, int N,
                  int raw);

/* An unmerged LoRA as a path runs it (lora_run.c): A and B rounded to the activations dtype D,
 * GEMMs with D operands and fp32 accumulation, scratch for cap rows. punica: vLLM's form (lora.h,
 * TD_LORA_PUNICA): B holds D(D(B) * scale) and scale is 1. */
typedef struct lora_rt {
    int rank;
    float scale;
    td_recipe recipe;      /* the LoRA GEMMs' recipe (never fp8, split_k 1)             */
    td_lora_pair *pairs;   // (L, slots) rounded A (r, in), B (out, r); a NULL = not adapted
    int slots;             /* the adapter's pairs per layer (lora.h td_lora_slots)      */
    float *owned;          /* storage of the rounded A and B                            */
    const td_backend *be;  /* whose buffers t and u are (the path's backend)               */
    float *t;              // (cap, r)        D(A x)
    float *u;              // (cap, max out)  D(B t), then D(scale u)
    float *qin;            // (cap, max(in, r)) GEMM operand scratch
    int punica, npairs;
    int on_device;         /* A and B rounded on the device from lora->owned_dev (be->prepare):
                              owned is a stale key of the device copies, released with them */
} lora_rt;

/* the recipe of an unmerged LoRA branch's GEMMs on a path of recipe r: the activations' dtype in
 * and out, fp32 accumulation, no split-K (the memory plan sizes its scratch from it too) */
td_recipe lora_branch_recipe(const td_recipe *r);
lora_rt *lora_rt_create(const td_lora *lora, const td_recipe *r, int cap, int punica,
                        const td_backend *be);
void lora_rt_free(lora_rt *rt);
/* A and B rounded again from lora (the adapter rt was made for, since updated): on the device from
 * lora->owned_dev when rt->on_device, else on the host (its device copies then dropped by forget). */
void lora_rt_refresh(lora_rt *rt, const td_lora *lora);
/* y (N, out) += the LoRA branch of slot `module` of `layer` (lora.h: 0..6 the seven projections,
 * in an MoE layer 4..6 the shared expert's, 7 + 3 e + k expert e's) on its input x (N, in);
 * nothing when ops has no adapter, this projection is not adapted, or module is -1. */
void lora_forward(const td_ops *ops, int layer, int module, float *y, const float *x, int N);

/* The gradient of one LoRA pair: dA (r, in), dB (out, r); NULL when not adapted. */
typedef struct {
    float *da, *db;
} lora_grad;

/* y += scale B(A x) of projection `module` in `layer`, backwards (nothing without an adapter,
 * or when this projection is not adapted): with t = D(A x) recomputed and du = D(scale dy),
 *   dB += du^T t,   dt = du B,   dA += dt^T x,   dx += dt A.
 * lg: (L, slots) gradients; scratch: N * (2 r + max(out)) floats. */
void lora_backward(const td_ops *ops, int layer, int module, float *dx, const float *dy,
                   const float *x, int N, const lora_grad *lg, float *scratch);

/* The backward's working buffers for up to cap rows (decoder_backward.c). */
typedef struct {
    const td_backend *be;
    float *dx;          // (cap, C)   gradient of the residual stream
    float *dxn;         // (cap, C)   gradient of a norm output (on entry: of the final norm's)
    float *dq, *dq_raw; // (cap, NH*HD)   after RoPE, before q-norm
    float *dk, *dk_raw; // (cap, NKV*HD)
    float *dv;          // (cap, NKV*HD)
    float *datt;        // (cap, NH*HD)   attention output
    float *dact, *dgate, *dup;   // (cap, F)
    float *att_scratch; // (nthreads, 2, ATT_BLOCK, max_keys)
    float *lora;        // (cap, 2 r + max width)  LoRA backward scratch, NULL without LoRA
    /* a mixture of experts' backward (moe.c): one expert's rows at a time, in the backend's
     * memory; the routing weights' gradient comes down for the logits' (host), which go up */
    float *moe_act;     // (cap, FW)  silu(gate) * up recomputed
    float *moe_dy;      // (cap, C)   gradient of an expert's output rows
    float *moe_dact, *moe_dgate, *moe_dup;   // (cap, FW)
    float *moe_dx;      // (cap, C)   gradient of an expert's input rows
    float *moe_dw;      // (cap, K)   gradient of the routing weights
    float *moe_dlogits; // (cap, E)   of the router logits (and of the shared expert's gate logit)
    float *moe_dw_h, *moe_dlogits_h;   /* host mirrors of the two above (themselves on the CPU) */
    const float *moe_aux_dp; // (E) the load-balancing loss's gradient wrt every row's router
                        //            probabilities, the same for all rows and layers (the
                        //            trainer's, src/train/aux_loss.c); NULL: no such loss
    void *owned[24];
    int nowned;
    void *host_owned[8];
    int nhost;
} td_grad_acts;

void grad_acts_alloc(td_grad_acts *g, const td_config *c, const td_ops *ops, int cap, int max_keys,
                     int lora_rank);
void grad_acts_free(td_grad_acts *g);

/* The backward of decoder_forward over the N rows of the activations a kept (save = 1),
 * tokens/pos as the forward had them: ga->dxn holds on entry the gradient of the final norm's
 * output (N, C). Accumulates into grads (carved like td_model_weights, writable; NULL entries
 * frozen) and, with an unmerged adapter in ops, into lg. Leaves the gradient of the embedding
 * output in ga->dx. */
/* A mixture-of-experts layer's MLP backwards (moe.c): dxn (N, C, accumulated) += the gradient of
 * its input (the post-attention norm output) given dout (N, C) the gradient of its output; weight
 * gradients into gw (router, experts, shared expert; NULL entries frozen). The experts run again on
 * their rows (the forward's ops in its order: the same values); an unmerged adapter's expert and
 * shared-expert pairs get their A/B gradients in lg. */
void moe_backward(const td_ops *ops, const td_model *m, td_acts *a, td_grad_acts *ga, const td_layer_weights *gw,
                  const lora_grad *lg, int l, const float *xn2, const float *dout, float *dxn, int N);

void decoder_backward(const td_ops *ops, const td_model *m, const td_acts *a, td_grad_acts *ga,
                      td_model_weights *grads, const lora_grad *lg, const int *tokens,
                      const int *pos, int N);

/* What a structure keeps for its recipe: the recipe, its weights and GEMM scratch.
 *   ws      every GEMM matrix, the embedding and the lm_head as the recipe's kernels read them:
 *           the model's own storage wherever the recipe's rounding leaves it unchanged (a bf16
 *           checkpoint under bf16 recipes, anything under fp32), else a copy in the narrowest
 *           storage that holds the rounded values exactly (fp8: 1-byte codes + block scales;
 *           bf16/fp16: 2 bytes) — or fp32 copies when f32 is set (a backward reads w).
 *   w       fp32 view: norms and biases (rounded copies, or the model's), and the GEMM
 *           matrices, embedding and lm_head where ws holds them in fp32 (NULL elsewhere).
 *   bytes   what the copies take (weights only), by the storage they are in.
 *   dev_be  set when the model's masters live on a device (m->owned_dev, a trainer's): the copies
 *           made from them were prepared there (be->prepare) and their host buffers are stale keys
 *           of the device copies, released with them (weights_recipe.c). */
typedef struct {
    td_recipe recipe, head;
    td_model_weights w;
    td_wset ws;
    void **owned;          /* the copies' allocations                                       */
    size_t nowned;
    size_t bytes[TD_FORMAT_COUNT];
    int f32;               /* copies in fp32 with a full fp32 view (trainers)              */
    float *qin, *gscratch, *wtile;
    lora_rt *lora;         /* unmerged adapter, or NULL                                     */
    td_lora_merge_stats merge;  /* what a merged adapter kept                               */
    const td_backend *dev_be;   /* the backend that prepared copies from m->owned_dev, or NULL */
} td_recipe_state;

/* Sets ops up for recipe r (copied into st) for batches of up to cap rows, with an adapter
 * (lora may be NULL) folded into the prepared weights (mode TD_LORA_MERGED) or run beside them
 * (TD_LORA_UNMERGED: PEFT's form; TD_LORA_PUNICA: vLLM's). f32: keep every weight the recipe
 * reads in fp32 too (w complete: decoder_backward needs it). */
int recipe_state_set(td_recipe_state *st, td_ops *ops, const td_model *m, const td_recipe *r,
                     const td_lora *lora, int mode, int cap, int f32, td_error *err);
void recipe_state_free(td_recipe_state *st);
/* The recipe state of a structure (tests: what it shares, what it copied). */
const td_recipe_state *forward_recipe_state(const td_forward *f);
const td_recipe_state *session_recipe_state(const td_session *s);

#endif
