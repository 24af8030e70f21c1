/* tidal — rope_forward_cuda (ops.h rope_forward; CPU: rope_cpu in cpu.c, the fp32 reference
 * rope_forward_ref in cpu_ref.c): HF rotate-half RoPE in place on x (N, nheads, HD).
 * One block per row: the angles a = (float)pos * inv_freq[k] in fp32 and c = (float)cos((double)a),
 * s = (float)sin((double)a) as the CPU forms them (double cos/sin rounded to float: the same
 * float as glibc's but for a double result within an ulp of an fp32 halfway point), in shared
 * memory; then every (head, k) pair of the row. D the activations dtype:
 *   fp32 / fused   x0 c - x1 s, x1 c + x0 s in fp32, then D() once (identity in fp32)
 *   vllm           c, s rounded to D, the same fp32 rotation, D() once
 *   unfused (HF)   c, s rounded to D, D(D(x0 c) - D(x1 s)), D(D(x1 c) + D(x0 s))
 * Every fp32 product and sum is a separate rounding (tdc_mul / tdc_add, kern.cuh), as in the
 * CPU's ISO-C build: the results are the CPU's bit for bit. Scratch: none. */
#include "kern.cuh"

#define ROPE_THREADS 128

__global__ static void rope_rows(float *x, const int *pos, const float *inv_freq, int nheads,
                                 int HD, int D, int form)
{
    TD_DYN_SMEM(float, cs);   /* cs[half], then sn[half] */
    int half = HD / 2, i = blockIdx.x;
    float *sn = cs + half;
    tdc_rope_table(cs, sn, pos[i], inv_freq, half, form != TD_ROPE_FUSED ? D : (int)TD_F32);   /* D(cos) */
    __syncthreads();
    float *xi = x + (size_t)i * nheads * HD;
    for (int e = threadIdx.x; e < nheads * half; e += blockDim.x) {
        int h = e / half, k = e - h * half;
        float *xh = xi + (size_t)h * HD;
        float x0 = xh[k], x1 = xh[k + half], c = cs[k], s = sn[k];
        if (form == TD_ROPE_UNFUSED) {
            xh[k] = tdc_round(D, tdc_round(D, tdc_mul(x0, c)) - tdc_round(D, tdc_mul(x1, s)));
            xh[k + half] = tdc_round(D, tdc_round(D, tdc_mul(x1, c)) + tdc_round(D, tdc_mul(x0, s)));
        } else {   /* fp32 rotation, one rounding (fused, vllm; fp32: none) */
            xh[k] = tdc_round(D, tdc_sub(tdc_mul(x0, c), tdc_mul(x1, s)));
            xh[k + half] = tdc_round(D, tdc_add(tdc_mul(x1, c), tdc_mul(x0, s)));
        }
    }
}

extern "C" void rope_forward_cuda(const td_ops *ctx, float *x, const int *pos, const float *inv_freq,
                                  int N, int nheads, int HD)
{
    if (N <= 0 || nheads <= 0 || HD < 2) return;
    tdc_recipe k = tdc_recipe_of(ctx);
    /* the CPU runs the fp32 reference for fp32 activations whatever the form, then rounds */
    int form = k.act == TD_F32 ? TD_ROPE_FUSED : k.rope;
    float *d_x = (float *)tdc_out(x, (size_t)N * nheads * HD * sizeof(float), 1);
    const int *d_pos = (const int *)tdc_in(pos, (size_t)N * sizeof(int));
    const float *d_f = (const float *)tdc_const(inv_freq, (size_t)(HD / 2) * sizeof(float));
    TD_LAUNCH(rope_rows, N, ROPE_THREADS, (size_t)HD * sizeof(float), tdc_stream(), d_x, d_pos,
              d_f, nheads, HD, k.act, form);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
