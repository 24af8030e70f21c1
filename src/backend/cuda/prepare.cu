/* tidal — a recipe's weights prepared on the device from a trainer's device masters
 * (td_backend_cuda's prepare entry, src/model/ops.h; the host form is weights_recipe.c's
 * td_gemm_prepare_weight / td_round_row / td_encode_row and lora_run.c's vLLM B):
 *   prepare_cuda   dst[i] = R(src[i]), then R(dst[i] * scale) when scale != 1, R = round.cuh's
 *                  tdc_round of fmt (the CPU's bit arithmetic, SATFINITE); stored as fp32 or as
 *                  bf16 / fp16 codes (tdc_bf16_enc / tdc_f16_enc: td_encode_row's codes). Bit for
 *                  bit the host preparation (tests/cudasim/test_prepare_sim.cpp).
 *   prepare_fp8_cuda  an FP8 weight: fp8_quantize_cuda (td_fp8_quantize bit for bit: the block
 *                  maxima are exact in any order, the scales scaling.c's fp32 arithmetic) into
 *                  the codes' and scales' copies; or its dequantised values (lut[code] * scale,
 *                  one fp32 product: td_fp8_fake_quant) as an fp32 copy.
 * dst is the device copy the ops look up for the host key (tdc_const_slot, backend.cu): the host
 * buffer is never written. */
#include "lora_rows.cuh"
#include "matmul.cuh"

#define PREP_THREADS 256

__global__ static void prepare_elems(void *dst, int storage, const float *src, size_t n, int fmt, float scale)
{
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        float v = tdc_round(fmt, src[i]);
        /* a NaN keeps its payload, quieted, as the CPU's multiply keeps it (the GPU's gives the
         * canonical 0x7fffffff: the H200 of 2026-11-29, tests/cudasim/test_prepare_sim) */
        if (scale != 1.0f) v = tdc_round(fmt, v != v ? __uint_as_float(__float_as_uint(v) | 0x00400000u) : tdc_mul(v, scale));
        if (storage == TD_BF16) ((uint16_t *)dst)[i] = tdc_bf16_enc(v);
        else if (storage == TD_F16) ((uint16_t *)dst)[i] = tdc_f16_enc(v);
        else ((float *)dst)[i] = v;
    }
}

extern "C" void prepare_cuda(const void *key, int storage, const float *src, size_t n, int fmt, float scale)
{
    if (!n) return;
    if ((storage != TD_F32 && storage != fmt) || (storage != TD_F32 && storage != TD_BF16 && storage != TD_F16) ||
        fmt == TD_E4M3 || fmt == TD_E5M2) {
        fprintf(stderr, "tidal: prepare_cuda: storage %d from format %d is not prepared on the device (a tidal bug)\n",
                storage, fmt);
        abort();
    }
    void *dst = tdc_const_slot(key, n * (storage == TD_F32 ? 4 : 2));
    size_t b = (n + PREP_THREADS - 1) / PREP_THREADS;
    TD_LAUNCH(prepare_elems, (unsigned)(b > 4096 ? 4096 : b), PREP_THREADS, 0, tdc_stream(), dst, storage,
              (const float *)tdc_in(src, n * sizeof(float)), n, fmt, scale);
    CUDA_CHECK_LAUNCH();
    tdc_done();
}

/* ---- a merged adapter: be->lora_fold (ops.h), weights_recipe.c's merge_sum on the device ------
 *   dW[i][j] = fl(scale * acc), acc = fma(B[i][r-1], A[r-1][j], ... fma(B[i][0], A[0][j], 0))
 *                (td_lora_fold_delta's chain, OpenBLAS's sgemm kernel made explicit)
 *   key[i][j] = R(W + dW) (stored as prepare stores), and R(W) beside it for the statistics.
 * One thread per row walks its columns in order and sums the row's statistics in double
 * (uncontracted: __dmul_rn / __dadd_rn, as the host compiles them); one thread then adds the
 * rows in order: td_lora_fold_stats' order, so the four sums are the host's bits. The row walk
 * is strided across threads (uncoalesced): the fold runs once per weight sync. */
__global__ static void fold_rows(void *dst, int storage, const float *w, const float *a, const float *b, int N,
                                 int K, int r, float scale, int fmt, double *row_stats)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= N) return;
    lora_row_stats st = {0, 0, 0, 0};
    for (int j = 0; j < K; j++) {
        float dw = lora_row_delta(a, b, i, j, K, r, scale);
        size_t e = (size_t)i * K + j;
        float merged = tdc_round(fmt, tdc_add(w[e], dw)), base = tdc_round(fmt, w[e]);
        if (storage == TD_BF16) ((uint16_t *)dst)[e] = tdc_bf16_enc(merged);
        else if (storage == TD_F16) ((uint16_t *)dst)[e] = tdc_f16_enc(merged);
        else ((float *)dst)[e] = merged;
        lora_row_add(&st, merged, base, dw);
    }
    lora_row_store(&st, row_stats, i);
}

