/* tidal — a mixture of experts' row ops on the device (ops.h moe_gather, moe_combine,
 * moe_scatter, moe_sum, moe_shared_combine; CPU: src/backend/cpu_moe.c, moe.c's arithmetic):
 *   gather          out_q = x_{rows[q] / K}                                 a copy
 *   combine         out_i = R(out_i + R(y_q * w_p)),  p = rows[q], i = p / K  (index_add_)
 *   scatter         v_p = D(y_q * w_p)                                       (fused_moe's output)
 *   sum             out_i = 0, out_i = D(out_i + v_{i K + j}) for j = 0 .. K-1  (moe_sum)
 *   shared_combine  g = D(1 / (1 + expf(-z_i))),  out_i = R(out_i + D(y_i * g))
 * D the activations dtype, R the stream's (fp32 under residual_fp32; ops.h), every rounding
 * tdc_round (the CPU's td_round bits), the fp32 products and sums uncontracted (tdc_mul, tdc_add),
 * expf glibc's own (expf_glibc.cuh): each op gives the CPU's bits.
 *
 * Parallel over rows and columns: one thread per (pair, column) or (row, column), each output
 * element written by one thread, so no two threads touch one element and no atomics are needed.
 * combine adds into out: where a row appears twice in one expert's list (never under top-k; a
 * replayed routing could: rows being in row order, its pairs are adjacent) the first pair's
 * thread adds the run in list order and the others return, the CPU's order. Experts follow one
 * another on the stream (one launch each), the CPU's order across experts. Scratch: none; host
 * tables and buffers are staged (tdc_in / tdc_out) as every op stages them. */
#include "expf_glibc.cuh"

#define MOE_THREADS 256

/* a launch over n pairs (or rows) x C columns: blocks of MOE_THREADS columns */
static dim3 pair_grid(int n, int C)
{
    return dim3((unsigned)n, (unsigned)((C + MOE_THREADS - 1) / MOE_THREADS));
}

__global__ static void moe_gather_rows(float *out, const float *x, const int *rows, int K, int C)
{
    int q = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
    if (h < C) out[(size_t)q * C + h] = x[(size_t)(rows[q] / K) * C + h];
}

__global__ static void moe_combine_rows(float *out, const float *y, const int *rows, const float *w, int n, int K,
                                        int C, int R)
{
    int q = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
    int i = rows[q] / K;
    if (h >= C || (q > 0 && rows[q - 1] / K == i)) return;   /* a run's first pair adds the run */
    float *o = out + (size_t)i * C + h, acc = *o;
    for (int t = q; t < n && rows[t] / K == i; t++)
        acc = tdc_round(R, tdc_add(acc, tdc_round(R, tdc_mul(y[(size_t)t * C + h], w[rows[t]]))));
    *o = acc;
}

__global__ static void moe_scatter_rows(float *v, const float *y, const int *rows, const float *w, int C, int D)
{
    int q = blockIdx.x, h = blockIdx.y * blockDim.x + threadIdx.x;
    if (h < C) v[(size_t)rows[q] * C + h] = tdc_round(D, tdc_mul(y[(size_t)q * C + h], w[rows[q]]));
}

__global__ static void moe_sum_elems(float *out, const float *v, size_t n, int K, int C, int D)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / (size_t)C, h = e % (size_t)C;
        float o = 0.0f;
        for (int j = 0; j < K; j++) o = tdc_round(D, tdc_add(o, v[(i * K + j) * C + h]));
        out[e] = o;
    }
}

__global__ static void moe_shared_elems(float *out, const float *y, const float *z, size_t n, int C, int D, int R)
{
    for (size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x; e < n; e += (size_t)gridDim.x * blockDim.x) {
        float g = tdc_round(D, 1.0f / tdc_add(1.0f, tdc_expf_glibc(-z[e / (size_t)C])));   /* F.sigmoid, D gate */
        out[e] = tdc_round(R, tdc_add(out[e], tdc_round(D, tdc_mul(y[e], g))));
    }
}

