/* tidal — the op list of the Llama-family forward (internal header).
 *
 * One list of named ops, llm.c names and argument order (outputs first, then inputs, then
 * sizes), each taking a td_ops context first. The context carries the recipe the op runs
 * under (NULL = the fp32 reference) and the backend that runs it: a small function table, as
 * ggml's backends are, with the memory calls (alloc / free / upload / download) and one entry
 * per op. The model code (decoder.c, lora_run.c) and the paths call only the names below; what
 * runs them is the backend's business:
 *
 *   CPU   src/backend/cpu.c: an op under a plain fp32 recipe is the fp32 reference form
 *         (`_ref`, src/backend/cpu_ref.c, the ggml name for the obvious form); under any other
 *         recipe the same maths with the recipe's rounding points (src/backend/cpu.c).
 *   CUDA  src/backend/cuda/backend.cu: the same table, every forward and backward op (the
 *         GEMMs' dgrad and wgrad on cuBLASLt: matmul_backward.cu); each op carries the name
 *         here + `_cuda`, one `op.cu` (forward) and `op_backward.cu` file per family
 *         (cuda_internal.cuh).
 *
 * Optional outputs a backward needs (rstd of RMSNorm, log-sum-exp of attention) are pointers
 * that may be NULL: the forward-only paths pass NULL and pay nothing.
 *
 * Backward ops (`op_backward`, paired with `op_forward` as in llm.c): gradients of the inputs
 * first, then the gradient of the output, then what the forward saw. Every input gradient is
 * ACCUMULATED (+=, callers zero them), so a tensor read by several ops (the residual stream,
 * the norm output read by q/k/v) collects each op's share, and a tied lm_head/embedding shares
 * one buffer. A NULL gradient pointer is not computed (a frozen weight under LoRA).
 * Under a recipe the backward mirrors the forward's precision (cpu_backward.c): GEMM operands
 * (grad-outputs included) rounded to the GEMM input format, fp32 accumulation and reductions,
 * input gradients rounded to the activations dtype where the op writes them, weight gradients
 * accumulated in fp32.
 * Shapes use the letters of config.h; N is a number of token rows.
 */
#ifndef TIDAL_MODEL_OPS_H
#define TIDAL_MODEL_OPS_H

#include <stddef.h>

#include "tidal/metrics.h"
#include "tidal/model.h"
#include "tidal/sampling.h"

typedef struct td_backend td_backend;
struct td_wset;

/* A weight matrix (rows, cols) as a path keeps it: in its storage dtype, never widened in
 * memory. The GEMMs widen it to fp32 one tile of TD_GEMM_TILE rows at a time (src/backend/
 * cpu.h), into per-thread scratch, then run the fp32 kernel on the tile; F32 is used in place.
 *   TD_F32, TD_BF16, TD_F16   the values themselves (a bf16/f16 checkpoint mapped as it is)
 *   TD_E4M3, TD_E5M2          1-byte codes; value = decode(code) * scale[block], blocks of
 *                             (sr, sc) elements, nbc blocks per row (td_fp8_dequantize's formula,
 *                             so the values are those td_fp8_fake_quant gives); row-major, or
 *                             with panels set in k-major panels of 8 rows (gemm.h's
 *                             td_fp8_codes_to_panels: a backend with fp8_panels asks for it) */
typedef struct td_wmat {
    const void *data;
    td_format dtype;
    const float *scale;           /* fp8 only                                                  */
    int sr, sc, nbc;              /* fp8 scale blocks: rows, columns, blocks per row           */
    int nan_free;                 /* fp8: 1 when it was checked that no code is a NaN (the decode
                                     kernel then skips its scan of the codes; 0: not known)      */
    int panels;                   /* fp8: 1 when the codes are in k-major panels of 8 rows       */
} td_wmat;

static inline td_wmat td_wmat_f32(const float *p)
{
    td_wmat w = {.data = p, .dtype = TD_F32};
    return w;
}

/* GEMMs are cut into fixed tiles of this many output columns (weight rows), whatever the
 * thread count (src/backend/cpu.h says why); a weight tile is widened to fp32 as a whole. */
#define TD_GEMM_TILE 128

/* Rows [r0, r0 + nr) of w (cols wide) as fp32 (src/backend/cpu_wmat.c): w's own memory when it
 * is fp32, else widened into dst (nr * cols floats), exactly. Host memory. */
const float *wmat_rows(const td_wmat *w, long r0, long nr, int cols, float *dst);

/* out (N, nr; stride ldo) = inp (N, cols) . (rows [r0, r0 + nr) of w)^T in the fixed order of
 * td_gemm_fixed (include/tidal/gemm.h: the GEMMs of at most TD_GEMM_FIXED_ROWS rows), 16-bit
 * weights read without widening, others widened into dst. Host memory. */
