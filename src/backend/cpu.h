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

/* How GEMMs are cut for threads (fp32 and recipe GEMMs alike): the threads worth using for
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

#endif
