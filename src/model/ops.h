/* tidal — the named ops of the Llama-family forward, fp32 CPU reference (internal header).
 *
 * Every op takes a td_ops context first. Today it only carries threading; the precision
 * recipes of the next issue hang their rounding points here (GEMM operands, op boundaries,
 * attention algorithm), so the forward code that calls these ops does not change.
 * Shapes use the letters of config.h; N is a number of token rows.
 */
#ifndef TIDAL_MODEL_OPS_H
#define TIDAL_MODEL_OPS_H

#include <stddef.h>

#include "tidal/model.h"

typedef struct {
    int nthreads;      /* OpenMP threads the ops may use (>= 1) */
    /* precision recipe (ops_recipe.c); all NULL / 0 for the fp32 reference */
    const td_recipe *recipe;      /* the path's recipe, NULL = fp32 reference                */
    const td_recipe *head;        /* the recipe of the lm_head GEMM (td_recipe_for_head)         */
    const td_model_weights *w;    /* the recipe's rounded weights, NULL = the model's own     */
    int decode;                   /* this step is a decode step (split-KV attention applies)  */
    int cache;                    /* keys/values are stored in a KV cache (kv_cache rounding) */
    float *qin;                   /* quantised GEMM input, rows * max(C, F, NH*HD) floats     */
    float *gscratch;              /* fp8-fast accumulators, nthreads * gscratch_per_thread    */
    size_t gscratch_per_thread;
    /* per-layer observation (--layers): called after each layer with the residual stream */
    td_layer_fn layer_fn;
    void *layer_user;
    const int *row_seq;           /* (rows) sequence / slot of each row, for layer_fn        */
    const struct lora_rt *lora;   /* unmerged LoRA adapter (lora_run.c), NULL = none          */
} td_ops;

void td_ops_init(td_ops *ctx);

/* How GEMMs are cut for threads (ops.c and ops_recipe.c alike): the threads worth using for
 * an (N, IN) x (IN, total) product (one below 2^16 multiply-adds, at most one per 16 output
 * columns), and thread t of k's slice [c0, c1) of the output columns (multiples of 16). */
static inline int gemm_threads(const td_ops *ctx, int N, int IN, long total)
{
    int nt = ctx->nthreads;
    if ((long)N * IN * total < 1L << 16) nt = 1;
    if (nt > total / 16) nt = total / 16 > 0 ? (int)(total / 16) : 1;
    return nt;
}

static inline void gemm_slice(long total, int t, int k, long *c0, long *c1)
{
    long per = ((total + k - 1) / k + 15) / 16 * 16;
    *c0 = t * per;
    *c1 = *c0 + per < total ? *c0 + per : total;
}

/* out (N, C) = embed[tokens[i]] */
void embedding_forward(const td_ops *ctx, float *out, const int *tokens, const float *embed,
                       int N, int C);

/* HF RMSNorm: out = x * rsqrt(mean(x^2) + eps) * weight, per row of C. In place allowed. */
void rmsnorm_forward(const td_ops *ctx, float *out, const float *inp, const float *weight,
                     int N, int C, float eps);

/* out (N, OUT) = inp (N, IN) @ weight (OUT, IN)^T + bias (OUT, may be NULL).
 * The one GEMM of tidal: every projection and the lm_head go through here. */
void matmul_forward(const td_ops *ctx, float *out, const float *inp, const float *weight,
                    const float *bias, int N, int IN, int OUT);

/* n products of the same input in one go: out[j] (N, OUT[j]) = inp (N, IN) @ weight[j]^T
 * + bias[j] (bias or bias[j] may be NULL). q/k/v and gate/up projections use it. */
void matmul_forward_multi(const td_ops *ctx, int n, float *const *out, const float *inp,
                          const float *const *weight, const float *const *bias, int N, int IN,
                          const int *OUT);

/* HF rotate-half RoPE in place on x (N, nheads, HD), row i at position pos[i]:
 * for k < HD/2, a = pos*inv_freq[k]:  x[k] <- x[k] cos a - x[k+HD/2] sin a,
 *                                     x[k+HD/2] <- x[k+HD/2] cos a + x[k] sin a. */
void rope_forward(const td_ops *ctx, float *x, const int *pos, const float *inv_freq, int N,
                  int nheads, int HD);

/* Attention processes long runs of query rows by blocks of ATT_BLOCK rows; runs shorter than
 * ATT_MIN_RUN row by row. scratch must hold nthreads * ATT_BLOCK * max_keys floats. */
#define ATT_BLOCK 64
#define ATT_MIN_RUN 8

/* Causal GQA attention for N query rows. Row i attends to keys/values 0..pos[i] of its own
 * sequence, stored at kv + kv_off[i] + j*KVD (KVD = NKV*HD) in k and v:
 *   out[i, h] = softmax_j(q[i,h] . k[j, h/(NH/NKV)] / sqrt(HD)) @ v[j, h/(NH/NKV)].
 * q, out: (N, NH*HD). scratch: (nthreads, ATT_BLOCK, max_keys) floats. */
void attention_forward(const td_ops *ctx, float *out, const float *q, const float *k,
                       const float *v, const size_t *kv_off, const int *pos, int N, int NH,
                       int NKV, int HD, float *scratch, int max_keys);

/* SwiGLU: out (N, F) = silu(gate) * up, silu(x) = x / (1 + e^-x). In place on gate allowed. */
void swiglu_forward(const td_ops *ctx, float *out, const float *gate, const float *up, int N,
                    int F);

/* Residual add: x (n) += y (n). */
void residual_forward(const td_ops *ctx, float *x, const float *y, size_t n);

/* Log-softmax over each row of V, in place on x (N, V): x - max - log(sum(exp(x - max))). */
void logsoftmax_forward(const td_ops *ctx, float *x, int N, int V);

/* ---- the same ops under a recipe (ops_recipe.c): fall back to the above in fp32 ---- */
void act_round(const td_ops *ctx, float *x, size_t n);
void rmsnorm_forward_r(const td_ops *ctx, float *out, const float *inp, const float *weight,
                       int N, int C, float eps);
void matmul_forward_r(const td_ops *ctx, const td_recipe *r, float *out, const float *inp,
                      const float *weight, const float *bias, int N, int IN, int OUT);
void rope_forward_r(const td_ops *ctx, float *x, const int *pos, const float *inv_freq, int N,
                    int nheads, int HD);
void attention_forward_r(const td_ops *ctx, float *out, const float *q, const float *k,
                         const float *v, const size_t *kv_off, const int *pos, int N, int NH,
                         int NKV, int HD, float *scratch, int max_keys);
void swiglu_forward_r(const td_ops *ctx, float *out, const float *gate, const float *up, int N,
                      int F);
void residual_forward_r(const td_ops *ctx, float *x, const float *y, size_t n);
void kv_round_rows(const td_ops *ctx, float *store, const size_t *kv_off, const int *pos, int N,
                   int KVD);

#endif
