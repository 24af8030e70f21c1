/* tidal — the CPU backend's pieces (internal header): the fp32 reference forms of the op list
 * (cpu_ref.c), with the op list's names plus `_ref` and its argument order, and how GEMMs are
 * cut over threads. The backend table itself is td_backend_cpu (cpu.c, declared in ops.h). */
#ifndef TIDAL_BACKEND_CPU_H
#define TIDAL_BACKEND_CPU_H

#include "../model/ops.h"

void cpu_init(td_ops *ctx);   /* one OpenMP pool, OpenBLAS single-threaded inside it */

void embedding_forward_ref(const td_ops *ctx, float *out, const int *tokens, const float *embed,
                           int N, int C);
void rmsnorm_forward_ref(const td_ops *ctx, float *out, float *rstd, const float *inp,
                         const float *weight, int N, int C, float eps);
void matmul_forward_ref(const td_ops *ctx, int n, float *const *out, const float *inp,
                        const float *const *weight, const float *const *bias, int N, int IN,
                        const int *OUT);
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

/* How GEMMs are cut for threads (fp32 and recipe GEMMs alike): the output columns, laid end
 * to end over the products of one call, are cut into fixed tiles of TD_GEMM_TILE columns, each
 * tile one GEMM call of its own; threads take whole tiles. The tiles do not depend on the
 * thread count, so neither does any result: OpenBLAS's sgemm/sgemv can give a column another
 * sum when the call's width or offset changes (it did, when the columns were split in as many
 * slices as threads). gemm_threads: the threads worth using for an (N, IN) x (IN, total)
 * product (one below 2^16 multiply-adds, at most one per tile); gemm_slice: thread t of k's
 * columns [c0, c1), a run of whole tiles. */
#define TD_GEMM_TILE 128

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
