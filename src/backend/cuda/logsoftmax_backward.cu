/* tidal — logsoftmax_backward_cuda (ops.h logsoftmax_backward; CPU: logsoftmax_backward_ref in
 * cpu_backward_ref.c, which the CPU table runs under every recipe: fp32 over the fp32 log-probs):
 *   dx[i, j] = (-c) td_expf(logp[i, j]),  then dx[i, target[i]] += c,   c = dlogp[i]
 * and a row with c == 0 gets zeros. Written, not accumulated; dx == logp allowed (in place: each
 * element is read and written by one thread). td_expf's fp32 steps (kern.cuh tdc_td_expf) and
 * the same two fp32 operations: the CPU's results bit for bit. Scratch: none. */
#include "kern.cuh"

#define LSMB_THREADS 256

__global__ static void logsoftmax_bwd_rows(float *dx, const float *logp, const int *target,
                                           const float *dlogp, int N, int V)
{
    for (int i = blockIdx.y; i < N; i += gridDim.y) {
        float c = dlogp[i];
        int t = target[i];
        for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < V; j += gridDim.x * blockDim.x) {
            size_t e = (size_t)i * V + (size_t)j;
            float v = 0.0f;
            if (c != 0.0f) {
                v = tdc_mul(-c, tdc_td_expf(logp[e]));
                if (j == t) v = tdc_add(v, c);
            }
            dx[e] = v;
        }
    }
}

extern "C" void logsoftmax_backward_cuda(const td_ops *ctx, float *dx, const float *logp,
                                         const int *target, const float *dlogp, int N, int V)
{
    (void)ctx;
    if (N <= 0 || V <= 0) return;
    const float *d_logp;
    float *d_dx = tdc_out_in(dx, logp, (size_t)N * V * sizeof(float), &d_logp);
    const int *d_t = (const int *)tdc_in(target, (size_t)N * sizeof(int));
    const float *d_c = (const float *)tdc_in(dlogp, (size_t)N * sizeof(float));
    unsigned bx = (unsigned)((V + LSMB_THREADS - 1) / LSMB_THREADS);
    dim3 grid(bx > 64 ? 64 : bx, (unsigned)(N > 65535 ? 65535 : N));
    TD_LAUNCH(logsoftmax_bwd_rows, grid, LSMB_THREADS, 0, tdc_stream(), d_dx, d_logp, d_t, d_c, N, V);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