void wmat_gemm_fixed(const td_wmat *w, long r0, long nr, int cols, const float *inp, int N,
                     float *out, int ldo, float *dst);

/* AdamW's per-step scalars (src/train/optim.c adamw_scalars: formed in double, used as fp32,
 * torch's _single_tensor_adamw): per element, with g the gradient,
 *   p = decay_on ? param * decay : param;   m = m1 * b1 + a1 * g;   v = m2 * b2 + a2 * (g * g)
 *   param = p + step_size * (m / (sqrtf(v) / bc2_sqrt + eps));   m1 = m;   m2 = v
 * each operation rounded to fp32 in this order (no contraction). */
typedef struct td_adamw_k {
    float decay, b1, b2, a1, a2, bc2_sqrt, eps, step_size;
    int decay_on;
} td_adamw_k;

typedef struct td_ops {
    const td_backend *be;         /* who runs the ops (td_backend_cpu)                         */
    int nthreads;                 /* threads the ops may use (>= 1)                            */
    const td_recipe *recipe;      /* the recipe the ops run under, NULL = fp32 reference       */
    const td_recipe *head;        /* the recipe of the lm_head GEMM (td_recipe_for_head)       */
    const td_model_weights *w;    /* the recipe's fp32 weights (norms, biases; every tensor for
                                     a backward), NULL = the model's own                      */
    const struct td_wset *ws;     /* the recipe's GEMM weights, embedding, lm_head (td_wmat)  */
    float *wtile;                 /* weight tiles widened to fp32: nthreads * wtile_per_thread */
    size_t wtile_per_thread;      /* TD_GEMM_TILE * the widest GEMM input                     */
    int decode;                   /* this step is a decode step (split-KV attention applies)   */
    int cache;                    /* keys/values are stored in a KV cache (kv_cache rounding)  */
    int kv_fmt;                   /* a KV cache's element format (td_kv_store_format): TD_F32 =
                                     floats, else codes of that td_format (kv_codes backends)  */
    float temperature;            /* logits / T before log-softmax (0 or 1: none; recipe.h)    */
    float *qin;                   /* quantised GEMM input, rows * max(C, F, NH*HD) floats      */
    float *gscratch;              /* fp8-fast accumulators, nthreads * gscratch_per_thread     */
    size_t gscratch_per_thread;
    /* per-layer observation (--layers): called after each layer with the residual stream */
    td_layer_fn layer_fn;
    void *layer_user;
    const int *row_seq;           /* (rows) sequence / slot of each row, for layer_fn         */
    const struct lora_rt *lora;   /* unmerged LoRA adapter (lora_run.c), NULL = none           */
    /* mixtures of experts (moe.c): each MoE layer's routing reported, or replayed */
    td_moe_fn moe_fn;
    void *moe_user;
    td_moe_replay_fn moe_replay;
    void *moe_replay_user;
    struct td_progress_s *progress; /* long work (tidal/progress.h): decoder_forward adds N rows
                                       per layer                                               */
} td_ops;

/* The backend function table. Each op entry has the signature of the op-list function of the
 * same name below. */
struct td_backend {
    const char *name;
    void (*init)(td_ops *ctx);                                    /* threads, library state */
    void *(*alloc)(size_t bytes);                                 /* a buffer the ops can use */
    void (*free)(void *p);
    void (*upload)(void *dst, const void *src, size_t bytes);     /* host -> backend buffer */
    void (*download)(void *dst, const void *src, size_t bytes);   /* backend buffer -> host */
    void (*zero)(void *p, size_t bytes);                          /* a buffer of alloc's = 0, on
                                                                     the backend (CUDA: on its
                                                                     stream, asynchronous) */
    int kv_codes;   /* stores a KV cache as codes of the recipe's kv_cache format (ctx->kv_fmt) */
    int fp8_panels; /* takes an fp8-fast recipe's fp8 weights in k-major panels of 8 rows (td_wmat
                       panels) where td_gemm_fp8_panels_preferred says so */

    void (*embedding_forward)(const td_ops *ctx, float *out, const int *tokens,
                              const td_wmat *embed, int N, int C);
    void (*rmsnorm_forward)(const td_ops *ctx, float *out, float *rstd, const float *inp,
                            const float *weight, int N, int C, float eps);
    void (*matmul_forward)(const td_ops *ctx, int n, float *const *out, const float *inp,
                           const td_wmat *weight, const float *const *bias, int N, int IN,
                           const int *OUT);
    void (*rope_forward)(const td_ops *ctx, float *x, const int *pos, const float *inv_freq, int N,
                         int nheads, int HD);
    void (*kv_write)(const td_ops *ctx, float *store, const float *rows, const size_t *kv_off,
                     const int *pos, int N, int KVD);
    void (*attention_forward)(const td_ops *ctx, float *out, float *lse, const float *q,
                              const float *k, const float *v, const size_t *kv_off, const int *pos,
                              int N, int NH, int NKV, int HD, float *scratch, int max_keys);
    void (*swiglu_forward)(const td_ops *ctx, float *out, const float *gate, const float *up, int N,
                           int F);
    void (*residual_forward)(const td_ops *ctx, float *out, const float *inp1, const float *inp2,
                             size_t n);
    void (*scale_forward)(const td_ops *ctx, float *x, float s, size_t n);
    void (*logsoftmax_forward)(const td_ops *ctx, float *x, int N, int V);
    void (*logprob_gather)(const td_ops *ctx, float *tlogp, int *top1, const float *logp,
                           const int *target, int N, int V);