/* the stream dtype R: the activations', fp32 under residual_fp32 */
static int stream_fmt(const tdc_recipe &k) { return k.residual_fp32 ? (int)TD_F32 : k.act; }

extern "C" void moe_gather_cuda(const td_ops *ctx, float *out, const float *x, const int *rows, int N, int n, int K,
                                int C)
{
    (void)ctx;
    if (n <= 0 || C <= 0) return;
    const int *d_rows = (const int *)tdc_in(rows, (size_t)n * sizeof(int));
    const float *d_x = (const float *)tdc_in(x, (size_t)N * C * sizeof(float));
    float *d_out = (float *)tdc_out(out, (size_t)n * C * sizeof(float), 0);
    TD_LAUNCH(moe_gather_rows, pair_grid(n, C), MOE_THREADS, 0, tdc_stream(), d_out, d_x, d_rows, K, C);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" void moe_combine_cuda(const td_ops *ctx, float *out, const float *y, const int *rows, const float *w, int N,
                                 int n, int K, int C)
{
    if (n <= 0 || C <= 0) return;
    const int *d_rows = (const int *)tdc_in(rows, (size_t)n * sizeof(int));
    const float *d_w = (const float *)tdc_in(w, (size_t)N * K * sizeof(float));
    const float *d_y = (const float *)tdc_in(y, (size_t)n * C * sizeof(float));
    float *d_out = (float *)tdc_out(out, (size_t)N * C * sizeof(float), 1);
    TD_LAUNCH(moe_combine_rows, pair_grid(n, C), MOE_THREADS, 0, tdc_stream(), d_out, d_y, d_rows, d_w, n, K, C,
              stream_fmt(tdc_recipe_of(ctx)));
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" void moe_scatter_cuda(const td_ops *ctx, float *v, const float *y, const int *rows, const float *w, int N,
                                 int n, int K, int C)
{
    if (n <= 0 || C <= 0) return;
    const int *d_rows = (const int *)tdc_in(rows, (size_t)n * sizeof(int));
    const float *d_w = (const float *)tdc_in(w, (size_t)N * K * sizeof(float));
    const float *d_y = (const float *)tdc_in(y, (size_t)n * C * sizeof(float));
    float *d_v = (float *)tdc_out(v, (size_t)N * K * C * sizeof(float), 1);   /* the other pairs' rows kept */
    TD_LAUNCH(moe_scatter_rows, pair_grid(n, C), MOE_THREADS, 0, tdc_stream(), d_v, d_y, d_rows, d_w, C,
              tdc_recipe_of(ctx).act);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" void moe_sum_cuda(const td_ops *ctx, float *out, const float *v, int N, int K, int C)
{
    size_t n = (size_t)N * C;
    if (n == 0) return;
    const float *d_v = (const float *)tdc_in(v, n * K * sizeof(float));
    float *d_out = (float *)tdc_out(out, n * sizeof(float), 0);
    TD_LAUNCH(moe_sum_elems, tdc_blocks(n, MOE_THREADS), MOE_THREADS, 0, tdc_stream(), d_out, d_v, n, K, C,
              tdc_recipe_of(ctx).act);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

extern "C" void moe_shared_combine_cuda(const td_ops *ctx, float *out, const float *y, const float *z, int N, int C)
{
    size_t n = (size_t)N * C;
    if (n == 0) return;
    tdc_recipe k = tdc_recipe_of(ctx);
    const float *d_y = (const float *)tdc_in(y, n * sizeof(float));
    const float *d_z = (const float *)tdc_in(z, (size_t)N * sizeof(float));
    float *d_out = (float *)tdc_out(out, n * sizeof(float), 1);
    TD_LAUNCH(moe_shared_elems, tdc_blocks(n, MOE_THREADS), MOE_THREADS, 0, tdc_stream(), d_out, d_y, d_z, n, C,
              k.act, stream_fmt(k));
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
