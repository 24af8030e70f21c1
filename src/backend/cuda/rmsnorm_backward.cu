/* tidal — rmsnorm_backward_cuda (ops.h rmsnorm_backward; CPU: rmsnorm_backward_cpu in
 * cpu_backward.c over rmsnorm_backward_ref in cpu_backward_ref.c). The same op serves the hidden
 * norms (rows of C) and Qwen3's q/k norms (rows of HD, one per token and head).
 *   dinp[i] = D(dinp[i] + rs (dy w - (x rs) m)),  m = (float)(sum_c (double)(dy w) (x rs) / C)
 *     one block per row; every (dy w) (x rs) is exact in double, so the double sum differs from
 *     the CPU's in-order sum only by its order (~C 2^-53 relative), which moves the fp32 m only
 *     when the sum sits that close to an fp32 rounding boundary; the rest is the CPU's fp32
 *     products and differences, uncontracted (tdc_mul / tdc_sub / tdc_add), then the rounding
 *     to the activations dtype D that the CPU's act_round makes (none in fp32)
 *   dweight[c] += sum_i dy[i,c] (x[i,c] rs[i])   fp32, never rounded: one thread per column
 *     summing the rows in order from 0 into an fp32 sum, then added to dweight: the CPU's order,
 *     bit for bit (a column reduction without atomics)
 * Scratch: none. */
#include "kern.cuh"

#define RMSB_THREADS 256

__global__ static void rmsnorm_bwd_rows(float *dinp, const float *dout, const float *inp,
                                        const float *weight, const float *rstd, int C, int D)
{
    TD_DYN_SMEM(double, red);
    size_t i = blockIdx.x;
    const float *x = inp + i * C, *dy = dout + i * C;
    float *dx = dinp + i * C, rs = rstd[i];
    double dot = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x)
        dot += (double)tdc_mul(dy[c], weight[c]) * (double)tdc_mul(x[c], rs);
    dot = tdc_block_sum_d(dot, red);
    float m = (float)(dot / (double)C);
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float t = tdc_sub(tdc_mul(dy[c], weight[c]), tdc_mul(tdc_mul(x[c], rs), m));
        dx[c] = tdc_round(D, tdc_add(dx[c], tdc_mul(rs, t)));
    }
}

__global__ static void rmsnorm_bwd_weight(float *dweight, const float *dout, const float *inp,
                                          const float *rstd, int N, int C)
{
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s = 0.0f;
    for (int i = 0; i < N; i++)
        s = tdc_add(s, tdc_mul(dout[(size_t)i * C + c], tdc_mul(inp[(size_t)i * C + c], rstd[i])));
    dweight[c] = tdc_add(dweight[c], s);
}

extern "C" void rmsnorm_backward_cuda(const td_ops *ctx, float *dinp, float *dweight,
                                      const float *dout, const float *inp, const float *weight,
                                      const float *rstd, int N, int C)
{
    if (N <= 0 || C <= 0 || (!dinp && !dweight)) return;
    int D = tdc_recipe_of(ctx).act;
    size_t bytes = (size_t)N * C * sizeof(float);
    const float *d_dout = (const float *)tdc_in(dout, bytes);
    const float *d_inp = (const float *)tdc_in(inp, bytes);
    const float *d_rstd = (const float *)tdc_in(rstd, (size_t)N * sizeof(float));
    if (dinp) {
        const float *d_w = (const float *)tdc_const(weight, (size_t)C * sizeof(float));
        float *d_dinp = (float *)tdc_out(dinp, bytes, 1);
        TD_LAUNCH(rmsnorm_bwd_rows, N, RMSB_THREADS, (RMSB_THREADS / 32) * sizeof(double),
                  tdc_stream(), d_dinp, d_dout, d_inp, d_w, d_rstd, C, D);
        CUDA_CHECK_LAUNCH();
    }
    if (dweight) {
        float *d_dw = (float *)tdc_out(dweight, (size_t)C * sizeof(float), 1);
        TD_LAUNCH(rmsnorm_bwd_weight, (C + 127) / 128, 128, 0, tdc_stream(), d_dw, d_dout, d_inp,
                  d_rstd, N, C);
        CUDA_CHECK_LAUNCH();
    }
    tdc_done();
}
