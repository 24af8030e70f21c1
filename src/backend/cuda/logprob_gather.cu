/* tidal — logprob_gather_cuda (ops.h logprob_gather; CPU: logprob_gather_cpu in cpu.c): per row
 * of the log-softmax rows, the target's log-prob and the first column of the row's largest
 * value. What a trainer reads of a micro-batch's logits: N floats and N ints come back to the
 * host, not N * V.
 *
 * One block per row: each thread scans its columns j, j + 256, ... in increasing order keeping
 * the first largest (strict >), then a tree over the threads keeps the larger value, the lower
 * column on a tie: the first largest of the row, the CPU's answer. (A row holding NaN may give
 * another column than the CPU's scan, which never moves past a NaN it meets first: such a row's
 * loss is not finite, and top1 only feeds the token accuracy.) Dynamic shared memory: a value
 * and a column per thread. Scratch: none. */
#include "kern.cuh"

#define LPG_THREADS 256

__global__ static void logprob_gather_rows(float *tlogp, int *top1, const float *logp,
                                           const int *target, int N, int V)
{
    TD_DYN_SMEM(float, val);
    int *col = (int *)(val + blockDim.x);
    for (int i = blockIdx.x; i < N; i += gridDim.x) {
        const float *row = logp + (size_t)i * V;
        int best = threadIdx.x < (unsigned)V ? (int)threadIdx.x : 0;
        for (int j = threadIdx.x + blockDim.x; j < V; j += blockDim.x) best = row[j] > row[best] ? j : best;
        val[threadIdx.x] = row[best];
        col[threadIdx.x] = best;
        __syncthreads();
        for (int s = blockDim.x / 2; s > 0; s >>= 1) {
            if (threadIdx.x < (unsigned)s) {
                float v = val[threadIdx.x + s];
                int c = col[threadIdx.x + s];
                if (v > val[threadIdx.x] || (v == val[threadIdx.x] && c < col[threadIdx.x])) {
                    val[threadIdx.x] = v;
                    col[threadIdx.x] = c;
                }
            }
            __syncthreads();
        }
        if (threadIdx.x == 0) {
            tlogp[i] = row[target[i]];
            top1[i] = col[0];
        }
        __syncthreads();   /* val/col are the next row's */
    }
}

extern "C" void logprob_gather_cuda(const td_ops *ctx, float *tlogp, int *top1, const float *logp,
                                    const int *target, int N, int V)
{
    (void)ctx;
    if (N <= 0 || V <= 0) return;
    const float *d_logp = (const float *)tdc_in(logp, (size_t)N * V * sizeof(float));
    const int *d_t = (const int *)tdc_in(target, (size_t)N * sizeof(int));
    float *d_tl = (float *)tdc_out(tlogp, (size_t)N * sizeof(float), 0);
    int *d_top = (int *)tdc_out(top1, (size_t)N * sizeof(int), 0);
    unsigned grid = (unsigned)(N > 65535 ? 65535 : N);
    size_t smem = LPG_THREADS * (sizeof(float) + sizeof(int));
    TD_LAUNCH(logprob_gather_rows, grid, LPG_THREADS, smem, tdc_stream(), d_tl, d_top, d_logp, d_t, N, V);
    CUDA_CHECK_LAUNCH();
    tdc_done();   /* copies tlogp and top1 back (host memory) and synchronises */
}
