/* tidal — the CPU backend's pieces (internal header): the fp32 reference forms of the op list
 * (cpu_ref.c), with the op list's names plus `_ref` and its argument order, and how GEMMs are
 * cut over threads. The backend table itself is td_backend_cpu (cpu.c, declared in ops.h). */
#ifndef TIDAL_BACKEND_CPU_H
#define TIDAL_BACKEND_CPU_H

#include "../model/ops.h"
#include "tidal/isa.h"

#include <stdint.h>

/* the activations' dtype D of ctx's recipe (fp32 without one) */
static inline td_format act_of(const td_ops *ctx) { return ctx->recipe ? ctx->recipe->activations : TD_F32; }

/* e^x for x in any float range: 2^n * e^r with n = round(x/ln2), |r| <= ln2/2, and the Cephes
 * expf minimax polynomial for e^r. Clamped to the normal range (e^-87.3 .. e^88.3). */
static inline __attribute__((always_inline)) float td_expf(float x)
{
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
    float n = (x * 1.44269504088896341f + 12582912.0f) - 12582912.0f; /* round to nearest */
    float r = x - n * 0.693359375f;
    r = r + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int32_t i; float f; } scale;
    scale.i = (int32_t)((uint32_t)((int32_t)n + 127) << 23);   /* unsigned: NaN inputs give INT_MIN here */
    return p * scale.f;
}

/* e[j] = e^-x[j] for j < m = min(n, TD_EXP_BLOCK), returns m: the exponentials of a block ahead
 * of the loop that uses them (the SwiGLU forward and backward: in one loop GCC carried td_expf's
 * clamp through the rest of the expression and ran its arm of x < -88.3 on every lane, a
 * subnormal quotient and a microcode assist per vector on Intel; cpu_ref.c span_swiglu) */
enum { TD_EXP_BLOCK = 256 };
static inline __attribute__((always_inline)) size_t td_expneg_block(const float *x, size_t n, float *e)
{
    size_t m = n < TD_EXP_BLOCK ? n : TD_EXP_BLOCK;
    #pragma omp simd
    for (size_t j = 0; j < m; j++) e[j] = td_expf(-x[j]);
    return m;
}

/* TD_CLONES (tidal/isa.h): the elementwise ops' inner loops at the CPU's width */

/* Files whose loops call td_expf add #pragma GCC optimize("no-trapping-math") (cpu_ref.c says
 * why). */

/* the optimiser's steps (cpu_optim.c; ops.h optim_*) */
void optim_adamw_cpu(float *param, const float *grad, float *m1, float *m2, size_t n, const td_adamw_k *k);
double optim_sumsq_cpu(const float *g, size_t n);
void optim_scale_cpu(float *g, size_t n, float k);

void cpu_init(td_ops *ctx);   /* one OpenMP pool, OpenBLAS single-threaded inside it */

void embedding_forward_ref(const td_ops *ctx, float *out, const int *tokens, const td_wmat *embed,
                           int N, int C);
void rmsnorm_forward_ref(const td_ops *ctx, float *out, float *rstd, const float *inp,
                         const float *weight, int N, int C, float eps);
void matmul_forward_ref(const td_ops *ctx, int n, float *const *out, const float *inp,
                        const td_wmat *weight, const float *const *bias, int N, int IN,
                        const int *OUT);
/* the cos and sin table of inv_freq (half wide) covering positions pos[0 .. N): row p at
 * p * 2 half, half cos then half sin (cpu_ref.c) */
const float *rope_cos_sin_table(const float *inv_freq, int half, const int *pos, int N);
void rope_forward_ref(const td_ops *ctx, float *x, const int *pos, const float *inv_freq, int N,
                      int nheads, int HD);
void attention_forward_ref(const td_ops *ctx, float *out, float *lse, const float *q,
                           const float *k, const float *v, const size_t *kv_off, const int *pos,
                           int N, int NH, int NKV, int HD, float *scratch, int max_keys);
void swiglu_forward_ref(const td_ops *ctx, float *out, const float *gate, const float *up, int N,
                        int F);
void residual_forward_ref(const td_ops *ctx, float *out, const float *inp1, const float *inp2,
                          size_t n);
void scale_forward_ref(const td_ops *ctx, float *x, float s, size_t n);
void logsoftmax_forward_ref(const td_ops *ctx, float *x, int N, int V);

/* The backward reference forms (cpu_backward_ref.c), and the pieces the recipe forms share:
 * the same maths with a rounding format D for what the op feeds its GEMMs (F32: none). */
void embedding_backward_ref(const td_ops *ctx, float *dembed, const float *dout,
                            const int *tokens, int N, int C);
void rmsnorm_backward_ref(const td_ops *ctx, float *dinp, float *dweight, const float *dout,
                          const float *inp, const float *weight, const float *rstd, int N, int C);
void matmul_backward_ref(const td_ops *ctx, float *dinp, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight, int N, int IN,
                         int OUT);
void rope_backward_ref(const td_ops *ctx, float *dx, const int *pos, const float *inv_freq, int N,
                       int nheads, int HD);
void rope_backward_rounded(const td_ops *ctx, td_format D, float *dx, const int *pos,
                           const float *inv_freq, int N, int nheads, int HD);
void attention_backward_ref(const td_ops *ctx, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, const int *pos, int N, int NH, int NKV, int HD,
                            float *scratch, int max_keys);
void attention_backward_rounded(const td_ops *ctx, td_format D, float *dq, float *dk, float *dv,
                                const float *dout, const float *q, const float *k,
                                const float *v, const float *out, const float *lse,
                                const int *pos, int N, int NH, int NKV, int HD, float *scratch,
                                int max_keys);
