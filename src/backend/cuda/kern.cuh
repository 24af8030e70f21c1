/* tidal — device helpers shared by the CUDA op kernels (embedding.cu, rmsnorm.cu, rope.cu,
 * attention.cu, swiglu.cu, residual.cu, logsoftmax.cu): fp32 arithmetic without contraction,
 * the CPU's exponentials, warp and block reductions. Within the simulator's subset
 * (tests/cudasim/cudasim.h): warp shuffles, dynamic shared memory, __syncthreads, _rn
 * intrinsics.
 *
 * Why explicit roundings: the CPU build is ISO C (-std=c11), where GCC never contracts a * b + c
 * into an FMA; nvcc contracts by default (--fmad=true). Where the CPU has separate products
 * (RoPE, the o += p v of attention, the split-KV merge) the kernels use tdc_mul / tdc_add
 * (__fmul_rn / __fadd_rn, never contracted), so the sequence of fp32 roundings is the CPU's.
 * Division and sqrtf are IEEE (nvcc's defaults -prec-div=true -prec-sqrt=true; no fast-math).
 */
#ifndef TIDAL_CUDA_KERN_CUH
#define TIDAL_CUDA_KERN_CUH

#include "cuda_internal.cuh"

#include <math.h>

#define TDC_DEV __device__ static inline

TDC_DEV float tdc_mul(float a, float b) { return __fmul_rn(a, b); }
TDC_DEV float tdc_add(float a, float b) { return __fadd_rn(a, b); }
TDC_DEV float tdc_sub(float a, float b) { return __fsub_rn(a, b); }

/* libm's expf / logf / log1pf as near as the device gets to glibc's: the double function
 * rounded to float, the correctly rounded result but for rare double roundings. glibc's expf
 * differs from it for 8.7e-5 of the inputs in [-88, 0] (every 7th float measured); CUDA's own
 * expf (2 ulp) would differ far more often. */
TDC_DEV float tdc_expf(float x) { return (float)exp((double)x); }
TDC_DEV float tdc_logf(float x) { return (float)log((double)x); }
TDC_DEV float tdc_log1pf(float x) { return (float)log1p((double)x); }

/* td_expf (src/backend/cpu.h, the reference forms' vectorisable exponential), the same fp32
 * operations in the same order, uncontracted. */
TDC_DEV float tdc_td_expf(float x)
{
    x = x < -87.3f ? -87.3f : (x > 88.3f ? 88.3f : x);
    float n = tdc_sub(tdc_add(tdc_mul(x, 1.44269504088896341f), 12582912.0f), 12582912.0f);
    float r = tdc_sub(x, tdc_mul(n, 0.693359375f));
    r = tdc_add(r, tdc_mul(n, 2.12194440e-4f));
    float p = 1.9875691500e-4f;
    p = tdc_add(tdc_mul(p, r), 1.3981999507e-3f);
    p = tdc_add(tdc_mul(p, r), 8.3334519073e-3f);
    p = tdc_add(tdc_mul(p, r), 4.1665795894e-2f);
    p = tdc_add(tdc_mul(p, r), 1.6666665459e-1f);
    p = tdc_add(tdc_mul(p, r), 5.0000001201e-1f);
    p = tdc_add(tdc_add(tdc_mul(tdc_mul(p, r), r), r), 1.0f);
    float scale = tdc_float((uint32_t)((int32_t)n + 127) << 23);
    return tdc_mul(p, scale);
}

/* ---- KV stores ------------------------------------------------------------------------------
 * A K/V store holds floats (fmt TD_F32) or, a KV cache on this backend, codes of the recipe's
 * kv_cache format (ops.h td_kv_store_format): element idx's value is the code's times s (the fp8
 * cache's kv_scale where kv_write divided by it, else 1): the CPU cache's float, exactly. */
TDC_DEV float tdc_kv_get(const void *base, size_t idx, int fmt, float s)
{
    switch (fmt) {
    case 0: return ((const float *)base)[idx];
    case 1: return tdc_mul(tdc_bf16_dec(((const uint16_t *)base)[idx]), s);
    case 2: return tdc_mul(tdc_f16_dec(((const uint16_t *)base)[idx]), s);
    case 3: return tdc_mul(tdc_e4m3_dec(((const uint8_t *)base)[idx]), s);
    default: return tdc_mul(tdc_e5m2_dec(((const uint8_t *)base)[idx]), s);
    }
}

/* the code of x (already divided by s) at element idx */
TDC_DEV void tdc_kv_put(void *base, size_t idx, int fmt, float x)
{
    switch (fmt) {
    case 0: ((float *)base)[idx] = x; break;
    case 1: ((uint16_t *)base)[idx] = tdc_bf16_enc(x); break;
    case 2: ((uint16_t *)base)[idx] = tdc_f16_enc(x); break;
    case 3: ((uint8_t *)base)[idx] = tdc_e4m3_enc(x); break;
    default: ((uint8_t *)base)[idx] = tdc_e5m2_enc(x); break;
    }
}

/* ---- reductions (warps of 32; blocks a multiple of 32 threads) ---------------------------- */

#define TDC_FULL 0xffffffffu

