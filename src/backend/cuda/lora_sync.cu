/* tidal — tidal-rl's --lora-sync merge-unmerge on the device (td_backend_cuda's lora_peft_sync and
 * lora_drift entries, src/model/ops.h; the host form is src/rl/sync.c's merge_unmerge and drift
 * with src/model/lora_peft.c's PEFT arithmetic):
 *   delta  = fl(fl(B A) * scale)    the rank sum an fma chain in k = 0..r-1 (td_lora_fold_delta)
 *   m      = D(w + delta)           merge_adapter(): the engine's matrix
 *   w      = D(m - D(delta))        unmerge_adapter(): the trainer's base, drifted
 *   stats  |E(m) - E(w)|^2, |delta|^2, <E(m) - E(w), delta>, #{E(m) != E(w)} (w before the sync)
 *   drift  max |w - w0|, sum |w - w0|, #{w != w0}
 * D and E are round.cuh's tdc_round (bf16 / fp16 overflow to Inf as td_round does). One thread per
 * row walks its columns in order with double sums (uncontracted), one thread adds the rows in
 * order: sync.c's order, so the sums are the host's bits (tests/cudasim/test_prepare_sim.cpp). The
 * row walk is strided across threads (uncoalesced): it runs once per weight sync. */
#include "lora_rows.cuh"

#define SYNC_THREADS 256

__global__ static void peft_rows(float *w, float *m, const float *a, const float *b, int N, int K, int r,
                                 float scale, int dtype, int efmt, double *row_stats)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    lora_row_stats st = {0, 0, 0, 0};
    for (int j = 0; j < K; j++) {
        float delta = lora_row_delta(a, b, i, j, K, r, scale);
        size_t e = (size_t)i * K + j;
        float wv = w[e], mv = tdc_round(dtype, tdc_add(wv, delta));
        lora_row_add(&st, tdc_round(efmt, mv), tdc_round(efmt, wv), delta);
        m[e] = mv;
        w[e] = tdc_round(dtype, __fsub_rn(mv, tdc_round(dtype, delta)));
    }
    lora_row_store(&st, row_stats, i);
}

__global__ static void drift_rows(const float *w, const float *w0, int N, int K, double *row_stats)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    double mx = 0, sum = 0, changed = 0;
    for (int j = 0; j < K; j++) {
        size_t e = (size_t)i * K + j;
        double d = fabs(__dadd_rn((double)w[e], -(double)w0[e]));
        mx = fmax(mx, d);
        sum = __dadd_rn(sum, d);
        changed += w[e] != w0[e];
    }
    row_stats[4 * (size_t)i] = mx;
    row_stats[4 * (size_t)i + 1] = sum;
    row_stats[4 * (size_t)i + 2] = changed;
    row_stats[4 * (size_t)i + 3] = 0;
}

/* the rows' statistics in row order: sums, or (max_first) a max then sums */
__global__ static void rows_total(const double *row_stats, int N, int max_first, double *stats)
{
    if (blockIdx.x || threadIdx.x) return;
    double s[4] = {0, 0, 0, 0};
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 4; k++) {
            double v = row_stats[4 * (size_t)i + k];
            s[k] = max_first && k == 0 ? fmax(s[k], v) : __dadd_rn(s[k], v);
        }
    for (int k = 0; k < 4; k++) stats[k] = s[k];
}

static void rows_to_host(double *row_stats, int N, int max_first, double *stats, int nstats)
{
    double *total = row_stats + 4 * (size_t)N;
    TD_LAUNCH(rows_total, 1, 1, 0, tdc_stream(), row_stats, N, max_first, total);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(stats, total, nstats * sizeof(double), cudaMemcpyDeviceToHost, tdc_stream()));
    CUDA_CHECK(cudaStreamSynchronize(tdc_stream()));
    tdc_d2h_count(nstats * sizeof(double));
}

static void check_fmt(const char *what, int f)
{
    if (f != TD_F32 && f != TD_BF16 && f != TD_F16) {
        fprintf(stderr, "tidal: %s: format %d is not folded on the device (a tidal bug)\n", what, f);
        abort();
    }
}

extern "C" void lora_peft_sync_cuda(float *w, float *m, const float *a, const float *b, int N, int K, int r,
                                    float scale, int dtype, int efmt, double *stats)
{
    check_fmt("lora_peft_sync_cuda (dtype)", dtype);
    check_fmt("lora_peft_sync_cuda (the rollout weights)", efmt);
    if (N <= 0 || K <= 0) return;
    double *row_stats = (double *)tdc_scratch(TDC_SLOT_MISC, ((size_t)N + 1) * 4 * sizeof(double));
    TD_LAUNCH(peft_rows, (unsigned)((N + SYNC_THREADS - 1) / SYNC_THREADS), SYNC_THREADS, 0, tdc_stream(), w, m, a,
              b, N, K, r, scale, dtype, efmt, row_stats);
    CUDA_CHECK_LAUNCH();
    rows_to_host(row_stats, N, 0, stats, 4);
}

extern "C" void lora_drift_cuda(const float *w, const float *w0, int N, int K, double *stats)
{
    if (N <= 0 || K <= 0) return;
    double *row_stats = (double *)tdc_scratch(TDC_SLOT_MISC, ((size_t)N + 1) * 4 * sizeof(double));
    TD_LAUNCH(drift_rows, (unsigned)((N + SYNC_THREADS - 1) / SYNC_THREADS), SYNC_THREADS, 0, tdc_stream(), w, w0, N,
              K, row_stats);
    CUDA_CHECK_LAUNCH();
    rows_to_host(row_stats, N, 1, stats, 3);
}