    void (*embedding_backward)(const td_ops *ctx, float *dembed, const float *dout,
                               const int *tokens, int N, int C);
    void (*rmsnorm_backward)(const td_ops *ctx, float *dinp, float *dweight, const float *dout,
                             const float *inp, const float *weight, const float *rstd, int N,
                             int C);
    void (*matmul_backward)(const td_ops *ctx, float *dinp, float *dweight, float *dbias,
                            const float *dout, const float *inp, const float *weight, int N,
                            int IN, int OUT);
    void (*rope_backward)(const td_ops *ctx, float *dx, const int *pos, const float *inv_freq,
                          int N, int nheads, int HD);
    void (*attention_backward)(const td_ops *ctx, float *dq, float *dk, float *dv,
                               const float *dout, const float *q, const float *k, const float *v,
                               const float *out, const float *lse, const int *pos, int N, int NH,
                               int NKV, int HD, float *scratch, int max_keys);
    void (*swiglu_backward)(const td_ops *ctx, float *dgate, float *dup, const float *dout,
                            const float *gate, const float *up, int N, int F);
    void (*logsoftmax_backward)(const td_ops *ctx, float *dx, const float *logp,
                                const int *target, const float *dlogp, int N, int V);

    /* a mixture of experts' rows (moe.c; the op list's moe_* below) */
    void (*moe_gather)(const td_ops *ctx, float *out, const float *x, const int *rows, int N, int n, int K,
                       int C);
    void (*moe_combine)(const td_ops *ctx, float *out, const float *y, const int *rows,
                        const float *w, int N, int n, int K, int C);
    void (*moe_scatter)(const td_ops *ctx, float *v, const float *y, const int *rows,
                        const float *w, int N, int n, int K, int C);
    void (*moe_sum)(const td_ops *ctx, float *out, const float *v, int N, int K, int C);
    void (*moe_shared_combine)(const td_ops *ctx, float *out, const float *y, const float *z, int N,
                               int C);
    void (*moe_combine_backward)(const td_ops *ctx, float *dw, float *dy, const float *dout,
                                 const float *y, const int *rows, const float *w, int N, int n, int K,
                                 int C);
    void (*moe_scatter_add)(const td_ops *ctx, float *dx, const float *dxe, const int *rows, int N, int n,
                            int K, int C, int rounded);
    void (*moe_shared_combine_backward)(const td_ops *ctx, float *dz, float *dy, const float *dout,
                                        const float *y, const float *z, int N, int C);

    /* The optimiser's element-wise steps on the backend's buffers (src/train/optim.c says what
     * each reproduces), the CPU's arithmetic on every backend: AdamW (td_adamw_k above) over n
     * elements; the sum of squares of n gradients in double (returned to the host; the CPU sums
     * in its vector order, a device in a fixed tree: they differ in the double's last bits);
     * g *= k in fp32. */
    void (*optim_adamw)(float *param, const float *grad, float *m1, float *m2, size_t n,
                        const td_adamw_k *k);
    double (*optim_sumsq)(const float *g, size_t n);
    void (*optim_scale)(float *g, size_t n, float k);

    /* A backend whose ops run asynchronously (CUDA): sync waits until they are done, so the
     * host may read what they wrote; forget drops the device copies of host weights (a recipe
     * is prepared again, a path is freed). NULL on the CPU. */
    void (*sync)(void);
    void (*forget)(void);
    /* The host scratch the backward's GEMMs keep from call to call (the CPU backend: faulting a
     * fresh buffer in on every call was 5 % of a bf16 training step), freed; the trainer calls
     * it at the end of each optimiser step, so that rollouts between steps do not hold it. NULL
     * where a backend plans its scratch (CUDA). */
    void (*scratch_release)(void);

