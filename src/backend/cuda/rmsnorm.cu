/* tidal — rmsnorm_forward_cuda (ops.h rmsnorm_forward; CPU: rmsnorm_cpu in cpu.c, the fp32
 * reference rmsnorm_forward_ref in cpu_ref.c). One block per row of C (rows may be the N * NH
 * heads of a q/k-norm), rs = 1 / sqrtf((float)(sum x^2 / C) + eps) with the sum of squares
 * accumulated in double as the CPU does (each x^2 is exact in double; only the order of the
 * additions differs, which changes the fp32 rs only when the double sum sits within ~C * 2^-53
 * of an fp32 rounding boundary), then per element, D the activations dtype:
 *   form 0 (unfused, HF / vLLM)        D(D(x rs) w)
 *   form 1 (fused, fused-add)          D(x rs w)          (x rs then * w: two fp32 products)
 *   form 2 (residual fp32, or D fp32)  (x rs) w
 * In place (out == inp) is allowed: a thread writes only the elements it read itself.
 * Scratch: none. */
#include "kern.cuh"

#define RMS_THREADS 256

__global__ static void rmsnorm_rows(float *out, float *rstd, const float *inp, const float *weight,
                                    int C, float eps, int D, int form)
{
    TD_DYN_SMEM(double, red);
    const float *x = inp + (size_t)blockIdx.x * C;
    float *y = out + (size_t)blockIdx.x * C;
    double ss = 0.0;
    for (int c = threadIdx.x; c < C; c += blockDim.x) ss += (double)x[c] * (double)x[c];
    ss = tdc_block_sum_d(ss, red);
    float rs = 1.0f / sqrtf((float)(ss / (double)C) + eps);
    if (rstd && threadIdx.x == 0) rstd[blockIdx.x] = rs;
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        float xr = x[c] * rs;
        if (form == 0) y[c] = tdc_round(D, tdc_round(D, xr) * weight[c]);
        else if (form == 1) y[c] = tdc_round(D, xr * weight[c]);
        else y[c] = xr * weight[c];
    }
}

extern "C" void rmsnorm_forward_cuda(const td_ops *ctx, float *out, float *rstd, const float *inp,
                                     const float *weight, int N, int C, float eps)
{
    if (N <= 0 || C <= 0) return;
    tdc_recipe k = tdc_recipe_of(ctx);
    int form = k.act == TD_F32 ? 2 : k.norm;
    size_t bytes = (size_t)N * C * sizeof(float);
    const float *d_w = (const float *)tdc_const(weight, (size_t)C * sizeof(float));
    const float *d_in;
    float *d_out = tdc_out_in(out, inp, bytes, &d_in), *d_rstd = NULL;
    if (rstd) d_rstd = (float *)tdc_out(rstd, (size_t)N * sizeof(float), 0);
    TD_LAUNCH(rmsnorm_rows, N, RMS_THREADS, (RMS_THREADS / 32) * sizeof(double), tdc_stream(),
              d_out, d_rstd, d_in, d_w, C, eps, k.act, form);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
