/* tidal — a mixture of experts' row ops backwards on the device (ops.h moe_combine_backward,
 * moe_scatter_add, moe_shared_combine_backward; CPU: src/backend/cpu_moe.c, moe.c's arithmetic):
 *   combine_backward  dw_p = (float) sum_h dout_i[h] y_q[h]      p = rows[q], i = p / K; the sum in
 *                                                                double, h = 0 .. C-1 in order
 *                     dy_q = D(w_p * dout_i)
 *   scatter_add       dx_i = R(dx_i + R(dxe_q))  (rounded; else R = fp32: dx_i + dxe_q)
 *   shared_backward   s = 1 / (1 + expf(-z_i)),  dz_i = D((float)(<dout_i, y_i> * s * (1 - s))),
 *                     dy_i = D(D(s) * dout_i)
 * D the activations dtype, R the stream's; tdc_round, uncontracted fp32 operations, glibc's expf
 * (expf_glibc.cuh) and the double sums in the CPU's order: the CPU's bits.
 *
 * The dot products are one thread per pair (or row) summing its C products in column order: a
 * double sum's bits depend on its order, and the CPU's is the sequential one (each product of two
 * floats is exact in double, so only the additions round). The element-wise parts are one thread
 * per (pair, column). scatter_add adds into dx: a row listed twice in one call (adjacent, see
 * moe.cu) is added by its first pair's thread in list order. Scratch: none. */
#include "expf_glibc.cuh"

#define MOE_THREADS 256

static dim3 pair_grid(int n, int C)
{
    return dim3((unsigned)n, (unsigned)((C + MOE_THREADS - 1) / MOE_THREADS));
}

/* the sum of a[h] * b[h] in double, h in order (the CPU's dot) */
__device__ static double moe_dot(const float *a, const float *b, int C)
{
    double s = 0;
    for (int h = 0; h < C; h++) s = s + (double)a[h] * (double)b[h];   /* exact products: one rounding each */
    return s;
}

__global__ static void moe_dw_pairs(float *dw, const float *dout, const float *y, const int *rows, int n, int K,
                                    int C)
{
    int q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= n) return;
    int p = rows[q];
    dw[p] = (float)moe_dot(dout + (size_t)(p / K) * C, y + (size_t)q * C, C);
}

__global__ static void moe_dy_pairs(float *dy, const float *dout, const int *rows, const float *w, int K, int C,
                                    int D)
{
    int q = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
    if (h >= C) return;
    int p = rows[q];
    dy[(size_t)q * C + h] = tdc_round(D, tdc_mul(w[p], dout[(size_t)(p / K) * C + h]));
}

/* rows NULL: pair q is row q */
__global__ static void moe_scatter_add_rows(float *dx, const float *dxe, const int *rows, int n, int K, int C, int R)
{
    int q = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
    int i = rows ? rows[q] / K : q;
    if (h >= C || (rows && q > 0 && rows[q - 1] / K == i)) return;   /* a run's first pair adds the run */
    float *d = dx + (size_t)i * C + h, acc = *d;
    for (int t = q; t < n && (rows ? rows[t] / K : t) == i; t++)
        acc = tdc_round(R, tdc_add(acc, tdc_round(R, dxe[(size_t)t * C + h])));
    *d = acc;
}

/* the gate's sigmoid in fp32, F.sigmoid's steps */
__device__ static inline float moe_sigmoid(float z) { return 1.0f / tdc_add(1.0f, tdc_expf_glibc(-z)); }

__global__ static void moe_dz_rows(float *dz, const float *dout, const float *y, const float *z, int N, int C, int D)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    float s = moe_sigmoid(z[i]);
    double d = moe_dot(dout + (size_t)i * C, y + (size_t)i * C, C) * (double)s;
    dz[i] = tdc_round(D, (float)(d * (double)tdc_sub(1.0f, s)));
}

__global__ static void moe_shared_dy_elems(float *dy, const float *dout, const float *z, size_t n, int C, int D)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x)
        dy[e] = tdc_round(D, tdc_mul(tdc_round(D, moe_sigmoid(z[e / (size_t)C])), dout[e]));
}

extern "C" void moe_combine_backward_cuda(const td_ops *ctx, float *dw, float *dy, const float *dout, const float *y,
                                          const int *rows, const float *w, int N, int n, int K, int C)
{
    if (n <= 0 || C <= 0) return;
    const int *d_rows = (const int *)tdc_in(rows, (size_t)n * sizeof(int));
    const float *d_w = (const float *)tdc_in(w, (size_t)N * K * sizeof(float));
    const float *d_dout = (const float *)tdc_in(dout, (size_t)N * C * sizeof(float));
    const float *d_y = (const float *)tdc_in(y, (size_t)n * C * sizeof(float));
    float *d_dw = (float *)tdc_out(dw, (size_t)N * K * sizeof(float), 1);   /* the other pairs' entries kept */
    float *d_dy = (float *)tdc_out(dy, (size_t)n * C * sizeof(float), 0);
    TD_LAUNCH(moe_dw_pairs, (unsigned)((n + 127) / 128), 128, 0, tdc_stream(), d_dw, d_dout, d_y, d_rows, n, K, C);
    CUDA_CHECK_LAUNCH();
    TD_LAUNCH(moe_dy_pairs, pair_grid(n, C), MOE_THREADS, 0, tdc_stream(), d_dy, d_dout, d_rows, d_w, K, C,
              tdc_recipe_of(ctx).act);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" void moe_scatter_add_cuda(const td_ops *ctx, float *dx, const float *dxe, const int *rows, int N, int n,
                                     int K, int C, int rounded)
{
    if (n <= 0 || C <= 0) return;
    tdc_recipe k = tdc_recipe_of(ctx);
    int R = rounded && !k.residual_fp32 ? k.act : (int)TD_F32;
    const int *d_rows = rows ? (const int *)tdc_in(rows, (size_t)n * sizeof(int)) : NULL;
    const float *d_dxe = (const float *)tdc_in(dxe, (size_t)n * C * sizeof(float));
    float *d_dx = (float *)tdc_out(dx, (size_t)N * C * sizeof(float), 1);
    TD_LAUNCH(moe_scatter_add_rows, pair_grid(n, C), MOE_THREADS, 0, tdc_stream(), d_dx, d_dxe, d_rows, n, K, C, R);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" void moe_shared_combine_backward_cuda(const td_ops *ctx, float *dz, float *dy, const float *dout,
                                                 const float *y, const float *z, int N, int C)
{
    size_t n = (size_t)N * C;
    if (n == 0) return;
    int D = tdc_recipe_of(ctx).act;
    const float *d_dout = (const float *)tdc_in(dout, n * sizeof(float));
    const float *d_y = (const float *)tdc_in(y, n * sizeof(float));
    const float *d_z = (const float *)tdc_in(z, (size_t)N * sizeof(float));
    float *d_dz = (float *)tdc_out(dz, (size_t)N * sizeof(float), 0);
    float *d_dy = (float *)tdc_out(dy, n * sizeof(float), 0);
    TD_LAUNCH(moe_dz_rows, (unsigned)((N + 127) / 128), 128, 0, tdc_stream(), d_dz, d_dout, d_y, d_z, N, C, D);
    CUDA_CHECK_LAUNCH();
    TD_LAUNCH(moe_shared_dy_elems, tdc_blocks(n, MOE_THREADS), MOE_THREADS, 0, tdc_stream(), d_dy, d_dout, d_z, n, C,
              D);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
