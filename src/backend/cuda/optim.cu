/* tidal — the optimiser's element-wise steps on the device (td_backend_cuda's optim_* entries,
 * src/model/ops.h; CPU: src/backend/cpu_optim.c), so a trainer's fp32 masters, gradients and
 * AdamW moments stay in device buffers through a step:
 *   optim_adamw_cuda   AdamW per element, the CPU's fp32 operations in its order, uncontracted
 *                      (tdc_mul / tdc_add, IEEE division and sqrtf): the CPU's results bit for
 *                      bit on the same inputs
 *   optim_scale_cuda   g *= k in fp32: bit for bit
 *   optim_sumsq_cuda   sum of g^2 in double: a fixed grid (at most SQ_BLOCKS blocks of SQ_THREADS,
 *                      each thread a strided run, then a block tree), the blocks' sums added on
 *                      the host in block order: the same result every run, not the CPU's vector
 *                      order (the two differ in the double's last bits)
 * Buffers: device memory (a host pointer is staged like any op's output). Scratch slot MISC:
 * the blocks' sums. */
#include "kern.cuh"

#define OPT_THREADS 256
#define SQ_THREADS 256
#define SQ_BLOCKS 256

__global__ static void adamw_elems(float *param, const float *grad, float *m1, float *m2, size_t n,
                                   td_adamw_k k)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float p = k.decay_on ? tdc_mul(param[i], k.decay) : param[i];
        float g = grad[i];
        float m = tdc_mul(m1[i], k.b1);
        m = tdc_add(m, tdc_mul(k.a1, g));
        float v = tdc_mul(m2[i], k.b2);
        v = tdc_add(v, tdc_mul(k.a2, tdc_mul(g, g)));
        float denom = tdc_add(__fdiv_rn(__fsqrt_rn(v), k.bc2_sqrt), k.eps);
        param[i] = tdc_add(p, tdc_mul(k.step_size, __fdiv_rn(m, denom)));
        m1[i] = m;
        m2[i] = v;
    }
}

__global__ static void scale_elems(float *g, size_t n, float k)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        g[i] = tdc_mul(g[i], k);
}

__global__ static void sumsq_blocks(double *part, const float *g, size_t n)
{
    TD_DYN_SMEM(double, red);
    double s = 0.0;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        s += (double)g[i] * (double)g[i];
    s = tdc_block_sum_d(s, red);
    if (threadIdx.x == 0) part[blockIdx.x] = s;
}

static unsigned elem_blocks(size_t n)
{
    size_t b = (n + OPT_THREADS - 1) / OPT_THREADS;
    return (unsigned)(b > 4096 ? 4096 : b ? b : 1);
}

extern "C" void optim_adamw_cuda(float *param, const float *grad, float *m1, float *m2, size_t n,
                                 const td_adamw_k *k)
{
    if (!n) return;
    size_t bytes = n * sizeof(float);
    float *d_p = (float *)tdc_out(param, bytes, 1), *d_m1 = (float *)tdc_out(m1, bytes, 1);
    float *d_m2 = (float *)tdc_out(m2, bytes, 1);
    const float *d_g = (const float *)tdc_in(grad, bytes);
    TD_LAUNCH(adamw_elems, elem_blocks(n), OPT_THREADS, 0, tdc_stream(), d_p, d_g, d_m1, d_m2, n, *k);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" void optim_scale_cuda(float *g, size_t n, float k)
{
    if (!n) return;
    float *d_g = (float *)tdc_out(g, n * sizeof(float), 1);
    TD_LAUNCH(scale_elems, elem_blocks(n), OPT_THREADS, 0, tdc_stream(), d_g, n, k);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" double optim_sumsq_cuda(const float *g, size_t n)
{
    if (!n) return 0.0;
    size_t b = (n + SQ_THREADS - 1) / SQ_THREADS;
    unsigned nb = (unsigned)(b > SQ_BLOCKS ? SQ_BLOCKS : b);
    const float *d_g = (const float *)tdc_in(g, n * sizeof(float));
    double *part = (double *)tdc_scratch(TDC_SLOT_MISC, SQ_BLOCKS * sizeof(double));
    TD_LAUNCH(sumsq_blocks, nb, SQ_THREADS, (SQ_THREADS / 32) * sizeof(double), tdc_stream(), part, d_g, n);
    CUDA_CHECK_LAUNCH();
    double host[SQ_BLOCKS];
    CUDA_CHECK(cudaMemcpyAsync(host, part, nb * sizeof(double), cudaMemcpyDeviceToHost, tdc_stream()));
    tdc_d2h_count(nb * sizeof(double));
    CUDA_CHECK(cudaStreamSynchronize(tdc_stream()));
    tdc_done();
    double s = 0.0;
    for (unsigned i = 0; i < nb; i++) s += host[i];
    return s;
}