    /* A recipe's weights prepared from masters in the backend's memory (a trainer on a device:
     * src/train/trainer.c; NULL on the CPU, whose weights are prepared on the host):
     * prepare  the device copy of the host buffer key (n elements of storage: TD_F32 floats,
     *          TD_BF16 / TD_F16 codes), the one the ops find for key, is made from src (n floats,
     *          backend memory): v = td_round(fmt, src[i]) (SATFINITE), then v = td_round(fmt,
     *          v * scale) when scale != 1 (vLLM's B scaled in the lora dtype, lora_run.c), stored
     *          as a float or encoded (td_encode_row's code of v; storage is then fmt). key itself
     *          is never written (the host copy is stale): the copy stays through forget, until
     *          release(key).
     * alias    fmt TD_F32: the device copy of the host range [host, host + bytes) is dev (backend
     *          memory the caller keeps current and alive: a trainer's masters), until
     *          release(host). fmt TD_BF16 / TD_F16: a rounding view of dev (floats) for the
     *          embedding's gather alone: the table at host (its storage's codes or floats) is
     *          td_round(fmt, dev[i]), rounded as the rows are gathered, no copy held (an op
     *          that asks for the whole table, tdc_const, is refused: a tidal bug).
     * release  drops what prepare or alias made for key (the host buffer is about to be freed). */
    void (*prepare)(const void *key, int storage, const float *src, size_t n, int fmt, float scale);
    void (*alias)(const void *host, const void *dev, size_t bytes, int fmt);
    void (*release)(const void *key);
    /* lora_fold: an adapter merged into the weight a recipe's GEMMs read (weights_recipe.c's
     * merge_sum, bit for bit; NULL on the CPU): key's device copy (N*K elements of storage, as
     * prepare) = R(W + dW), R = td_round of fmt (SATFINITE), dW = fl(scale * fl(sum over k of
     * B[i][k] A[k][j])) the sum an fma chain in k = 0..r-1 (td_lora_fold_delta); w (N x K), a
     * (r x K), b (N x r): floats in the backend's memory. stats (host, 4 doubles) = the merge's
     * sums over the matrix, td_lora_fold_stats' order (each row in double in column order, the
     * rows added in order): |R(W+dW) - R(W)|^2, |dW|^2, <R(W+dW) - R(W), dW>, #{R(W+dW) != R(W)}. */
    void (*lora_fold)(const void *key, int storage, const float *w, const float *a, const float *b, int N,
                      int K, int r, float scale, int fmt, double *stats);
    /* lora_peft_sync: tidal-rl's --lora-sync merge-unmerge of one adapted matrix (src/rl/sync.c's
     * host loop, bit for bit; NULL on the CPU): delta = fl(fl(B A) * scale) (td_lora_peft_delta),
     * m = D(w + delta) (PEFT's merge_adapter: the engine's matrix), w = D(m - D(delta))
     * (unmerge_adapter, the rounded form), D = td_round of dtype (no saturation: torch's cast);
     * stats (host, 4 doubles) = the merge's sums of E(m) against E(w before the sync), E =
     * td_round of efmt (the rollout recipe's weights), in lora_fold's order. w, m (N x K), a, b:
     * backend memory. lora_drift: stats (host, 3 doubles) = max |w - w0|, the sum of |w - w0|
     * (each row in double in column order, the rows added in order), #{w != w0}. */
    void (*lora_peft_sync)(float *w, float *m, const float *a, const float *b, int N, int K, int r, float scale,
                           int dtype, int efmt, double *stats);
    void (*lora_drift)(const float *w, const float *w0, int N, int K, double *stats);
    /* prepare_fp8: an FP8 weight from masters src (rows x cols floats, backend memory), bit for
     * bit the host's (td_fp8_quantize of s: fp8_quant.cu): the device copies of codes_key (rows *
     * cols codes) and scales_key (td_fp8_num_scales floats); or, with f32_key (codes_key and
     * scales_key NULL), td_fp8_fake_quant's values (lut[code] * scale in fp32) as f32_key's copy
     * (rows * cols floats, a trainer's fp32 view). The keys are never written, as prepare's. */
    void (*prepare_fp8)(const void *codes_key, const void *scales_key, const void *f32_key, const td_fp8_scheme *s,
                        const float *src, int rows, int cols);

    /* td_sample on the backend (include/tidal/sampling.h): n rows of logits (V wide, backend or
     * host memory), each row's seen tokens (host) and stream rng (advanced as td_sample does);
     * writes tok (n), logp (n, the processed log-prob of each token; NULL = none) and proc (n, V
     * processed rows; NULL = none) to host memory: the tokens td_sample draws. Returns how many
     * rows were sampled on the host. NULL on the CPU (the paths call td_sample). */
    int (*sample)(const td_ops *ctx, const td_sampling *s, const float *logits, int n, int V,
                  const int *const *seen, const int *n_seen, td_rng *rng, int *tok, float *logp,
                  float *proc);