__global__ static void fold_total(const double *row_stats, int N, double *stats)
{
    if (blockIdx.x || threadIdx.x) return;
    double s[4] = {0, 0, 0, 0};
    for (int i = 0; i < N; i++)
        for (int k = 0; k < 4; k++) s[k] = __dadd_rn(s[k], row_stats[4 * (size_t)i + k]);
    for (int k = 0; k < 4; k++) stats[k] = s[k];
}

extern "C" void lora_fold_cuda(const void *key, int storage, const float *w, const float *a, const float *b, int N,
                               int K, int r, float scale, int fmt, double *stats)
{
    size_t n = (size_t)N * K;
    if ((storage != TD_F32 && storage != fmt) || (storage != TD_F32 && storage != TD_BF16 && storage != TD_F16) ||
        fmt == TD_E4M3 || fmt == TD_E5M2 || N <= 0 || K <= 0 || r <= 0) {
        fprintf(stderr, "tidal: lora_fold_cuda: storage %d from format %d (%d x %d, rank %d) is not folded on the "
                "device (a tidal bug)\n", storage, fmt, N, K, r);
        abort();
    }
    void *dst = tdc_const_slot(key, n * (storage == TD_F32 ? 4 : 2));
    double *row_stats = (double *)tdc_scratch(TDC_SLOT_MISC, (size_t)N * 4 * sizeof(double) + 4 * sizeof(double));
    double *total = row_stats + 4 * (size_t)N;
    TD_LAUNCH(fold_rows, (unsigned)((N + PREP_THREADS - 1) / PREP_THREADS), PREP_THREADS, 0, tdc_stream(), dst,
              storage, w, a, b, N, K, r, scale, fmt, row_stats);
    CUDA_CHECK_LAUNCH();
    TD_LAUNCH(fold_total, 1, 1, 0, tdc_stream(), row_stats, N, total);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaMemcpyAsync(stats, total, 4 * sizeof(double), cudaMemcpyDeviceToHost, tdc_stream()));
    CUDA_CHECK(cudaStreamSynchronize(tdc_stream()));
    tdc_d2h_count(4 * sizeof(double));
}

/* ---- FP8 weights: be->prepare_fp8 (ops.h) ------------------------------------------------------ */

__global__ static void fp8_dequant(float *y, const uint8_t *codes, const float *scales, int fmt, int rows, int cols,
                                   int br, int bc, int nbc)
{
    size_t n = (size_t)rows * cols;
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        size_t b = (i / cols) / br * nbc + (i % cols) / bc;
        float v = fmt == TD_E4M3 ? tdc_e4m3_dec(codes[i]) : tdc_e5m2_dec(codes[i]);
        y[i] = tdc_mul(v, scales[b]);
    }
}

extern "C" void prepare_fp8_cuda(const void *codes_key, const void *scales_key, const void *f32_key,
                                 const td_fp8_scheme *s, const float *src, int rows, int cols)
{
    size_t n = (size_t)rows * cols, ns = td_fp8_num_scales(s, (size_t)rows, (size_t)cols);
    if (!n) return;
    if (s->fmt != TD_E4M3 && s->fmt != TD_E5M2) {
        fprintf(stderr, "tidal: prepare_fp8_cuda: format %d is not FP8 (a tidal bug)\n", s->fmt);
        abort();
    }
    if (!f32_key) {
        fp8_quantize_cuda(s, src, rows, cols, (uint8_t *)tdc_const_slot(codes_key, n),
                          (float *)tdc_const_slot(scales_key, ns * sizeof(float)));
        tdc_done();
        return;
    }
    size_t br, bc;
    td_fp8_block_shape(s, (size_t)rows, (size_t)cols, &br, &bc);
    float *y = (float *)tdc_const_slot(f32_key, n * sizeof(float));
    size_t off = (n + 255) / 256 * 256;
    uint8_t *codes = (uint8_t *)tdc_scratch(TDC_SLOT_GEMM_A, off + ns * sizeof(float));
    float *scales = (float *)(codes + off);
    fp8_quantize_cuda(s, src, rows, cols, codes, scales);
    size_t b = (n + PREP_THREADS - 1) / PREP_THREADS;
    TD_LAUNCH(fp8_dequant, (unsigned)(b > 4096 ? 4096 : b), PREP_THREADS, 0, tdc_stream(), y, codes, scales, s->fmt,
              rows, cols, (int)br, (int)bc, (int)((cols + bc - 1) / bc));
    CUDA_CHECK_LAUNCH();
    tdc_done();
}
