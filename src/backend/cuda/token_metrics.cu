/* tidal — token_metrics_cuda: td_token_metrics_compute (src/analysis/metrics.c) on the device,
 * one block per pair of log-prob rows (A's and B's for the same token), so a caller holding both
 * paths' rows on the device brings down one td_token_metrics per token instead of two V-wide
 * rows (issue 26, item 2's last part). tidal-diff --device cuda uses it (the table's
 * token_metrics entry): B's log-softmax rows kept on the device by position
 * (row_logsoftmax_cuda below, td_rows_dev in src/paths/rows_dev.c), A's scored chunk by chunk.
 * The same formulas term by term: each row renormalised in double (za, zb = td_log_sum_exp),
 * KL(B||A) and KL(A||B) in the termwise non-negative form p k3, entropy, total variation; top-1
 * the first index of the maximum, rank 1 + the count of larger values, logp_a / logp_b the rows'
 * values at y: those four exactly the CPU's. The double sums run in the block's order instead of
 * the CPU's sequential one (za, zb included): sums of non-negative terms, each within ~2V 2^-53
 * of the CPU's relatively; za and zb move every r = a - b by a few 1e-16, which for near rows
 * (|r| ~ 1e-4, KL ~ 1e-9) changes k3 ~ r^2 / 2 by ~1e-12 relatively: measured <= 1.1e-11
 * relative on KL / TV / entropy (tests/cudasim/test_token_metrics_sim, V 100 and 151,936).
 * lb NULL: td_token_metrics_replay's A side (replayed rollouts), token_metrics_replay_rows.
 * No scratch. */
#include "kern.cuh"
#include "tidal/metrics.h"

#define TM_THREADS 256

TDC_DEV double tm_k3(double la, double lb)
{
    double r = la - lb;
    if (r == INFINITY) return INFINITY;
    return expm1(r) - r;
}

/* first index of the maximum of x over the block (ties: the lowest index) */
TDC_DEV int tm_argmax(const float *x, int V, float *fred, int *ired)
{
    float bv = -INFINITY;
    int bi = 0x7fffffff;
    for (int j = threadIdx.x; j < V; j += blockDim.x)
        if (x[j] > bv || (x[j] == bv && j < bi)) { bv = x[j]; bi = j; }
    if (threadIdx.x == 0) *ired = 0x7fffffff;
    float m = tdc_block_max(bv, fred);   /* synchronises first */
    if (bv == m) atomicMin(ired, bi);
    __syncthreads();
    int r = *ired == 0x7fffffff ? 0 : *ired;
    __syncthreads();
    return r;
}

TDC_DEV double tm_lse(const float *x, int V, float *fred, double *dred)
{
    float mx = -INFINITY;
    for (int j = threadIdx.x; j < V; j += blockDim.x) mx = x[j] > mx ? x[j] : mx;
    mx = tdc_block_max(mx, fred);
    if (mx == -INFINITY) return 0;
    double s = 0;
    for (int j = threadIdx.x; j < V; j += blockDim.x) s += exp((double)x[j] - mx);
    s = tdc_block_sum_d(s, dred);
    return mx + log(s);
}

__global__ static void token_metrics_rows(const float *la_all, const size_t *ia, const float *lb_all,
                                          const size_t *ib, int V, const int *ys, td_token_metrics *out)
{
    __shared__ float fred[TM_THREADS / 32];
    __shared__ double dred[TM_THREADS / 32];
    __shared__ int ired;
    const float *la = la_all + (ia ? ia[blockIdx.x] : (size_t)blockIdx.x) * V;
    const float *lb = lb_all + (ib ? ib[blockIdx.x] : (size_t)blockIdx.x) * V;
    int y = ys[blockIdx.x];
    const float ya = la[y], yb = lb[y];
    double za = tm_lse(la, V, fred, dred), zb = tm_lse(lb, V, fred, dred);
    double kl_ba = 0, kl_ab = 0, tv = 0, ha = 0, hb = 0, ra = 0, rb = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        double a = la[v] - za, b = lb[v] - zb;
        double pa = exp(a), pb = exp(b);
        kl_ba += pb > 0 ? pb * tm_k3(a, b) : pa;
        kl_ab += pa > 0 ? pa * tm_k3(b, a) : pb;
        if (pb > 0) hb -= pb * b;
        if (pa > 0) ha -= pa * a;
        tv += fabs(pa - pb);
        ra += la[v] > ya;
        rb += lb[v] > yb;
    }
    kl_ba = tdc_block_sum_d(kl_ba, dred);
    kl_ab = tdc_block_sum_d(kl_ab, dred);
    tv = tdc_block_sum_d(tv, dred);
    ha = tdc_block_sum_d(ha, dred);
    hb = tdc_block_sum_d(hb, dred);
    ra = tdc_block_sum_d(ra, dred);
    rb = tdc_block_sum_d(rb, dred);
    int top_a = tm_argmax(la, V, fred, &ired), top_b = tm_argmax(lb, V, fred, &ired);
    if (threadIdx.x == 0) {
        td_token_metrics m;
        m.logp_a = ya;
        m.logp_b = yb;
        m.kl_ba = kl_ba;
        m.kl_ab = kl_ab;
        m.k3 = tm_k3(ya, yb);
        m.tv = 0.5 * tv;
        m.entropy_a = ha;
        m.entropy_b = hb;
        m.top1_a = top_a;
        m.top1_b = top_b;
        m.rank_a = 1 + (int)ra;
        m.rank_b = 1 + (int)rb;
        out[blockIdx.x] = m;
    }
}