    /* Per-token metrics on the backend (tidal-diff with both paths' rows kept there; NULL on the
     * CPU, whose paths call td_log_softmax and td_token_metrics_compute on host rows).
     * row_logsoftmax: for i < n, dst + dst_row[i] * V (backend memory) = td_log_softmax of src
     * row i (backend or host memory) divided by T first (an fp32 division, when T > 0 and != 1):
     * td_log_softmax's floats (include/tidal/logprob.h).
     * token_metrics: m[i] (host) = td_token_metrics_compute(la + ia[i] * V, lb + ib[i] * V, V,
     * y[i]) for n pairs of log-prob rows in backend memory (ia, ib, y host; ia or ib NULL = i):
     * logp, k3, top-1 and rank exactly, the double sums in another order (metrics.h). lb NULL:
     * A's rows alone, td_token_metrics_replay's A side (logp_a, top1_a, rank_a exactly, entropy_a
     * in another order) with logp_b and k3 NaN, for the caller to set from its logp_b. */
    void (*row_logsoftmax)(const td_ops *ctx, float *dst, const size_t *dst_row, const float *src,
                           int n, int V, float T);
    void (*token_metrics)(const td_ops *ctx, td_token_metrics *m, const float *la,
                          const size_t *ia, const float *lb, const size_t *ib, const int *y,
                          int n, int V);
};

extern const td_backend td_backend_cpu;   /* src/backend/cpu.c */
extern const td_backend td_backend_cuda;  /* src/backend/cuda/backend.cu (built with nvcc) */

static inline void td_ops_sync(const td_ops *ctx)
{
    if (ctx->be->sync) ctx->be->sync();
}

static inline void td_backend_forget(const td_backend *be)
{
    if (be->forget) be->forget();
}

/* Whether the backend runs the backward ops (trainers need them; both backends have them all). */
static inline int td_backend_has_backward(const td_backend *be)
{
    return be->matmul_backward != NULL;
}

/* A context for backend be with no recipe (the fp32 reference); be->init sets threads. */
void td_ops_init(td_ops *ctx, const td_backend *be);

/* The context a GEMM with its own recipe runs in (the lm_head, a LoRA branch): ctx with that
 * recipe and that GEMM operand scratch (gscratch may be NULL when r needs none). */
static inline td_ops td_ops_gemm(const td_ops *ctx, const td_recipe *r, float *qin, float *gscratch)
{
    td_ops g = *ctx;
    g.recipe = r;
    g.qin = qin;
    g.gscratch = gscratch;
    return g;
}

/* ---- the op list ------------------------------------------------------------------------- */

/* out (N, C) = embed[tokens[i]] (widened to fp32) */
static inline void embedding_forward(const td_ops *ctx, float *out, const int *tokens,
                                     const td_wmat *embed, int N, int C)
{
    ctx->be->embedding_forward(ctx, out, tokens, embed, N, C);
}

/* HF RMSNorm: out = x * rsqrt(mean(x^2) + eps) * weight, per row of C; rstd (N), if not NULL,
 * receives each row's rsqrt(mean(x^2) + eps). In place (out == inp) allowed. */
static inline void rmsnorm_forward(const td_ops *ctx, float *out, float *rstd, const float *inp,
                                   const float *weight, int N, int C, float eps)
{
    ctx->be->rmsnorm_forward(ctx, out, rstd, inp, weight, N, C, eps);
}

/* n products of the same input in one go: out[j] (N, OUT[j]) = inp (N, IN) @ weight[j]^T
 * + bias[j] (bias or bias[j] may be NULL); weight: n matrices (td_wmat, widened per tile).
 * Every projection and the lm_head go through here. */
static inline void matmul_forward_multi(const td_ops *ctx, int n, float *const *out,
                                        const float *inp, const td_wmat *weight,
                                        const float *const *bias, int N, int IN, const int *OUT)
{
    ctx->be->matmul_forward(ctx, n, out, inp, weight, bias, N, IN, OUT);
}

/* out (N, OUT) = inp (N, IN) @ weight (OUT, IN)^T + bias (OUT, may be NULL). */
static inline void matmul_forward(const td_ops *ctx, float *out, const float *inp,
                                  const td_wmat *weight, const float *bias, int N, int IN, int OUT)
{
    ctx->be->matmul_forward(ctx, 1, &out, inp, weight, &bias, N, IN, &OUT);
}

/* HF rotate-half RoPE in place on x (N, nheads, HD), row i at position pos[i]:
 * for k < HD/2, a = pos*inv_freq[k]:  x[k] <- x[k] cos a - x[k+HD/2] sin a,
 *                                     x[k+HD/2] <- x[k+HD/2] cos a + x[k] sin a. */
static inline void rope_forward(const td_ops *ctx, float *x, const int *pos, const float *inv_freq,
                                int N, int nheads, int HD)
{
    ctx->be->rope_forward(ctx, x, pos, inv_freq, N, nheads, HD);
}

