/* tidal — logsoftmax_forward_cuda (ops.h logsoftmax_forward; CPU: logsoftmax_cpu in cpu.c over
 * logsoftmax_forward_ref in cpu_ref.c): in place on x (N, V), one block per row.
 *   1. T = ctx->temperature (when > 0 and != 1): x = L(x / T), L the logits' dtype with
 *      logits_temperature "activations" (recipe temp_in_act), else fp32
 *   2. mx = max x;  sum = sum_j e^(x_j - mx) with the reference's exponential (td_expf) and its
 *      summation structure: fp32 partial sums over blocks of 1024 logits, the blocks added in
 *      double in order (each block here is one warp's: 32 lane sums, then a shuffle tree, where
 *      the CPU's vector lanes sum in another order: the block sums agree to a few fp32 ulp)
 *   3. x = x - (mx + (float)log(sum)), rounded to the activations dtype with logsoftmax
 *      "activations" (recipe logsoftmax_act)
 * The activations dtype is the context recipe's (the lm_head's, td_recipe_for_head).
 * Dynamic shared memory: one double per 1024-block of the row. Scratch: none. */
#include "kern.cuh"

#define LSM_THREADS 256
#define LSM_CHUNK 1024

__global__ static void logsoftmax_rows(float *x, int V, float T, int L, int R)
{
    TD_DYN_SMEM(double, part);   /* nb block sums, then the 8 warps' maxima */
    int nb = (V + LSM_CHUNK - 1) / LSM_CHUNK;
    float *red = (float *)(part + nb);
    float *row = x + (size_t)blockIdx.x * V;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) {
        float v = row[j];
        if (T != 1.0f) row[j] = v = tdc_round(L, v / T);
        mx = v > mx ? v : mx;
    }
    mx = tdc_block_max(mx, red);   /* synchronises: the divided row is visible to all */
    for (int b = warp; b < nb; b += nw) {
        int j1 = (b + 1) * LSM_CHUNK < V ? (b + 1) * LSM_CHUNK : V;
        float s = 0.0f;
        for (int j = b * LSM_CHUNK + lane; j < j1; j += 32) s += tdc_td_expf(row[j] - mx);
        s = tdc_warp_sum(s);
        if (lane == 0) part[b] = (double)s;
    }
    __syncthreads();
    double sum = 0.0;
    for (int b = 0; b < nb; b++) sum += part[b];   /* every thread, the same order */
    float norm = mx + (float)log(sum);
    for (int j = threadIdx.x; j < V; j += blockDim.x) row[j] = tdc_round(R, row[j] - norm);
}

extern "C" void logsoftmax_forward_cuda(const td_ops *ctx, float *x, int N, int V)
{
    if (N <= 0 || V <= 0) return;
    const td_recipe *r = ctx->recipe;
    tdc_recipe k = tdc_recipe_of(ctx);
    float T = ctx->temperature > 0 ? ctx->temperature : 1.0f;
    int L = r && r->temp_in_act ? k.act : (int)TD_F32;
    int R = r && r->logsoftmax_act ? k.act : (int)TD_F32;
    int nb = (V + LSM_CHUNK - 1) / LSM_CHUNK;
    size_t smem = (size_t)nb * sizeof(double) + (LSM_THREADS / 32) * sizeof(float);
    float *d_x = (float *)tdc_out(x, (size_t)N * V * sizeof(float), 1);
    TD_LAUNCH(logsoftmax_rows, N, LSM_THREADS, smem, tdc_stream(), d_x, V, T, L, R);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