void swiglu_backward_ref(const td_ops *ctx, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, int N, int F);
void logsoftmax_backward_ref(const td_ops *ctx, float *dx, const float *logp, const int *target,
                             const float *dlogp, int N, int V);
/* Threaded accumulating GEMMs (row-major): C (M, N) += alpha * op(A) . op(B) with
 *   nn: A (M, K), B (K, N);   tn: A (K, M) transposed;   nt: B (N, K) transposed. */
void gemm_nn_acc(const td_ops *ctx, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float *C, int ldc);
void gemm_tn_acc(const td_ops *ctx, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float *C, int ldc);
void gemm_nt_acc(const td_ops *ctx, int M, int N, int K, float alpha, const float *A, int lda,
                 const float *B, int ldb, float *C, int ldc);
/* db (OUT) += column sums of dout (N, OUT) */
void bias_grad_acc(const td_ops *ctx, float *db, const float *dout, int N, int OUT);

/* Thread t's weight tile scratch of ctx (TD_GEMM_TILE rows of the widest GEMM input; NULL
 * when every weight is fp32). */
float *wtile_scratch(const td_ops *ctx, int t);

/* The backward GEMMs' host scratch (cpu_backward.c), kept per thread between calls and grown to
 * the largest call; td_backend_cpu.scratch_release frees the calling thread's. */
void cpu_scratch_release(void);

/* x (n) rounded in place to the context recipe's activations dtype (cpu.c): what an op writes
 * at a kernel boundary, forward or backward. */
void act_round(const td_ops *ctx, float *x, size_t n);

/* The recipe forms of the backward ops (cpu_backward.c), entries of td_backend_cpu. */
void embedding_backward_cpu(const td_ops *ctx, float *dembed, const float *dout,
                            const int *tokens, int N, int C);
void rmsnorm_backward_cpu(const td_ops *ctx, float *dinp, float *dweight, const float *dout,
                          const float *inp, const float *weight, const float *rstd, int N, int C);
void matmul_backward_cpu(const td_ops *ctx, float *dinp, float *dweight, float *dbias,
                         const float *dout, const float *inp, const float *weight, int N, int IN,
                         int OUT);
void rope_backward_cpu(const td_ops *ctx, float *dx, const int *pos, const float *inv_freq, int N,
                       int nheads, int HD);
void attention_backward_cpu(const td_ops *ctx, float *dq, float *dk, float *dv, const float *dout,
                            const float *q, const float *k, const float *v, const float *out,
                            const float *lse, const int *pos, int N, int NH, int NKV, int HD,
                            float *scratch, int max_keys);
void swiglu_backward_cpu(const td_ops *ctx, float *dgate, float *dup, const float *dout,
                         const float *gate, const float *up, int N, int F);

/* a mixture of experts' row ops (cpu_moe.c; ops.h moe_*), moe.c's arithmetic in its order */
void moe_gather_cpu(const td_ops *ctx, float *out, const float *x, const int *rows, int N, int n, int K, int C);
void moe_combine_cpu(const td_ops *ctx, float *out, const float *y, const int *rows, const float *w, int N, int n,
                     int K, int C);
void moe_scatter_cpu(const td_ops *ctx, float *v, const float *y, const int *rows, const float *w, int N, int n,
                     int K, int C);
void moe_sum_cpu(const td_ops *ctx, float *out, const float *v, int N, int K, int C);
void moe_shared_combine_cpu(const td_ops *ctx, float *out, const float *y, const float *z, int N, int C);
void moe_combine_backward_cpu(const td_ops *ctx, float *dw, float *dy, const float *dout, const float *y,
                              const int *rows, const float *w, int N, int n, int K, int C);
void moe_scatter_add_cpu(const td_ops *ctx, float *dx, const float *dxe, const int *rows, int N, int n, int K,
                         int C, int rounded);
void moe_shared_combine_backward_cpu(const td_ops *ctx, float *dz, float *dy, const float *dout,
                                     const float *y, const float *z, int N, int C);
/* vLLM's moe_sum over host rows in format D (moe_sum_cpu; tests call it by name) */
void moe_sum_topk(td_format D, int N, int K, int C, const float *v, float *out);

/* How GEMMs are cut for threads (fp32 and recipe GEMMs alike): the output columns, laid end
 * to end over the products of one call, are cut into fixed tiles of TD_GEMM_TILE columns, each
 * tile one GEMM call of its own; threads take whole tiles. The tiles do not depend on the
 * thread count, so neither does any result: OpenBLAS's sgemm can give a column another
 * sum when the call's width or offset changes (it did, when the columns were split in as many
 * slices as threads). gemm_threads: the threads worth using for an (N, IN) x (IN, total)
 * product (one below 2^16 multiply-adds, at most one per tile); gemm_slice: thread t of k's
 * columns [c0, c1), a run of whole tiles. */
/* TD_GEMM_TILE (128) is defined in ops.h */

static inline int gemm_threads(const td_ops *ctx, int N, int IN, long total)
{
    int nt = ctx->nthreads;
    long tiles = (total + TD_GEMM_TILE - 1) / TD_GEMM_TILE;
    if ((long)N * IN * total < 1L << 16) nt = 1;
    if (nt > tiles) nt = tiles > 0 ? (int)tiles : 1;
    return nt;
}

static inline void gemm_slice(long total, int t, int k, long *c0, long *c1)
{
    long tiles = (total + TD_GEMM_TILE - 1) / TD_GEMM_TILE;
    *c0 = tiles * t / k * TD_GEMM_TILE;
    *c1 = tiles * (t + 1) / k * TD_GEMM_TILE;
    if (*c0 > total) *c0 = total;
    if (*c1 > total) *c1 = total;
}

#endif