/* The element format of a KV cache under recipe r on backend be: codes of the recipe's kv_cache
 * format where the backend stores codes (CUDA) and that format is narrower than fp32, floats
 * otherwise (the CPU: TD_F32 always). Codes hold exactly the values the CPU's float cache holds:
 * kv_write rounds to kv_cache when it differs from the activations (the value is the code's,
 * times kv_scale for a scaled fp8 cache), and when it is the activations' format the rows are
 * already rounded to it (GEMM outputs, RoPE, LoRA's residual add all round to D) — except under
 * residual_fp32, where an unmerged LoRA's add to K or V stays fp32: floats there. A KV cache
 * takes td_kv_esize(fmt) bytes per element: per token and layer 2 * NKV * HD *
 * td_kv_esize(fmt) bytes (K and V). */
static inline int td_kv_store_format(const td_backend *be, const td_recipe *r)
{
    if (!be->kv_codes || !r || r->kv_cache == TD_F32) return TD_F32;
    if (r->kv_cache == r->activations && r->residual_fp32) return TD_F32;
    return (int)r->kv_cache;
}
static inline size_t td_kv_esize(int fmt) { return fmt == TD_F32 ? 4 : fmt == TD_BF16 || fmt == TD_F16 ? 2 : 1; }

/* KV write: row i of rows (N, KVD) goes to store + kv_off[i] + pos[i]*KVD (nothing is copied
 * when that is the row itself), rounded there to the recipe's kv_cache format when the context
 * is a KV cache's (inference path): fp8 as D(q(x / kv_scale) * kv_scale). With ctx->cache and a
 * ctx->kv_fmt other than TD_F32 the store holds codes of that format (offsets in elements) and
 * attention_forward reads them (kv_codes backends only). */
static inline void kv_write(const td_ops *ctx, float *store, const float *rows,
                            const size_t *kv_off, const int *pos, int N, int KVD)
{
    ctx->be->kv_write(ctx, store, rows, kv_off, pos, N, KVD);
}

/* Attention processes long runs of query rows by blocks of ATT_BLOCK rows; runs shorter than
 * ATT_MIN_RUN row by row. scratch must hold nthreads * ATT_BLOCK * max_keys floats. */
#define ATT_BLOCK 64
#define ATT_MIN_RUN 8

/* Causal GQA attention for N query rows. Row i attends to keys/values 0..pos[i] of its own
 * sequence, stored at kv + kv_off[i] + j*KVD (KVD = NKV*HD) in k and v:
 *   out[i, h] = softmax_j(q[i,h] . k[j, h/(NH/NKV)] / sqrt(HD)) @ v[j, h/(NH/NKV)].
 * q, out: (N, NH*HD). lse (N, NH), if not NULL, receives log sum_j e^score of each row and head.
 * scratch: (nthreads, ATT_BLOCK, max_keys) floats. */
static inline void attention_forward(const td_ops *ctx, float *out, float *lse, const float *q,
                                     const float *k, const float *v, const size_t *kv_off,
                                     const int *pos, int N, int NH, int NKV, int HD,
                                     float *scratch, int max_keys)
{
    ctx->be->attention_forward(ctx, out, lse, q, k, v, kv_off, pos, N, NH, NKV, HD, scratch,
                               max_keys);
}

/* SwiGLU: out (N, F) = silu(gate) * up, silu(x) = x / (1 + e^-x). In place on gate allowed. */
static inline void swiglu_forward(const td_ops *ctx, float *out, const float *gate,
                                  const float *up, int N, int F)
{
    ctx->be->swiglu_forward(ctx, out, gate, up, N, F);
}

/* Residual add: out (n) = inp1 + inp2; out == inp1 allowed (the stream updated in place). */
static inline void residual_forward(const td_ops *ctx, float *out, const float *inp1,
                                    const float *inp2, size_t n)
{
    ctx->be->residual_forward(ctx, out, inp1, inp2, n);
}

/* x (n) = s * x, rounded to the activations dtype (PEFT's lora_B(...) * scaling). */
static inline void scale_forward(const td_ops *ctx, float *x, float s, size_t n)
{
    ctx->be->scale_forward(ctx, x, s, n);
}

/* Log-softmax over each row of V, in place on x (N, V): x - max - log(sum(exp(x - max))), of
 * x / ctx->temperature when that is set, with the roundings of the context's recipe
 * (logits_temperature, logsoftmax; recipe.h). */
static inline void logsoftmax_forward(const td_ops *ctx, float *x, int N, int V)
{
    ctx->be->logsoftmax_forward(ctx, x, N, V);
}

/* Per row of the log-softmax rows logp (N, V): tlogp[i] = logp[i, target[i]] and top1[i] =
 * the first index of the row's largest value (a strict > scan from column 0). What a trainer
 * reads of a micro-batch's logits on the host: N floats and N ints, not N * V. tlogp and
 * top1 may be host memory (a device backend stages them). */
static inline void logprob_gather(const td_ops *ctx, float *tlogp, int *top1, const float *logp,
                                  const int *target, int N, int V)
{
    ctx->be->logprob_gather(ctx, tlogp, top1, logp, target, N, V);
}

