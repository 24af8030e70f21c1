/* tidal — residual_forward_cuda and scale_forward_cuda (ops.h residual_forward,
 * scale_forward; CPU: residual_cpu and scale_cpu in cpu.c over the fp32 reference forms):
 *   residual   out = D(a + b), unrounded with residual fp32 (autocast's fp32 stream)
 *   scale      x = D(x * s)
 * D the activations dtype (fp32: no rounding). One fp32 operation each: the CPU's bits.
 * out == inp1 allowed (the stream updated in place). Scratch: none. */
#include "kern.cuh"

__global__ static void residual_elems(float *out, const float *a, const float *b, size_t n, int D)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = tdc_round(D, a[i] + b[i]);
}

__global__ static void scale_elems(float *x, float s, size_t n, int D)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = tdc_round(D, x[i] * s);
}

extern "C" void residual_forward_cuda(const td_ops *ctx, float *out, const float *inp1,
                                      const float *inp2, size_t n)
{
    if (n == 0) return;
    tdc_recipe k = tdc_recipe_of(ctx);
    size_t bytes = n * sizeof(float);
    const float *d_a, *d_b;
    float *d_out;
    if (out == inp2) {   /* the sum is symmetric: whichever input the output is */
        d_out = tdc_out_in(out, inp2, bytes, &d_b);
        d_a = (const float *)tdc_in(inp1, bytes);
    } else {
        d_out = tdc_out_in(out, inp1, bytes, &d_a);
        d_b = (const float *)tdc_in(inp2, bytes);
    }
    TD_LAUNCH(residual_elems, tdc_blocks(n, 256), 256, 0, tdc_stream(), d_out, d_a, d_b, n,
              k.residual_fp32 ? (int)TD_F32 : k.act);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" void scale_forward_cuda(const td_ops *ctx, float *x, float s, size_t n)
{
    if (n == 0) return;
    float *d_x = (float *)tdc_out(x, n * sizeof(float), 1);
    TD_LAUNCH(scale_elems, tdc_blocks(n, 256), 256, 0, tdc_stream(), d_x, s, n,
              tdc_recipe_of(ctx).act);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
