/* tidal — rope_backward_cuda (ops.h rope_backward; CPU: rope_backward_cpu in cpu_backward.c over
 * rope_backward_rounded in cpu_backward_ref.c): the inverse rotation in place on dx
 * (N, nheads, HD), one block per row as rope.cu's forward:
 *   a = (float)pos * inv_freq[k] in fp32, c = (float)cos((double)a), s = (float)sin((double)a),
 *   rounded to the activations dtype D for the HF (unfused) form only (the CPU's rule: every
 *   other form, and no recipe, keeps them fp32);
 *   g0' = D(g0 c + g1 s),  g1' = D(g1 c - g0 s)
 * fp32 products and sums uncontracted (tdc_mul / tdc_add / tdc_sub), then the act_round of the
 * CPU: the CPU's results bit for bit. Scratch: none. */
#include "kern.cuh"

#define ROPEB_THREADS 128

__global__ static void rope_bwd_rows(float *dx, const int *pos, const float *inv_freq, int nheads,
                                     int HD, int Dcs, int D)
{
    TD_DYN_SMEM(float, cs);   /* cs[half], then sn[half] */
    int half = HD / 2, i = blockIdx.x;
    float *sn = cs + half;
    tdc_rope_table(cs, sn, pos[i], inv_freq, half, Dcs);
    __syncthreads();
    float *gi = dx + (size_t)i * nheads * HD;
    for (int e = threadIdx.x; e < nheads * half; e += blockDim.x) {
        int h = e / half, k = e - h * half;
        float *g = gi + (size_t)h * HD;
        float g0 = g[k], g1 = g[k + half], c = cs[k], s = sn[k];
        g[k] = tdc_round(D, tdc_add(tdc_mul(g0, c), tdc_mul(g1, s)));
        g[k + half] = tdc_round(D, tdc_sub(tdc_mul(g1, c), tdc_mul(g0, s)));
    }
}

extern "C" void rope_backward_cuda(const td_ops *ctx, float *dx, const int *pos,
                                   const float *inv_freq, int N, int nheads, int HD)
{
    if (N <= 0 || nheads <= 0 || HD < 2) return;
    tdc_recipe k = tdc_recipe_of(ctx);
    int unfused = ctx->recipe && ctx->recipe->rope == TD_ROPE_UNFUSED;
    float *d_x = (float *)tdc_out(dx, (size_t)N * nheads * HD * sizeof(float), 1);
    const int *d_pos = (const int *)tdc_in(pos, (size_t)N * sizeof(int));
    const float *d_f = (const float *)tdc_const(inv_freq, (size_t)(HD / 2) * sizeof(float));
    TD_LAUNCH(rope_bwd_rows, N, ROPEB_THREADS, (size_t)HD * sizeof(float), tdc_stream(), d_x,
              d_pos, d_f, nheads, HD, unfused ? k.act : (int)TD_F32, k.act);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