/* ---- the backward ops (see the top of this file: input gradients accumulate) ------------- */

/* dembed[tokens[i]] += dout[i], rows (N, C). */
static inline void embedding_backward(const td_ops *ctx, float *dembed, const float *dout,
                                      const int *tokens, int N, int C)
{
    ctx->be->embedding_backward(ctx, dembed, dout, tokens, N, C);
}

/* RMSNorm y = x * rstd * w with the forward's rstd: xhat = x * rstd, g = dy * w,
 *   dinp += rstd * (g - xhat * mean_c(g * xhat)),   dweight += sum_rows dy * xhat. */
static inline void rmsnorm_backward(const td_ops *ctx, float *dinp, float *dweight,
                                    const float *dout, const float *inp, const float *weight,
                                    const float *rstd, int N, int C)
{
    ctx->be->rmsnorm_backward(ctx, dinp, dweight, dout, inp, weight, rstd, N, C);
}

/* out = inp @ weight^T + bias:  dinp (N, IN) += dout (N, OUT) @ weight (OUT, IN),
 * dweight (OUT, IN) += dout^T @ inp, dbias (OUT) += sum_rows dout. Any of the three may be NULL.
 * The weight is the one the forward multiplied (the recipe's rounded copy). */
static inline void matmul_backward(const td_ops *ctx, float *dinp, float *dweight, float *dbias,
                                   const float *dout, const float *inp, const float *weight,
                                   int N, int IN, int OUT)
{
    ctx->be->matmul_backward(ctx, dinp, dweight, dbias, dout, inp, weight, N, IN, OUT);
}

/* RoPE is a rotation per pair (k, k + HD/2): its gradient is the inverse rotation, in place on
 * dx (N, nheads, HD): dx[k] <- dx[k] cos a + dx[k+HD/2] sin a, dx[k+HD/2] <- dx[k+HD/2] cos a
 * - dx[k] sin a. */
static inline void rope_backward(const td_ops *ctx, float *dx, const int *pos,
                                 const float *inv_freq, int N, int nheads, int HD)
{
    ctx->be->rope_backward(ctx, dx, pos, inv_freq, N, nheads, HD);
}

/* Causal GQA attention of packed whole sequences (teacher forcing: row i's own key/value at
 * row i, rows of one sequence consecutive with positions 0, 1, ...). P is recomputed from the
 * saved q, k and log-sum-exp (FlashAttention-2's backward): P = exp(q.k / sqrt(HD) - lse),
 *   dv += P^T dout,  dP = dout v^T,  D_i = sum_c dout * out,  dS = P (dP - D_i),
 *   dq += dS k / sqrt(HD),  dk += dS^T q / sqrt(HD)   (k/v gradients summed over the group).
 * scratch: (nthreads, 2, ATT_BLOCK, max_keys) floats. */
static inline void attention_backward(const td_ops *ctx, float *dq, float *dk, float *dv,
                                      const float *dout, const float *q, const float *k,
                                      const float *v, const float *out, const float *lse,
                                      const int *pos, int N, int NH, int NKV, int HD,
                                      float *scratch, int max_keys)
{
    ctx->be->attention_backward(ctx, dq, dk, dv, dout, q, k, v, out, lse, pos, N, NH, NKV, HD,
                                scratch, max_keys);
}

/* out = silu(g) * u: dgate += dout * u * s (1 + g (1 - s)) with s = sigmoid(g),
 * dup += dout * silu(g). */
static inline void swiglu_backward(const td_ops *ctx, float *dgate, float *dup,
                                   const float *dout, const float *gate, const float *up, int N,
                                   int F)
{
    ctx->be->swiglu_backward(ctx, dgate, dup, dout, gate, up, N, F);
}

/* The gradient of the logits (N, V) when the loss sees only each row's target log-prob:
 * L = sum_i f_i(logp[i, target[i]]) with dlogp[i] = dL/dlogp[i, target[i]] (cross-entropy:
 * -1 / #targets; a policy gradient: -advantage * weight / normaliser). Then
 *   dx[i, j] = dlogp[i] * (1[j == target[i]] - exp(logp[i, j])).
 * Writes (not accumulates) dx; dx == logp allowed (in place over the log-softmax rows).
 * A row with dlogp 0 (no target, masked) gets zeros. */
static inline void logsoftmax_backward(const td_ops *ctx, float *dx, const float *logp,
                                       const int *target, const float *dlogp, int N, int V)
{
    ctx->be->logsoftmax_backward(ctx, dx, logp, target, dlogp, N, V);
}

