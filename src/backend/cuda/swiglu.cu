/* tidal — swiglu_forward_cuda (ops.h swiglu_forward; CPU: swiglu_cpu in cpu.c, the fp32
 * reference swiglu_forward_ref in cpu_ref.c): out (N, F) = silu(gate) * up, elementwise.
 *   fp32 (reference)   g / (1 + td_expf(-g)) * u      td_expf: the CPU reference's polynomial
 *                                                      exponential, same fp32 steps (kern.cuh)
 *   D = bf16 / fp16    D(D(g / (1 + expf(-g))) * u)   expf: glibc's, as a double exp rounded
 *                                                      to float (kern.cuh tdc_expf)
 * In place on gate allowed. Scratch: none. */
#include "kern.cuh"

__global__ static void swiglu_elems(float *out, const float *gate, const float *up, size_t n, int D)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = up[i];
        if (D == TD_F32) out[i] = g / (1.0f + tdc_td_expf(-g)) * u;
        else out[i] = tdc_round(D, tdc_round(D, g / (1.0f + tdc_expf(-g))) * u);
    }
}

extern "C" void swiglu_forward_cuda(const td_ops *ctx, float *out, const float *gate,
                                    const float *up, int N, int F)
{
    size_t n = (size_t)N * F, bytes = n * sizeof(float);
    if (n == 0) return;
    const float *d_gate, *d_up = (const float *)tdc_in(up, bytes);
    float *d_out = tdc_out_in(out, gate, bytes, &d_gate);
    TD_LAUNCH(swiglu_elems, tdc_blocks(n, 256), 256, 0, tdc_stream(), d_out, d_gate, d_up, n,
              tdc_recipe_of(ctx).act);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