/* td_token_metrics_replay's A side (replayed rollouts: B known by the token's log-prob alone,
 * which the caller has): A's row as it is, not renormalised, entropy -sum_{p > 0} p la with
 * p = exp(la) in double (summed in the block's order), top-1 and rank as above, logp_a = la[y];
 * logp_b and k3 NaN for the caller to set (td_k3), the fields of B's distribution NaN / -1. */
__global__ static void token_metrics_replay_rows(const float *la_all, const size_t *ia, int V, const int *ys,
                                                 td_token_metrics *out)
{
    __shared__ float fred[TM_THREADS / 32];
    __shared__ double dred[TM_THREADS / 32];
    __shared__ int ired;
    const float *la = la_all + (ia ? ia[blockIdx.x] : (size_t)blockIdx.x) * V;
    const float ya = la[ys[blockIdx.x]];
    double ha = 0, ra = 0;
    for (int v = threadIdx.x; v < V; v += blockDim.x) {
        double pa = exp((double)la[v]);
        if (pa > 0) ha -= pa * la[v];
        ra += la[v] > ya;
    }
    ha = tdc_block_sum_d(ha, dred);
    ra = tdc_block_sum_d(ra, dred);
    int top_a = tm_argmax(la, V, fred, &ired);
    if (threadIdx.x == 0) {
        td_token_metrics m;
        m.logp_a = ya;
        m.logp_b = m.k3 = NAN;
        m.kl_ba = m.kl_ab = m.tv = m.entropy_b = NAN;
        m.entropy_a = ha;
        m.top1_a = top_a;
        m.rank_a = 1 + (int)ra;
        m.top1_b = m.rank_b = -1;
        out[blockIdx.x] = m;
    }
}

/* n pairs of rows (V wide, device or host; pair i: la + ia[i] * V and lb + ib[i] * V, ia / ib
 * NULL = i), y (n, host or device): m (n, host or device). The rows a NULL index reads are
 * n * V floats from la / lb; with an index, la / lb must be device memory (no staging).
 * lb NULL: A's rows alone (token_metrics_replay_rows). */
extern "C" void token_metrics_cuda(const td_ops *ctx, td_token_metrics *m, const float *la, const size_t *ia,
                                   const float *lb, const size_t *ib, const int *y, int n, int V)
{
    (void)ctx;
    if (n <= 0 || V <= 0) return;
    const float *d_la = ia ? la : (const float *)tdc_in(la, (size_t)n * V * sizeof(float));
    const size_t *d_ia = (const size_t *)tdc_in(ia, (size_t)n * sizeof(size_t));
    const int *d_y = (const int *)tdc_in(y, (size_t)n * sizeof(int));
    td_token_metrics *d_m = (td_token_metrics *)tdc_out(m, (size_t)n * sizeof(td_token_metrics), 0);
    if (lb) {
        const float *d_lb = ib ? lb : (const float *)tdc_in(lb, (size_t)n * V * sizeof(float));
        const size_t *d_ib = (const size_t *)tdc_in(ib, (size_t)n * sizeof(size_t));
        TD_LAUNCH(token_metrics_rows, n, TM_THREADS, 0, tdc_stream(), d_la, d_ia, d_lb, d_ib, V, d_y, d_m);
    } else {
        TD_LAUNCH(token_metrics_replay_rows, n, TM_THREADS, 0, tdc_stream(), d_la, d_ia, V, d_y, d_m);
    }
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

/* ---- row_logsoftmax_cuda: td_log_softmax (src/numerics/logprob.c) on the device ------------
 * td_log_softmax subtracts (float)(mx + log(sum)), sum = the double sum of exp(x - mx) in
 * index order. The block sums in another order, within (2n + 16) 2^-53 sum of it (n non-zero
 * terms; also a few ulp of exp / log on a real GPU): the float is taken on the device when
 * both ends of that interval round to it, else thread 0 sums in td_log_sum_exp's order (rare:
 * about 1e-4 of the rows at V = 151,936; sampling.cu's log-softmax is certified the same way).
 * So a row kept on the device is bit for bit the row the host would have made of the same
 * logits. */

extern "C" { int row_logsoftmax_cuda_force_exact = 0; }   /* tests: always the sequential sum */

__global__ static void row_logsoftmax_rows(float *dst, const size_t *drow, const float *src, int V, float T,
                                           int force)
{
    __shared__ float fred[TM_THREADS / 32];
    __shared__ double dred[TM_THREADS / 32];
    __shared__ float sh_lse;
    const float *x = src + (size_t)blockIdx.x * V;
    float *w = dst + (drow ? drow[blockIdx.x] : (size_t)blockIdx.x) * V;
    int tid = threadIdx.x, nt = blockDim.x;
    float fmx = -INFINITY;
    for (int j = tid; j < V; j += nt) {
        float v = x[j];
        if (T != 1.0f) v = v / T;
        w[j] = v;
        fmx = v > fmx ? v : fmx;
    }
    fmx = tdc_block_max(fmx, fred);   /* synchronises: w is visible to all */
    tdc_block_log_softmax_certified(w, V, fmx, force, fred, dred, &sh_lse);
}

extern "C" void row_logsoftmax_cuda(const td_ops *ctx, float *dst, const size_t *dst_row, const float *src, int n,
                                    int V, float T)
{
    (void)ctx;
    if (n <= 0 || V <= 0) return;
    if (!(T > 0)) T = 1.0f;
    const float *d_src = (const float *)tdc_in(src, (size_t)n * V * sizeof(float));
    const size_t *d_row = (const size_t *)tdc_in(dst_row, (size_t)n * sizeof(size_t));
    TD_LAUNCH(row_logsoftmax_rows, n, TM_THREADS, 0, tdc_stream(), dst, d_row, d_src, V, T,
              row_logsoftmax_cuda_force_exact);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