/* ---- mixtures of experts (src/model/moe.c) ------------------------------------------------
 * An MoE layer's N rows each chose K experts: pair p = i * K + j is row i's j-th choice (top-k
 * order). The routing decision is the host's (moe.c: softmax, top-k, the weights), the rows stay
 * on the backend: moe.c hands these ops, per expert, rows (n ints): the pairs routed to that
 * expert in row order, and w (N * K): every pair's routing weight (backend memory, uploaded once
 * per layer; a device backend stages host tables, as it stages any host input). x, out, dout,
 * dx: the layer's rows (N, C); y, dy, dxe: the expert's (n, C). Roundings (td_round, SATFINITE):
 * D the activations dtype, R the stream's (D, or fp32 under residual_fp32); none under no recipe.
 * Top-k chooses an expert once per row, so the pairs of one call have distinct rows; a row listed
 * twice (a replayed routing could; its pairs are then adjacent, rows being in row order) is added
 * to in list order, as a loop over the list would. */

/* out (n, C): row q = row rows[q] / K of x (an expert's input rows). */
static inline void moe_gather(const td_ops *ctx, float *out, const float *x, const int *rows, int N, int n,
                              int K, int C)
{
    ctx->be->moe_gather(ctx, out, x, rows, N, n, K, C);
}

/* transformers' index_add_ of one expert's output rows y (n, C) into out (N, C), q = 0 .. n-1:
 *   out_i = R(out_i + R(y_q * w[rows[q]])),   i = rows[q] / K
 * (the products in fp32). Experts are combined one call after another, in expert order. */
static inline void moe_combine(const td_ops *ctx, float *out, const float *y, const int *rows,
                               const float *w, int N, int n, int K, int C)
{
    ctx->be->moe_combine(ctx, out, y, rows, w, N, n, K, C);
}

/* vLLM's fused_moe (MUL_ROUTED_WEIGHT): v (N * K, C) row rows[q] = D(y_q * w[rows[q]]) from the
 * down GEMM's fp32 rows y (n, C). */
static inline void moe_scatter(const td_ops *ctx, float *v, const float *y, const int *rows,
                               const float *w, int N, int n, int K, int C)
{
    ctx->be->moe_scatter(ctx, v, y, rows, w, N, n, K, C);
}

/* vLLM's moe_sum: out (N, C) row i = 0, then out_i = D(out_i + v row i * K + j) for j = 0 .. K-1
 * (a D accumulator, top-k order). Writes out. */
static inline void moe_sum(const td_ops *ctx, float *out, const float *v, int N, int K, int C)
{
    ctx->be->moe_sum(ctx, out, v, N, K, C);
}

/* Qwen2-MoE's shared expert behind its gate: per row i of out (N, C), with y (N, C) the shared
 * expert's output and z (N) the gate's logit,
 *   g = D(1 / (1 + expf(-z_i))),   out_i = R(out_i + D(y_i * g))
 * (expf: glibc's, on every backend; fp32 operations). */
static inline void moe_shared_combine(const td_ops *ctx, float *out, const float *y, const float *z,
                                      int N, int C)
{
    ctx->be->moe_shared_combine(ctx, out, y, z, N, C);
}

/* moe_combine backwards for one expert, dout (N, C) the gradient of the layer's output, y (n, C)
 * the expert's output rows: for q < n, p = rows[q], i = p / K,
 *   dw[p] = (float) sum_h dout_i[h] y_q[h]   (in double, h = 0 .. C-1 in order)
 *   dy_q  = D(w[p] * dout_i)                 (n, C)
 * Writes dw's n entries (dw: N * K) and dy. */
static inline void moe_combine_backward(const td_ops *ctx, float *dw, float *dy, const float *dout,
                                        const float *y, const int *rows, const float *w, int N, int n,
                                        int K, int C)
{
    ctx->be->moe_combine_backward(ctx, dw, dy, dout, y, rows, w, N, n, K, C);
}

/* moe_gather backwards: dx (N, C) row i = rows[q] / K (rows NULL: i = q) += dxe (n, C) row q,
 * in fp32, or with rounded: dx_i = R(dx_i + R(dxe_q)). */
static inline void moe_scatter_add(const td_ops *ctx, float *dx, const float *dxe, const int *rows,
                                   int N, int n, int K, int C, int rounded)
{
    ctx->be->moe_scatter_add(ctx, dx, dxe, rows, N, n, K, C, rounded);
}

/* moe_shared_combine backwards, dout and y (N, C), z (N): with s = 1 / (1 + expf(-z_i)) (fp32),
 *   dz_i = D((float)(<dout_i, y_i> * s * (1 - s)))   (the dot in double in h order, then double
 *                                                     products; 1 - s in fp32)
 *   dy_i = D(D(s) * dout_i)
 * Writes dz (N) and dy (N, C). */
static inline void moe_shared_combine_backward(const td_ops *ctx, float *dz, float *dy,
                                               const float *dout, const float *y, const float *z,
                                               int N, int C)
{
    ctx->be->moe_shared_combine_backward(ctx, dz, dy, dout, y, z, N, C);
}

#endif