TDC_DEV float tdc_warp_max(float v)
{
    for (int o = 16; o > 0; o >>= 1) {
        float w = __shfl_xor_sync(TDC_FULL, v, o);
        v = w > v ? w : v;
    }
    return v;
}

TDC_DEV float tdc_warp_sum(float v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TDC_FULL, v, o);
    return v;
}

TDC_DEV double tdc_warp_sum_d(double v)
{
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(TDC_FULL, v, o);
    return v;
}

/* Block-wide sum in double (every thread gets it); red: blockDim.x / 32 doubles of shared
 * memory. The order is fixed by the thread layout: the same result every run. */
TDC_DEV double tdc_block_sum_d(double v, double *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tdc_warp_sum_d(v);
    __syncthreads();                     /* red may still be read from a previous call */
    if (lane == 0) red[warp] = v;
    __syncthreads();
    double s = 0.0;
    for (int w = 0; w < nw; w++) s += red[w];
    return s;
}

/* Block-wide max in fp32 (every thread gets it); red: blockDim.x / 32 floats. */
TDC_DEV float tdc_block_max(float v, float *red)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    v = tdc_warp_max(v);
    __syncthreads();
    if (lane == 0) red[warp] = v;
    __syncthreads();
    float m = red[0];
    for (int w = 1; w < nw; w++) m = red[w] > m ? red[w] : m;
    return m;
}

/* td_log_softmax's rows (src/numerics/logprob.c) in place on w[0..V), one block a row, fmx the
 * row's block-wide max: w -= (float)(fmx + log(sum exp(w - fmx))). td_log_softmax sums in index
 * order in double; the block sums in another order, within (2n + 16) 2^-53 of it (n non-zero
 * terms; also a few ulp of exp / log on a real GPU): the float is taken from the block's sum when
 * both ends of that interval round to it, else thread 0 sums in td_log_sum_exp's order (force:
 * always). The sampler (sampling.cu) and B's rows kept on the device (token_metrics.cu) share it,
 * so both give the host's bits. fred, dred: blockDim.x / 32 floats and doubles of shared memory;
 * sh_lse: one shared float. Synchronises the block before it returns. */
#define TDC_U53 1.1102230246251565e-16
TDC_DEV void tdc_block_log_softmax_certified(float *w, int V, float fmx, int force, float *fred, double *dred,
                                             float *sh_lse)
{
    (void)fred;
    int tid = threadIdx.x, nt = blockDim.x;
    double sum = 0, n = 0;
    for (int j = tid; j < V; j += nt) {
        double e = exp((double)w[j] - fmx);
        sum += e;
        n += e > 0;
    }
    sum = tdc_block_sum_d(sum, dred);
    n = tdc_block_sum_d(n, dred);
    if (tid == 0) {
        float lse = 0.0f;
        if (fmx != -INFINITY) {
            double d = (2.0 * n + 16.0) * TDC_U53 * 1.01;     /* relative error of sum */
            double l = log(sum);
            double e = 1.01 * d + 8.0 * TDC_U53 * (fabs((double)fmx) + fabs(l));
            double c = fmx + l;
            float lo = (float)(c - e), hi = (float)(c + e);
            if (lo == hi && !force) lse = lo;
            else {   /* td_log_sum_exp itself */
                double s = 0;
                for (int j = 0; j < V; j++) s += exp((double)w[j] - fmx);
                lse = (float)(fmx + log(s));
            }
        }
        *sh_lse = lse;
    }
    __syncthreads();
    float lse = *sh_lse;
    for (int j = tid; j < V; j += nt) w[j] -= lse;
    __syncthreads();
}

/* An output that may be one of the op's inputs (in place): out staged with its contents when
 * it is the input itself (*d_in then points at it), else the input staged on its own. */
static inline float *tdc_out_in(float *out, const float *in, size_t bytes, const float **d_in)
{
    if (out == in) {
        float *d = (float *)tdc_out(out, bytes, 1);
        *d_in = d;
        return d;
    }
    *d_in = (const float *)tdc_in(in, bytes);
    return (float *)tdc_out(out, bytes, 0);
}

/* blocks for n elements at `threads` per block, grid-stride beyond 65535 * 16 blocks */
static inline unsigned tdc_blocks(size_t n, int threads)
{
    size_t b = (n + (size_t)threads - 1) / (size_t)threads;
    return (unsigned)(b < 1 ? 1 : b > 1048560 ? 1048560 : b);
}

/* RoPE's cos/sin row of position pos into cs[0..half) and sn[0..half) (a block's threads share
 * the loop; the caller syncs): a = pos * inv_freq[k] in fp32, cos and sin in double cast to
 * fp32 as the CPU's, then rounded to Dcs (TD_F32: kept) -- the forward's and the backward's one
 * table (rope.cu, rope_backward.cu: they differ only in which forms round it). */
__device__ static inline void tdc_rope_table(float *cs, float *sn, int pos, const float *inv_freq, int half, int Dcs)
{
    for (int k = threadIdx.x; k < half; k += blockDim.x) {
        float a = (float)pos * inv_freq[k];
        cs[k] = tdc_round(Dcs, (float)cos((double)a));
        sn[k] = tdc_round(Dcs, (float)sin((double)a));
    }
}

#endif
