/* tidal — swiglu_backward_cuda (ops.h swiglu_backward; CPU: swiglu_backward_cpu in
 * cpu_backward.c over swiglu_backward_ref in cpu_backward_ref.c), elementwise on (N, F):
 *   s = 1 / (1 + td_expf(-g))                    the reference's polynomial exponential under
 *                                                every recipe (kern.cuh tdc_td_expf, its fp32
 *                                                steps), IEEE division
 *   dgate = D(dgate + ((dy u) s) (1 + g (1 - s)))
 *   dup   = D(dup + dy (g s))
 * in the CPU's C evaluation order, uncontracted (tdc_mul / tdc_add / tdc_sub), D the activations
 * dtype (act_round; none in fp32): the CPU's results bit for bit. Scratch: none. */
#include "kern.cuh"

__global__ static void swiglu_bwd_elems(float *dgate, float *dup, const float *dout,
                                        const float *gate, const float *up, size_t n, int D)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float g = gate[i], u = up[i], dy = dout[i];
        float s = 1.0f / tdc_add(1.0f, tdc_td_expf(-g));
        float a = tdc_mul(tdc_mul(tdc_mul(dy, u), s), tdc_add(1.0f, tdc_mul(g, tdc_sub(1.0f, s))));
        dgate[i] = tdc_round(D, tdc_add(dgate[i], a));
        dup[i] = tdc_round(D, tdc_add(dup[i], tdc_mul(dy, tdc_mul(g, s))));
    }
}

extern "C" void swiglu_backward_cuda(const td_ops *ctx, float *dgate, float *dup,
                                     const float *dout, const float *gate, const float *up, int N,
                                     int F)
{
    size_t n = (size_t)N * F, bytes = n * sizeof(float);
    if (n == 0) return;
    const float *d_dout = (const float *)tdc_in(dout, bytes);
    const float *d_gate = (const float *)tdc_in(gate, bytes);
    const float *d_up = (const float *)tdc_in(up, bytes);
    float *d_dg = (float *)tdc_out(dgate, bytes, 1), *d_du = (float *)tdc_out(dup, bytes, 1);
    TD_LAUNCH(swiglu_bwd_elems, tdc_blocks(n, 256), 256, 0, tdc_stream(), d_dg, d_du, d_dout,
              d_gate, d_up, n, tdc_recipe_of(ctx).act);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
